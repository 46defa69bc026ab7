"""Text files -> documents -> a tokenized Arrow corpus directory (`plm tokenize`), and readers for it.

A corpus directory holds `dataset/` (a DatasetDict with `train` and `validation`), `tokenizer.json` and
`meta.json`. It is built in a hidden temp directory and renamed into place, so a directory with a
`meta.json` is always complete. Memory stays flat in corpus size throughout: the text is read line by
line twice (tokenizer training, then encoding), big files in byte-range pieces that `--num-proc`
workers encode batch by batch into Arrow shards (data/ranges.py, data/shards.py), and the shards are
moved into the dataset rather than copied. Readers stream over memory-mapped Arrow batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data import tables
from plmcli.data.tokenizers import (
    load_tokenizer,
    resolve_special_tokens,
    special_token_ids,
    tokenizer_hash,
    tokenizer_kind,
    train_tokenizer,
)
from plmcli.data.outdir import build_atomically
from plmcli.data.ranges import PROBE_BYTES, binary_error, decode_line, encoding_error, iter_lines, range_documents
from plmcli.data.sentences import split_sentences as split_text_sentences
from plmcli.errors import PlmError

if TYPE_CHECKING:
    from datasets import DatasetDict
    from tokenizers import Tokenizer

FORMAT = "plm-tokenized"
VERSION = 3  # 2: word_starts column; 3: word_starts filled (encode_batch)
STDIN = "-"
UNIT_BYTES = 64 << 20
"""A text file bigger than this is encoded in pieces of about this size, so `--num-proc` workers share it."""
ENCODE_BATCH_BYTES = 1 << 20
"""Text handed to the tokenizer at a time (up to 1000 documents): a worker's memory is about one batch."""


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


