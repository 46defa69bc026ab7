"""Text files -> documents -> a tokenized Arrow corpus directory (`plm tokenize`), and readers for it.

A corpus directory holds `dataset/` (a DatasetDict with `train` and `validation`), `tokenizer.json` and
`meta.json`. It is built in a hidden temp directory and renamed into place, so a directory with a
`meta.json` is always complete. Memory stays flat in corpus size throughout: text is streamed line by
line into Arrow on disk, and everything after that streams over memory-mapped Arrow batches.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.tokenizers import (
    load_tokenizer,
    resolve_special_tokens,
    special_token_ids,
    tokenizer_hash,
    tokenizer_kind,
    train_tokenizer,
)
from plmcli.data.outdir import build_atomically
from plmcli.errors import PlmError

if TYPE_CHECKING:
    from datasets import DatasetDict
    from tokenizers import Tokenizer

FORMAT = "plm-tokenized"
VERSION = 3  # 2: word_starts column; 3: word_starts filled (encode_batch)
STDIN = "-"
_PROBE_BYTES = 8192  # how much of each file is checked for NUL bytes (as git and grep do)


# ----------------------------------------------------------------------------- reading text


def _read_meta(directory: Path) -> dict | None:
    """meta.json of a `plm tokenize` output directory, or None if `directory` is not one."""
    try:
        meta = json.loads((Path(directory) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _is_derived_data(directory: Path) -> bool:
    """A directory built from a tokenized corpus (e.g. `plm make-mlm-data`): meta.json with its tokenizer."""
    try:
        meta = json.loads((Path(directory) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "tokenizer" in meta and (Path(directory) / "tokenizer.json").is_file()


def _expand_inputs(inputs: list[str]) -> list[str]:
    """Input arguments -> the text files to read, in order (directories walked recursively, sorted)."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise PlmError("no input files given", "pass text files, directories, .gz files or '-' for stdin")
    files: list[str] = []
    for arg in map(str, inputs):
        if arg == STDIN:
            files.append(STDIN)
            continue
        p = Path(arg)
        if p.is_dir():
            if _read_meta(p) is not None:
                raise PlmError(f"'{p}' is already a `plm tokenize` output, not text",
                               "pass it to `plm pretrain --data` directly, or give the original text files")
            found = []
            for root, dirs, names in os.walk(p):
                # Skip hidden entries and nested tokenize outputs (e.g. `--out` placed inside the input dir).
                dirs[:] = [d for d in dirs if not d.startswith(".") and _read_meta(Path(root, d)) is None]
                found.extend(Path(root, n) for n in names if not n.startswith("."))
            files.extend(str(f) for f in sorted(found, key=lambda f: f.relative_to(p).parts))
        elif p.is_file():
            files.append(str(p))
        else:
            raise PlmError(f"input '{arg}' not found", "check the path (use '-' to read standard input)")
    return files


def _raw_lines(name: str) -> Iterator[bytes]:
    if name == STDIN:
        buf = getattr(sys.stdin, "buffer", None)
        # A text-only stdin (e.g. replaced by a StringIO) is already decoded; re-encode it line by line.
        yield from buf if buf is not None else (line.encode("utf-8") for line in sys.stdin)
        return
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rb") as f:
            head = f.read(_PROBE_BYTES)
            if head.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise _encoding_error(name, 1, "it starts with a UTF-16 byte-order mark", "utf-16")
            if b"\0" in head:
                raise _binary_error(name)
            f.seek(0)
            yield from f
    except (OSError, EOFError) as e:  # includes gzip.BadGzipFile and truncated .gz streams
        raise PlmError(f"cannot read '{name}': {e}",
                       "check the file (a .gz file must be gzip-compressed text)") from e


def _binary_error(name: str) -> PlmError:
    return PlmError(f"'{name}' looks like a binary file (it contains NUL bytes)",
                    "pass only plain-text files (or .gz of them)")


