"""`plm make-mlm-data`: static masked-LM instances with BERT's create_pretraining_data semantics.

The corpus (a `plm tokenize` output) is first flattened, per split, into memory-mapped arrays: all
tokens, their word starts, sentence start offsets and each document's first sentence. Every instance is
then two token ranges of those arrays (A and B), so building instances is a little Python per chunk of
sentences and everything per token — assembling [CLS] A [SEP] B [SEP], masking — is numpy over a whole
batch of instances at once (`masking.mask_batch`).

Work is cut into shards of whole documents (about SHARD_TOKENS tokens each) and one job per (dupe, shard),
each with its own random stream seeded by (seed, split, dupe, shard): the output is the same for any
`num_proc`. Runs of consecutive jobs stream straight into the Arrow files of a `datasets` save_to_disk
directory (one file per run, written by one worker), so memory stays flat and nothing is written twice.

Deviations from Google's script (each small, all on purpose):
- instances are not shuffled across the corpus (pretrain shuffles at load time);
- a random next segment is drawn from the other documents uniformly in one draw (not 10 tries);
- truncate_seq_pair's per-token coin flips are drawn as one binomial per side (same distribution);
- (the masking budget is Google's, [CLS]/[SEP] counted; --mask-count maskable counts the maskable tokens
  alone instead, plm's count before: a little fewer targets in short instances);
- SOP with a one-sentence chunk splits that sentence at a random word boundary instead of taking a
  random segment of another document (ALBERT's code), which keeps the label meaning "swapped";
- empty sentences/documents (lines that tokenize to nothing) are dropped.

Knowledge masking (ERNIE 1.0) first rewrites each document's word starts so that every lexicon match is
one unit (`masking.Lexicon.word_starts`) — or, with no lexicon, every phrase or entity that jieba's tagger
and a chunker find (`knowledge.AutoUnits`) —, then masks whole units; the rest works as for whole words.
"""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from plmcli.data.corpus import masked_lm_special_ids, require_meta
from plmcli.data.knowledge import AutoUnits, check_kind, units_key
from plmcli.config_schema import check_value
from plmcli.data.masking import Lexicon, check_ngram_probs, check_span, chinese_word_starts, lexicon_key, mask_batch, resolve_lexicon
from plmcli.data.masking_options import MaskingOptions, counted_lengths
from plmcli.data.mlm_instances import assemble, packed_instances, pair_instances
from plmcli.data.store import build_atomically, cache_key, read_meta, write_meta
from plmcli.errors import PlmError

FORMAT = "plm-mlm"
VERSION = 2  # 2: pair instances drawn chunk-vectorised (a new random stream)
PAIRS = ("nsp", "sop", "none")
MASKINGS = ("token", "wwm", "ngram", "ngram_per_word", "chinese-wwm", "span", "knowledge")
PACKINGS = ("full_sentences", "doc_sentences")
"""--pairs none: RoBERTa's FULL-SENTENCES (across documents, a separator between them) or DOC-SENTENCES."""
SHARD_TOKENS = 1 << 18
"""Tokens per unit of work (whole documents). Fixed, so the output does not depend on num_proc."""
BATCH = 1024
"""Instances masked together."""
FILE_JOBS = 8
"""Jobs per output Arrow file (at least): a unit of parallel work, about 2M input tokens."""
MAX_FILES = 256
"""Output files per split (at most, about): big corpora put more jobs in each file."""
_SPLITS = ("train", "validation")


def _features():
    from datasets import Features, Sequence, Value

    return Features({
        "input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
        "attention_mask": Sequence(Value("int8")), "masked_lm_positions": Sequence(Value("int32")),
        "masked_lm_labels": Sequence(Value("int32")), "next_sentence_label": Value("int8"),
    })


def _read_out_meta(directory: Path) -> dict | None:
    return read_meta(directory, FORMAT)


# ----------------------------------------------------------------------------- flattening the corpus


