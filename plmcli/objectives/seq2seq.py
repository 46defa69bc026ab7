"""Sequence-to-sequence objectives for encoder-decoder models (families `seq2seq`, `transformer`).

translation  parallel text, `source<TAB>target` per line (plmcli.data.parallel); predict the target
             given the source.
denoising    plain documents (the default corpus path), BART-style (Lewis et al. 2019): each chunk of a
             document is corrupted (sentence permutation, token deletion, token masking or span
             infilling) and the model restores the original.

Both feed the model the same batch: the source plus eos (padded, with a mask), the decoder input
bos + target, and the labels target + eos (padding -100). The loss is per target token, with label
smoothing when asked; metric "nll" is the unsmoothed loss, the one perplexity is reported from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.config_schema import Fraction, Positive, Probability, Size
from plmcli.data.batching import LengthGroupedOrder
from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.device import row_lengths
from plmcli.objectives.base import Mixes, Objective, StepOutput

MASK_LENGTHS = ("span-poisson", "token")
_NOISE_TAG = 13  # seed-tuple tag of the noise draws (independent of the data order's draws)


@dataclass
class TranslationConfig:
    label_smoothing: Probability = 0.0
    """Label smoothing ε (Szegedy et al.; Vaswani et al. use 0.1): the target puts ε/V on every token."""
    length_bucketing: bool = True
    """Shuffle, then sort by length within windows of `bucket_batches` bands of up to 256 sentences (and shuffle the
    bands), so a batch holds similar lengths and pads little, whatever the micro batch."""
    bucket_batches: Size = 50
    """Length bands (up to 256 sentences each, data/batching.py: GROUP_SIZE) per sorting window."""


@dataclass
class DenoisingConfig(TranslationConfig):
    mask_ratio: Fraction = 0.3
    """Share of tokens masked (BART: 0.3); 0 turns masking off."""
    mask_length: Literal[MASK_LENGTHS] = "span-poisson"
    """span-poisson: text infilling, spans of Poisson(λ) length each become one mask (0-length spans
    insert one); token: token masking, each chosen token becomes a mask."""
    poisson_lambda: Positive = 3.0
    """λ of the span lengths (BART: 3)."""
    random_ratio: Fraction = 0.1
    """Share of the mask tokens replaced by a random token instead (BART: 0.1)."""
    delete_ratio: Probability = 0.0
    """Share of tokens deleted (token deletion; the model must find where)."""
    permute_sentences: Fraction = 1.0
    """Share of a chunk's sentences (its corpus lines) shuffled among themselves (BART: 1.0)."""


