"""Permutation language modelling (XLNet, Yang et al. 2019): predict tokens in a random factorisation order.

Data, as XLNet's data_utils.py (create_tfrecords, _split_a_and_b, _sample_mask, _local_perm), with our
own code:
- The split's token stream (<eos> after every document) is cut into S = B·world parallel streams, one per
  batch row (B = the micro batch); rank r reads streams r·B … r·B+B-1, and micro-batch k holds sample k of
  each of its streams (objectives/bptt.py's layout).
  Sample k starts at i = k·reuse_len: the reuse part stream[i : i+reuse_len], then A <sep> B <sep> <cls>
  filling seq_len, A continuing at i+reuse_len and ending at a sentence (corpus line) boundary; B is the
  real continuation half the time, else a run of whole sentences from a random place in the stream (no
  loss is attached to the choice, as in XLNet). Segments: reuse + A + <sep> 0, B + <sep> 1, <cls> 2. The
  next sample's reuse part follows this one's, so the memory carried between micro-batches (`state`:
  the first reuse_len content states of each layer) is the true preceding text.
- Targets (§2.3, partial prediction): spans of n = 1…5 tokens (P ∝ 1/n), each in a context of
  n·mask_alpha/mask_beta tokens and starting at a word start, until the part's share of num_predict is
  reached, topped up with single tokens; the reuse part and the rest each get their share. Never <sep> / <cls>.
- Factorisation order: the reuse part first, then the rest, each in a random order (in blocks of
  perm_size when set). Non-target tokens come first within their part: every later position sees them,
  and they see no target. <sep> / <cls> take part in the order without being predicted (as the TF code).
  The content stream of a token sees the tokens up to and including it in the order, its query stream
  those strictly before it; the reuse part sees nothing of the rest (its states become the next memory).
- bi_data: half the rows read their streams backwards (relative distances negated in the model).
Every random choice is a pure function of (seed, micro-batch index k, row), so a resumed run is bitwise
identical; the memory restarts empty after a resume and at each epoch, like the BPTT objective's state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.config_schema import Count, Size
from plmcli.data.tasks import truncate_pair
from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.objectives.base import Objective, StepOutput

MAX_SPAN = 5
SPAN_P = (1.0 / np.arange(1, MAX_SPAN + 1)) / (1.0 / np.arange(1, MAX_SPAN + 1)).sum()


@dataclass
class PLMConfig:
    num_predict: Size = 85
    """Targets per sequence (paper: 85 of 512, K ≈ 6: only the last ~1/K of each factorisation order is
    predicted)."""
    mask_alpha: Size = 6
    """A span of n targets sits in a context of n·mask_alpha/mask_beta tokens."""
    mask_beta: Size = 1
    """See mask_alpha (paper: 6 and 1)."""
    reuse_len: Count = 256
    """Leading tokens of each sequence whose states become the next segment's memory (paper: 256 of 512); 0 = none."""
    perm_size: Count = 0
    """Permute in blocks of this many tokens, left to right (must divide reuse_len and seq_len - reuse_len);
    0 = each part whole."""
    bi_data: bool = False
    """Half of each micro-batch reads its streams backwards (the released models' data); needs an even micro batch."""


