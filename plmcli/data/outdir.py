"""Output directories that are either complete or absent: built in a temp dir, then renamed."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from plmcli.errors import PlmError


def find_plm_error(e: BaseException) -> PlmError | None:
    """datasets wraps errors raised inside generators and map workers; dig ours out of the chain."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PlmError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def check_writable(out, flag: str = "--out") -> None:
    """PlmError unless the output `out` (a directory, or a file to write) can be created where it is meant
    to go, found before any work: the nearest existing directory must take a new entry. The check leaves
    nothing behind (a probe directory, made and removed)."""
    out = Path(out)
    base = out if out.is_dir() else out.parent if out.exists() else out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise PlmError(f"cannot write {out}: {base} is a file, not a directory", f"choose a writable {flag}")
    probe = base / f".plm-write-check-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise PlmError(f"cannot write {out}: {e.strerror or e}", f"choose a writable {flag}") from None


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
    tmp = temp_beside(out_dir)
    try:
        try:
            meta = build(tmp)
        except Exception as e:
            plm = find_plm_error(e)
            if plm is not None and plm is not e:
                raise plm from None
            raise
        swap_into(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def temp_beside(dest: Path) -> Path:
    """An empty temp dir next to `dest` (same filesystem, so the final rename is atomic), with the
    permissions a plain mkdir would give: mkdtemp's 0700 would hide the output from other users."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
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


def discard(out_dir: Path, made: bool) -> None:
    """Remove what a command wrote into `out_dir`: the directory itself if the command made it, else its
    contents (an empty directory the user made stays)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return
    for child in [out_dir] if made else list(out_dir.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
