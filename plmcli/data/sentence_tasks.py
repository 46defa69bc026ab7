"""ERNIE 2.0's structure-aware tasks (Sun et al. 2019, §4.2.2) as static masked instances.

Sentence reordering: "a given paragraph is randomly split into 1 to m segments and then all of the
combinations are shuffled by a random permuted order"; the model names the permutation among
k = Σ_{n=1}^{m} n! classes. Sentence distance: a 3-class task, "0" the two sentences are adjacent in
one document, "1" both in one document but not adjacent, "2" from two different documents.

Each instance serves one task, drawn per instance: reordering with probability `reorder_prob`, else
distance (the paper trains its tasks continually in one multi-task loop; one task per row keeps both
task inputs as the paper describes them).
- reordering: a paragraph (consecutive whole sentences of one document, up to max_seq_len − 1 − m tokens;
  a shorter target with short_seq_prob, as BERT's; a longer first sentence is cut) is split into n
  segments, n uniform in 1..m — at sentence boundaries where it has at least n sentences, else at word
  starts — and shown shuffled: [CLS] s_π0 [SEP] s_π1 [SEP] ..., segment ids alternating 0, 1, 0 by the
  shown position. Segment k shown is original segment π[k]; the label is π's index in `permutations(m)`.
- distance: [CLS] A [SEP] B [SEP] (segment ids 0 / 1), A one sentence, B the sentence right after A (0),
  a sentence of A's document at least two sentences away (1), or a sentence of another document (2),
  uniform among the classes the document allows; a sentence that allows none (a one-sentence document
  in a one-document corpus) is left out. The longer side is cut at its end to fit.
Every row is then masked as make-mlm-data masks (`masking.mask_batch`), for the MLM loss on the same row.
Instances are built in one process, one random stream per (seed, split, dupe): a corpus the size of a
sample takes seconds; make-mlm-data's sharded parallel build is the model for a large one.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from plmcli.data.corpus import masked_lm_special_ids, require_meta
from plmcli.data.masking import check_ngram_probs, check_span, lexicon_key, mask_batch, resolve_lexicon
from plmcli.data.store import build_atomically, cache_key, read_meta, write_meta
from plmcli.errors import PlmError

FORMAT = "plm-ernie2"
VERSION = 1
MAX_SEGMENTS = 5
"""m at most: 153 permutation classes (m = 6 would be 873, more classes than a paragraph has tokens)."""
MASKINGS = ("token", "wwm", "ngram", "ngram_per_word", "chinese-wwm", "span", "knowledge")
DISTANCE = ("adjacent", "same_document", "other_document")
BATCH = 1024
"""Instances masked together."""
_SPLITS = ("train", "validation")


# ----------------------------------------------------------------------------- permutation classes


def permutations(m: int) -> list[tuple[int, ...]]:
    """Every permutation of n = 1..m segments, n ascending, each n's in lexicographic order: class c is
    permutations(m)[c] (m = 3: (0), (0 1), (1 0), (0 1 2), (0 2 1), (1 0 2), (1 2 0), (2 0 1), (2 1 0))."""
    return [p for n in range(1, m + 1) for p in itertools.permutations(range(n))]


def num_classes(m: int) -> int:
    """k = Σ_{n=1}^{m} n!, the reordering classes of up to m segments."""
    return sum(math.factorial(n) for n in range(1, m + 1))


def permutation_class(perm) -> int:
    """The class of a permutation of range(n): the n! classes of n segments follow those of fewer."""
    n = len(perm)
    rank, rest = 0, list(range(n))
    for i, p in enumerate(perm):  # lexicographic rank (Lehmer code)
        j = rest.index(int(p))
        rank += j * math.factorial(n - 1 - i)
        rest.pop(j)
    return num_classes(n - 1) + rank


# ----------------------------------------------------------------------------- a split as flat arrays


class Split(NamedTuple):
    """One split: all tokens, their word (masking unit) starts, each non-empty sentence's start offset
    (then the end), and each document's first sentence (then the sentence count)."""

    tokens: np.ndarray
    ws: np.ndarray
    sent: np.ndarray
    doc: np.ndarray

    @property
    def n_docs(self) -> int:
        return len(self.doc) - 1