def _expand_inputs(inputs: list[str], column: str = "text", for_eval: bool = False) -> list[str]:
    """Input arguments -> what to read, in order: text files (directories walked recursively, sorted),
    '-', and the tables (data/tables.py) of data files, saved datasets and Hub names, read by `column`
    unless the argument carries its own (--text-column). `for_eval`: a DatasetDict gives its test split."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise PlmError("no input files given", "pass text files, directories, .gz files or '-' for stdin")
    files: list[str] = []
    for arg in inputs:
        if isinstance(arg, tables.TableInput):  # already resolved
            files.append(arg)
            continue
        col = arg.column if isinstance(arg, tables.ColumnRequest) else column
        arg = str(arg)
        if arg == STDIN:
            files.append(STDIN)
            continue
        p = Path(arg)
        if p.is_dir():
            if _read_meta(p) is not None:
                raise PlmError(f"'{p}' is already a `plm tokenize` output, not text",
                               "pass it to `plm pretrain --data` directly, or give the original text files")
            if tables.is_saved_dataset(p):
                files.extend(tables.resolve(arg, col, for_eval))
                continue
            found = []
            for root, dirs, names in os.walk(p):
                # Skip hidden entries and nested tokenize outputs (e.g. `--out` placed inside the input dir);
                # a saved dataset inside is read as one input.
                dirs[:] = [d for d in dirs if not d.startswith(".") and _read_meta(Path(root, d)) is None]
                found.extend(Path(root, d) for d in dirs if tables.is_saved_dataset(Path(root, d)))
                dirs[:] = [d for d in dirs if not tables.is_saved_dataset(Path(root, d))]
                found.extend(Path(root, n) for n in names if not n.startswith("."))
            if not found:
                raise PlmError(f"directory '{p}' holds no text files (hidden files are skipped)",
                               "pass a directory with text (or JSON Lines / CSV / Parquet) files, or the files themselves")
            for f in sorted(found, key=lambda f: f.relative_to(p).parts):
                files.extend(_file_input(str(f), col, for_eval))
        elif p.is_file():
            files.extend(_file_input(arg, col, for_eval))
        elif tables.looks_like_hub_name(arg):
            files.extend(tables.resolve(arg, col, for_eval))
        else:
            raise PlmError(f"input '{arg}' not found", "check the path (use '-' to read standard input)")
    return files


def _file_input(name: str, column: str, for_eval: bool) -> list[str]:
    """A file (or a saved dataset met in a directory walk): its tables when `datasets` reads it, else itself."""
    if Path(name).is_dir() or tables.builder_of(name):
        return tables.resolve(name, column, for_eval)
    return [name]


def _stdin_lines() -> Iterator[str]:
    """Standard input, decoded and checked as files are (it can only be read once, so it is checked as it streams)."""
    buf = getattr(sys.stdin, "buffer", None)
    # A text-only stdin (e.g. replaced by a StringIO) is already decoded; re-encode it line by line.
    raws = buf if buf is not None else (line.encode("utf-8") for line in sys.stdin)
    checked = 0
    for lineno, raw in enumerate(raws, start=1):
        if lineno == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise encoding_error(STDIN, "line 1", "it starts with a UTF-16 byte-order mark", "utf-16")
        if checked < PROBE_BYTES:
            if b"\0" in raw[: PROBE_BYTES - checked]:
                raise binary_error(STDIN)
            checked += len(raw)
        yield decode_line(raw, STDIN, f"line {lineno}", lineno == 1)


def _text_lines(name: str) -> Iterator[str]:
    """Decoded lines of one input, each ending in exactly one "\\n" (CRLF and a missing final newline fixed)."""
    if name == STDIN:
        yield from _stdin_lines()
    elif isinstance(name, tables.TableInput):
        yield from tables.lines(name)
    else:
        yield from (line for _, line in iter_lines(name))


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


def iter_documents(inputs: list[str], doc_per_line: bool = False, column: str = "text") -> Iterator[str]:
    """Stream documents from text/.gz files, directories, '-' (stdin) or `datasets` inputs (data/tables.py).

    Documents are separated by blank lines (or are single lines with `doc_per_line`); a document's text
    is its lines, each ending in "\\n". A table's rows are documents (its text column, `column`).
    """
    seen = False
    for doc in _documents(_expand_inputs(inputs, column), doc_per_line):
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
        if isinstance(name, tables.TableInput):
            stats.append(tables.stats(name))
        elif name == STDIN:
            stats.append({"path": STDIN, "size": None, "mtime": None})
        else:
            st = os.stat(name)
            stats.append({"path": str(Path(name).resolve()), "size": st.st_size, "mtime": st.st_mtime_ns})
    return stats


def _key(stats: list[dict], tok_cfg: TokenizerConfig, doc_per_line: bool, val_fraction: float,
         split_sentences: bool = False) -> str:
    if any(s.get("path") == STDIN for s in stats):
        return hashlib.sha256(uuid.uuid4().bytes).hexdigest()  # stdin is never cached
    tok = dataclasses.asdict(tok_cfg)
    if tok_cfg.path and Path(tok_cfg.path).is_file():  # the file's content matters, not its name
        tok["path"] = hashlib.sha256(Path(tok_cfg.path).read_bytes()).hexdigest()
    settings = [stats, tok, doc_per_line, float(val_fraction), FORMAT, VERSION]
    if split_sentences:  # only when set, so corpora tokenized before the option keep their keys
        settings.append("split_sentences")
    blob = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def corpus_key(inputs: list[str], tok_cfg: TokenizerConfig, doc_per_line: bool = False, val_fraction: float = 0.05,
               split_sentences: bool = False, column: str = "text") -> str:
    """Cache key of a tokenize run: inputs (paths, sizes, mtimes; a table's column and split, a Hub
    dataset's name and config), tokenizer settings, split settings."""
    return _key(_input_stats(_expand_inputs(inputs, column)), tok_cfg, doc_per_line, val_fraction, split_sentences)


def _spool_stdin(files: list[str], tmp: Path) -> list[str]:
    """stdin can be read only once and tokenize reads its inputs twice (tokenizer, then encoding): keep a copy."""
    if STDIN not in files:
        return files
    copy = tmp / ".stdin.txt"
    with open(copy, "w", encoding="utf-8") as f:
        f.writelines(_stdin_lines())
    return [str(copy) if name == STDIN else name for name in files]


def _plan_units(files: list[str]) -> list[tuple[str, int, int | None, int]]:
    """(file, start, end, bytes) pieces of about UNIT_BYTES; a .gz file is one piece (it cannot be entered midway)."""
    units = []
    for name in files:
        if isinstance(name, tables.TableInput):  # rows cannot be entered at a byte offset: one piece
            units.append((name, 0, None, tables.size(name)))
            continue
        size = os.path.getsize(name)
        n = 1 if name.endswith(".gz") else max(1, -(-size // UNIT_BYTES))
        bounds = [size * i // n for i in range(n + 1)]
        units += [(name, bounds[i], None if i == n - 1 else bounds[i + 1], bounds[i + 1] - bounds[i]) for i in range(n)]
    return units


def _encoder(spec: tuple):
    """In each worker: unit -> batches of encoded documents (see shards.write_shards)."""
    from tokenizers import Tokenizer

    tok_json, doc_per_line, split = spec
    tok = Tokenizer.from_str(tok_json)

    def batches(unit):
        name, start, end = unit[:3]
        batch, size = [], 0
        docs = _documents([name], doc_per_line) if isinstance(name, tables.TableInput) else \
            range_documents(name, start, end, doc_per_line)
        for doc in docs:
            batch.append(doc)
            size += len(doc)
            if len(batch) >= 1000 or size >= ENCODE_BATCH_BYTES:
                yield batch
                batch, size = [], 0
        if batch:
            yield batch

    def encode(unit):
        # One batch ahead on a second thread: the tokenizer's Rust code releases the GIL, so encoding batch
        # k+1 overlaps reading the text and writing Arrow for batch k. Results come back in order.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = None
            for batch in batches(unit):
                job = pool.submit(_encode, {"text": batch}, tok, split)
                if pending is not None:
                    yield pending.result()
                pending = job
            if pending is not None:
                yield pending.result()

    return encode


def _totals(rb) -> dict:
    """Documents, sentences, tokens and bytes in one Arrow record batch of an encoded corpus."""
    import pyarrow.compute as pc

    def total(x):
        return int(pc.sum(x).as_py() or 0)

    return {"documents": rb.num_rows, "sentences": total(pc.list_value_length(rb["sentence_starts"])),
            "tokens": total(pc.list_value_length(rb["input_ids"])), "bytes": total(rb["num_bytes"])}


def _encode(batch: dict, tok, split_sentences: bool = False) -> dict:
    """Documents -> the corpus' Arrow columns, built from flat arrays and offsets: no Python work per token.
    A document's sentences are its lines, or with `split_sentences` the sentences within its lines."""
    import pyarrow as pa

    docs = batch["text"]
    lines, per_doc = [], []
    for doc in docs:
        doc_lines = _split_lines(doc)
        if split_sentences:
            doc_lines = [piece for line in doc_lines for piece in split_text_sentences(line)]
        lines.extend(doc_lines)
        per_doc.append(len(doc_lines))
    # encode_batch, not encode_batch_fast: the fast path leaves word_ids empty, and whole-word masking needs them.
    encodings = tok.encode_batch(lines, add_special_tokens=False)
    line_at = _offsets(np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings)))
    doc_lines_at = _offsets(np.asarray(per_doc, dtype=np.int64))
    doc_at = line_at[doc_lines_at]
    ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=int(line_at[-1]))
    sentence_starts = line_at[:-1] - np.repeat(doc_at[:-1], per_doc)

    def lists(offsets, values):
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))

    return {"input_ids": lists(doc_at, ids), "sentence_starts": lists(doc_lines_at, sentence_starts.astype(np.int32)),
            "word_starts": lists(doc_at, _word_starts(encodings, line_at)),
            "num_bytes": pa.array([len(doc.encode("utf-8")) for doc in docs], type=pa.int64())}


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Lengths -> offsets, with a leading 0 and the total at the end."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _word_starts(encodings, line_at: np.ndarray) -> np.ndarray:
    """Whether each token starts a pre-tokenizer word (whole-word masking with any tokenizer, no "##"
    assumption): the first token of a line, or one whose word id differs from the token before it."""
    n = int(line_at[-1])
    # An added token (e.g. "<eos>" in the text) has word id None: as float it reads NaN, then -1, so two of
    # them in a row compare equal, as None == None does, and neither equals a word's id.
    words = np.fromiter(chain.from_iterable(e.word_ids for e in encodings), dtype=np.float64, count=n)
    words = np.nan_to_num(words, nan=-1.0)
    starts = np.ones(n, dtype=np.bool_)
    np.not_equal(words[1:], words[:-1], out=starts[1:])
    starts[line_at[:-1][line_at[1:] > line_at[:-1]]] = True
    return starts


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


