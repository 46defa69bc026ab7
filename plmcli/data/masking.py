"""Masked-LM targets for a whole batch at once: BERT's create_masked_lm_predictions, vectorised.

Per sequence the budget is `min(max_predictions or inf, max(1, round(n_maskable * mask_prob)))`, as in
BERT (which counts [CLS]/[SEP] in the length; we count only maskable tokens). Units — tokens, whole words,
n-grams of whole words or spans of whole words — are visited in random order and a unit that would
overflow the budget is skipped (Google's `continue`). That sequential greedy pass is computed exactly with
a few cumulative-sum passes over all units of the batch (one pass per "overflow" event, not per token).

Strategies:
  token  every maskable token is a unit.
  wwm    whole words (a `word_starts` token and its continuations; special tokens end a word).
  ngram  MacBERT/ALBERT n-grams: n whole words, n in 1..4 drawn with `ngram_probs`.
  span   SpanBERT: spans of whole words, length ~ Geometric(span_p) truncated to 1..span_max; the span
         that reaches the budget is cut to the whole words that fit (SpanBERT cuts it too), and
         80/10/10 is decided per span.
Deviation (ngram, span): instead of drawing a length at every random start and skipping overlaps,
each run of words between special tokens is cut into consecutive units whose lengths are drawn
i.i.d. (the last one from the distribution truncated to the words left, as ALBERT does at a sequence
end). Units never overlap, so the chosen units' lengths follow `ngram_probs` / the span pmf without
the bias toward short units that overlap rejection causes; adjacent units may still touch.

Chinese whole-word masking = "wwm" with the word starts of `chinese_word_starts` (jieba segmentation).
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple, Sequence

import numpy as np

from plmcli.errors import PlmError

STRATEGIES = ("token", "wwm", "ngram", "span")


class Units(NamedTuple):
    """The units chosen for masking, in no particular order (for tests and diagnostics)."""

    row: np.ndarray  # (U,) sequence of each unit
    start: np.ndarray  # (U,) column of its first token
    length: np.ndarray  # (U,) tokens
    words: np.ndarray  # (U,) whole words


def span_pmf(span_p: float = 0.2, span_max: int = 10) -> np.ndarray:
    """P(span of n words), n = 1..span_max: Geometric(span_p) truncated and renormalised (SpanBERT's code)."""
    pmf = span_p * (1 - span_p) ** np.arange(span_max)
    return pmf / pmf.sum()


def _budget(special: np.ndarray, mask_prob: float, max_predictions: int) -> np.ndarray:
    n = (~special).sum(axis=1)
    budget = np.maximum(1, np.round(n * mask_prob)).astype(np.int64)
    budget[n == 0] = 0
    if max_predictions and max_predictions > 0:
        np.minimum(budget, max_predictions, out=budget)
    return budget


def _words(special: np.ndarray, word_starts: np.ndarray | None):
    """Flat start/end positions of every word and whether it is the first word of its run.

    A run is a stretch of maskable tokens between special tokens (or row ends); words never cross one.
    """
    B, T = special.shape
    valid = ~special
    brk = np.empty_like(valid)  # True where the previous token is special or the row starts
    brk[:, 0] = True
    brk[:, 1:] = special[:, :-1]
    if word_starts is None:
        starts = np.flatnonzero(valid)
        ends = starts + 1
    else:
        ws = (valid & (np.asarray(word_starts, dtype=bool) | brk)).ravel()
        starts = np.flatnonzero(ws)
        bounds = np.append(np.flatnonzero(ws | special.ravel()), B * T)
        ends = bounds[np.searchsorted(bounds, starts) + 1]
    return starts, ends, brk.ravel()[starts]


def _tiles(run_first: np.ndarray, cdf: np.ndarray, rng: np.random.Generator):
    """Cut each run of words into consecutive units of n words, n ~ `cdf` (cumulative over n = 1..).

    Unit k of a run takes the run's k-th draw; a unit longer than the words left is redrawn from the
    distribution truncated to what is left. Returns (first word index, words) per unit.
    """
    W = len(run_first)
    first = np.flatnonzero(run_first)
    run_len = np.diff(np.append(first, W))
    run = np.cumsum(run_first) - 1
    u = rng.random(W)
    n = 1 + np.searchsorted(cdf, u * cdf[-1], side="right")
    while True:
        excl = np.cumsum(n) - n
        offset = excl - excl[first][run]  # where unit k of the run starts, in words
        left = run_len[run] - offset
        over = (left > 0) & (n > left)
        if not over.any():
            break
        m = left[over]
        n[over] = np.minimum(m, 1 + np.searchsorted(cdf, u[over] * cdf[m - 1], side="right"))
    live = left > 0
    return first[run[live]] + offset[live], n[live]


def _greedy(lengths: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """BERT's pass over the units of each row in order (columns of `lengths`, 0 = no unit): take a unit
    if it fits in what is left of the row's budget, else skip it. Exact; one pass per overflow, not per unit."""
    chosen = np.zeros(lengths.shape, dtype=bool)
    left = budget.copy()
    open_ = lengths > 0
    while True:
        active = open_ & (lengths <= left[:, None])  # a unit that does not fit now never will
        if not active.any():
            break
        fits = np.cumsum(np.where(active, lengths, 0), axis=1) <= left[:, None]
        take = active & fits  # a prefix of each row's active units; the first miss ends it
        chosen |= take
        left -= np.where(take, lengths, 0).sum(axis=1)
        open_ &= ~take
    return chosen


def select_units(special: np.ndarray, word_starts: np.ndarray | None, rng: np.random.Generator, *,
                 mask_prob: float = 0.15, max_predictions: int = 0, strategy: str = "token",
                 ngram_probs: Sequence[float] = (0.4, 0.3, 0.2, 0.1), span_p: float = 0.2,
                 span_max: int = 10) -> Units:
    """Choose the units to predict in each row of a (B, T) batch; see the module docstring."""
    if strategy not in STRATEGIES:
        raise PlmError(f"unknown masking strategy '{strategy}'", f"use one of: {', '.join(STRATEGIES)}")
    if not 0 < mask_prob < 1:
        raise PlmError(f"mask_prob must be in (0, 1), got {mask_prob}", "use e.g. 0.15")
    special = np.asarray(special, dtype=bool)
    B, T = special.shape
    budget = _budget(special, mask_prob, max_predictions)
    if strategy == "token":  # all units are one token: take the `budget` smallest random keys of each row
        keys = rng.random((B, T))
        keys[special] = 2.0
        cutoff = np.sort(keys, axis=1)[np.arange(B), np.maximum(budget - 1, 0)]
        rows, cols = np.nonzero((keys <= cutoff[:, None]) & (budget > 0)[:, None])
        ones = np.ones(len(rows), dtype=np.int64)
        return Units(rows, cols, ones, ones)
    wstart, wend, run_first = _words(special, word_starts)

    if strategy == "wwm":
        first, nw = np.arange(len(wstart)), np.ones(len(wstart), dtype=np.int64)
    else:
        pmf = np.asarray(ngram_probs if strategy == "ngram" else span_pmf(span_p, span_max), dtype=float)
        if pmf.ndim != 1 or len(pmf) == 0 or (pmf < 0).any() or pmf.sum() <= 0:
            raise PlmError(f"bad unit-length probabilities {pmf.tolist()}", "give non-negative weights for n = 1, 2, ...")
        first, nw = _tiles(run_first, np.cumsum(pmf / pmf.sum()), rng)
    start = wstart[first]  # flat position of each unit's first token (units never overlap)
    length = np.zeros(B * T, dtype=np.int64)
    length[start] = wend[first + nw - 1] - start

    # Each row's units in random order: sort random keys per row, non-units (inf) last.
    keys = np.full(B * T, np.inf)
    keys[start] = rng.random(len(start))
    order = np.argsort(keys.reshape(B, T), axis=1)
    flat_order = order + (np.arange(B) * T)[:, None]  # (B, T) flat position of the k-th unit of each row
    ls = length[flat_order]

    if strategy != "span":
        pos = flat_order[_greedy(ls, budget)]
        words = np.ones(len(pos), dtype=np.int64)
        if strategy == "ngram":
            words_at = np.zeros(B * T, dtype=np.int64)
            words_at[start] = nw
            words = words_at[pos]
        return Units(pos // T, pos % T, length[pos], words)

    # SpanBERT: spans in random order until the budget; the one that reaches it is cut to whole words.
    room = budget[:, None] - (np.cumsum(ls, axis=1) - ls)
    keep = (ls > 0) & (room > 0)
    pos, room = flat_order[keep], room[keep]
    first_at = np.zeros(B * T, dtype=np.int64)
    first_at[start] = first
    words_at = np.zeros(B * T, dtype=np.int64)
    words_at[start] = nw
    n, ln = words_at[pos], length[pos]
    cut = ln > room
    if cut.any():
        last = np.searchsorted(wend, pos[cut] + room[cut], side="right") - 1  # last word that fits
        n[cut] = last - first_at[pos[cut]] + 1
        ln[cut] = np.where(n[cut] > 0, wend[np.maximum(last, 0)] - pos[cut], 0)
    ok = n > 0
    return Units(pos[ok] // T, pos[ok] % T, ln[ok], n[ok])


def mask_batch(input_ids: np.ndarray, special: np.ndarray, word_starts: np.ndarray | None,
               rng: np.random.Generator, *, mask_prob: float = 0.15, max_predictions: int = 0,
               strategy: str = "token", mask_id: int, vocab_size: int,
               replace_probs: Sequence[float] = (0.8, 0.1, 0.1),
               ngram_probs: Sequence[float] = (0.4, 0.3, 0.2, 0.1), random_ids: np.ndarray | None = None,
               span_p: float = 0.2, span_max: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Mask a padded (B, T) batch. Returns (masked copy of input_ids, target): labels are input_ids[target].

    `special` (B, T) marks tokens never to mask ([CLS], [SEP], padding); `word_starts` (B, T) marks
    tokens that begin a word (None: every token is a word). Of the targets, replace_probs[0] become
    `mask_id`, replace_probs[1] a uniform draw from `random_ids` (default: all of 0..vocab_size-1), and
    the rest stay unchanged — decided per token, or per span for strategy "span".
    """
    input_ids = np.asarray(input_ids)
    B, T = input_ids.shape
    units = select_units(special, word_starts, rng, mask_prob=mask_prob, max_predictions=max_predictions,
                         strategy=strategy, ngram_probs=ngram_probs, span_p=span_p, span_max=span_max)
    total = int(units.length.sum())
    unit_of = np.repeat(np.arange(len(units.length)), units.length)
    within = np.arange(total) - np.repeat(np.cumsum(units.length) - units.length, units.length)
    pos = (units.row * T + units.start)[unit_of] + within  # flat positions of the targets

    target = np.zeros(B * T, dtype=bool)
    target[pos] = True
    masked = input_ids.copy()
    flat = masked.reshape(-1)
    u = rng.random(len(units.length))[unit_of] if strategy == "span" else rng.random(total)
    p_mask, p_rand = float(replace_probs[0]), float(replace_probs[1])
    flat[pos[u < p_mask]] = mask_id
    rand = pos[(u >= p_mask) & (u < p_mask + p_rand)]
    if rand.size:
        if random_ids is None:
            flat[rand] = rng.integers(0, vocab_size, size=rand.size)
        else:
            random_ids = np.asarray(random_ids)
            flat[rand] = random_ids[rng.integers(0, len(random_ids), size=rand.size)]
    return masked, target.reshape(B, T)


# ----------------------------------------------------------------------------- Chinese whole words

# BERT's _is_chinese_char blocks (CJK ideographs; not Japanese kana or Korean hangul).
_CJK = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
        "\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f")
_CHINESE = re.compile(f"[{_CJK}]+")


@functools.lru_cache(maxsize=None)
def _jieba():
    import jieba

    jieba.setLogLevel(60)  # jieba logs "Building prefix dict..." to stderr on first use
    jieba.initialize()
    return jieba


def chinese_word_starts(tokens: list[str]) -> np.ndarray:
    """Word starts for the token strings of one sentence, Chinese words found by jieba (HMM off).

    A token is a continuation (False) if it is a "##" piece or a Chinese token that begins inside a
    multi-character, all-Chinese jieba word; every other token starts a word. Use as word_starts for
    strategy "wwm" (Chinese-BERT-wwm).
    """
    pieces = [t[2:] if t.startswith("##") and len(t) > 2 else t for t in tokens]
    text = "".join(pieces)
    inside = np.zeros(len(text) + 1, dtype=bool)
    pos = 0
    for word in _jieba().lcut(text, HMM=False):
        if len(word) > 1 and _CHINESE.fullmatch(word):
            inside[pos + 1: pos + len(word)] = True
        pos += len(word)
    out = np.ones(len(tokens), dtype=bool)
    pos = 0
    for i, (tok, piece) in enumerate(zip(tokens, pieces)):
        if (tok.startswith("##") and len(tok) > 2) or (inside[pos] and _CHINESE.fullmatch(piece)):
            out[i] = False
        pos += len(piece)
    return out