def flatten(rows) -> Split:
    """(ids, sentence_starts, word_starts) per document -> a Split, empty sentences and documents dropped."""
    tokens, ws, sent, doc, n_tok = [], [], [], [0], 0
    for ids, starts, w in rows:
        ids = np.asarray(ids, dtype=np.int32)
        b = np.append(np.asarray(starts, dtype=np.int64), len(ids))
        s = b[:-1][b[1:] > b[:-1]]
        if not len(s):
            continue
        # Tokens before a document's first sentence start (none in `plm tokenize` output) join no sentence.
        tokens.append(ids[s[0]:])
        ws.append(np.asarray(w, dtype=bool)[s[0]:])
        sent.append(s - s[0] + n_tok)
        n_tok += len(ids) - int(s[0])
        doc.append(doc[-1] + len(s))
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dtype=dt)  # noqa: E731
    return Split(cat(tokens, np.int32), cat(ws, bool), np.append(cat(sent, np.int64), n_tok),
                 np.asarray(doc, dtype=np.int64))


# ----------------------------------------------------------------------------- instances


class Instance(NamedTuple):
    segments: list
    """(start, end) token ranges of the split, in the order the row shows them."""
    reorder_label: int
    """The permutation class (reordering instances), else -1."""
    distance_label: int
    """0 adjacent, 1 same document, 2 other document (distance instances), else -1."""


def instances(split: Split, rng: np.random.Generator, cfg: dict) -> list[Instance]:
    """One pass of both tasks over the split's documents (see the module doc)."""
    out = []
    doc = split.doc
    for d in range(split.n_docs):
        s0, s1 = int(doc[d]), int(doc[d + 1])
        i = s0
        while i < s1:
            if rng.random() < cfg["reorder_prob"]:
                inst, i = _reorder(split, i, s1, rng, cfg)
            else:
                inst, i = _distance(split, d, i, rng, cfg["max_seq_len"] - 3), i + 1
            if inst is not None:
                out.append(inst)
    return out


def _reorder(split: Split, i: int, s1: int, rng, cfg: dict) -> tuple[Instance, int]:
    """A paragraph from sentence i on, split and shuffled; returns it and the sentence after it."""
    m, sent = cfg["reorder_segments"], split.sent
    cap = cfg["max_seq_len"] - 1 - m  # [CLS] and a [SEP] after each of up to m segments
    target = cap if rng.random() >= cfg["short_seq_prob"] else int(rng.integers(2, cap + 1))
    j = i + 1
    while j < s1 and sent[j + 1] - sent[i] <= target:
        j += 1
    start, end = int(sent[i]), min(int(sent[j]), int(sent[i]) + target)
    n = int(rng.integers(1, m + 1))
    if j - i >= n:  # cut at n - 1 of the paragraph's inner sentence boundaries
        cuts = sent[i + 1 + np.sort(rng.choice(j - i - 1, n - 1, replace=False))]
    else:  # fewer sentences than segments: cut at word starts (any token when too few words)
        cand = start + 1 + np.flatnonzero(split.ws[start + 1:end])
        if len(cand) < n - 1:
            cand = np.arange(start + 1, end)
        n = min(n, len(cand) + 1)
        cuts = np.sort(rng.choice(cand, n - 1, replace=False))
    bounds = [start, *(int(c) for c in cuts), end]
    segs = list(zip(bounds[:-1], bounds[1:]))
    perm = rng.permutation(n)
    return Instance([segs[p] for p in perm], permutation_class(perm), -1), j


