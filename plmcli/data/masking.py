"""Masked-LM targets for a whole batch at once: BERT's create_masked_lm_predictions, vectorised.

Per sequence the budget is `min(max_predictions or inf, max(1, round(n * mask_prob)))`: n is the length that
`counted` gives, [CLS]/[SEP] included (BERT's count), else the maskable tokens alone. Units — tokens, whole words,
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
  knowledge  ERNIE 1.0: the units `word_starts` gives (from `Lexicon.word_starts`: a lexicon match — a
         phrase or an entity — is one unit, other text whole words; or from `knowledge.AutoUnits`, the
         phrases or entities a tagger finds), 80/10/10 decided per unit.
  ngram_per_word  n-gram masking decided word by word: walk the words of each row in order; at
         each word, while the budget lasts, start a span there with probability p — n whole words, n drawn
         with `ngram_probs` (40/30/20/10), truncated to the words left before a special token and cut to
         the whole words that fit the budget —, mask it (80/10/10 per token) and continue after it; else
         move on to the next word. p = r / (E[n](1 - r) + r) for r = mask_prob, so that one walk's expected
         masked share of words, p·E[n] / (p·E[n] + 1 - p), is mask_prob (`ngram_start_prob` overrides it);
         a row left with budget walks again over its unmasked words, so it spends its budget as BERT does.
Deviation (ngram, span): instead of drawing a length at every random start and skipping overlaps,
each run of words between special tokens is cut into consecutive units whose lengths are drawn
i.i.d. (the last one from the distribution truncated to the words left, as ALBERT does at a sequence
end). Units never overlap, so the chosen units' lengths follow `ngram_probs` / the span pmf without
the bias toward short units that overlap rejection causes; adjacent units may still touch.

Chinese whole-word masking = "wwm" with the word starts of `chinese_word_starts` (jieba segmentation).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import re
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from plmcli.errors import PlmError, needs

STRATEGIES = ("token", "wwm", "ngram", "ngram_per_word", "span", "knowledge")
PER_UNIT = ("span", "knowledge")
"""Strategies whose 80/10/10 choice is made once per unit (SpanBERT, ERNIE); the others decide per token."""


class Units(NamedTuple):
    """The units chosen for masking, in no particular order (for tests and diagnostics)."""

    row: np.ndarray  # (U,) sequence of each unit
    start: np.ndarray  # (U,) column of its first token
    length: np.ndarray  # (U,) tokens
    words: np.ndarray  # (U,) whole words


def check_span(span_p: float, span_max: int, names: tuple[str, str] = ("span_p", "span_max")) -> None:
    """PlmError unless Geometric(span_p) truncated to 1..span_max is a distribution; `names` as the user wrote them."""
    p_name, max_name = names
    if not (isinstance(span_max, (int, np.integer)) and span_max >= 1):
        raise PlmError(f"{max_name} {span_max} must be a whole number of words ≥ 1",
                       f"use e.g. {max_name} 10 (SpanBERT: spans of at most 10 words)")
    if not 0 < span_p <= 1:
        raise PlmError(f"{p_name} {span_p} must be in (0, 1]: the success probability of the geometric span length",
                       f"use e.g. {p_name} 0.2 (SpanBERT: mean span 3.8 words)")


def check_ngram_probs(probs, name: str = "ngram_probs") -> None:
    """PlmError unless `probs` (P(n) for n = 1, 2, ...) is a distribution over n-gram lengths."""
    p = np.asarray(probs, dtype=float)
    if p.ndim != 1 or len(p) < 1 or (p < 0).any() or abs(p.sum() - 1) > 1e-6:
        raise PlmError(f"{name} {list(probs)} must be P(1-gram), P(2-gram), ... summing to 1",
                       f"e.g. {name} 0.4,0.3,0.2,0.1 (MacBERT) or 0.5455,0.2727,0.1818 (ALBERT: ∝ 1/n, n ≤ 3)")


def span_pmf(span_p: float = 0.2, span_max: int = 10) -> np.ndarray:
    """P(span of n words), n = 1..span_max: Geometric(span_p) truncated and renormalised (SpanBERT's code)."""
    check_span(span_p, span_max)
    pmf = span_p * (1 - span_p) ** np.arange(span_max)
    return pmf / pmf.sum()


def _budget(special: np.ndarray, mask_prob: float, max_predictions: int, counted=None) -> np.ndarray:
    """Each row's masked tokens: a share of `counted` (its length), else of its maskable tokens; never more than those."""
    n = (~special).sum(axis=1)
    budget = np.maximum(1, np.round((n if counted is None else np.asarray(counted)) * mask_prob)).astype(np.int64)
    np.minimum(budget, n, out=budget)
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
        return starts, starts + 1, brk.ravel()[starts]
    ws = valid & (np.asarray(word_starts, dtype=bool) | brk)
    # Every word ends at the next boundary: a word start or a special token (a row starts with one or the
    # other), or the batch end, which one extra flag marks.
    flags = np.empty(B * T + 1, dtype=bool)
    flags[:-1] = (ws | special).ravel()
    flags[-1] = True
    bound = np.flatnonzero(flags)
    k = np.flatnonzero(ws.ravel()[bound[:-1]])
    starts = bound[k]
    return starts, bound[k + 1], brk.ravel()[starts]


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


def _greedy(order: np.ndarray, length: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """BERT's pass over the units of each row in order: take a unit if it fits in what is left of the
    row's budget, else skip it. `order` (B, T): each row's columns in visiting order; `length` (B·T,):
    unit lengths at the units' first tokens, 0 elsewhere. Returns the flat positions taken. Exact; one
    numpy pass per overflow, not per unit.

    The pass is sequential in the columns, so it runs on the first few columns (where nearly every row
    spends its budget) and carries what is left over to the rest only for rows that still have room.
    """
    B, T = order.shape
    head = min(T, 2 * int(budget.max(initial=0)) + 8)
    row_start = (np.arange(B) * T)[:, None]
    flat = order[:, :head] + row_start
    left = budget.copy()
    pos = flat[_greedy_pass(length[flat], left)]
    rows = np.flatnonzero(left > 0) if head < T else ()
    if len(rows):
        flat = order[rows, head:] + row_start[rows]
        pos = np.concatenate([pos, flat[_greedy_pass(length[flat], left[rows])]])
    return pos


def _greedy_pass(lengths: np.ndarray, left: np.ndarray) -> np.ndarray:
    """_greedy over these columns, spending `left` (per row) in place."""
    chosen = np.zeros(lengths.shape, dtype=bool)
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


def _token_targets(special: np.ndarray, budget: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(B, T) bool: the `budget` maskable tokens of each row with the smallest random keys (a uniform
    sample without replacement). Only the budget-th smallest key is needed, so a partition, not a sort."""
    B, T = special.shape
    keys = rng.random((B, T), dtype=np.float32)  # half the bytes of float64 to draw and partition
    keys[special] = 2.0
    k = int(budget.max(initial=0))
    if k == 0:
        return np.zeros((B, T), dtype=bool)
    part = np.partition(keys, k - 1, axis=1)[:, :k]  # each row's k smallest keys, the k-th in its place
    if (budget == k).all():
        cutoff = part[:, k - 1]
    else:  # shorter rows have smaller budgets: order the k smallest to read their cutoff
        part.sort(axis=1)
        cutoff = part[np.arange(B), np.maximum(budget - 1, 0)]
    chosen = (keys <= cutoff[:, None]) & (budget > 0)[:, None]
    # float32 keys tie now and then (2^24 values); a tie at the cutoff would take one token too many.
    over = np.flatnonzero(chosen.sum(axis=1) > budget)
    for r in over.tolist():
        keep = np.argsort(keys[r], kind="stable")[: budget[r]]
        chosen[r] = False
        chosen[r, keep] = True
    return chosen


def start_prob(mask_prob: float, ngram_probs: Sequence[float]) -> float:
    """ngram_per_word's p: the walk starts a span at a word with probability p, so it masks a share
    p·E[n] / (p·E[n] + 1 - p) of the words; this p makes that share mask_prob."""
    pmf = np.asarray(ngram_probs, dtype=float)
    mean = float((np.arange(1, len(pmf) + 1) * pmf).sum() / pmf.sum())
    return mask_prob / (mean * (1 - mask_prob) + mask_prob)


def _walk(wstart, wend, run_first, T: int, budget: np.ndarray, pmf: np.ndarray, p: float,
          rng: np.random.Generator) -> Units:
    """ngram_per_word: the walk over the words (flat positions wstart/wend, in batch order) of every row.

    Sequential by nature (each decision waits for the last span's end), so a plain loop. A span is cut at
    its run's end and at a word already masked (n then comes from `pmf` truncated to the words there), and
    to the whole words that fit the row's budget. Rows whose walk ends with budget left, and a word that
    could still fit, walk again over their unmasked words with fresh draws, so a row spends its budget as
    with the other strategies (one pass would leave short rows often unmasked)."""
    W = len(wstart)
    cdf = np.cumsum(pmf / pmf.sum()).tolist()
    first = np.flatnonzero(run_first)
    stop = np.append(first[1:], W)[np.cumsum(run_first) - 1].tolist()  # each word's run ends before this word
    ws, we, row, left = wstart.tolist(), wend.tolist(), (wstart // T).tolist(), budget.tolist()
    masked = [False] * W
    units: list[tuple[int, int, int, int]] = []  # (row, flat start, tokens, words)
    todo = list(range(W))  # the words of the rows still walking (whole rows, so a row's words are adjacent)
    while todo:
        go, u = (rng.random(len(todo)) < p).tolist(), rng.random(len(todo)).tolist()
        k = 0
        while k < len(todo):
            i = todo[k]
            r = row[i]
            if go[k] and left[r] > 0 and not masked[i]:
                avail = 1
                while avail < len(cdf) and i + avail < stop[i] and not masked[i + avail]:
                    avail += 1
                n = min(avail, 1 + bisect.bisect_right(cdf, u[k] * cdf[avail - 1]))
                while n and we[i + n - 1] - ws[i] > left[r]:  # cut to the whole words that fit the budget
                    n -= 1
                if n:
                    units.append((r, ws[i], we[i + n - 1] - ws[i], n))
                    left[r] -= we[i + n - 1] - ws[i]
                    masked[i:i + n] = [True] * n
                    k += n  # skip past it
                    continue
            k += 1
        alive = {row[i] for i in todo if not masked[i] and we[i] - ws[i] <= left[row[i]]}
        todo = [i for i in todo if row[i] in alive]
    rows, starts, lens, words = np.asarray(units, dtype=np.int64).reshape(-1, 4).T
    return Units(rows, starts % T, lens, words)


def select_units(special: np.ndarray, word_starts: np.ndarray | None, rng: np.random.Generator, *,
                 mask_prob: float = 0.15, max_predictions: int = 0, strategy: str = "token",
                 ngram_probs: Sequence[float] = (0.4, 0.3, 0.2, 0.1), span_p: float = 0.2,
                 span_max: int = 10, ngram_start_prob: float | None = None, counted=None) -> Units:
    """Choose the units to predict in each row of a (B, T) batch; see the module docstring. `counted` (B,): the
    lengths the budgets are a share of (None: the maskable tokens); `ngram_start_prob` None: derived (start_prob)."""
    if strategy not in STRATEGIES:
        raise PlmError(f"unknown masking strategy '{strategy}'", f"use one of: {', '.join(STRATEGIES)}")
    if not 0 < mask_prob < 1:
        raise PlmError(f"mask_prob must be in (0, 1), got {mask_prob}", "use e.g. 0.15")
    special = np.asarray(special, dtype=bool)
    B, T = special.shape
    budget = _budget(special, mask_prob, max_predictions, counted)
    if strategy == "token":
        rows, cols = np.nonzero(_token_targets(special, budget, rng))
        ones = np.ones(len(rows), dtype=np.int64)
        return Units(rows, cols, ones, ones)
    wstart, wend, run_first = _words(special, word_starts)
    if strategy == "ngram_per_word":
        check_ngram_probs(ngram_probs)
        if ngram_start_prob is not None and not 0 < ngram_start_prob <= 1:  # 1: a span at every word
            raise PlmError(f"ngram_start_prob {ngram_start_prob} must be in (0, 1] (None: derived from mask_prob)",
                           "leave it out, or give the probability of starting a span at a word")
        p = start_prob(mask_prob, ngram_probs) if ngram_start_prob is None else ngram_start_prob
        return _walk(wstart, wend, run_first, T, budget, np.asarray(ngram_probs, dtype=float), p, rng)

    if strategy in ("wwm", "knowledge"):  # one word per unit
        first, nw = None, None
        start, unit_len = wstart, wend - wstart
    else:
        pmf = np.asarray(ngram_probs if strategy == "ngram" else span_pmf(span_p, span_max), dtype=float)
        if pmf.ndim != 1 or len(pmf) == 0 or (pmf < 0).any() or pmf.sum() <= 0:
            raise PlmError(f"bad unit-length probabilities {pmf.tolist()}", "give non-negative weights for n = 1, 2, ...")
        first, nw = _tiles(run_first, np.cumsum(pmf / pmf.sum()), rng)
        start = wstart[first]  # flat position of each unit's first token (units never overlap)
        unit_len = wend[first + nw - 1] - start
    length = np.zeros(B * T, dtype=np.int64)
    length[start] = unit_len

    # Each row's units in random order: sort random keys per row, non-units (inf) last.
    keys = np.full(B * T, np.inf)
    keys[start] = rng.random(len(start))
    order = np.argsort(keys.reshape(B, T), axis=1)

    if strategy != "span":
        pos = _greedy(order, length, budget)
        words = np.ones(len(pos), dtype=np.int64)
        if strategy == "ngram":
            words_at = np.zeros(B * T, dtype=np.int64)
            words_at[start] = nw
            words = words_at[pos]
        return Units(pos // T, pos % T, length[pos], words)

    # SpanBERT: spans in random order until the budget; the one that reaches it is cut to whole words.
    flat_order = order + (np.arange(B) * T)[:, None]  # (B, T) flat position of the k-th unit of each row
    ls = length[flat_order]
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
               span_p: float = 0.2, span_max: int = 10, ngram_start_prob: float | None = None,
               counted=None) -> tuple[np.ndarray, np.ndarray]:
    """Mask a padded (B, T) batch. Returns (masked copy of input_ids, target): labels are input_ids[target].

    `special` (B, T) marks tokens never to mask ([CLS], [SEP], padding); `word_starts` (B, T) marks
    tokens that begin a word (None: every token is a word). Of the targets, replace_probs[0] become
    `mask_id`, replace_probs[1] a uniform draw from `random_ids` (default: all of 0..vocab_size-1), and
    the rest stay unchanged — decided per token, or per unit for the PER_UNIT strategies. `counted` (B,): the
    lengths each row's budget is a share of ([CLS]/[SEP] included: BERT's count); None: its maskable tokens.
    """
    input_ids = np.asarray(input_ids)
    B, T = input_ids.shape
    if strategy == "token":  # one-token units: the targets straight from the keys, no unit bookkeeping
        if not 0 < mask_prob < 1:
            raise PlmError(f"mask_prob must be in (0, 1), got {mask_prob}", "use e.g. 0.15")
        special = np.asarray(special, dtype=bool)
        target = _token_targets(special, _budget(special, mask_prob, max_predictions, counted), rng)
        pos = np.flatnonzero(target)
        return _replace(input_ids, pos, rng.random(len(pos)), rng, mask_id, vocab_size, replace_probs, random_ids), target
    units = select_units(special, word_starts, rng, mask_prob=mask_prob, max_predictions=max_predictions,
                         strategy=strategy, ngram_probs=ngram_probs, span_p=span_p, span_max=span_max,
                         ngram_start_prob=ngram_start_prob, counted=counted)
    total = int(units.length.sum())
    unit_of = np.repeat(np.arange(len(units.length)), units.length)
    within = np.arange(total) - np.repeat(np.cumsum(units.length) - units.length, units.length)
    pos = (units.row * T + units.start)[unit_of] + within  # flat positions of the targets

    target = np.zeros(B * T, dtype=bool)
    target[pos] = True
    u = rng.random(len(units.length))[unit_of] if strategy in PER_UNIT else rng.random(total)
    return _replace(input_ids, pos, u, rng, mask_id, vocab_size, replace_probs, random_ids), target.reshape(B, T)


def _replace(input_ids, pos, u, rng, mask_id, vocab_size, replace_probs, random_ids) -> np.ndarray:
    """A copy of input_ids with the targets at flat `pos` replaced: [MASK] where u < p_mask, a random
    token where p_mask <= u < p_mask + p_rand, else unchanged."""
    masked = input_ids.copy()
    flat = masked.reshape(-1)
    p_mask, p_rand = float(replace_probs[0]), float(replace_probs[1])
    flat[pos[u < p_mask]] = mask_id
    rand = pos[(u >= p_mask) & (u < p_mask + p_rand)]
    if rand.size:
        if random_ids is None:
            flat[rand] = rng.integers(0, vocab_size, size=rand.size)
        else:
            random_ids = np.asarray(random_ids)
            flat[rand] = random_ids[rng.integers(0, len(random_ids), size=rand.size)]
    return masked


# ----------------------------------------------------------------------------- Chinese whole words

# BERT's _is_chinese_char blocks (CJK ideographs; not Japanese kana or Korean hangul).
_CJK = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
        "\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f")
_CHINESE = re.compile(f"[{_CJK}]+")


ZH_FEATURE = "Chinese word segmentation (tokenizer.segment=jieba, whole-word masking, ERNIE units)"
"""What jieba is for, in the error naming the zh extra when it is missing (errors.needs)."""


@functools.lru_cache(maxsize=None)
def load_jieba():
    """jieba, initialised and quiet (it logs "Building prefix dict..." to stderr on first use)."""
    jieba = needs("jieba", "zh", ZH_FEATURE)

    jieba.setLogLevel(60)
    jieba.initialize()
    return jieba


def is_chinese(text: str) -> bool:
    """Whether `text` is all Chinese characters (BERT's CJK blocks)."""
    return _CHINESE.fullmatch(text) is not None


def jieba_word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the multi-character, all-Chinese jieba words of `text` (HMM off)."""
    spans, pos = [], 0
    for word in load_jieba().lcut(text, HMM=False):
        if len(word) > 1 and is_chinese(word):
            spans.append((pos, pos + len(word)))
        pos += len(word)
    return spans


def chinese_span_starts(tokens: list[str], find_spans) -> np.ndarray:
    """Word starts for the token strings of one sentence whose words `find_spans(text)` gives as character
    spans [start, end) of the tokens' text ("##" stripped, joined).

    A token is a continuation (False) if it is a "##" piece or a Chinese token that begins strictly inside
    a span; every other token starts a word. The one mapping from character spans onto tokens, for jieba's
    words (chinese-wwm) and for ERNIE's units found by a tagger (data/knowledge.py).
    """
    pieces = [t[2:] if t.startswith("##") and len(t) > 2 else t for t in tokens]
    text = "".join(pieces)
    inside = np.zeros(len(text) + 1, dtype=bool)
    for s, e in find_spans(text):
        inside[s + 1: e] = True
    out = np.ones(len(tokens), dtype=bool)
    pos = 0
    for i, (tok, piece) in enumerate(zip(tokens, pieces)):
        if (tok.startswith("##") and len(tok) > 2) or (inside[pos] and is_chinese(piece)):
            out[i] = False
        pos += len(piece)
    return out


def chinese_word_starts(tokens: list[str]) -> np.ndarray:
    """Word starts for the token strings of one sentence, Chinese words found by jieba (HMM off).

    A token is a continuation (False) if it is a "##" piece or a Chinese token that begins inside a
    multi-character, all-Chinese jieba word; every other token starts a word. Use as word_starts for
    strategy "wwm" (Chinese-BERT-wwm).
    """
    return chinese_span_starts(tokens, jieba_word_spans)


# ----------------------------------------------------------------------------- ERNIE knowledge masking


def resolve_lexicon(path: str | Path) -> Path:
    """A lexicon file: `path` as given, else the sample of that name shipped in plmcli/corpus/ (recipes name those)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    from plmcli.config import shipped_sample

    shipped = shipped_sample(str(path))
    if p.name == str(path) and shipped.is_file():
        return shipped
    raise PlmError(f"lexicon file '{path}' does not exist",
                   "pass a text file with one phrase or entity per line (e.g. chinese-sample-entities.txt, shipped)")


def read_lexicon(path: str | Path) -> list[str]:
    """The entries of a lexicon file: one phrase or entity per line; text after a TAB (a tag, a count) is
    ignored, and so are blank lines and lines starting with '#'. PlmError when there are none."""
    p = resolve_lexicon(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PlmError(f"cannot read lexicon file '{path}' ({e.__class__.__name__})", "give a UTF-8 text file") from None
    entries = [e for e in (line.split("\t", 1)[0].strip() for line in lines) if e and not e.startswith("#")]
    if not entries:
        raise PlmError(f"lexicon file '{path}' has no usable lines",
                       "write one phrase or entity per line (text after a TAB is ignored)")
    return entries


def lexicon_key(path: str | Path) -> str:
    """A digest of a lexicon's entries: what cached data built with it depends on (not its path)."""
    return hashlib.sha256("\n".join(sorted(set(read_lexicon(path)))).encode("utf-8")).hexdigest()


class Lexicon:
    """Phrases and entities as token sequences of one tokenizer, found in text longest match first.

    An entry matches where its tokens *and* its word boundaries appear, starting and ending on whole
    words: "york" never matches the start of "yorkshire". Each entry is encoded with and without a
    leading space, so byte-level BPE finds it mid-sentence too. Entries holding the unknown token are
    dropped (they would match any unknown text).
    """

    def __init__(self, entries: list[str], tokenizer, unk_id: int | None = None):
        variants = list(dict.fromkeys(entries + [" " + e for e in entries]))
        by_len: dict[int, set] = {}
        for enc in tokenizer.encode_batch(variants, add_special_tokens=False):
            ids = enc.ids
            if not ids or (unk_id is not None and unk_id in ids):
                continue
            w = enc.word_ids
            by_len.setdefault(len(ids), set()).add(tuple(2 * i + (k == 0 or w[k] != w[k - 1]) for k, i in enumerate(ids)))
        if not by_len:
            raise PlmError("no lexicon entry is made of known tokens of the corpus's tokenizer",
                           "check that the lexicon is in the corpus's language (and its vocabulary covers it)")
        self.lengths = sorted(by_len, reverse=True)
        # Odd random multipliers, one per position in an entry (fixed seed: hashes are the same in every process).
        self._mult = np.random.default_rng(0).integers(1, 2**63, size=self.lengths[0], dtype=np.uint64) * 2 + 1
        self._hash, self._rows = {}, {}  # per entry length: sorted hashes, and the entries in that order
        for L, keys in by_len.items():
            rows = np.array(sorted(keys), dtype=np.int64)
            h = self._hashes(rows)
            order = np.argsort(h, kind="stable")
            self._hash[L], self._rows[L] = h[order], rows[order]

    @classmethod
    def load(cls, path: str | Path, tokenizer, unk_id: int | None = None) -> "Lexicon":
        return cls(read_lexicon(path), tokenizer, unk_id)

    def _hashes(self, rows: np.ndarray) -> np.ndarray:
        # Multiply-and-add hash with uint64 wraparound; every hit is checked against the entry itself.
        with np.errstate(over="ignore"):
            return (rows.astype(np.uint64) * self._mult[: rows.shape[1]]).sum(axis=1, dtype=np.uint64)

    def matches(self, ids: np.ndarray, word_starts: np.ndarray, sentence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Non-overlapping matches in flat tokens: (starts, lengths). `sentence` (n,) numbers the sentence of
        each token; no match crosses one. Overlaps go to the longer match, then to the one further left."""
        n = len(ids)
        ws = np.append(np.asarray(word_starts, dtype=bool), True)
        sentence = np.append(np.asarray(sentence), -1)
        keys = 2 * np.asarray(ids, dtype=np.int64) + ws[:n]
        found_s, found_l = [], []
        for L in self.lengths:
            if L > n:
                continue
            i = np.flatnonzero(ws[: n - L + 1])
            i = i[ws[i + L] & (sentence[i] == sentence[i + L - 1])]  # whole words, inside one sentence
            if not len(i):
                continue
            win = keys[i[:, None] + np.arange(L)]
            h = self._hashes(win)
            k = np.minimum(np.searchsorted(self._hash[L], h), len(self._hash[L]) - 1)
            hit = self._hash[L][k] == h
            hit[hit] = (self._rows[L][k[hit]] == win[hit]).all(axis=1)
            found_s.append(i[hit])
            found_l.append(np.full(int(hit.sum()), L))
        if not found_s:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        starts, lengths = np.concatenate(found_s), np.concatenate(found_l)
        taken = np.zeros(n, dtype=bool)
        keep = np.zeros(len(starts), dtype=bool)
        for j in np.lexsort((starts, -lengths)):  # longest first, then leftmost
            s, e = starts[j], starts[j] + lengths[j]
            if not taken[s:e].any():
                taken[s:e] = keep[j] = True
        order = np.argsort(starts[keep])
        return starts[keep][order], lengths[keep][order]

    def word_starts(self, ids, word_starts, sentence_starts, tokens: list[str] | None = None) -> np.ndarray:
        """ERNIE's masking units for one document as word starts: every lexicon match is one unit, other
        text keeps its words — with `tokens` (the token strings), Chinese text is cut into jieba words
        (`chinese_word_starts`) instead of single characters.

        ids, word_starts (n,): the document's tokens and their words; sentence_starts: offsets of its lines.
        """
        n = len(ids)
        base = np.asarray(word_starts, dtype=bool)
        sentence = np.zeros(n + 1, dtype=np.int64)
        np.add.at(sentence, np.clip(np.asarray(sentence_starts[1:], dtype=np.int64), 0, n), 1)
        sentence = np.cumsum(sentence)[:n]
        starts, lengths = self.matches(ids, base, sentence)
        out = base.copy()
        if tokens is not None:
            bounds = list(sentence_starts) + [n]
            for s, e in zip(bounds[:-1], bounds[1:]):
                if e > s and _CHINESE.search("".join(tokens[s:e])):
                    out[s:e] &= chinese_word_starts(tokens[s:e])
        ends = starts + lengths
        out[starts] = True
        out[ends[ends < n]] = True  # a jieba word running out of a match starts a unit of its own
        inside = np.zeros(n + 1, dtype=np.int64)
        np.add.at(inside, starts + 1, 1)
        np.add.at(inside, ends, -1)
        out[np.cumsum(inside)[:n] > 0] = False
        return out