def tokenizer_entry(tok_cfg: TokenizerConfig, lines) -> tuple:
    """(tokenizer, its meta.json entry): loaded from tok_cfg.path, else trained on `lines()` (a stream of text)."""
    if tok_cfg.path:
        tok = load_tokenizer(tok_cfg.path)
        specials = resolve_special_tokens(tok_cfg, add_unk=False)
        kind = tokenizer_kind(tok)
    else:
        tok = train_tokenizer(lines(), tok_cfg)
        specials = resolve_special_tokens(tok_cfg)
        kind = tok_cfg.kind
    ids = special_token_ids(tok, specials)
    return tok, {**dataclasses.asdict(tok_cfg), "kind": kind, "hash": tokenizer_hash(tok),
                 "vocab_size": tok.get_vocab_size(), "special_tokens": specials, "special_token_ids": ids}


def encode_splits(tmp: Path, units: list, tok, doc_per_line: bool, num_proc: int, key: str, n_train,
                  split_sentences: bool = False, held_out_units: int = 0) -> dict:
    """Encode the documents of `units` into tmp/dataset (train = the first n_train(n) of n documents, or
    with `held_out_units` the documents of all units but the last that many; validation the rest);
    returns the counts per split. Raises PlmError if `n_train` does."""
    from datasets import Features, Sequence, Value

    from plmcli.data.shards import file_splits, write_shards

    if num_proc > 1:  # forked workers would otherwise warn that rayon parallelism was already used
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    features = Features({"input_ids": Sequence(Value("int32")), "sentence_starts": Sequence(Value("int32")),
                         "word_starts": Sequence(Value("bool")), "num_bytes": Value("int64")})
    try:
        shards = list(write_shards(units, _encoder, (tok.to_str(), doc_per_line, split_sentences), features, _totals,
                                   tmp / ".shards", num_proc, [u[3] for u in units]))
        rows = [sh["rows"] for sh in shards]
        cut = sum(rows[: len(rows) - held_out_units]) if held_out_units else n_train(sum(rows))
        sums = file_splits(tmp / "dataset", shards, cut, features, _totals, key[:16])
    finally:
        shutil.rmtree(tmp / ".shards", ignore_errors=True)
    return {split: {k: sums[split].get(k, 0) for k in ("documents", "sentences", "tokens", "bytes")} for split in sums}