def _distance(split: Split, d: int, i: int, rng, cap: int) -> Instance | None:
    """Sentence i of document d and a partner at one of the distances its document allows."""
    s0, s1 = int(split.doc[d]), int(split.doc[d + 1])
    before, after = max(i - 1 - s0, 0), max(s1 - i - 2, 0)  # sentences at least two away, each side
    allowed = [c for c, ok in enumerate((i + 1 < s1, before + after > 0, split.n_docs > 1)) if ok]
    if not allowed:
        return None
    label = allowed[int(rng.integers(len(allowed)))]
    if label == 0:
        b = i + 1
    elif label == 1:
        r = int(rng.integers(before + after))
        b = s0 + r if r < before else i + 2 + (r - before)
    else:
        e = int(rng.integers(split.n_docs - 1))
        e += e >= d
        b = int(split.doc[e]) + int(rng.integers(split.doc[e + 1] - split.doc[e]))
    (a_s, a_e), (b_s, b_e) = ((int(split.sent[k]), int(split.sent[k + 1])) for k in (i, b))
    la, lb = truncated(a_e - a_s, b_e - b_s, cap)
    return Instance([(a_s, a_s + la), (b_s, b_s + lb)], -1, label)


def truncated(la: int, lb: int, cap: int) -> tuple[int, int]:
    """Lengths after dropping tokens from the longer side (B on ties) until la + lb ≤ cap."""
    extra = max(la + lb - cap, 0)
    ra, rb = min(extra, max(la - lb, 0)), min(extra, max(lb - la, 0))
    rest = extra - ra - rb  # once equal, drops alternate starting with B
    return la - ra - rest // 2, lb - rb - (rest + 1) // 2


# ----------------------------------------------------------------------------- rows and masking


def assemble(split: Split, batch: list[Instance], ids: dict):
    """Padded (N, T) tokens, special, word starts and segment ids of [CLS] seg [SEP] seg [SEP] ..., and the lengths."""
    lengths = np.array([1 + sum(e - s + 1 for s, e in inst.segments) for inst in batch], dtype=np.int64)
    N, T = len(batch), int(lengths.max())
    tokens = np.full((N, T), ids.get("pad", 0), dtype=np.int64)
    special = np.ones((N, T), dtype=bool)
    ws = np.ones((N, T), dtype=bool)
    types = np.zeros((N, T), dtype=np.int8)
    tokens[:, 0] = ids["cls"]
    for r, inst in enumerate(batch):
        pos = 1
        for k, (s, e) in enumerate(inst.segments):
            n = e - s
            tokens[r, pos:pos + n] = split.tokens[s:e]
            special[r, pos:pos + n] = False
            ws[r, pos + 1:pos + n] = split.ws[s + 1:e]  # a segment starts a word: it was cut at a word start
            types[r, pos:pos + n + 1] = k % 2
            tokens[r, pos + n] = ids["sep"]
            pos += n + 1
    return tokens, special, ws, types, lengths


def _table(masked, target, original, types, lengths, batch: list[Instance]):
    import pyarrow as pa

    from plmcli.data.mlm_data import list_column, masked_lm_columns

    offsets, lm = masked_lm_columns(masked, target, original, lengths)
    valid = np.arange(masked.shape[1])[None, :] < lengths[:, None]
    return pa.table({
        "input_ids": lm["input_ids"],
        "token_type_ids": list_column(offsets, types[valid]),
        "masked_lm_positions": lm["masked_lm_positions"],
        "masked_lm_labels": lm["masked_lm_labels"],
        "reorder_label": pa.array(np.array([x.reorder_label for x in batch], dtype=np.int16)),
        "distance_label": pa.array(np.array([x.distance_label for x in batch], dtype=np.int8)),
    })


def masked_tables(split: Split, insts: list[Instance], rng, cfg: dict):
    """The instances as Arrow tables of masked rows, BATCH at a time."""
    strategy = {"chinese-wwm": "wwm"}.get(cfg["masking"], cfg["masking"])
    ids = cfg["special_ids"]
    for k in range(0, len(insts), BATCH):
        batch = insts[k:k + BATCH]
        tokens, special, ws, types, lengths = assemble(split, batch, ids)
        masked, target = mask_batch(
            tokens, special, None if strategy == "token" else ws, rng, mask_prob=cfg["mask_prob"],
            max_predictions=cfg["max_predictions"], strategy=strategy, mask_id=ids["mask"],
            vocab_size=cfg["vocab_size"], random_ids=cfg["random_ids"], span_p=cfg.get("span_p", 0.2),
            span_max=cfg.get("span_max", 10), ngram_probs=tuple(cfg.get("ngram_probs", (0.4, 0.3, 0.2, 0.1))))
        yield _table(masked, target, tokens, types, lengths, batch)