class _Row:
    """One stream read forwards or backwards: slices [a, b) of its tokens, word starts and sentence starts."""

    def __init__(self, tokens, words, starts, reverse: bool):
        self.tok, self.words, self.starts, self.reverse, self.n = tokens, words, starts, reverse, len(tokens)

    def _get(self, arr, a, b):
        return np.asarray(arr[a:b] if not self.reverse else arr[self.n - b : self.n - a][::-1])

    def tokens(self, a, b):
        return self._get(self.tok, a, b).astype(np.int64)

    def word_starts(self, a, b):  # a flag of the token itself: read backwards it travels with the token
        return self._get(self.words, a, b).astype(bool)

    def sentence_starts(self, a, b):
        """True at t where a new sentence begins (t-1 and t in different sentences)."""
        if not self.reverse:
            return np.asarray(self.starts[a:b], dtype=bool)
        # Backwards, t starts a sentence iff natural token n-t does (the boundary after natural n-1-t);
        # t = 0 has no token before it.
        out = np.asarray(self.starts[max(self.n - b + 1, 0) : self.n - a + 1][::-1], dtype=bool)
        return np.concatenate([[True], out]) if a == 0 and b > 0 else out

    def next_start(self, t: int, limit: int) -> int:
        """The first sentence start at or after t, else `limit`."""
        while t < limit:
            hit = np.flatnonzero(self.sentence_starts(t, min(t + 4096, limit)))
            if len(hit):
                return t + int(hit[0])
            t += 4096
        return limit

    def prev_start(self, t: int) -> int:
        """The last sentence start at or before t, else 0."""
        while t > 0:
            lo = max(0, t - 4095)
            hit = np.flatnonzero(self.sentence_starts(lo, t + 1))
            if len(hit):
                return lo + int(hit[-1])
            t = lo - 1
        return 0


def split_a_b(row: _Row, begin: int, tot_len: int, rng: np.random.Generator):
    """XLNet's _split_a_and_b: (a_begin, a_end, b_begin, b_end, is_next) with A + B = tot_len tokens."""
    n = row.n
    cuts = begin + 1 + np.flatnonzero(row.sentence_starts(begin + 1, begin + tot_len))  # sentence starts inside
    end = row.next_start(begin + tot_len, n)  # the sentence that crosses the budget ends here
    if len(cuts) == 0 or rng.random() < 0.5:  # B from a random place: whole sentences from there
        is_next = False
        a_end = end if len(cuts) == 0 else int(rng.choice(cuts))
        b_len = max(1, tot_len - (a_end - begin))
        b_begin = int(rng.integers(0, n - b_len))
        b_end = b_begin + b_len
        b_begin = row.prev_start(b_begin)
        b_end = row.next_start(b_end, n - 1)
    else:  # B is A's true continuation
        is_next = True
        a_end = int(rng.choice(cuts))
        b_begin, b_end = a_end, end
    la, lb = truncate_pair(np.array([a_end - begin]), np.array([b_end - b_begin]), tot_len)
    return begin, begin + int(la[0]), b_begin, b_begin + int(lb[0]), is_next  # truncated as _split_a_and_b


def sample_targets(n: int, goal: int | None, rng: np.random.Generator, alpha: int, beta: int,
                   word_start: np.ndarray | None = None, allowed: np.ndarray | None = None,
                   reverse: bool = False) -> np.ndarray:
    """XLNet's _sample_mask: a bool mask of about `goal` targets among n tokens.

    Walking left to right: draw n_span ∈ 1…5 (P ∝ 1/n_span), a context of ctx = n_span·alpha//beta
    tokens, l ~ U{0 … ctx-1}; the span starts l tokens on (moved to the next word start) and covers
    n_span tokens; the walk resumes ctx - l tokens after it. Then single random tokens up to `goal`
    (None: spans only). Tokens not `allowed` (<sep>, <cls>) are never targets. `reverse` samples in
    the reversed order (the backward rows of bi_data read in their natural order).
    """
    word_start = np.ones(n, bool) if word_start is None else np.asarray(word_start, bool)
    allowed = np.ones(n, bool) if allowed is None else np.asarray(allowed, bool)
    if reverse:
        word_start, allowed = word_start[::-1], allowed[::-1]
    mask = np.zeros(n, bool)
    got, cur = 0, 0
    spans = rng.choice(np.arange(1, MAX_SPAN + 1), size=n + 1, p=SPAN_P)
    lefts = rng.random(n + 1)
    for span, u in zip(spans, lefts):
        if cur >= n or (goal is not None and got >= goal):
            break
        span = int(span) if goal is None else min(int(span), goal - got)
        ctx = span * alpha // beta
        left = int(u * ctx)
        beg = cur + left
        while beg < n and not word_start[beg]:
            beg += 1
        if beg + span >= n:  # as the TF code: a span never reaches the last token
            break
        mask[beg : beg + span] = allowed[beg : beg + span]
        got += int(allowed[beg : beg + span].sum())
        cur = beg + span + ctx - left
    if goal is not None and got < goal:
        free = np.flatnonzero(allowed & ~mask)
        mask[rng.choice(free, min(goal - got, len(free)), replace=False)] = True
    return mask[::-1].copy() if reverse else mask


