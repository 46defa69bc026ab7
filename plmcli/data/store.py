"""Data on disk: a data directory's meta.json, the cache key outputs are found by, and writes that are
whole or absent.

Every prepared directory (`plm tokenize`, make-mlm-data, parallel, streaming, a finetune's data) says
what it is in `meta.json`; only this module reads and writes that file. Every cached output is found by
`cache_key` over what made it, so the same inputs and settings find the same directory. Every file or
directory plm writes is built under a temp name beside its destination and renamed into place: a reader
sees the old output or the complete new one, never half of one, and a failure leaves no temp behind.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from plmcli.data.outdir import find_plm_error
from plmcli.errors import PlmError, WriteFailed

META = "meta.json"
CORPUS_FORMAT = "plm-tokenized"
"""The format of a `plm tokenize` output (data/corpus.py): text readers refuse to read one as text."""


# ----------------------------------------------------------------------------- meta.json


def read_meta(directory, fmt: str | None = None) -> dict | None:
    """meta.json of `directory`, or None if it is missing, damaged, or (with `fmt`) of another format."""
    try:
        meta = json.loads((Path(directory) / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    return meta if fmt is None or meta.get("format") == fmt else None


def load_meta(directory) -> dict:
    """meta.json of a directory plm prepared itself (it must be there): a PlmError when it cannot be read."""
    meta = read_meta(directory)
    if meta is None:
        raise PlmError(f"'{directory}' has no readable {META}",
                       "delete the directory (or the cache) and let plm prepare it again")
    return meta


def has_meta(directory) -> bool:
    return (Path(directory) / META).is_file()


def write_meta(directory, meta: dict) -> None:
    """Write meta.json into a directory being built (its temp directory: renamed into place whole)."""
    (Path(directory) / META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def has_split(meta: dict, split: str) -> bool:
    """Whether a prepared directory's meta counts anything in `split` (documents, instances or examples)."""
    counts = meta.get("counts", {}).get(split, {})
    return any(counts.get(k, 0) > 0 for k in ("documents", "instances", "examples"))


def is_derived_data(directory) -> bool:
    """A directory built from a tokenized corpus (e.g. `plm make-mlm-data`): meta.json with its tokenizer."""
    meta = read_meta(directory)
    return meta is not None and "tokenizer" in meta and (Path(directory) / "tokenizer.json").is_file()


# ----------------------------------------------------------------------------- cache keys


def cache_key(*parts) -> str:
    """The key of a cached output: sha256 of its parts as JSON with sorted keys. Changing the recipe would
    orphan every cache on disk; a part added later should be appended only when set (see corpus_key)."""
    return hashlib.sha256(json.dumps(list(parts), sort_keys=True).encode("utf-8")).hexdigest()


def content_fingerprint(meta: dict) -> str:
    """What a prepared data directory holds, by content: its tokenizer, its counts per split (documents,
    tokens, bytes, ...) and, streamed, its files' sizes. Not its key: that counts the inputs' paths and
    mtimes, which differ between two nodes' copies of one corpus (several nodes compare this)."""
    streamed = meta.get("streaming") or {}
    return cache_key((meta.get("tokenizer") or {}).get("hash"), meta.get("counts"),
                     [streamed.get(k) for k in ("sizes", "train_bytes", "validation_start")])


def tokenizer_settings(tok_cfg) -> dict:
    """Tokenizer settings as they enter a key: a tokenizer file counts by its content, not its name."""
    tok = dataclasses.asdict(tok_cfg)
    if tok_cfg.path and Path(tok_cfg.path).is_file():
        tok["path"] = hashlib.sha256(Path(tok_cfg.path).read_bytes()).hexdigest()
    return tok


def inputs_key(stats: list[dict], tok_cfg, *settings) -> str:
    """The key of an output tokenized from inputs (`text.input_stats`): unique when stdin is one of them,
    as stdin is never cached."""
    if any(s.get("path") == "-" for s in stats):  # text.STDIN
        return hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    return cache_key(stats, tokenizer_settings(tok_cfg), *settings)


# ----------------------------------------------------------------------------- atomic files