# ----------------------------------------------------------------------------- the build


def check(max_seq_len: int, reorder_segments: int, reorder_prob: float, short_seq_prob: float, dupe_factor: int) -> None:
    """Settings the instances cannot be built with, in one line each."""
    if not 1 <= reorder_segments <= MAX_SEGMENTS:
        raise PlmError(f"objective.reorder_segments {reorder_segments} must be 1..{MAX_SEGMENTS} "
                       f"({num_classes(MAX_SEGMENTS)} classes at {MAX_SEGMENTS})", "ERNIE 2.0-style: 3 (9 classes)")
    if max_seq_len < max(5, reorder_segments + 3):
        raise PlmError(f"train.seq_len {max_seq_len} leaves no room for {reorder_segments} segments and their "
                       "[SEP]s (or a sentence pair)", f"--set train.seq_len={max(5, reorder_segments + 3) * 16}")
    if not 0 <= reorder_prob <= 1 or not 0 <= short_seq_prob <= 1:
        raise PlmError(f"objective.reorder_prob {reorder_prob} and short_seq_prob {short_seq_prob} must be in [0, 1]",
                       "e.g. reorder_prob 0.5 (half reordering, half distance instances)")
    if dupe_factor < 1:
        raise PlmError(f"objective.dupe_factor {dupe_factor} must be at least 1", "e.g. --set objective.dupe_factor=5")


def _unit_starts(corpus_dir: Path, masking: str, lexicon) -> Callable | None:
    """Per document (ids, sentence_starts, word_starts) -> the masking units' starts, for the maskings
    whose units are not the tokenizer's words (jieba words, lexicon matches); None for the others."""
    from plmcli.data.mlm_data import chinese_row_starts, knowledge_lexicon, text_vocab

    if masking == "chinese-wwm":
        vocab = text_vocab(corpus_dir)
        return lambda ids, starts, ws: chinese_row_starts(ids, starts, ws, vocab)
    if masking == "knowledge":
        lex, vocab = knowledge_lexicon(corpus_dir, lexicon)
        return lambda ids, starts, ws: lex.word_starts(np.asarray(ids), ws, starts,
                                                       [vocab[i] for i in ids] if vocab is not None else None)
    return None


def read_split(ds, units: Callable | None) -> Split:
    """A tokenized corpus split (input_ids, sentence_starts, word_starts) as a Split."""
    def rows():
        for batch in ds.iter(batch_size=500):
            for ids, starts, ws in zip(batch["input_ids"], batch["sentence_starts"], batch["word_starts"]):
                yield ids, starts, (units(ids, starts, ws) if units is not None else ws)

    return flatten(rows())


def build_sentence_tasks(corpus_dir, out_dir, *, max_seq_len: int = 128, reorder_segments: int = 3,
                         reorder_prob: float = 0.5, short_seq_prob: float = 0.1, dupe_factor: int = 5,
                         mask_prob: float = 0.15, max_predictions: int = 20, masking: str = "token",
                         lexicon: str | None = None, span_p: float = 0.2, span_max: int = 10,
                         ngram_probs=(0.4, 0.3, 0.2, 0.1), seed: int = 12345, force: bool = False) -> dict:
    """ERNIE 2.0 instances (both tasks, masked) from a `plm tokenize` directory into `out_dir` (a
    `datasets` DatasetDict with meta.json); returns the output's meta. Reuses `out_dir` when it already
    holds this exact output unless `force`."""
    check(max_seq_len, reorder_segments, reorder_prob, short_seq_prob, dupe_factor)
    if masking not in MASKINGS:
        raise PlmError(f"objective.masking '{masking}' is not one of {', '.join(MASKINGS)}", "e.g. token")
    check_span(span_p, span_max)
    check_ngram_probs(ngram_probs)
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    cmeta = require_meta(corpus_dir)
    masked_lm_special_ids(cmeta)  # a corpus without [CLS]/[SEP]/[MASK] is refused before any work
    settings = dict(max_seq_len=max_seq_len, reorder_segments=reorder_segments, reorder_prob=reorder_prob,
                    short_seq_prob=short_seq_prob, dupe_factor=dupe_factor, mask_prob=mask_prob,
                    max_predictions=max_predictions, masking=masking, seed=seed)
    # Only the settings a masking uses join in, so they neither show in meta.json nor change the key.
    if masking == "span":
        settings |= dict(span_p=span_p, span_max=span_max)
    if masking in ("ngram", "ngram_per_word"):
        settings |= dict(ngram_probs=[float(x) for x in ngram_probs])
    if masking == "knowledge":
        settings |= dict(lexicon=str(resolve_lexicon(lexicon).resolve()), lexicon_key=lexicon_key(lexicon))
    keyed = {k: v for k, v in settings.items() if k != "lexicon"}  # the lexicon counts by content
    key = cache_key(cmeta.get("key"), cmeta["tokenizer"].get("hash"), keyed, FORMAT, VERSION)
    return build_atomically(out_dir, key, lambda d: read_meta(d, FORMAT),
                            lambda tmp: _build(tmp, corpus_dir, cmeta, settings, key), "ERNIE 2.0 data", force)


