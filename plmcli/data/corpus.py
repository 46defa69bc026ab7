"""Text files -> documents -> a tokenized Arrow corpus directory (`plm tokenize`), and readers for it.

A corpus directory holds `dataset/` (a DatasetDict with `train` and `validation`), `tokenizer.json` and
`meta.json`. It is built in a hidden temp directory and renamed into place, so a directory with a
`meta.json` is always complete. Memory stays flat in corpus size throughout: the text is read line by
line twice (tokenizer training, then encoding), big files in byte-range pieces that `--num-proc`
workers encode batch by batch into Arrow shards (data/text.py, data/shards.py), and the shards are
moved into the dataset rather than copied. Readers stream over memory-mapped Arrow batches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections import deque
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

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
from plmcli.data.store import (
    CORPUS_FORMAT,
    atomic_path,
    build_atomically,
    inputs_key,
    is_derived_data,
    read_meta,
    write_json,
    write_meta,
)
from plmcli.data.text import (
    STDIN,
    documents,
    expand_inputs,
    input_stats,
    range_documents,
    split_lines,
    spool_stdin,
    text_lines,
)
from plmcli.data.text import split_sentences as split_text_sentences
from plmcli.errors import PlmError

if TYPE_CHECKING:
    from datasets import DatasetDict
    from tokenizers import Tokenizer

FORMAT = CORPUS_FORMAT
VERSION = 3  # 2: word_starts column; 3: word_starts filled (encode_batch)
UNIT_BYTES = 64 << 20
"""A text file bigger than this is encoded in pieces of about this size, so `--num-proc` workers share it."""
ENCODE_BATCH_BYTES = 1 << 20
"""Text handed to the tokenizer at a time (up to 1000 documents): a worker's memory is about one batch."""
FIRST_BATCH_BYTES = 32 << 10
"""A unit's first (and, in a plain text file, last) batch: batches double from this to ENCODE_BATCH_BYTES."""
GIL_SWITCH_S = 0.0002
"""The interpreter's thread switch interval while a unit is encoded (Python's default is 5 ms)."""
BATCHES_AHEAD = 2
"""Batches handed to the tokenizer's thread before the oldest is read out."""


# ----------------------------------------------------------------------------- tokenizing


def read_corpus_meta(directory: Path) -> dict | None:
    """meta.json of a `plm tokenize` output directory, or None if `directory` is not one."""
    return read_meta(directory, FORMAT)


def _key(stats: list[dict], tok_cfg: TokenizerConfig, doc_per_line: bool, val_fraction: float,
         split_sentences: bool = False) -> str:
    settings = [doc_per_line, float(val_fraction), FORMAT, VERSION]
    if split_sentences:  # only when set, so corpora tokenized before the option keep their keys
        settings.append("split_sentences")
    return inputs_key(stats, tok_cfg, *settings)


def corpus_key(inputs: list[str], tok_cfg: TokenizerConfig, doc_per_line: bool = False, val_fraction: float = 0.05,
               split_sentences: bool = False, column: str = "text") -> str:
    """Cache key of a tokenize run: inputs (paths, sizes, mtimes; a table's column and split, a Hub
    dataset's name and config), tokenizer settings, split settings."""
    return _key(input_stats(expand_inputs(inputs, column)), tok_cfg, doc_per_line, val_fraction, split_sentences)


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