def remove(path: Path) -> None:
    """Remove a file, link or directory tree if it is there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


WRITE_LOG = "PLM_WRITE_LOG"
"""Debugging several processes: with this environment variable naming a file, every atomic write (every
file or directory plm writes, caches included) appends a line `RANK PATH` to it, RANK being the
launcher's global rank (0 without one). The tests read it to check that one process builds a cache."""


def log_write(dest: Path) -> None:
    log = os.environ.get(WRITE_LOG)
    if log:  # one short O_APPEND write per line: lines of several processes do not interleave
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.environ.get('RANK', '0')} {Path(dest).resolve()}\n")


_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_REASONS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
            errno.EFBIG: "file too large (over the file size limit, ulimit -f)"}


def _errno_of(e: BaseException) -> int | None:
    """The errno of a failed write, also where torch's zip writer or safetensors hid it."""
    if isinstance(e, OSError):
        return e.errno
    # safetensors wraps Rust's io::Error, the errno as `code: N` or `(os error N)` by version; torch's zip
    # writer says no errno at all.
    code = re.search(r"(?:code: |os error )(\d+)", str(e)) if type(e).__name__ == "SafetensorError" else None
    return int(code.group(1)) if code else None


def _is_write_failure(e: BaseException, every_oserror: bool) -> bool:
    if isinstance(e, OSError):
        return every_oserror or e.errno in _DISK_ERRNOS
    torch_write = isinstance(e, RuntimeError) and any(w in str(e) for w in ("inline_container", "PytorchStreamWriter"))
    return torch_write or (type(e).__name__ == "SafetensorError" and any(w in str(e) for w in ("IoError", "I/O error")))


def _size(n: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _bytes_in(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _write_failure(e: BaseException, tmp: Path, needed: Callable[[], int | None] | None) -> str:
    """Why a write failed, in the user's words; a full disk with what is free and what the write needs."""
    import resource

    code = _errno_of(e)
    if code not in _REASONS:  # torch's writer gives no errno: the limit or the free space tells which it was
        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            code = errno.EFBIG
        elif isinstance(e, OSError) and e.errno is not None:
            return (e.strerror or str(e)).lower()
        else:
            code = errno.ENOSPC
    reason = _REASONS[code]
    if code == errno.EFBIG:
        return reason
    try:
        free = f"{_size(shutil.disk_usage(tmp.parent).free)} free"
    except OSError:
        free = "free space unknown"
    size = needed() if needed else None
    need = f"it needs about {_size(size)}" if size else f"{_size(_bytes_in(tmp))} were written when it failed"
    return f"{reason} ({free} there, {need})"


@contextmanager
def writing(what: str, tmp, continue_with: str | None = None, needed: Callable[[], int | None] | None = None,
            every_oserror: bool = True):
    """Around a write of `what` into the temp path `tmp` (a file or directory) that is renamed into place: a
    failure (Ctrl-C too) removes `tmp`, and a failed write (disk full, quota, file size limit; with
    `every_oserror` any OSError) becomes the one-line WriteFailed naming what, where and why. `needed`: the bytes
    the write takes, when the caller knows (a checkpoint: the last one's size), asked only once the disk is full."""
    tmp = Path(tmp)
    try:
        yield
    except WriteFailed as e:  # a write inside this one failed: this one's continuation is the way on
        remove(tmp)
        if continue_with is None or e.continued:
            raise
        raise _write_failed(e.message, e.fix, continue_with) from e.__cause__
    except BaseException as e:
        if not _is_write_failure(e, every_oserror):
            remove(tmp)
            raise
        reason = _write_failure(e, tmp, needed)  # before the temp goes: what it holds says how far the write got
        remove(tmp)
        fix = ("raise the file size limit (ulimit -f)" if "ulimit" in reason
               else "free some space there (or write elsewhere)" if reason.startswith(("no space", "disk quota"))
               else "check that place and its permissions")
        raise _write_failed(f"cannot write {what} in {tmp.parent}: {reason}", fix, continue_with) from e


def _write_failed(message: str, fix: str, continue_with: str | None) -> WriteFailed:
    then = f", then continue with `{continue_with}`" if continue_with else ", then run it again"
    e = WriteFailed(message, f"{fix}{then}; the files written before are intact")
    e.fix, e.continued = fix, continue_with is not None
    return e


@contextmanager
def atomic_path(dest, tmp=None, continue_with: str | None = None,
                needed: Callable[[], int | None] | None = None) -> Iterator[Path]:
    """A temp path beside `dest` to write (a file or a link); a clean exit renames it onto `dest`, a failure
    (Ctrl-C too) removes it, and a full disk or file size limit is the one-line WriteFailed (`writing`, which
    takes `continue_with` and `needed`). `tmp` names the temp path when a caller must know it (several processes)."""
    dest = Path(dest)
    log_write(dest)
    tmp = Path(tmp) if tmp is not None else dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    with writing(dest.name, tmp, continue_with, needed, every_oserror=False):
        yield tmp
        os.replace(tmp, dest)


def write_text(dest, text: str, continue_with: str | None = None) -> None:
    with atomic_path(dest, continue_with=continue_with) as tmp:
        tmp.write_text(text, encoding="utf-8")


def finite(obj):
    """`obj` with every non-finite float (inf, -inf, nan) in it, at any depth, replaced by None. JSON has no
    Infinity or NaN (RFC 8259): Python's json writes them as bare words that jq, JavaScript and most other
    parsers refuse. null is what JSON.stringify writes for them and jq prints for NaN, and it keeps every number
    field a number or null (an unsmoothed n-gram's ppl inf comes with zero_prob_tokens > 0, which says why)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_text(obj, **options) -> str:
    """Strict JSON of `obj` (json.dumps `options`): non-finite floats become null (`finite`)."""
    return json.dumps(finite(obj), allow_nan=False, **options)


def write_json(dest, obj, continue_with: str | None = None) -> None:
    """Strict JSON (`json_text`), indented: summary.json and metrics.json are read by people too."""
    write_text(dest, json_text(obj, indent=2, ensure_ascii=False) + "\n", continue_with)


# ----------------------------------------------------------------------------- atomic directories


def temp_beside(dest: Path) -> Path:
    """An empty temp dir next to `dest` (same filesystem, so the final rename is atomic), with the
    permissions a plain mkdir would give: mkdtemp's 0700 would hide the output from other users.

    Its name holds this process's pid: the temp dirs of `dest` that an interrupted run left (Ctrl-C twice,
    kill -9), whose process is gone, are removed here; a live writer's are left alone."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{glob.escape(dest.name)}.tmp-*"):
        pid = stale.name[len(dest.name) + 6:].split("-", 1)[0]
        if stale.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-{os.getpid()}-", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    return tmp


def swap_into(tmp: Path, dest: Path) -> None:
    """Rename the finished `tmp` to `dest`; an existing `dest` (older output, empty dir) is swapped out
    only now, so at every moment `dest` is either the old output or the complete new one."""
    if dest.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, trash / "old")
        os.replace(tmp, dest)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, dest)