def _encoding_error(name: str, lineno: int, why: str, enc: str = "<enc>") -> PlmError:
    return PlmError(
        f"'{name}' is not UTF-8 text (line {lineno}: {why})",
        f"convert it first: iconv -f {enc} -t utf-8 '{name}' > converted.txt"
        + (" (<enc> is the file's encoding, e.g. latin1 or cp1252)" if enc == "<enc>" else ""),
    )


def _text_lines(name: str) -> Iterator[str]:
    """Decoded lines of one input, each ending in exactly one "\\n" (CRLF and a missing final newline fixed)."""
    checked = 0
    for lineno, raw in enumerate(_raw_lines(name), start=1):
        if checked < _PROBE_BYTES:  # files were probed up front; stdin can only be checked as it streams
            if b"\0" in raw[: _PROBE_BYTES - checked]:
                raise _binary_error(name)
            checked += len(raw)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _encoding_error(name, lineno, f"invalid byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line") from None
        if lineno == 1 and line.startswith("\ufeff"):
            line = line[1:]
        if line.endswith("\r\n"):
            line = line[:-2] + "\n"
        elif not line.endswith("\n"):
            line += "\n"
        yield line


def _documents(files: list[str], doc_per_line: bool) -> Iterator[str]:
    for name in files:
        doc: list[str] = []
        for line in _text_lines(name):
            if not line.strip():
                if doc:
                    yield "".join(doc)
                    doc = []
            elif doc_per_line:
                yield line
            else:
                doc.append(line)
        if doc:  # documents never span files
            yield "".join(doc)


def iter_documents(inputs: list[str], doc_per_line: bool = False) -> Iterator[str]:
    """Stream documents from text/.gz files, directories or '-' (stdin).

    Documents are separated by blank lines (or are single lines with `doc_per_line`); a document's text
    is its lines, each ending in "\\n".
    """
    seen = False
    for doc in _documents(_expand_inputs(inputs), doc_per_line):
        seen = True
        yield doc
    if not seen:
        raise PlmError("the input contains no text (every line is blank)", "check the input files")


def _split_lines(doc: str) -> list[str]:
    # Not str.splitlines: that also splits on \r, \x0b, \u2028 ... which are ordinary characters here.
    parts = doc.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


# ----------------------------------------------------------------------------- tokenizing


def _input_stats(files: list[str]) -> list[dict]:
    stats = []
    for name in files:
        if name == STDIN:
            stats.append({"path": STDIN, "size": None, "mtime": None})
        else:
            st = os.stat(name)
            stats.append({"path": str(Path(name).resolve()), "size": st.st_size, "mtime": st.st_mtime_ns})
    return stats