def _build(tmp: Path, files: list[str], tok_cfg: TokenizerConfig, doc_per_line: bool,
           val_fraction: float, num_proc: int, key: str, split_sentences: bool = False) -> dict:
    """Two streamed passes over the text: train the tokenizer, then encode `num_proc` pieces at a time.

    Memory stays flat in corpus size: the tokenizer trainer keeps counts of distinct words, each worker
    one batch of documents, and the Arrow shards it writes become the dataset without a copy.
    """
    if tok_cfg.path:
        load_tokenizer(tok_cfg.path)  # fail before the long pass over the text
    inputs = _input_stats(files)
    files = _spool_stdin(files, tmp)
    if not any(line.strip() for name in files for line in _text_lines(name)):  # stops at the first text
        raise PlmError("the input contains no text (every line is blank)", "check the input files")
    # A dataset's own validation split is the validation set (then nothing else is held out).
    held_out = [f for f in files if isinstance(f, tables.TableInput) and f.split == "validation"]
    files = [f for f in files if not any(f is h for h in held_out)] + held_out
    tok, entry = tokenizer_entry(tok_cfg, lambda: (line for name in files for line in _text_lines(name)))
    counts = encode_splits(tmp, _plan_units(files), tok, doc_per_line, num_proc, key,
                           lambda n: n - _num_validation(n, val_fraction), split_sentences, len(held_out))
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / ".stdin.txt").unlink(missing_ok=True)
    meta = {"format": FORMAT, "version": VERSION, "tokenizer": entry, "inputs": inputs, "doc_per_line": doc_per_line,
            "split_sentences": split_sentences, "val_fraction": val_fraction, "counts": counts, "key": key}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta


