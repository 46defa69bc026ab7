"""Parallel text (`source<TAB>target` per line) -> a tokenized Arrow directory for translation.

Input is read as `plm tokenize` reads text (files, directories, .gz, '-' for stdin; UTF-8 checked):
blank lines are skipped, further tab-separated columns (the attribution column of Tatoeba/Anki files)
are ignored, and a line with no tab is an error that names the file and line. One tokenizer is
trained on both sides (a shared vocabulary, as the Transformer's shared embeddings need). The output
directory holds `dataset/` (a DatasetDict: train, validation = the last data.val_fraction of the
pairs; columns src_ids, tgt_ids), `tokenizer.json` and `meta.json` (format "plm-parallel"). It is
built in a temp directory and renamed into place, and cached under a key over the inputs and settings.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Iterator

from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.corpus import arrow_totals, default_cache_dir, num_validation, read_corpus_meta
from plmcli.data.store import build_atomically, inputs_key, is_derived_data, read_meta, write_meta
from plmcli.data.text import STDIN, expand_inputs, input_stats, text_lines
from plmcli.data.tokenizers import (
    load_tokenizer,
    resolve_special_tokens,
    special_token_ids,
    tokenizer_hash,
    tokenizer_kind,
    train_tokenizer,
)
from plmcli.errors import PlmError

FORMAT = "plm-parallel"
VERSION = 1
REQUIRED_ROLES = ("pad", "eos")
"""A translation batch pads, and every source and target ends in eos; the decoder starts from bos
(eos when the tokenizer has no bos)."""


def split_pair(line: str, name: str, lineno: int) -> tuple[str, str]:
    """One `source<TAB>target` line -> (source, target); PlmError naming the file and line otherwise."""
    text = line.rstrip("\n")
    if "\t" not in text:
        raise PlmError(f"'{name}' line {lineno} has no tab: parallel text needs source<TAB>target on every line",
                       "separate source and target with one tab character (e.g. `paste src.txt tgt.txt > pairs.tsv`)")
    src, tgt = text.split("\t", 2)[:2]
    if not src.strip() or not tgt.strip():
        side = "source" if not src.strip() else "target"
        raise PlmError(f"'{name}' line {lineno} has an empty {side}", "remove the line or fill in both sides")
    return src.strip(), tgt.strip()


def iter_pairs(inputs) -> Iterator[tuple[str, str]]:
    """(source, target) of every non-blank line of the inputs, in order."""
    seen = False
    for name in expand_inputs(inputs):
        for lineno, line in enumerate(text_lines(name), start=1):
            if line.strip():
                seen = True
                yield split_pair(line, name, lineno)
    if not seen:
        raise PlmError("the parallel input contains no text (every line is blank)", "check the input files")


def read_parallel_meta(directory) -> dict | None:
    """meta.json of a parallel-corpus directory, or None if `directory` is not one."""
    return read_meta(directory, FORMAT)


def _key(files: list[str], tok_cfg: TokenizerConfig, val_fraction: float) -> str:
    return inputs_key(input_stats(files), tok_cfg, float(val_fraction), FORMAT, VERSION)


def _check_roles(specials: dict[str, str]) -> None:
    missing = [r for r in REQUIRED_ROLES if r not in specials]
    if missing:
        raise PlmError(f"translation needs special tokens for {', '.join(missing)}, and the tokenizer settings have none",
                       "add e.g. tokenizer.special_tokens: {pad: <pad>, bos: <s>, eos: </s>, unk: <unk>, mask: <mask>}")


def _rows(files: list[str]) -> Iterator[dict]:
    for src, tgt in iter_pairs(files):
        yield {"src": src, "tgt": tgt}


def _encode(batch: dict, tok) -> dict:
    src = tok.encode_batch(batch["src"], add_special_tokens=False)
    tgt = tok.encode_batch(batch["tgt"], add_special_tokens=False)
    return {"src_ids": [e.ids for e in src], "tgt_ids": [e.ids for e in tgt],
            "tgt_bytes": [len(t.encode("utf-8")) for t in batch["tgt"]]}


def _counts(ds) -> dict:
    return {"examples": len(ds), **arrow_totals(ds, {"src_tokens": "src_ids", "tgt_tokens": "tgt_ids"},
                                                {"tgt_bytes": "tgt_bytes"})}


def _build(tmp: Path, files: list[str], tok_cfg: TokenizerConfig, val_fraction: float, num_proc: int, key: str) -> dict:
    from datasets import Dataset, DatasetDict, Features, Sequence, Value

    given = load_tokenizer(tok_cfg.path) if tok_cfg.path else None  # fail before the long pass over the text
    specials = resolve_special_tokens(tok_cfg, add_unk=given is None)
    _check_roles(specials)
    cache = tmp / ".cache"
    raw = Dataset.from_generator(_rows, features=Features({"src": Value("large_string"), "tgt": Value("large_string")}),
                                 cache_dir=str(cache), gen_kwargs={"files": files}, fingerprint=f"pairs-{key[:32]}")
    if given is not None:
        tok, kind = given, tokenizer_kind(given)
    else:
        both = (text for batch in raw.iter(batch_size=256) for side in ("src", "tgt") for text in batch[side])
        tok, kind = train_tokenizer(both, tok_cfg), tok_cfg.kind
    ids = special_token_ids(tok, specials)

    features = Features({"src_ids": Sequence(Value("int32")), "tgt_ids": Sequence(Value("int32")),
                         "tgt_bytes": Value("int64")})
    encoded = raw.map(_encode, batched=True, batch_size=1000, num_proc=num_proc if num_proc > 1 else None,
                      remove_columns=["src", "tgt"], features=features, fn_kwargs={"tok": tok},
                      new_fingerprint=f"penc-{key[:32]}", desc="tokenizing pairs")
    n = len(encoded)
    n_train = n - num_validation(n, val_fraction)
    splits = DatasetDict(train=encoded.select(range(n_train)),
                         validation=encoded.select(range(n_train, n) if n_train < n else []))
    splits.save_to_disk(str(tmp / "dataset"), num_shards={k: 1 for k, ds in splits.items() if len(ds) == 0})
    tok.save(str(tmp / "tokenizer.json"))
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": {**dataclasses.asdict(tok_cfg), "kind": kind, "hash": tokenizer_hash(tok),
                      "vocab_size": tok.get_vocab_size(), "special_tokens": specials, "special_token_ids": ids},
        "inputs": input_stats(files),
        "val_fraction": val_fraction,
        "counts": {name: _counts(ds) for name, ds in splits.items()},
        "key": key,
    }
    write_meta(tmp, meta)
    del raw, encoded, splits  # drop the memory maps before deleting the files under them
    shutil.rmtree(cache, ignore_errors=True)
    return meta


def tokenize_parallel(inputs, out_dir, tok_cfg: TokenizerConfig, val_fraction: float = 0.05, num_proc: int = 1,
                      force: bool = False) -> dict:
    """Train (or load) a shared tokenizer and encode parallel text into `out_dir`; returns its meta.

    Reuses `out_dir` when it already holds this exact corpus (same key) unless `force`.
    """
    if not 0 <= val_fraction < 1:
        raise PlmError(f"val_fraction must be in [0, 1), got {val_fraction}", "use e.g. 0.05 (5% of the pairs)")
    files = expand_inputs(inputs)
    key = _key(files, tok_cfg, val_fraction)
    return build_atomically(Path(out_dir), key, read_parallel_meta,
                            lambda tmp: _build(tmp, files, tok_cfg, val_fraction, num_proc, key), "parallel corpus", force)


def prepare_parallel(inputs, tok_cfg: TokenizerConfig, data_cfg: DataConfig, cache_root=None) -> Path:
    """A parallel-corpus directory for `inputs`: one as is, else parallel text tokenized into the cache."""
    inputs = [str(i) for i in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if len(inputs) == 1 and inputs[0] != STDIN and Path(inputs[0]).is_dir():
        d = Path(inputs[0])
        if read_parallel_meta(d) is not None:
            return d
        if read_corpus_meta(d) is not None or is_derived_data(d):
            raise PlmError(f"'{d}' holds tokenized documents, not parallel text",
                           "pass the source<TAB>target text files, or train on documents with --set objective.name=denoising")
    files = expand_inputs(inputs)
    key = _key(files, tok_cfg, data_cfg.val_fraction)
    out = Path(cache_root) if cache_root is not None else default_cache_dir()
    out = out / "parallel" / key[:16]
    tokenize_parallel(inputs, out, tok_cfg, val_fraction=data_cfg.val_fraction, num_proc=data_cfg.num_proc)
    return out


def load_split(directory, split: str):
    """One split of a parallel-corpus directory as an Arrow-formatted Dataset."""
    from datasets import load_from_disk

    meta = read_parallel_meta(directory)
    if meta is None:
        raise PlmError(f"'{directory}' is not a parallel corpus (no plm-parallel meta.json)",
                       "give translation runs source<TAB>target text; plm tokenizes and caches it")
    if meta.get("version") != VERSION:
        raise PlmError(f"'{directory}' was written by an incompatible plm (parallel format version {meta.get('version')})",
                       "delete it (or the cache) and let plm rebuild it from the text")
    if split not in meta["counts"]:
        raise PlmError(f"no split '{split}' in '{directory}'", f"use one of: {', '.join(meta['counts'])}")
    return load_from_disk(str(Path(directory) / "dataset" / split)).with_format("arrow")