class Translation(Mixes):
    Config = TranslationConfig
    ppl_metric = "nll"
    """val_ppl = exp(unsmoothed NLL per target token), not exp of the smoothed training loss."""

    def __init__(self, cfg, tokenizer, special_ids: dict[str, int], seq_len: int):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if not 0 <= cfg.label_smoothing < 1:
            raise PlmError(f"objective.label_smoothing {cfg.label_smoothing} must be in [0, 1)", "e.g. 0.1 (Vaswani et al.)")
        if cfg.bucket_batches < 1:
            raise PlmError(f"objective.bucket_batches {cfg.bucket_batches} must be ≥ 1", "e.g. 50")

    default_data = "reverse-sample.txt"
    """With no --data: Shakespeare lines paired with their words reversed, shipped in plmcli/corpus/."""

    @staticmethod
    def prepare_corpus(inputs, tokenizer_cfg, data_cfg):
        from plmcli.data.parallel import prepare_parallel

        return prepare_parallel(inputs, tokenizer_cfg, data_cfg)

    def check_model(self, model):
        if not traits_of(model).seq2seq:
            raise PlmError(f"{type(model).__name__} is not an encoder-decoder model",
                           "use this objective with family seq2seq or transformer (recipes seq2seq-attn-mini, transformer-mini)")
        self.check_positions(model)

    def _ids(self) -> tuple[int, int, int]:
        """(pad, decoder start, eos)."""
        missing = [r for r in ("pad", "eos") if r not in self.special_ids]
        if missing:
            raise PlmError(f"{type(self).__name__.lower()} needs '{missing[0]}' in the tokenizer's special tokens",
                           "add e.g. tokenizer.special_tokens: {pad: <pad>, bos: <s>, eos: </s>, mask: <mask>}")
        ids = self.special_ids
        return ids["pad"], ids.get("bos", ids["eos"]), ids["eos"]

    # ------------------------------------------------------------ data

    def corpus_stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        import pyarrow.compute as pc

        from plmcli.data.parallel import load_split

        ds = load_split(corpus_dir, split)
        stream = self.batch_stream(*self._pairs(ds, corpus_dir, split, needed=True), batch_size, seed, rank, world, shuffle)
        if shuffle and self.cfg.length_bucketing:
            lengths = np.concatenate([
                np.maximum(pc.list_value_length(t["src_ids"]).to_numpy(zero_copy_only=False),
                           pc.list_value_length(t["tgt_ids"]).to_numpy(zero_copy_only=False))
                for t in ds.iter(batch_size=100_000)])
            stream.order = LengthGroupedOrder(lengths, seed, window=self.cfg.bucket_batches)
        return stream

    def samples(self, corpus_dir, split, seed, shuffle, needed):
        """This split's sentence pairs (a mix's source too: data/mixing.py), read as Arrow tables."""
        from plmcli.data.parallel import load_split

        return self._pairs(load_split(corpus_dir, split), corpus_dir, split, needed)

    @staticmethod
    def _pairs(ds, corpus_dir, split, needed):
        if len(ds) < 1 and needed:
            raise PlmError(f"the {split} split of '{corpus_dir}' has no sentence pairs", "add pairs, or lower data.val_fraction")
        return len(ds), lambda epochs, indices: ds[list(indices)]

    def collate(self, parts: list) -> dict:
        import pyarrow as pa

        tbl = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        return collate_flat(*_flat_column(tbl["src_ids"]), *_flat_column(tbl["tgt_ids"]), *self._ids(), self.seq_len)

    def tokens_in(self, batch):
        return int((batch["labels"] != -100).sum())

    # ------------------------------------------------------------ loss

    def loss_counts(self, batch):
        return {"loss": (batch["labels"] != -100).sum()}

    def step(self, model, batch, state=None):
        with row_lengths(batch["src_mask"], batch.get("src_lengths")):  # an RNN encoder packs without a read back
            logits = model(batch["src_ids"], batch["src_mask"], batch["tgt_in_ids"])  # (B, T, V)
        labels = batch["labels"].flatten()
        logp = F.log_softmax(logits.flatten(0, 1).float(), -1)
        nll = F.nll_loss(logp, labels, ignore_index=-100)
        eps = self.cfg.label_smoothing
        # cross_entropy of log-probabilities = of the logits (log_softmax is idempotent)
        loss = F.cross_entropy(logp, labels, ignore_index=-100, label_smoothing=eps) if eps else nll
        count = (labels != -100).sum()
        return StepOutput(loss, {"loss": loss.detach() * count, "nll": nll.detach() * count}, count)


def collate(srcs: list, tgts: list, pad: int, start: int, eos: int, max_len: int) -> dict:
    """Sources and targets (token lists) -> a padded batch. Each side is cut to max_len-1 tokens + eos:
    src_ids = source + eos, tgt_in_ids = start + target, labels = target + eos (-100 at padding)."""
    return collate_flat(*_flat(srcs), *_flat(tgts), pad, start, eos, max_len)


def _flat_column(col) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow list column -> (its values flat, each row's length)."""
    import pyarrow.compute as pc

    return (pc.list_flatten(col).to_numpy(zero_copy_only=False),
            pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64))