def tokenize_corpus(inputs: list[str], out_dir: str | Path, tok_cfg: TokenizerConfig, doc_per_line: bool = False,
                    val_fraction: float = 0.05, num_proc: int = 1, force: bool = False,
                    split_sentences: bool = False, column: str = "text") -> dict:
    """Train (or load) a tokenizer and encode `inputs` into `out_dir`; returns the corpus meta. Tables
    (data/tables.py) are read by their text `column`; one with a validation split keeps it as validation.

    Reuses `out_dir` when it already holds this exact corpus (same key) unless `force`.
    """
    if not 0 <= val_fraction < 1:
        raise PlmError(f"val_fraction must be in [0, 1), got {val_fraction}", "use e.g. 0.05 (5% of documents)")
    if num_proc < 1:
        raise PlmError(f"num_proc must be at least 1, got {num_proc}", "use e.g. --num-proc 4")
    out_dir = Path(out_dir)
    files = _expand_inputs(inputs, column)
    key = _key(_input_stats(files), tok_cfg, doc_per_line, val_fraction, split_sentences)

    return build_atomically(out_dir, key, _read_meta,
                            lambda tmp: _build(tmp, files, tok_cfg, doc_per_line, val_fraction, num_proc, key,
                                               split_sentences), "plm tokenize", force)


# ----------------------------------------------------------------------------- using a corpus


def default_cache_dir(check: bool = True) -> Path:
    """Where prepared corpora are cached: $PLM_CACHE, else ~/.cache/plm. With `check`, refused at once
    when a file cannot be created there: before any tokenizing, not at the first write after it."""
    env = os.environ.get("PLM_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "plm"
    if check:
        try:
            path.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()  # os.access misses read-only mounts for root
        except OSError as e:
            where = f"$PLM_CACHE ({path})" if env else f"the cache directory {path}"
            raise PlmError(f"cannot write {where}: {e.strerror or e}",
                           "export PLM_CACHE=<a writable directory> (prepared corpora are cached there)") from None
    return path


def prepare_corpus(inputs, tok_cfg: TokenizerConfig, data_cfg: DataConfig, cache_root: str | Path | None = None) -> Path:
    """A corpus directory for `inputs`: a `plm tokenize` output as is, else text tokenized into the cache."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    inputs = [i if isinstance(i, str) else str(i) for i in inputs]
    if len(inputs) == 1 and inputs[0] != STDIN and Path(inputs[0]).is_dir():
        if _read_meta(Path(inputs[0])) or _is_derived_data(Path(inputs[0])):
            return Path(inputs[0])
    key = corpus_key(inputs, tok_cfg, data_cfg.doc_per_line, data_cfg.val_fraction, data_cfg.split_sentences,
                     data_cfg.text_column)
    out = Path(cache_root) if cache_root is not None else default_cache_dir()
    out = out / "corpora" / key[:16]
    tokenize_corpus(inputs, out, tok_cfg, doc_per_line=data_cfg.doc_per_line,
                    val_fraction=data_cfg.val_fraction, num_proc=data_cfg.num_proc,
                    split_sentences=data_cfg.split_sentences, column=data_cfg.text_column)
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
    if split == "train" and "streaming" in meta:
        raise PlmError(f"'{corpus_dir}' holds a corpus prepared for --streaming: its training text is read as it trains",
                       "add --streaming to `plm pretrain`, or tokenize the text with `plm tokenize`")
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
    """Every line of the inputs, validated and decoded as for tokenize (used by eval-ppl); a DatasetDict
    is read from its test split (else validation), a table by the column its argument carries."""
    for name in _expand_inputs(inputs, for_eval=True):
        yield from _text_lines(name)