def _key(stats: list[dict], tok_cfg: TokenizerConfig, doc_per_line: bool, val_fraction: float) -> str:
    if any(s["path"] == STDIN for s in stats):
        return hashlib.sha256(uuid.uuid4().bytes).hexdigest()  # stdin is never cached
    tok = dataclasses.asdict(tok_cfg)
    if tok_cfg.path and Path(tok_cfg.path).is_file():  # the file's content matters, not its name
        tok["path"] = hashlib.sha256(Path(tok_cfg.path).read_bytes()).hexdigest()
    blob = json.dumps([stats, tok, doc_per_line, float(val_fraction), FORMAT, VERSION], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def corpus_key(inputs: list[str], tok_cfg: TokenizerConfig, doc_per_line: bool = False, val_fraction: float = 0.05) -> str:
    """Cache key of a tokenize run: inputs (paths, sizes, mtimes), tokenizer settings, split settings."""
    return _key(_input_stats(_expand_inputs(inputs)), tok_cfg, doc_per_line, val_fraction)


def _doc_rows(files: list[str], doc_per_line: bool) -> Iterator[dict]:
    for doc in iter_documents(files, doc_per_line):
        yield {"text": doc}


def _encode(batch: dict, tok) -> dict:
    lines, per_doc = [], []
    for doc in batch["text"]:
        doc_lines = _split_lines(doc)
        lines.extend(doc_lines)
        per_doc.append(len(doc_lines))
    # encode_batch, not encode_batch_fast: the fast path leaves word_ids empty, and whole-word masking needs them.
    encodings = iter(tok.encode_batch(lines, add_special_tokens=False))
    ids_out, starts_out, words_out = [], [], []
    for n in per_doc:
        ids: list[int] = []
        starts = []
        word_starts: list[bool] = []
        for _ in range(n):
            enc = next(encodings)
            starts.append(len(ids))
            ids.extend(enc.ids)
            # The pre-tokenizer's words, for whole-word masking with any tokenizer (no "##" assumption).
            w = enc.word_ids
            word_starts.extend(i == 0 or w[i] != w[i - 1] for i in range(len(w)))
        ids_out.append(ids)
        starts_out.append(starts)
        words_out.append(word_starts)
    return {"input_ids": ids_out, "sentence_starts": starts_out, "word_starts": words_out,
            "num_bytes": [len(doc.encode("utf-8")) for doc in batch["text"]]}


def _num_validation(n_docs: int, val_fraction: float) -> int:
    if val_fraction <= 0 or n_docs < 2:
        return 0
    return min(n_docs - 1, max(1, round(n_docs * val_fraction)))


def arrow_totals(ds, lengths: dict[str, str], sums: dict[str, str]) -> dict:
    """Streamed totals over a dataset: {name: Σ len(list column)} for `lengths`, {name: Σ column} for `sums`."""
    import pyarrow.compute as pc

    c = {k: 0 for k in list(lengths) + list(sums)}
    for tbl in ds.with_format("arrow").iter(batch_size=10_000):
        for k, col in lengths.items():
            c[k] += int(pc.sum(pc.list_value_length(tbl[col])).as_py() or 0)
        for k, col in sums.items():
            c[k] += int(pc.sum(tbl[col]).as_py() or 0)
    return c


def _counts(ds) -> dict:
    return {"documents": len(ds), **arrow_totals(ds, {"sentences": "sentence_starts", "tokens": "input_ids"},
                                                 {"bytes": "num_bytes"})}


def _build(tmp: Path, files: list[str], tok_cfg: TokenizerConfig, doc_per_line: bool,
           val_fraction: float, num_proc: int, key: str) -> dict:
    from datasets import DatasetDict, Dataset, Features, Sequence, Value

    cache = tmp / ".cache"
    given = load_tokenizer(tok_cfg.path) if tok_cfg.path else None  # fail before the long pass over the text
    # One pass over the inputs (stdin can be read only once); the text then lives in Arrow on disk.
    raw = Dataset.from_generator(
        _doc_rows, features=Features({"text": Value("large_string")}), cache_dir=str(cache),
        gen_kwargs={"files": files, "doc_per_line": doc_per_line}, fingerprint=f"raw-{key[:32]}",
    )

    if given is not None:
        tok = given
        specials = resolve_special_tokens(tok_cfg, add_unk=False)
        kind = tokenizer_kind(tok)
    else:
        lines = (line for batch in raw.iter(batch_size=256) for doc in batch["text"] for line in _split_lines(doc))
        tok = train_tokenizer(lines, tok_cfg)
        specials = resolve_special_tokens(tok_cfg)
        kind = tok_cfg.kind
    special_ids = special_token_ids(tok, specials)

    if num_proc > 1:  # forked workers would otherwise warn that rayon parallelism was already used
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    features = Features({"input_ids": Sequence(Value("int32")), "sentence_starts": Sequence(Value("int32")),
                         "word_starts": Sequence(Value("bool")), "num_bytes": Value("int64")})
    encoded = raw.map(_encode, batched=True, batch_size=1000, num_proc=num_proc if num_proc > 1 else None,
                      remove_columns=["text"], features=features, fn_kwargs={"tok": tok},
                      new_fingerprint=f"enc-{key[:32]}", desc="tokenizing")

    n = len(encoded)
    n_train = n - _num_validation(n, val_fraction)
    # select() rejects an empty range but takes an empty list
    splits = DatasetDict(train=encoded.select(range(n_train)),
                         validation=encoded.select(range(n_train, n) if n_train < n else []))
    # An empty split saved with the default sharding writes no .arrow file and cannot be loaded back.
    splits.save_to_disk(str(tmp / "dataset"), num_shards={k: 1 for k, ds in splits.items() if len(ds) == 0})
    counts = {name: _counts(ds) for name, ds in splits.items()}
    tok.save(str(tmp / "tokenizer.json"))

    meta = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": {**dataclasses.asdict(tok_cfg), "kind": kind, "hash": tokenizer_hash(tok),
                      "vocab_size": tok.get_vocab_size(), "special_tokens": specials,
                      "special_token_ids": special_ids},
        "inputs": _input_stats(files),
        "doc_per_line": doc_per_line,
        "val_fraction": val_fraction,
        "counts": counts,
        "key": key,
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    del raw, encoded, splits  # drop the memory maps before deleting the files under them
    shutil.rmtree(cache, ignore_errors=True)
    return meta