def _memmap(path: Path, dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # numpy cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)  # plain views index faster than np.memmap


class _Flat:
    """One split as flat arrays on disk: tokens, word starts, sentence starts (+ end), doc first sentences (+ end)."""

    def __init__(self, prefix: str):
        p = Path(prefix)
        self.tokens = _memmap(p.with_suffix(".tokens"), np.int32)
        self.ws = _memmap(p.with_suffix(".ws"), np.bool_)
        self.sent = _memmap(p.with_suffix(".sent"), np.int64)
        self.doc = _memmap(p.with_suffix(".doc"), np.int64)
        self.n_docs = max(len(self.doc) - 1, 0)


def _flatten(ds, prefix: Path) -> dict:
    """Write `ds` (documents) as _Flat arrays, dropping empty sentences and documents; returns counts."""
    import pyarrow.compute as pc

    n_tok = n_sent = n_docs = max_sents = 0
    files = {k: open(prefix.with_suffix("." + k), "wb") for k in ("tokens", "ws", "sent", "doc")}
    try:
        for tbl in ds.with_format("arrow").iter(batch_size=1000):
            ids = pc.list_flatten(tbl["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
            ws = pc.list_flatten(tbl["word_starts"]).to_numpy(zero_copy_only=False).astype(np.bool_)
            doc_len = pc.list_value_length(tbl["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int64)
            rel = pc.list_flatten(tbl["sentence_starts"]).to_numpy(zero_copy_only=False).astype(np.int64)
            per_doc = pc.list_value_length(tbl["sentence_starts"]).to_numpy(zero_copy_only=False).astype(np.int64)
            doc_start = np.cumsum(doc_len) - doc_len
            doc_of = np.repeat(np.arange(len(doc_len)), per_doc)
            start = rel + doc_start[doc_of]
            end = np.append(start[1:], 0)
            last = np.cumsum(per_doc) - 1
            end[last[per_doc > 0]] = (doc_start + doc_len)[per_doc > 0]
            keep = end > start
            start, doc_of = start[keep], doc_of[keep]
            kept = np.bincount(doc_of, minlength=len(doc_len))
            first = np.cumsum(kept) - kept
            files["tokens"].write(ids.tobytes())
            files["ws"].write(ws.tobytes())
            files["sent"].write((start + n_tok).tobytes())
            files["doc"].write((first[kept > 0] + n_sent).tobytes())
            n_tok += len(ids)
            n_sent += len(start)
            n_docs += int((kept > 0).sum())
            max_sents = max(max_sents, int(kept.max(initial=0)))
        files["sent"].write(np.array([n_tok], dtype=np.int64).tobytes())
        files["doc"].write(np.array([n_sent], dtype=np.int64).tobytes())
    finally:
        for f in files.values():
            f.close()
    return {"documents": n_docs, "sentences": n_sent, "tokens": n_tok, "max_sentences": max_sents}


def chinese_row_starts(ids, sentence_starts, word_starts, vocab: list[str]) -> np.ndarray:
    """One document's word starts with jieba's Chinese words joined (each sentence segmented on its own)."""
    ws = np.asarray(word_starts, dtype=bool).copy()
    bounds = list(sentence_starts) + [len(ids)]
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e > s:
            ws[s:e] &= chinese_word_starts([vocab[i] for i in ids[s:e]])
    return ws


def _chinese_batch(batch: dict, vocab: list[str]) -> dict:
    return {"word_starts": [chinese_row_starts(ids, starts, ws, vocab).tolist()
                            for ids, starts, ws in zip(batch["input_ids"], batch["sentence_starts"], batch["word_starts"])]}


def _knowledge_batch(batch: dict, lexicon: Lexicon, vocab: list[str] | None) -> dict:
    out = []
    for ids, starts, ws in zip(batch["input_ids"], batch["sentence_starts"], batch["word_starts"]):
        tokens = [vocab[i] for i in ids] if vocab is not None else None
        out.append(lexicon.word_starts(np.asarray(ids), ws, starts, tokens).tolist())
    return {"word_starts": out}


def knowledge_lexicon(corpus_dir: Path, lexicon, units: str | None = None) -> tuple[Lexicon | AutoUnits, list[str] | None]:
    """The lexicon encoded with the corpus's tokenizer, and the token strings for the jieba fallback
    (None with byte-level BPE, whose tokens are bytes: there the fallback units are its words).
    With no lexicon, `units` (phrases | entities): the units jieba's tagger finds (`knowledge.AutoUnits`)."""
    from plmcli.data.tokenizers import load_tokenizer

    if not lexicon:
        return AutoUnits(units), text_vocab(Path(corpus_dir), f"knowledge units found by the tagger ({units})")
    meta = require_meta(Path(corpus_dir))["tokenizer"]
    lex = Lexicon.load(lexicon, load_tokenizer(Path(corpus_dir) / "tokenizer.json"),
                       meta.get("special_token_ids", {}).get("unk"))
    kind = meta.get("kind", "")
    return lex, None if kind == "bytelevel-bpe" else text_vocab(Path(corpus_dir))


def text_vocab(corpus_dir: Path, what: str = "--masking chinese-wwm") -> list[str]:
    """Token id -> its text (for jieba), from the corpus's tokenizer; byte-level BPE is refused (`what` needs text)."""
    from plmcli.data.tokenizers import load_tokenizer

    kind = require_meta(Path(corpus_dir))["tokenizer"].get("kind", "")
    if kind == "bytelevel-bpe":
        raise PlmError(f"{what} needs a tokenizer whose tokens are text; byte-level BPE tokens are bytes",
                       "re-run `plm tokenize` with --tokenizer wordpiece (or char), as Chinese BERT does")
    vocab = load_tokenizer(corpus_dir / "tokenizer.json").get_vocab(with_added_tokens=True)
    words = [""] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        words[i] = tok.removesuffix("</w>").removeprefix("\u2581")  # bpe end-of-word, unigram word start
    return words


def masked_lm_columns(masked, target, original, lengths) -> tuple[np.ndarray, dict]:
    """(B, T) masked rows, their targets and original ids, (B,) real lengths -> (the rows' list offsets, the
    Arrow list columns every masked-LM instance table holds: input_ids, masked_lm_positions, masked_lm_labels)."""
    valid = np.arange(masked.shape[1])[None, :] < lengths[:, None]
    offsets = np.append(0, np.cumsum(lengths)).astype(np.int32)
    rows, cols = np.nonzero(target)
    pred_off = np.append(0, np.cumsum(np.bincount(rows, minlength=len(lengths)))).astype(np.int32)
    return offsets, {
        "input_ids": list_column(offsets, masked[valid].astype(np.int32, copy=False)),
        "masked_lm_positions": list_column(pred_off, cols.astype(np.int32)),
        "masked_lm_labels": list_column(pred_off, original[rows, cols].astype(np.int32, copy=False)),
    }


def list_column(offsets: np.ndarray, values: np.ndarray):
    """An Arrow list column from flat `values` cut at `offsets`."""
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _table(masked, target, original, types, lengths, labels):
    import pyarrow as pa

    offsets, lm = masked_lm_columns(masked, target, original, lengths)
    return pa.table({
        "input_ids": lm["input_ids"],
        "token_type_ids": list_column(offsets, types),
        "attention_mask": list_column(offsets, np.ones(int(offsets[-1]), dtype=np.int8)),
        "masked_lm_positions": lm["masked_lm_positions"],
        "masked_lm_labels": lm["masked_lm_labels"],
        "next_sentence_label": pa.array(labels.astype(np.int8)),
    })


def _job_table(job: tuple, cfg: dict):
    """One (split, dupe, shard, lo, hi) job: its instances, masked, as an Arrow table."""
    split, dupe, shard, lo, hi = job
    flat = _Flat(cfg["prefix"][split])
    rng = np.random.default_rng([cfg["seed"] & (2**64 - 1), _SPLITS.index(split), dupe, shard])
    paired = cfg["pairs"] != "none"
    inst = pair_instances(flat, lo, hi, rng, cfg) if paired else packed_instances(flat, lo, hi, cfg)
    ids, strategy = cfg["special_ids"], {"chinese-wwm": "wwm"}.get(cfg["masking"], cfg["masking"])
    random_ids = np.asarray(cfg["random_ids"])
    for k in range(0, len(inst[0]), BATCH):
        a_s, a_l, b_s, b_l, labels = (x[k: k + BATCH] for x in inst)
        tokens, special, ws, types, lengths = assemble(flat, a_s, a_l, b_s, b_l, paired, lo, hi, ids, strategy != "token")
        masked, target = mask_batch(
            tokens, special, None if strategy == "token" else ws, rng, mask_prob=cfg["mask_prob"],
            max_predictions=cfg["max_predictions"], strategy=strategy, mask_id=ids["mask"],
            vocab_size=cfg["vocab_size"], random_ids=random_ids, span_p=cfg.get("span_p", 0.2),
            span_max=cfg.get("span_max", 10), ngram_probs=tuple(cfg.get("ngram_probs", (0.4, 0.3, 0.2, 0.1))),
            ngram_start_prob=cfg.get("ngram_start_prob"), counted=counted_lengths(cfg["mask_count"], lengths))
        yield _table(masked, target, tokens, types, lengths, labels)


def _write_file(task: tuple) -> dict:
    """Run a group of jobs in order into one Arrow stream file (datasets' on-disk format); returns its counts."""
    import pyarrow as pa

    path, jobs, cfg = task
    counts = {"instances": 0, "tokens": 0, "predictions": 0, "positives": 0}
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, _features().arrow_schema) as writer:
        for job in jobs:
            for tbl in _job_table(job, cfg):
                writer.write_table(tbl)
                counts["instances"] += tbl.num_rows
                counts["tokens"] += len(tbl["input_ids"].combine_chunks().values)
                counts["predictions"] += len(tbl["masked_lm_positions"].combine_chunks().values)
                counts["positives"] += int(np.count_nonzero(tbl["next_sentence_label"].to_numpy() == 1))
    return counts


def _file_groups(n_jobs: int) -> list[range]:
    """Consecutive jobs per output file: at least FILE_JOBS, and at most about MAX_FILES files per split.
    A function of the job count alone, so the files (and the row order) do not depend on num_proc."""
    per = max(FILE_JOBS, -(-n_jobs // MAX_FILES))
    return [range(i, min(i + per, n_jobs)) for i in range(0, n_jobs, per)]


def _write_split(split_dir: Path, jobs: list, cfg: dict, pool, work: Path) -> dict:
    """The split as a `datasets` save_to_disk directory: our stream files, plus the state and info files
    that datasets itself writes for an empty dataset of the same features, pointed at those files."""
    from datasets import Dataset
    from datasets.utils.tqdm import tqdm

    groups = _file_groups(len(jobs)) or [range(0)]
    names = [f"data-{i:05d}-of-{len(groups):05d}.arrow" for i in range(len(groups))]
    split_dir.mkdir(parents=True)
    tasks = [(split_dir / name, [jobs[j] for j in g], cfg) for name, g in zip(names, groups)]
    results = pool.imap(_write_file, tasks) if pool is not None else map(_write_file, tasks)
    counts = {"instances": 0, "tokens": 0, "predictions": 0, "positives": 0}
    for c in tqdm(results, total=len(tasks), desc=f"make-mlm-data ({split_dir.name})", unit=" files"):
        counts = {k: counts[k] + c[k] for k in counts}
    empty = work / "empty"
    if not (empty / "state.json").is_file():
        Dataset.from_dict({k: [] for k in _features()}, features=_features()).save_to_disk(str(empty))
    state = json.loads((empty / "state.json").read_text(encoding="utf-8"))
    state["_data_files"] = [{"filename": name} for name in names]
    state["_fingerprint"] = f"{cfg['key'][:24]}-{split_dir.name}"
    (split_dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    shutil.copyfile(empty / "dataset_info.json", split_dir / "dataset_info.json")
    return counts


def _shards(flat: _Flat) -> list[tuple[int, int]]:
    """Document ranges of about SHARD_TOKENS tokens each (a document is never split)."""
    if flat.n_docs == 0:
        return []
    doc_tok = np.asarray(flat.sent[np.asarray(flat.doc)])  # token offset of each document, then the end
    cuts = np.searchsorted(doc_tok[:-1], np.arange(SHARD_TOKENS, int(doc_tok[-1]), SHARD_TOKENS))
    bounds = np.unique(np.concatenate([[0], cuts, [flat.n_docs]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


# ----------------------------------------------------------------------------- the command


def _check(max_seq_len, short_seq_prob, dupe_factor, mask_prob, max_predictions, pairs, masking, num_proc,
           span_p=0.2, span_max=10, lexicon=None, ngram_probs=(0.4, 0.3, 0.2, 0.1), knowledge_units=None,
           mask_count="reference", ngram_start_prob=None):
    if pairs not in PAIRS or masking not in MASKINGS:
        name, value, choices = ("--pairs", pairs, PAIRS) if pairs not in PAIRS else ("--masking", masking, MASKINGS)
        raise PlmError(f"unknown {name} '{value}'", f"use one of: {', '.join(choices)}")
    check_span(span_p, span_max, ("--span-p", "--span-max"))
    check_ngram_probs(ngram_probs, "--ngram-probs")
    check_value(MaskingOptions, "mask_count", mask_count, "--mask-count")
    check_value(MaskingOptions, "ngram_start_prob", ngram_start_prob, "--ngram-start-prob")
    if ngram_start_prob is not None and masking != "ngram_per_word":
        raise PlmError(f"--ngram-start-prob applies to --masking ngram_per_word, not {masking}",
                       "add --masking ngram_per_word, or drop --ngram-start-prob")
    if masking == "knowledge" and bool(lexicon) == bool(knowledge_units):
        raise PlmError("--masking knowledge needs --lexicon FILE (one phrase or entity per line) or --knowledge-units "
                       f"phrases|entities (found by jieba's tagger){', not both' if lexicon else ''}",
                       "e.g. --knowledge-units entities, or --lexicon chinese-sample-entities.txt (shipped)")
    for name, value in (("--lexicon", lexicon), ("--knowledge-units", knowledge_units)):
        if value and masking != "knowledge":
            raise PlmError(f"{name} applies to --masking knowledge, not {masking}", f"add --masking knowledge, or drop {name}")
    if knowledge_units:
        check_kind(knowledge_units, "--knowledge-units")
    problems = [
        (max_seq_len < 5, f"--max-seq-len {max_seq_len} is too short ([CLS] A [SEP] B [SEP] needs at least 5)",
         "--max-seq-len 128"),
        (not 0 < mask_prob < 1, f"--mask-prob {mask_prob} must be between 0 and 1", "--mask-prob 0.15"),
        (not 0 <= short_seq_prob <= 1, f"--short-seq-prob {short_seq_prob} must be in [0, 1]", "--short-seq-prob 0.1"),
        (dupe_factor < 1, f"--dupe-factor {dupe_factor} must be at least 1", "--dupe-factor 5"),
        (max_predictions < 0, f"--max-predictions {max_predictions} must be >= 0 (0 = no cap)", "--max-predictions 20"),
        (num_proc < 1, f"--num-proc {num_proc} must be at least 1", "--num-proc 4"),
    ]
    for bad, message, example in problems:
        if bad:
            raise PlmError(message, f"use e.g. {example}")


def _check_corpus(stats: dict, pairs: str) -> None:
    if stats["tokens"] == 0:
        raise PlmError("the corpus's train split has no tokens", "tokenize some text first with `plm tokenize`")
    if pairs == "nsp" and stats["documents"] < 2:
        raise PlmError("--pairs nsp needs at least 2 documents (random next segments come from other documents), "
                       "but the corpus has 1", "use --pairs sop or --pairs none, or tokenize more documents "
                       "(documents are separated by blank lines; --doc-per-line: one per line)")
    if pairs != "none" and stats["max_sentences"] < 2:
        raise PlmError(f"--pairs {pairs} needs documents with at least 2 sentences (lines), but every document "
                       "of the corpus has one", "use --pairs none, or tokenize with --split-sentences (pretrain: "
                       "--set data.split_sentences=true), or without --doc-per-line")


def make_mlm_data(corpus_dir, out_dir, *, max_seq_len: int = 128, short_seq_prob: float = 0.1, dupe_factor: int = 5,
                  mask_prob: float = 0.15, max_predictions: int = 20, pairs: str = "nsp", masking: str = "token",
                  seed: int = 12345, num_proc: int = 1, force: bool = False, span_p: float = 0.2, span_max: int = 10,
                  lexicon: str | None = None, ngram_probs=(0.4, 0.3, 0.2, 0.1), packing: str = "full_sentences",
                  knowledge_units: str | None = None, mask_count: str = "reference",
                  ngram_start_prob: float | None = None) -> dict:
    """Masked-LM instances from a `plm tokenize` directory into `out_dir`; returns the output's meta.

    `packing` (pairs none): full_sentences packs sentences across documents, doc_sentences keeps each
    instance inside one document (RoBERTa's FULL-SENTENCES / DOC-SENTENCES).

    `mask_count` and `ngram_start_prob`: masking_options.MaskingOptions.
    ngram_probs shapes masking "ngram"; span_p / span_max shape masking "span"; `lexicon` (a file, one phrase or entity per line) gives the
    units of masking "knowledge"; without one, `knowledge_units` (phrases | entities) has jieba's tagger find
    them (`knowledge.AutoUnits`). Reuses `out_dir` when it already holds this exact output (same corpus,
    settings and lexicon entries) unless `force`.
    """
    _check(max_seq_len, short_seq_prob, dupe_factor, mask_prob, max_predictions, pairs, masking, num_proc,
           span_p, span_max, lexicon, ngram_probs, knowledge_units, mask_count, ngram_start_prob)
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    cmeta = require_meta(corpus_dir)
    masked_lm_special_ids(cmeta)  # a corpus without [CLS]/[SEP]/[MASK] is refused before any work
    settings = dict(max_seq_len=max_seq_len, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                    mask_prob=mask_prob, max_predictions=max_predictions, pairs=pairs, masking=masking, seed=seed,
                    mask_count=mask_count)  # keyed whatever its value: data built with the older count is not reused
    if packing not in PACKINGS:
        raise PlmError(f"--packing '{packing}' is not one of {', '.join(PACKINGS)}", "use --packing full_sentences")
    if pairs == "none":
        settings["packing"] = packing
    elif packing == "doc_sentences":
        raise PlmError(f"--packing doc_sentences (--no-cross-documents) applies to --pairs none (RoBERTa's DOC-SENTENCES), "
                       f"not --pairs {pairs}", "add --pairs none, or drop it (NSP/SOP pairs stay within a document anyway)")
    # Settings a masking does not use stay out, so they neither show in meta.json nor change the cache key.
    if masking == "span":
        settings |= dict(span_p=span_p, span_max=span_max)
    if masking in ("ngram", "ngram_per_word"):
        settings |= dict(ngram_probs=[float(x) for x in ngram_probs])
    if masking == "ngram_per_word" and ngram_start_prob is not None:
        settings["ngram_start_prob"] = float(ngram_start_prob)
    if masking == "knowledge" and lexicon:
        settings |= dict(lexicon=str(resolve_lexicon(lexicon).resolve()), lexicon_key=lexicon_key(lexicon))
    elif masking == "knowledge":  # the tagger's version and the grammar count, so a changed grammar builds afresh
        settings |= dict(knowledge_units=knowledge_units, units_key=units_key(knowledge_units))
    keyed = {k: v for k, v in settings.items() if k != "lexicon"}  # the lexicon counts by content, not by path
    if "packing" in keyed:  # keyed by its older name, cross_documents, so outputs built before keep their key
        keyed["cross_documents"] = keyed.pop("packing") != "doc_sentences"
    key = cache_key(cmeta.get("key"), cmeta["tokenizer"].get("hash"), keyed, FORMAT, VERSION)

    return build_atomically(out_dir, key, _read_out_meta,
                            lambda tmp: _build(tmp, corpus_dir, cmeta, settings, num_proc, key), "plm make-mlm-data", force)


def _fork_context():
    import multiprocessing as mp

    # fork where there is one: workers inherit the imports and the memory-mapped corpus instead of loading them again.
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def _build(tmp: Path, corpus_dir: Path, cmeta: dict, settings: dict, num_proc: int, key: str) -> dict:
    from datasets import load_from_disk

    work = tmp / ".work"
    work.mkdir()
    source = load_from_disk(str(corpus_dir / "dataset"))
    tok_meta = cmeta["tokenizer"]
    masking = settings["masking"]
    vocab = text_vocab(corpus_dir) if masking == "chinese-wwm" else None
    lexicon = knowledge_lexicon(corpus_dir, settings.get("lexicon"), settings.get("knowledge_units")) if masking == "knowledge" else None

    stats, prefix = {}, {}
    for split in _SPLITS:
        ds = source[split] if split in source else source["train"].select([])
        prefix[split] = str(work / split)
        if vocab is not None and len(ds):
            ds = ds.map(_chinese_batch, batched=True, batch_size=200, fn_kwargs={"vocab": vocab},
                        num_proc=num_proc if num_proc > 1 and len(ds) > 1 else None,
                        cache_file_name=str(work / f"{split}.cws.arrow"), new_fingerprint=f"cws-{key[:24]}-{split}",
                        desc="jieba word segmentation")
        if lexicon is not None and len(ds):
            ds = ds.map(_knowledge_batch, batched=True, batch_size=200, fn_kwargs={"lexicon": lexicon[0], "vocab": lexicon[1]},
                        num_proc=num_proc if num_proc > 1 and len(ds) > 1 else None,
                        cache_file_name=str(work / f"{split}.units.arrow"), new_fingerprint=f"units-{key[:24]}-{split}",
                        desc="knowledge units")
        stats[split] = _flatten(ds, work / split)
    _check_corpus(stats["train"], settings["pairs"])

    special = set(tok_meta["special_token_ids"].values())
    vocab_size = int(tok_meta["vocab_size"])
    # packed_instances reads the packing as cross_documents (false: DOC-SENTENCES)
    cfg = {**settings, "cross_documents": settings.get("packing") != "doc_sentences",
           "prefix": prefix, "special_ids": tok_meta["special_token_ids"], "vocab_size": vocab_size,
           "random_ids": [i for i in range(vocab_size) if i not in special], "key": key}
    positive = {"nsp": "random_next", "sop": "swapped"}.get(settings["pairs"])
    counts = {}
    ctx = _fork_context()
    with (ctx.Pool(num_proc) if num_proc > 1 else nullcontext()) as pool:
        for split in _SPLITS:
            shards = _shards(_Flat(prefix[split]))
            dupes = settings["dupe_factor"] if split == "train" else 1
            jobs = [(split, d, s, lo, hi) for d in range(dupes) for s, (lo, hi) in enumerate(shards)]
            c = _write_split(tmp / "dataset" / split, jobs, cfg, pool, work)
            positives = c.pop("positives")
            counts[split] = {"documents": stats[split]["documents"], **c, **({positive: positives} if positive else {})}
    (tmp / "dataset" / "dataset_dict.json").write_text(json.dumps({"splits": list(_SPLITS)}), encoding="utf-8")
    shutil.copyfile(corpus_dir / "tokenizer.json", tmp / "tokenizer.json")
    meta = {"format": FORMAT, "version": VERSION, **settings, "source": cmeta.get("key"),
            "corpus": str(corpus_dir.resolve()), "counts": counts, "tokenizer": tok_meta, "key": key}
    write_meta(tmp, meta)
    del source
    shutil.rmtree(work, ignore_errors=True)
    return meta