def _features():
    from datasets import Features, Sequence, Value

    return Features({
        "input_ids": Sequence(Value("int32")), "token_type_ids": Sequence(Value("int8")),
        "masked_lm_positions": Sequence(Value("int32")), "masked_lm_labels": Sequence(Value("int32")),
        "reorder_label": Value("int16"), "distance_label": Value("int8"),
    })


def _build(tmp: Path, corpus_dir: Path, cmeta: dict, settings: dict, key: str) -> dict:
    import pyarrow as pa
    from datasets import Dataset, load_from_disk

    source = load_from_disk(str(corpus_dir / "dataset"))
    tok = cmeta["tokenizer"]
    vocab_size = int(tok["vocab_size"])
    special = set(tok["special_token_ids"].values())
    cfg = {**settings, "special_ids": tok["special_token_ids"], "vocab_size": vocab_size,
           "random_ids": np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)}
    units = _unit_starts(corpus_dir, settings["masking"], settings.get("lexicon"))
    splits, counts = {}, {}
    for si, name in enumerate(_SPLITS):
        split = read_split(source[name], units) if name in source else flatten([])
        if name == "train" and len(split.sent) < 3:
            raise PlmError("the corpus's train split has fewer than 2 sentences: ERNIE 2.0's sentence tasks need more",
                           "use more text (documents are separated by blank lines, one sentence per line)")
        tables, c = [], dict.fromkeys(("instances", "reordering", "distance", "tokens", "predictions"), 0)
        for dupe in range(settings["dupe_factor"] if name == "train" else 1):
            rng = np.random.default_rng([settings["seed"] & (2**64 - 1), si, dupe])
            for tbl in masked_tables(split, instances(split, rng, cfg), rng, cfg):
                tables.append(tbl)
                r = tbl["reorder_label"].to_numpy()
                c = {"instances": c["instances"] + tbl.num_rows, "reordering": c["reordering"] + int((r >= 0).sum()),
                     "distance": c["distance"] + int((r < 0).sum()),
                     "tokens": c["tokens"] + len(tbl["input_ids"].combine_chunks().values),
                     "predictions": c["predictions"] + len(tbl["masked_lm_positions"].combine_chunks().values)}
        table = pa.concat_tables(tables) if tables else _features().arrow_schema.empty_table()
        splits[name] = Dataset(table.cast(_features().arrow_schema))
        counts[name] = {"documents": split.n_docs, **c}
    for name, ds in splits.items():  # an empty split is still one (empty) file, or datasets cannot load it
        ds.save_to_disk(str(tmp / "dataset" / name), num_shards=None if len(ds) else 1)
    (tmp / "dataset" / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}), encoding="utf-8")
    (tmp / "tokenizer.json").write_bytes((corpus_dir / "tokenizer.json").read_bytes())
    meta = {"format": FORMAT, "version": VERSION, **settings, "source": cmeta.get("key"),
            "corpus": str(corpus_dir.resolve()), "counts": counts, "tokenizer": tok, "key": key}
    write_meta(tmp, meta)
    return meta