def permutation_mask(target: np.ndarray, func: np.ndarray, reuse_len: int, rng: np.random.Generator,
                     perm_size: int = 0) -> np.ndarray:
    """XLNet's _local_perm over the reuse part and the rest: (T, T) bool, True = i may not attend to j.

    Each token gets a rank in one global order: the reuse part before the rest; inside a part, the
    ordinary non-targets first (all at the part's lowest rank), then targets and <sep>/<cls> in random
    order (blocks of perm_size in sequence, one random order inside every block). The query stream of i
    sees j iff rank j < rank i; a non-target also sees its equals (that is, its part's other non-targets).
    """
    T = len(target)
    rank = np.empty(T, np.int64)
    lowest = np.empty(T, np.int64)
    for start, end, offset in ((0, reuse_len, 0), (reuse_len, T, reuse_len + 1)):
        if end > start:
            p = perm_size or end - start
            idx = np.arange(end - start)
            rank[start:end] = offset + (idx // p) * p + rng.permutation(p)[idx % p]
            lowest[start:end] = offset - 1
    ordinary = ~target & ~func
    rank[ordinary] = lowest[ordinary]
    own = rank + ~target  # a non-target's content is its query: it may see its rank's equals
    return own[:, None] <= rank[None, :]


def sentence_start_stream(corpus_dir, split: str, sep_id: int) -> np.ndarray:
    """True at each token that begins a corpus line (XLNet reads one sentence per line) and at each
    document separator (<eod> is a sentence of its own), in step with token_stream(corpus_dir, split,
    sep_id). Streamed once into corpus_dir, one byte per token; a json sidecar, written last, marks it complete."""
    import pyarrow.compute as pc
    from datasets import load_from_disk

    path = Path(corpus_dir) / f"{split}.{sep_id}.sentence_flags.bin"
    side = path.with_suffix(".json")
    if not side.is_file():
        from plmcli.data.store import atomic_path, write_json

        length = 0
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            ds = load_from_disk(str(Path(corpus_dir) / "dataset" / split)).with_format("arrow")
            for tbl in ds.iter(batch_size=10_000):
                col = lambda c: c.to_numpy(zero_copy_only=False).astype(np.int64)  # noqa: E731
                lens = col(pc.list_value_length(tbl["input_ids"]))
                n_sent = col(pc.list_value_length(tbl["sentence_starts"]))
                rel = col(pc.list_flatten(tbl["sentence_starts"]))
                base = np.concatenate([[0], np.cumsum(lens + 1)[:-1]])  # each document is followed by its separator
                flags = np.zeros(int((lens + 1).sum()), bool)
                flags[np.repeat(base, n_sent) + rel] = True
                flags[base + lens] = True
                f.write(flags.tobytes())
                length += len(flags)
        write_json(side, {"length": length})
    n = json.loads(side.read_text())["length"]
    return np.memmap(path, dtype=np.bool_, mode="r", shape=(n,)) if n else np.zeros(0, bool)


class PermutationStream(torch.utils.data.Dataset):
    """`stream[k]`: micro-batch k, sample k of each of this rank's streams (random access: the position is k)."""

    def __init__(self, obj: "PermutationLM", tokens, words, starts, batch_size: int, seed: int, rank: int,
                 world: int, train: bool, split: str):
        c, T = obj.cfg, obj.seq_len
        n_fwd = batch_size // 2 if c.bi_data else batch_size
        S = n_fwd * world
        L = len(tokens) // S
        if L <= T:
            raise PlmError(f"the {split} split has {len(tokens)} tokens, too few for {S} streams of more than {T}",
                           f"need > {S * (T + 1)}: add text, lower train.global_batch_size / train.seq_len, "
                           "or raise data.val_fraction")
        # (S, L) views of the memmaps, then this rank's rows: nothing is read until a sample is.
        rows = lambda a: np.asarray(a[: S * L]).reshape(S, L)[rank * n_fwd : (rank + 1) * n_fwd]  # noqa: E731
        streams = list(zip(rows(tokens), rows(words), rows(starts)))
        self.rows = [_Row(*s, reverse=False) for s in streams]
        if c.bi_data:
            self.rows += [_Row(*s, reverse=True) for s in streams]
        self.obj, self.seed, self.first_row, self.train = obj, seed, rank * batch_size, train
        self.stride = c.reuse_len or T - 3
        self.num_segments = (L - T) // self.stride + 1

    def __getitem__(self, k: int):
        epoch, seg = divmod(k, self.num_segments)
        if not self.train and epoch > 0:
            return None  # an evaluation pass reads each sample once
        rows = [self.obj.sample(row, seg * self.stride, np.random.default_rng((self.seed, k, self.first_row + b, 17)))
                for b, row in enumerate(self.rows)]  # each row's draws: a function of (seed, k, global row)
        batch = {key: torch.from_numpy(np.stack([r[key] for r in rows])) for key in rows[0]}
        batch["reset"] = seg == 0  # the streams restart: the memory is not their history
        return batch

    def batches_per_epoch(self) -> int:
        return self.num_segments

    def __len__(self) -> int:  # DataLoader wants one; a training stream is endless
        return 2**62


class PermutationLM(Objective):
    Config = PLMConfig

    def __init__(self, cfg: PLMConfig, tokenizer, special_ids: dict[str, int], seq_len: int):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        self.sep, self.cls = special_ids.get("sep"), special_ids.get("cls")
        R, T = cfg.reuse_len, seq_len
        if not 0 <= R <= T - 5:
            raise PlmError(f"objective.reuse_len {R} leaves no room in train.seq_len {T} for A <sep> B <sep> <cls>",
                           f"use 0 ≤ reuse_len ≤ {max(T - 5, 0)} (paper: half of seq_len)")
        if cfg.mask_beta < 1 or cfg.mask_alpha < cfg.mask_beta:
            raise PlmError(f"objective.mask_alpha {cfg.mask_alpha} / mask_beta {cfg.mask_beta}: need alpha ≥ beta ≥ 1",
                           "the paper's values: mask_alpha=6, mask_beta=1")
        self.n_reuse = -(-cfg.num_predict * R // T)  # the reuse part's share (half of 85 rounded up at 256/512)
        if cfg.num_predict < 1 or self.n_reuse > R or cfg.num_predict - self.n_reuse > T - R - 3:
            raise PlmError(f"objective.num_predict {cfg.num_predict} is more than a sequence of {T} can predict "
                           f"({T - 3} tokens besides <sep> <sep> <cls>, shared between the reuse part and the rest)",
                           f"lower objective.num_predict (paper: 85 of 512, about 1/6 of the tokens: {max(1, T // 6)} here)")
        p = cfg.perm_size
        if p < 0 or (p and ((R and R % p) or (T - R) % p)):
            raise PlmError(f"objective.perm_size {p} must divide reuse_len {R} and seq_len - reuse_len {T - R}",
                           "use 0 (each part in one random order) or a common divisor")

    def check_model(self, model):
        if not traits_of(model).permutation_lm:
            raise PlmError(f"{type(model).__name__} has no two-stream attention for permutation language modelling",
                           "use objective.name: plm with family xlnet (xlnet-mini, xlnet-base)")
        self.check_positions(model)
        model.freeze_summary()  # finetuning's pooler gets no gradient here; DDP must not wait for it
        # The query stream and LM head run at num_predict rows of seq_len: flops_per_token (and the logged
        # MFU) count what runs rather than the paper's 85/512.
        model.predict_fraction = self.cfg.num_predict / self.seq_len

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        from plmcli.data.corpus import token_stream
        from plmcli.objectives.mlm_units import word_start_stream

        for role in ("sep", "cls"):
            if role not in self.special_ids:
                raise PlmError(f"permutation LM data needs a '{role}' special token, and the tokenizer has none",
                               f"add tokenizer.special_tokens.{role} (e.g. <{role}>) to the recipe")
        if self.cfg.bi_data and batch_size % 2:
            raise PlmError(f"objective.bi_data needs an even micro batch, and it is {batch_size}",
                           "set train.micro_batch_size (or global_batch_size / processes) to an even number")
        sep_doc = self.separator()
        tokens = token_stream(corpus_dir, split, sep_doc)
        words = word_start_stream(Path(corpus_dir), split, sep_doc)
        starts = sentence_start_stream(corpus_dir, split, sep_doc)
        return PermutationStream(self, tokens, words, starts, batch_size, seed, rank, world, shuffle, split)

    def sample(self, row: _Row, i: int, rng: np.random.Generator) -> dict:
        """One training sequence of a stream at offset i: ids, segments, perm mask, targets (numpy)."""
        c, T, R = self.cfg, self.seq_len, self.cfg.reuse_len
        a0, a1, b0, b1, _ = split_a_b(row, i + R, T - R - 3, rng)
        sep, cls = np.array([self.sep]), np.array([self.cls])
        x = np.concatenate([row.tokens(i, i + R), row.tokens(a0, a1), sep, row.tokens(b0, b1), sep, cls])
        words = np.concatenate([row.word_starts(i, i + R), row.word_starts(a0, a1), [True],
                                row.word_starts(b0, b1), [True, True]])
        seg = np.concatenate([np.zeros(R + a1 - a0 + 1, np.int64), np.ones(b1 - b0 + 1, np.int64), [2]])
        func = (x == self.sep) | (x == self.cls)
        target = np.concatenate([
            sample_targets(R, self.n_reuse, rng, c.mask_alpha, c.mask_beta, words[:R], ~func[:R], row.reverse),
            sample_targets(T - R, c.num_predict - self.n_reuse, rng, c.mask_alpha, c.mask_beta, words[R:], ~func[R:],
                           row.reverse)])
        pos = np.flatnonzero(target)  # ascending, ≤ num_predict
        mapping = np.zeros((c.num_predict, T), np.float32)
        mapping[np.arange(len(pos)), pos] = 1.0
        labels = np.full(c.num_predict, -100, np.int64)
        labels[: len(pos)] = x[pos]
        perm = permutation_mask(target, func, R, rng, c.perm_size)
        return {"input_ids": x, "token_type_ids": seg, "perm_mask": perm, "target_mapping": mapping, "labels": labels}

    def loss_counts(self, batch):
        return {"loss": (batch["labels"] != -100).sum()}

    def step(self, model, batch, state=None):
        # A new epoch restarts the streams, so the memory is no longer their history.
        mems = None if bool(batch.get("reset", False)) or state is None else [m.detach() for m in state]
        logits, mems = model(batch["input_ids"], batch["token_type_ids"], batch["perm_mask"], batch["target_mapping"],
                             mems=mems, reuse_len=self.cfg.reuse_len, bi_data=self.cfg.bi_data)  # (B, M, V)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        count = (labels != -100).sum()
        return StepOutput(loss, {"loss": loss.detach() * count}, count, mems)