def _flat(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """Token lists or arrays -> (their values end to end, each one's length)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.concatenate([np.asarray(r, dtype=np.int64).reshape(-1) for r in rows]) if rows else np.zeros(0, np.int64)
    return flat, lengths


def _cut(values: np.ndarray, lengths: np.ndarray, width: int, keep: np.ndarray, fill: int, at: int = 0) -> np.ndarray:
    """(B, width) filled with `fill`, row b holding the first keep[b] of its `lengths[b]` values from column `at`."""
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(width - at)
    inside = pos < keep[:, None]  # (B, width - at)
    out = np.full((len(lengths), width), fill, dtype=np.int64)
    out[:, at:][inside] = values[(starts[:, None] + pos)[inside]]
    return out


def collate_flat(src: np.ndarray, src_len: np.ndarray, tgt: np.ndarray, tgt_len: np.ndarray, pad: int, start: int,
                 eos: int, max_len: int) -> dict:
    """`collate` of rows given flat (values, lengths per row), as Arrow list columns hold them: built with array
    operations, not a tensor per row (a transformer-base micro-batch is 128 pairs)."""
    rows = np.arange(len(src_len))
    ls, lt = np.minimum(src_len, max_len - 1), np.minimum(tgt_len, max_len - 1)
    S, T = int(ls.max()) + 1, int(lt.max()) + 1
    src_ids = _cut(np.asarray(src, dtype=np.int64), src_len, S, ls, pad)
    src_ids[rows, ls] = eos
    tgt_in = _cut(np.asarray(tgt, dtype=np.int64), tgt_len, T, lt, pad, at=1)
    tgt_in[:, 0] = start
    labels = np.where(np.arange(T) <= lt[:, None], np.roll(tgt_in, -1, axis=1), -100)
    labels[rows, lt] = eos
    return {"src_ids": torch.from_numpy(src_ids), "src_mask": torch.from_numpy(np.arange(S) <= ls[:, None]),
            "tgt_in_ids": torch.from_numpy(tgt_in), "labels": torch.from_numpy(labels),
            "src_lengths": (ls + 1).tolist()}  # for the step's row_lengths: ints stay on the host, a tensor would not


# ---------------------------------------------------------------- denoising


class Denoising(Translation):
    Config = DenoisingConfig
    default_data = Objective.default_data  # plain documents, not pairs

    def __init__(self, cfg, tokenizer, special_ids, seq_len):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        for name in ("mask_ratio", "random_ratio", "delete_ratio", "permute_sentences"):
            v = getattr(cfg, name)
            if not 0 <= v <= 1 or (name == "delete_ratio" and v == 1):
                raise PlmError(f"objective.{name} {v} must be a share in [0, 1{')' if name == 'delete_ratio' else ']'}",
                               f"e.g. --set objective.{name}=0.1")
        if cfg.mask_length not in MASK_LENGTHS:
            raise PlmError(f"objective.mask_length '{cfg.mask_length}' is not one of {', '.join(MASK_LENGTHS)}",
                           "span-poisson (text infilling) or token (token masking)")
        if cfg.poisson_lambda <= 0:
            raise PlmError(f"objective.poisson_lambda {cfg.poisson_lambda} must be > 0", "BART uses 3")

    @staticmethod
    def prepare_corpus(inputs, tokenizer_cfg, data_cfg):
        return Objective.prepare_corpus(inputs, tokenizer_cfg, data_cfg)  # plain documents

    def corpus_stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        chunks = DocumentChunks(Path(corpus_dir), split, self.seq_len - 1)
        stream = self.batch_stream(*self._chunks(chunks, corpus_dir, split, seed, needed=True), batch_size, seed, rank,
                                   world, shuffle)
        if shuffle and self.cfg.length_bucketing:
            stream.order = LengthGroupedOrder(chunks.lengths(), seed, window=self.cfg.bucket_batches)
        return stream

    def samples(self, corpus_dir, split, seed, shuffle, needed):
        """This split's document chunks (a mix's source too: data/mixing.py), each noised by (seed, epoch, chunk):
        fetch gives (sources, targets)."""
        return self._chunks(DocumentChunks(Path(corpus_dir), split, self.seq_len - 1), corpus_dir, split, seed, needed)

    def _chunks(self, chunks, corpus_dir, split, seed, needed):
        from plmcli.data.corpus import require_meta, token_stream

        meta = require_meta(Path(corpus_dir))
        self._ids()
        if "mask" not in self.special_ids and self.cfg.mask_ratio > 0:
            raise PlmError("denoising needs a 'mask' special token, and the tokenizer has none",
                           "add tokenizer.special_tokens.mask (e.g. <mask>), or --set objective.mask_ratio=0")
        if chunks.n < 1 and needed:
            raise PlmError(f"the {split} split of '{corpus_dir}' has no tokens", "add text, or lower data.val_fraction")
        tokens = token_stream(corpus_dir, split, None) if chunks.n else None
        vocab = meta["tokenizer"]["vocab_size"]
        ordinary = np.setdiff1d(np.arange(vocab), list(self.special_ids.values()))
        mask_id = self.special_ids.get("mask", -1)

        def fetch(epochs, indices):
            srcs, tgts = [], []
            for e, i in zip(epochs, indices):
                a, b, bounds = chunks[i]
                original = np.asarray(tokens[a:b], dtype=np.int64)
                rng = np.random.default_rng((seed, e, int(i), _NOISE_TAG))
                srcs.append(add_noise(original, bounds, self.cfg, rng, mask_id, ordinary))
                tgts.append(original)
            return srcs, tgts

        return chunks.n, fetch

    def collate(self, parts: list) -> dict:
        return collate([s for p in parts for s in p[0]], [t for p in parts for t in p[1]], *self._ids(), self.seq_len)


class DocumentChunks:
    """Each document of a `plm tokenize` split cut into consecutive chunks of at most `width` tokens.
    `chunks[i]` = (start, end) in the split's flat token stream and the chunk's sentence (corpus line)
    starts relative to it. Memory is O(documents)."""

    def __init__(self, corpus_dir: Path, split: str, width: int):
        import pyarrow.compute as pc
        from datasets import load_from_disk

        from plmcli.data.corpus import column_stream

        ds = load_from_disk(str(corpus_dir / "dataset" / split)).with_format("arrow")
        doc_len, n_sent = [], []
        for tbl in ds.iter(batch_size=10_000):
            doc_len.append(pc.list_value_length(tbl["input_ids"]).to_numpy(zero_copy_only=False))
            n_sent.append(pc.list_value_length(tbl["sentence_starts"]).to_numpy(zero_copy_only=False))
        self.doc_len = np.concatenate(doc_len).astype(np.int64) if doc_len else np.zeros(0, np.int64)
        n_sent = np.concatenate(n_sent).astype(np.int64) if n_sent else np.zeros(0, np.int64)
        self.doc_start = np.concatenate([[0], np.cumsum(self.doc_len)])
        self.sent_start = np.concatenate([[0], np.cumsum(n_sent)])
        self.sentences = column_stream(corpus_dir, split, "sentence_starts", None, np.int32, f"{split}.sentence_starts.bin")
        self.width = width
        per_doc = -(-self.doc_len // width)
        self.first_chunk = np.concatenate([[0], np.cumsum(per_doc)])
        self.n = int(self.first_chunk[-1])

    def lengths(self) -> np.ndarray:
        idx = np.arange(self.n)
        d = np.searchsorted(self.first_chunk, idx, side="right") - 1
        c = idx - self.first_chunk[d]
        return np.minimum(self.width, self.doc_len[d] - c * self.width)

    def __getitem__(self, i: int):
        d = int(np.searchsorted(self.first_chunk, i, side="right") - 1)
        off = (i - int(self.first_chunk[d])) * self.width
        a = off
        b = min(off + self.width, int(self.doc_len[d]))
        rel = np.asarray(self.sentences[self.sent_start[d] : self.sent_start[d + 1]], dtype=np.int64)
        bounds = np.unique(np.concatenate([[0], rel[(rel > a) & (rel < b)] - a]))
        base = int(self.doc_start[d])
        return base + a, base + b, bounds


def add_noise(tokens: np.ndarray, bounds: np.ndarray, cfg: DenoisingConfig, rng: np.random.Generator,
              mask_id: int, ordinary: np.ndarray) -> np.ndarray:
    """BART's noising of one chunk, in its order: sentence permutation, token deletion, then token
    masking or span infilling. `bounds` are the sentence starts within the chunk (the first is 0)."""
    x = tokens
    if cfg.permute_sentences > 0 and len(bounds) > 1:
        pieces = np.split(x, bounds[1:])
        k = int(round(len(pieces) * cfg.permute_sentences))
        if k > 1:
            chosen = np.sort(rng.choice(len(pieces), k, replace=False))
            order = np.arange(len(pieces))
            order[chosen] = chosen[rng.permutation(k)]
            x = np.concatenate([pieces[j] for j in order])
    if cfg.delete_ratio > 0 and len(x) > 1:
        keep = rng.random(len(x)) >= cfg.delete_ratio
        keep[rng.integers(len(x))] = True  # never delete everything
        x = x[keep]
    if cfg.mask_ratio > 0 and len(x):
        x = _mask(x, cfg, rng, mask_id)
        masks = x == mask_id
        swap = masks & (rng.random(len(x)) < cfg.random_ratio)
        if swap.any() and len(ordinary):
            x = x.copy()
            x[swap] = rng.choice(ordinary, int(swap.sum()))
    return x


def _mask(x: np.ndarray, cfg: DenoisingConfig, rng: np.random.Generator, mask_id: int) -> np.ndarray:
    n = len(x)
    target = math.ceil(n * cfg.mask_ratio)
    if cfg.mask_length == "token":
        out = x.copy()
        out[rng.choice(n, min(target, n), replace=False)] = mask_id
        return out
    # Text infilling: span lengths ~ Poisson(λ) until they cover `target` tokens (the last one cut to fit).
    lengths = []
    while sum(lengths) < target:
        lengths.append(int(rng.poisson(cfg.poisson_lambda)))
    if not lengths:
        return x
    lengths[-1] -= sum(lengths) - target
    spans = [l for l in lengths if l > 0]
    n_insert = len(lengths) - len(spans)
    out = x
    if spans:
        # Place the spans, in their drawn order, at a uniformly random composition of the unmasked tokens
        # into the k+1 gaps around them, with ≥ 1 token between spans when there are enough tokens, so
        # exactly `target` tokens are masked and each span becomes its own mask token.
        k, free = len(spans), n - target
        between = 1 if free >= k - 1 else 0
        free -= between * (k - 1)
        cuts = np.sort(rng.choice(free + k, k, replace=False))
        gaps = np.diff(np.concatenate([[-1], cuts, [free + k]])) - 1
        gaps[1:-1] += between
        starts = np.cumsum(gaps[:-1]) + np.concatenate([[0], np.cumsum(spans)[:-1]])
        covered = np.zeros(n, dtype=bool)
        for s, l in zip(starts, spans):
            covered[s : s + l] = True
        run_start = covered & ~np.concatenate([[False], covered[:-1]])
        out = np.where(run_start, mask_id, x)[~covered | run_start]
    if n_insert:  # 0-length spans: a mask inserted where nothing is missing
        out = np.insert(out, np.sort(rng.integers(0, len(out) + 1, n_insert)), mask_id)
    return out