@contextmanager
def atomic_dir(dest) -> Iterator[Path]:
    """A temp directory beside `dest` to build in; a clean exit swaps it into place, a failure removes it."""
    dest = Path(dest)
    log_write(dest)
    tmp = temp_beside(dest)
    with writing(dest.name, tmp, every_oserror=False):
        yield tmp
        swap_into(tmp, dest)


def build_atomically(out_dir: Path, key: str, read_meta: Callable[[Path], dict | None], build: Callable[[Path], dict],
                     what: str, force: bool = False) -> dict:
    """Return the meta of `out_dir` if it was built with `key`, else `build(tmp)` it and swap it into place.

    `read_meta(dir)` gives the meta of an output of this kind or None; a non-empty directory of another
    kind is never overwritten. An interrupted build leaves the old output (or nothing) behind.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        old = read_meta(out_dir) if out_dir.is_dir() else None
        if old is None and not (out_dir.is_dir() and not any(out_dir.iterdir())):
            raise PlmError(f"'{out_dir}' exists and is not a `{what}` output",
                           "choose another --out directory (plm will not overwrite it)")
        if old is not None and old.get("key") == key and not force:
            return old
    with atomic_dir(out_dir) as tmp:
        try:
            meta = build(tmp)
        except Exception as e:
            plm = find_plm_error(e)
            if plm is not None and plm is not e:
                raise plm from None
            raise
    return meta


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host: not gone, and not a zombie its parent has not reaped yet
    (torchrun's agent holds a dead worker so for a while)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: the process exists, another user's
        pass
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc (macOS): kill's answer stands
        return True