def tokenize_corpus(inputs: list[str], out_dir: str | Path, tok_cfg: TokenizerConfig, doc_per_line: bool = False,
                    val_fraction: float = 0.05, num_proc: int = 1, force: bool = False) -> dict:
    """Train (or load) a tokenizer and encode `inputs` into `out_dir`; returns the corpus meta.

    Reuses `out_dir` when it already holds this exact corpus (same key) unless `force`.
    """
    if not 0 <= val_fraction < 1:
        raise PlmError(f"val_fraction must be in [0, 1), got {val_fraction}", "use e.g. 0.05 (5% of documents)")
    if num_proc < 1:
        raise PlmError(f"num_proc must be at least 1, got {num_proc}", "use e.g. --num-proc 4")
    out_dir = Path(out_dir)
    files = _expand_inputs(inputs)
    key = _key(_input_stats(files), tok_cfg, doc_per_line, val_fraction)

    return build_atomically(out_dir, key, _read_meta,
                            lambda tmp: _build(tmp, files, tok_cfg, doc_per_line, val_fraction, num_proc, key), "plm tokenize", force)


# ----------------------------------------------------------------------------- using a corpus


def default_cache_dir() -> Path:
    """Where prepared corpora are cached: $PLM_CACHE, else ~/.cache/plm."""
    env = os.environ.get("PLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "plm"


def prepare_corpus(inputs, tok_cfg: TokenizerConfig, data_cfg: DataConfig, cache_root: str | Path | None = None) -> Path:
    """A corpus directory for `inputs`: a `plm tokenize` output as is, else text tokenized into the cache."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    inputs = [str(i) for i in inputs]
    if len(inputs) == 1 and inputs[0] != STDIN and Path(inputs[0]).is_dir():
        if _read_meta(Path(inputs[0])) or _is_derived_data(Path(inputs[0])):
            return Path(inputs[0])
    key = corpus_key(inputs, tok_cfg, data_cfg.doc_per_line, data_cfg.val_fraction)
    out = Path(cache_root) if cache_root is not None else default_cache_dir()
    out = out / "corpora" / key[:16]
    tokenize_corpus(inputs, out, tok_cfg, doc_per_line=data_cfg.doc_per_line,
                    val_fraction=data_cfg.val_fraction, num_proc=data_cfg.num_proc)
    return out


def _require_meta(corpus_dir: Path) -> dict:
    meta = _read_meta(corpus_dir)
    if meta is None:
        raise PlmError(f"'{corpus_dir}' is not a tokenized corpus (no plm meta.json)",
                       f"run `plm tokenize TEXT... --out {corpus_dir}` first")
    if meta.get("version") != VERSION:
        raise PlmError(f"'{corpus_dir}' was written by an incompatible plm (format version {meta.get('version')})",
                       "re-run `plm tokenize` on the original text")
    return meta


def load_corpus(corpus_dir: str | Path) -> tuple[DatasetDict, Tokenizer, dict]:
    """(DatasetDict with train/validation, Tokenizer, meta) of a `plm tokenize` output."""
    from datasets import load_from_disk

    corpus_dir = Path(corpus_dir)
    meta = _require_meta(corpus_dir)
    return load_from_disk(str(corpus_dir / "dataset")), load_tokenizer(corpus_dir / "tokenizer.json"), meta


def split_bytes(corpus_dir: str | Path, split: str) -> int:
    """UTF-8 bytes of text in `split` (the denominator of bits per byte)."""
    return int(_require_meta(Path(corpus_dir))["counts"][split]["bytes"])


def token_stream(corpus_dir: str | Path, split: str, sep_id: int | None) -> np.ndarray:
    """All tokens of `split` as one flat read-only array (memmap), `sep_id` after each document if given.

    Built once by streaming over the dataset and cached next to it as `{split}.{sep_id}.tokens.bin`.
    """
    meta = _require_meta(Path(corpus_dir))
    top = max(meta["tokenizer"]["vocab_size"], (sep_id or 0) + 1)
    dtype = np.uint16 if top <= 65536 else np.uint32
    return column_stream(corpus_dir, split, "input_ids", sep_id, dtype, f"{split}.{sep_id}.tokens.bin")


def column_stream(corpus_dir: str | Path, split: str, column: str, sep, dtype, filename: str) -> np.ndarray:
    """A list column of `split` flattened into one read-only memmap, `sep` after each document unless None.

    Streams the dataset in batches (memory flat in corpus size) into corpus_dir/filename once; a json
    sidecar, written last, marks the file complete.
    """
    from datasets import load_from_disk

    corpus_dir = Path(corpus_dir)
    meta = _require_meta(corpus_dir)
    if split not in meta["counts"]:
        raise PlmError(f"no split '{split}' in '{corpus_dir}'", f"use one of: {', '.join(meta['counts'])}")
    bin_path = corpus_dir / filename
    side_path = bin_path.with_suffix(".json")
    dtype = np.dtype(dtype)
    if not side_path.is_file():
        ds = load_from_disk(str(corpus_dir / "dataset" / split))
        length = 0
        fd, tmp = tempfile.mkstemp(prefix=f".{bin_path.name}.", dir=corpus_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                for tbl in ds.with_format("arrow").iter(batch_size=10_000):
                    col = tbl[column].combine_chunks()
                    values = col.flatten().to_numpy(zero_copy_only=False).astype(dtype)
                    if sep is not None:
                        offsets = col.offsets.to_numpy()
                        values = np.insert(values, offsets[1:] - offsets[0], sep)
                    f.write(values.tobytes())
                    length += len(values)
            os.replace(tmp, bin_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        side_tmp = side_path.with_name(f".{side_path.name}.{uuid.uuid4().hex[:8]}")
        side_tmp.write_text(json.dumps({"dtype": dtype.name, "length": length, "sep": None if sep is None else int(sep)}))
        os.replace(side_tmp, side_path)
    side = json.loads(side_path.read_text())
    if side["length"] == 0:  # numpy cannot memmap an empty file
        return np.zeros(0, dtype=side["dtype"])
    return np.memmap(bin_path, dtype=side["dtype"], mode="r", shape=(side["length"],))


def iter_text_lines(inputs: list[str]) -> Iterator[str]:
    """Every line of the inputs, validated and decoded as for tokenize (used by eval-ppl)."""
    for name in _expand_inputs(inputs):
        yield from _text_lines(name)