def _document_batches(unit: tuple, doc_per_line: bool):
    """The documents of `unit` (a _plan_units piece), in batches for the tokenizer.

    Batches start small and, where the text's size is known, end small: the tokenizer thread starts once a
    few kB are read instead of a whole batch, and the batch it encodes last leaves little for the other
    thread to finish alone. Between, big batches keep the per-batch costs (Arrow record batches, hand-offs
    between the threads) low."""
    name, start, end, unit_bytes = unit
    table = isinstance(name, tables.TableInput)
    left = None if table or name.endswith(".gz") else unit_bytes  # .gz: compressed bytes, not text
    batch, size, target = [], 0, FIRST_BATCH_BYTES
    docs = documents([name], doc_per_line) if table else range_documents(name, start, end, doc_per_line)
    for doc in docs:
        batch.append(doc)
        size += len(doc)  # characters: at most the bytes they take, so `left` never runs out early
        limit = target if left is None else max(FIRST_BATCH_BYTES, min(target, left // 2))
        if len(batch) >= 1000 or size >= limit:
            yield batch
            if left is not None:
                left -= size
            batch, size, target = [], 0, min(2 * target, ENCODE_BATCH_BYTES)
    if batch:
        yield batch


def _encoder(spec: tuple):
    """In each worker: unit -> batches of encoded documents (see shards.write_shards)."""
    tok, doc_per_line, split = spec  # in a worker process, a copy unpickled from the parent's

    def encode_batch(lines: list[str], spent: deque) -> list:
        # encode_batch, not encode_batch_fast: the fast path leaves word_ids empty, and whole-word
        # masking needs them.
        encodings = tok.encode_batch(lines, add_special_tokens=False)
        while spent:  # the batches this thread encoded before and the other one has read out
            spent.popleft().clear()
        return encodings

    def encode(unit):
        # A second thread runs only the tokenizer, whose Rust code releases the GIL: the work of a bare
        # encode_batch loop. This thread meanwhile reads and splits the next documents, reads the finished
        # encodings out and writes Arrow, so all of that stays off the tokenizer's path. Two batches are
        # queued ahead so the tokenizer never waits for this side. Results come back in order.
        # The encodings are freed on the tokenizer's thread too, as a bare loop frees its own: glibc locks the
        # arena that made them for each free, so frees from this thread contend with the tokenizer's own
        # allocations (it ran 17% slower that way, in one process). Short GIL switches let it take the GIL
        # back quickly for those frees and its results.
        from concurrent.futures import ThreadPoolExecutor

        spent: deque = deque()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_S)
        try:
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending: deque = deque()
                for docs in _document_batches(unit, doc_per_line):
                    lines, per_doc = _lines(docs, split)
                    pending.append((docs, per_doc, pool.submit(encode_batch, lines, spent)))
                    if len(pending) > BATCHES_AHEAD:
                        yield _read_out(pending.popleft(), spent)
                while pending:
                    yield _read_out(pending.popleft(), spent)
        finally:  # what is still in `spent` goes with this generator's frame
            sys.setswitchinterval(switch)

    return encode


def _read_out(item: tuple, spent: deque) -> dict:
    """The Arrow columns of one encoded batch; its encodings then go to `spent`, for the tokenizer's thread
    to free."""
    docs, per_doc, job = item
    encodings = job.result()
    columns = _columns(docs, per_doc, encodings)
    spent.append(encodings)
    return columns


def _totals(rb) -> dict:
    """Documents, sentences, tokens and bytes in one Arrow record batch of an encoded corpus."""
    import pyarrow.compute as pc

    def total(x):
        return int(pc.sum(x).as_py() or 0)

    return {"documents": rb.num_rows, "sentences": total(pc.list_value_length(rb["sentence_starts"])),
            "tokens": total(pc.list_value_length(rb["input_ids"])), "bytes": total(rb["num_bytes"])}


def _lines(docs: list[str], split_sentences: bool = False) -> tuple[list[str], list[int]]:
    """(the lines to encode, lines per document). A document's sentences are its lines, or with
    `split_sentences` the sentences within its lines."""
    lines, per_doc = [], []
    for doc in docs:
        doc_lines = split_lines(doc)
        if split_sentences:
            doc_lines = [piece for line in doc_lines for piece in split_text_sentences(line)]
        lines.extend(doc_lines)
        per_doc.append(len(doc_lines))
    return lines, per_doc


def _columns(docs: list[str], per_doc: list[int], encodings) -> dict:
    """The corpus' Arrow columns of `docs` from the encodings of their lines, built from flat arrays and
    offsets: no Python work per token."""
    import pyarrow as pa

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


def num_validation(n_docs: int, val_fraction: float) -> int:
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


def tokenizer_entry(tok_cfg: TokenizerConfig, lines, loaded: Tokenizer | None = None) -> tuple:
    """(tokenizer, its meta.json entry): `loaded` or loaded from tok_cfg.path, else trained on `lines()` (a
    stream of text)."""
    if tok_cfg.path:
        tok = loaded or load_tokenizer(tok_cfg.path)
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
        shards = list(write_shards(units, _encoder, (tok, doc_per_line, split_sentences), features, _totals,
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
    loaded = load_tokenizer(tok_cfg.path) if tok_cfg.path else None  # fail before the long pass over the text
    inputs = input_stats(files)
    files = spool_stdin(files, tmp)
    if not any(line.strip() for name in files for line in text_lines(name)):  # stops at the first text
        raise PlmError("the input contains no text (every line is blank)", "check the input files")
    # A dataset's own validation split is the validation set (then nothing else is held out).
    held_out = [f for f in files if isinstance(f, tables.TableInput) and f.split == "validation"]
    files = [f for f in files if not any(f is h for h in held_out)] + held_out
    tok, entry = tokenizer_entry(tok_cfg, lambda: (line for name in files for line in text_lines(name)), loaded)
    counts = encode_splits(tmp, _plan_units(files), tok, doc_per_line, num_proc, key,
                           lambda n: n - num_validation(n, val_fraction), split_sentences, len(held_out))
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / ".stdin.txt").unlink(missing_ok=True)
    meta = {"format": FORMAT, "version": VERSION, "tokenizer": entry, "inputs": inputs, "doc_per_line": doc_per_line,
            "split_sentences": split_sentences, "val_fraction": val_fraction, "counts": counts, "key": key}
    write_meta(tmp, meta)
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
    files = expand_inputs(inputs, column)
    key = _key(input_stats(files), tok_cfg, doc_per_line, val_fraction, split_sentences)

    return build_atomically(out_dir, key, read_corpus_meta,
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
        if read_corpus_meta(Path(inputs[0])) or is_derived_data(Path(inputs[0])):
            return Path(inputs[0])
    key = corpus_key(inputs, tok_cfg, data_cfg.doc_per_line, data_cfg.val_fraction, data_cfg.split_sentences,
                     data_cfg.text_column)
    out = Path(cache_root) if cache_root is not None else default_cache_dir()
    out = out / "corpora" / key[:16]
    tokenize_corpus(inputs, out, tok_cfg, doc_per_line=data_cfg.doc_per_line,
                    val_fraction=data_cfg.val_fraction, num_proc=data_cfg.num_proc,
                    split_sentences=data_cfg.split_sentences, column=data_cfg.text_column)
    return out


def require_meta(corpus_dir: Path) -> dict:
    """meta.json of a `plm tokenize` output of this plm's format version, else a one-line PlmError."""
    meta = read_corpus_meta(corpus_dir)
    if meta is None:
        raise PlmError(f"'{corpus_dir}' is not a tokenized corpus (no plm meta.json)",
                       f"run `plm tokenize TEXT... --out {corpus_dir}` first")
    if meta.get("version") != VERSION:
        raise PlmError(f"'{corpus_dir}' was written by an incompatible plm (format version {meta.get('version')})",
                       "re-run `plm tokenize` on the original text")
    return meta


def masked_lm_special_ids(meta: dict) -> dict[str, int]:
    """The corpus tokenizer's special token ids, which must include the [CLS], [SEP] and [MASK] that static
    masked-LM instances are built from, else a one-line PlmError."""
    special_ids = meta["tokenizer"].get("special_token_ids", {})
    missing = [r for r in ("cls", "sep", "mask") if r not in special_ids]
    if missing:
        raise PlmError(f"the corpus's tokenizer has no {'/'.join(missing)} token",
                       "re-run `plm tokenize` with --special-tokens 'cls=[CLS],sep=[SEP],mask=[MASK],pad=[PAD],unk=[UNK]'")
    return special_ids

def load_corpus(corpus_dir: str | Path) -> tuple[DatasetDict, Tokenizer, dict]:
    """(DatasetDict with train/validation, Tokenizer, meta) of a `plm tokenize` output."""
    from datasets import load_from_disk

    corpus_dir = Path(corpus_dir)
    meta = require_meta(corpus_dir)
    return load_from_disk(str(corpus_dir / "dataset")), load_tokenizer(corpus_dir / "tokenizer.json"), meta


def split_bytes(corpus_dir: str | Path, split: str) -> int:
    """UTF-8 bytes of text in `split` (the denominator of bits per byte)."""
    return int(require_meta(Path(corpus_dir))["counts"][split]["bytes"])


def token_stream(corpus_dir: str | Path, split: str, sep_id: int | None) -> np.ndarray:
    """All tokens of `split` as one flat read-only array (memmap), `sep_id` after each document if given.

    Built once by streaming over the dataset and cached next to it as `{split}.{sep_id}.tokens.bin`.
    """
    meta = require_meta(Path(corpus_dir))
    top = max(meta["tokenizer"]["vocab_size"], (sep_id or 0) + 1)
    dtype = np.uint16 if top <= 65536 else np.uint32
    return column_stream(corpus_dir, split, "input_ids", sep_id, dtype, f"{split}.{sep_id}.tokens.bin")


def column_stream(corpus_dir: str | Path, split: str, column: str, sep, dtype, filename: str) -> np.ndarray:
    """A list column of `split` flattened into one read-only memmap, `sep` after each document unless None.

    Streams the dataset in batches (memory flat in corpus size) into corpus_dir/filename once; a json
    sidecar, written last, marks the file complete.
    """
    corpus_dir = Path(corpus_dir)
    meta = require_meta(corpus_dir)
    if split == "train" and "streaming" in meta:
        raise PlmError(f"'{corpus_dir}' holds a corpus prepared for --streaming: its training text is read as it trains",
                       "add --streaming to `plm pretrain`, or tokenize the text with `plm tokenize`")
    if split not in meta["counts"]:
        raise PlmError(f"no split '{split}' in '{corpus_dir}'", f"use one of: {', '.join(meta['counts'])}")
    bin_path = corpus_dir / filename
    side_path = bin_path.with_suffix(".json")
    dtype = np.dtype(dtype)
    if not side_path.is_file():
        from datasets import load_from_disk  # only here: a built stream is read without datasets' seconds of import

        ds = load_from_disk(str(corpus_dir / "dataset" / split))
        length = 0
        with atomic_path(bin_path) as tmp, open(tmp, "wb") as f:
            for tbl in ds.with_format("arrow").iter(batch_size=10_000):
                col = tbl[column].combine_chunks()
                values = col.flatten().to_numpy(zero_copy_only=False).astype(dtype)
                if sep is not None:
                    offsets = col.offsets.to_numpy()
                    values = np.insert(values, offsets[1:] - offsets[0], sep)
                f.write(values.tobytes())
                length += len(values)
        write_json(side_path, {"dtype": dtype.name, "length": length, "sep": None if sep is None else int(sep)})
    side = json.loads(side_path.read_text())
    if side["length"] == 0:  # numpy cannot memmap an empty file
        return np.zeros(0, dtype=side["dtype"])
    return np.memmap(bin_path, dtype=side["dtype"], mode="r", shape=(side["length"],))


