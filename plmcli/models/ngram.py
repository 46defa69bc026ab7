"""N-gram language models fitted by counting: add-λ (Lidstone) and interpolated modified Kneser-Ney.

Conventions (the same for fit, eval-ppl and export):
- words are the recipe tokenizer's tokens (recipes use the `word` tokenizer: whitespace-separated words);
- each line is a sentence, left-padded with N-1 `<s>` and ended with `</s>`; `</s>` is predicted, `<s>` never;
- V = the training types (seen ≥ min_count times) + `</s>` + `<unk>` (not `<s>`); rarer training words and
  words never seen in training read as `<unk>`;
- c(h) = Σ_w c(h, w) over the tokens that follow h; perplexity is over every predicted token, `</s>` included.

add-k        P(w|h) = (c(h,w) + λ) / (c(h) + λ|V|), h = the N-1 previous tokens (an unseen h gives 1/|V|).
  λ = 0 is the unsmoothed maximum-likelihood estimate P(w|h) = c(h,w)/c(h): an n-gram never seen has
  probability 0, and so has every word after a history never seen (0/0: the counts say nothing there; NLTK's
  MLE scores it 0 too). Nothing is smoothed: eval-ppl reports perplexity inf and counts the zero-probability
  tokens, generation refuses a prompt whose context was never seen, and ARPA writes log10 0 as -99.
kneser-ney   P_n(w|h) = max(c'(hw) − D_n(c'(hw)), 0) / c'(h) + γ(h)·P_{n-1}(w|h⁻),  P_0(w) = 1/|V|
             γ(h) = (D1·N1(h•) + D2·N2(h•) + D3+·N3+(h•)) / c'(h)      (Chen & Goodman 1998, interpolated)
  c' is the raw count at the top order and the continuation count N1+(•g) below it, except for n-grams that
  start with <s>: nothing real precedes them, so they keep raw counts (as SRILM and KenLM do). D1, D2, D3+ of
  order n come from the count-of-counts n1..n4 of c' at that order. A history never seen (c'(h) = 0) backs
  off: P_n(w|h) = P_{n-1}(w|h⁻).
Sentence starts: only <s> precedes <s>, so `<s> <s> r` has exactly the counts of `<s> r`. Lest the padding count
the same statistics at several orders, a history that starts with two <s> reads as the one-<s> history:
P(w | <s> <s> r) = P(w | <s> r). Add-λ is unchanged by this (equal counts); Kneser-Ney becomes the single-<s>
model of SRILM and KenLM (KN5 on PTB: test ppl 141.2, the figure Mikolov et al. report).
Both smoothings are one recursion α(hw) + γ(h)·P_lower: add-λ has α = c(hw)/(c(h)+λ|V|), γ(h) = λ|V|/(c(h)+λ|V|)
over a uniform lower order, so one scorer and one ARPA writer serve both.

Storage: the n-grams of order n sit in one sorted int64 array, a reversed trie: key(w1..wn) = row(w2..wn)·B + w1,
with row(·) the suffix's index in the order below and B = |V| + 1. Keys stay far below 2^63 whatever the order
and vocabulary. Order n holds every n-gram that ends at a predicted token or serves as a history; counting is
one np.unique per order over the padded token array (PTB train, order 5: about a second).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from plmcli.config_schema import Count
from plmcli.errors import PlmError
from plmcli.models.base import LanguageModel, Traits

SMOOTHINGS = ("add-k", "kneser-ney")
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)
"""Used for an order whose count-of-counts cannot give D1 < 1 < ... (a tiny corpus), as KenLM's discount_fallback option."""
UNK, EOS = 0, 1  # n-gram ids; words follow, and <s> = |V| (never predicted, so V stays 0..|V|-1)
WEIGHTS = "model.npz"


@dataclass
class NGramConfig:
    order: int = 3
    """N: each word is predicted from the N-1 words before it (≥ 1)."""
    smoothing: Literal[SMOOTHINGS] = "kneser-ney"
    """add-k (Lidstone: (c(h,w)+k)/(c(h)+k|V|)) | kneser-ney (interpolated modified KN, Chen & Goodman 1998)."""
    k: float = 1.0
    """λ of add-k smoothing (≥ 0): 1 is Laplace's add-one; 0 the unsmoothed maximum-likelihood estimate
    c(h,w)/c(h), under which unseen events have probability 0."""
    min_count: int = 1
    """Training words seen fewer times than this become <unk> (≥ 1; 1 keeps every word)."""
    vocab_size: Count = 0
    """The tokenizer's size, filled in from it; the model's own vocabulary V comes from the training counts."""

    def __post_init__(self):
        if not isinstance(self.order, int) or self.order < 1:
            raise PlmError(f"model.order {self.order} must be an integer ≥ 1", "e.g. --set model.order=3 (1 = unigram)")
        if self.smoothing not in SMOOTHINGS:
            raise PlmError(f"model.smoothing '{self.smoothing}' is not one of {', '.join(SMOOTHINGS)}",
                           "e.g. --set model.smoothing=kneser-ney")
        if not self.k >= 0:
            raise PlmError(f"model.k {self.k} must be ≥ 0 (λ of add-λ; 0 = unsmoothed maximum likelihood)",
                           "e.g. --set model.k=0.1")
        if not isinstance(self.min_count, int) or self.min_count < 1:
            raise PlmError(f"model.min_count {self.min_count} must be an integer ≥ 1", "e.g. --set model.min_count=2")


def kn_discounts(counts: np.ndarray) -> tuple[tuple[float, float, float], bool]:
    """Chen & Goodman's D1, D2, D3+ from the count-of-counts n1..n4 of `counts`; (fallback, True) if undefined."""
    n1, n2, n3, n4 = (int(np.count_nonzero(counts == i)) for i in (1, 2, 3, 4))
    if min(n1, n2, n3, n4) == 0:
        return FALLBACK_DISCOUNTS, True
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < di <= i + 1 for i, di in enumerate(d)):  # D_i outside (0, i]: probabilities would break
        return FALLBACK_DISCOUNTS, True
    return d, False


class NGramLM(LanguageModel):
    """An n-gram LM: no parameters, no gradient; `fit` counts, `score` scores sentences (eval-ppl: plmcli.eval.counts)."""

    traits = Traits(causal=True, counts=True, scoring="counts")
    Config = NGramConfig
    tiny = ("data.val_fraction=0.2",)  # counting is cheap at any order; hold out enough of a tiny corpus to score

    def __init__(self, cfg: NGramConfig):
        super().__init__()
        self.cfg = cfg
        self.words: list[str] = []  # n-gram id -> string; ids 0..V-1 are V, id V is <s>
        self.tok_map = np.zeros(0, dtype=np.int64)  # tokenizer id -> n-gram id
        self.keys: list[np.ndarray] = []  # keys[n]: sorted trie keys of order n (keys[0] unused)
        self.count: list[np.ndarray] = []  # count[n]: c' of each order-n entry (0: a history only)
        self.denom: list[np.ndarray] = []  # denom[n]: c'(h)-based denominator of each order-n entry as a history; 0 = unseen
        self.gamma: list[np.ndarray] = []  # gamma[n]: its back-off weight γ(h)
        self.discount = np.zeros((cfg.order + 1, 4))  # discount[n, min(c, 3)], discount[n, 0] = 0
        self.fallback: list[int] = []  # orders whose discounts fell back to FALLBACK_DISCOUNTS

    # ------------------------------------------------------------ vocabulary

    @property
    def vocab_size(self) -> int:
        """|V| (with </s> and <unk>, without <s>)."""
        return len(self.words) - 1

    @property
    def bos(self) -> int:
        return len(self.words) - 1

    @property
    def unsmoothed(self) -> bool:
        """add-λ with λ = 0: the maximum-likelihood estimate, where unseen events have probability 0."""
        return self.cfg.smoothing == "add-k" and self.cfg.k == 0

    @functools.cached_property
    def word_index(self) -> dict[str, int]:
        """word -> id, built on the first lookup (generation prompts, ARPA export), not for every fit."""
        return {w: i for i, w in enumerate(self.words)}

    def word_id(self, word: str) -> int:
        return self.word_index.get(word, UNK)

    def _build_vocab(self, counts: np.ndarray, names: list[str], unk_id: int | None) -> None:
        """V from training counts over source ids (tokenizer ids): those seen ≥ min_count times become words."""
        specials = {"<s>", "</s>", "<unk>"}  # a literal marker in the text must not alias the model's own
        keep = [i for i in np.flatnonzero(counts >= self.cfg.min_count) if i != unk_id and names[i] not in specials]
        self.words = ["<unk>", "</s>"] + [names[i] for i in keep] + ["<s>"]
        self.tok_map = np.full(len(counts), UNK, dtype=np.int64)
        self.tok_map[np.asarray(keep, dtype=np.int64)] = np.arange(2, 2 + len(keep))
        self.__dict__.pop("word_index", None)

    def to_ids(self, token_ids) -> np.ndarray:
        """Tokenizer ids -> n-gram ids (ids outside V -> <unk>)."""
        t = np.asarray(token_ids, dtype=np.int64)
        ok = (t >= 0) & (t < len(self.tok_map))
        return np.where(ok, self.tok_map[np.where(ok, t, 0)], UNK)

    # ------------------------------------------------------------ counting

    def _pad(self, words: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sentences -> one flat array, each `<s>`*(N-1) + words + `</s>`; also each position's offset in its sentence."""
        N, L = self.cfg.order, lengths + self.cfg.order
        starts = np.cumsum(L) - L
        flat = np.full(int(L.sum()), self.bos, dtype=np.int64)
        wstart = np.cumsum(lengths) - lengths
        flat[np.repeat(starts + N - 1 - wstart, lengths) + np.arange(len(words))] = words
        flat[starts + N - 1 + lengths] = EOS
        return flat, np.arange(len(flat)) - np.repeat(starts, L)

    def _count(self, words: np.ndarray, lengths: np.ndarray) -> None:
        N, B = self.cfg.order, len(self.words)
        flat, offset = self._pad(words, lengths)
        pred = flat != self.bos  # the predicted positions: every word and </s>
        rows = np.zeros(len(flat), dtype=np.int64)  # order 0: every position ends the empty n-gram, row 0
        self.keys, raw, prefix = [np.zeros(1, dtype=np.int64)], [np.array([int(pred.sum())])], [None]
        for n in range(1, N + 1):
            valid = offset >= n - 1  # the window of n tokens ending here stays inside its sentence
            at = np.flatnonzero(valid)
            if len(self.keys[-1]) * B >= 2**62:
                raise PlmError(f"too many distinct {n - 1}-grams to index", "lower model.order or raise model.min_count")
            uniq, inv = np.unique(rows[at] * B + flat[at - (n - 1)], return_inverse=True)
            new = np.full(len(flat), -1, dtype=np.int64)
            new[at] = inv
            p = np.flatnonzero(pred)
            pre = np.zeros(len(uniq), dtype=np.int64)  # the row of each n-gram's history (n-1 tokens) one order down
            pre[new[p]] = rows[p - 1]  # order 0 (n = 1): row 0, the empty history
            self.keys.append(uniq)
            raw.append(np.bincount(new[p], minlength=len(uniq)))
            prefix.append(pre)
            rows = new
        self._estimate(raw, prefix)

    def _estimate(self, raw: list[np.ndarray], prefix: list) -> None:
        """Counts -> the per-order tables the scorer reads: count c', denom and γ per history, discounts."""
        N, B, V = self.cfg.order, len(self.words), self.vocab_size
        kn = self.cfg.smoothing == "kneser-ney"
        self.count = [raw[0]] + [None] * N
        self.count[N] = raw[N]
        for n in range(N - 1, 0, -1):
            if not kn:
                self.count[n] = raw[n]
                continue
            above = self.keys[n + 1][raw[n + 1] > 0]
            cont = np.bincount(above // B, minlength=len(self.keys[n]))  # N1+(•g): distinct left neighbours
            self.count[n] = np.where(self.keys[n] % B == self.bos, raw[n], cont)
        starts = [np.zeros(1, dtype=bool)] + [k % B == self.bos for k in self.keys[1:]]  # entries starting with <s>
        for n in range(2, N + 1):
            # `<s> <s> …` repeats the statistics of `<s> …` one order down: drop it, and a history that starts
            # with two <s> is then unseen and backs off to the one-<s> history with the same counts.
            self.count[n] = np.where(starts[n] & starts[n - 1][self.keys[n] // B], 0, self.count[n])
        self.discount = np.zeros((N + 1, 4))
        self.fallback = []
        self.denom, self.gamma = [], []
        for n in range(1, N + 1):
            c = self.count[n]
            if kn:
                d, fell_back = kn_discounts(c)
                self.discount[n, 1:] = d
                if fell_back:
                    self.fallback.append(n)
            seen = c > 0
            h, cs = prefix[n][seen], c[seen]
            total = np.bincount(h, weights=cs, minlength=len(self.keys[n - 1])).astype(float)
            if kn:
                gnum = np.bincount(h, weights=self.discount[n, np.minimum(cs, 3)], minlength=len(total))
                denom, gamma = total, np.divide(gnum, total, out=np.zeros_like(total), where=total > 0)
            else:  # add-λ: one interpolation with the uniform distribution, at the top order or at `<s> …`
                active = (total > 0) & (starts[n - 1] | (n == N))
                denom = np.where(active, total + self.cfg.k * V, 0.0)
                gamma = np.divide(self.cfg.k * V, denom, out=np.zeros_like(denom), where=active)
            self.denom.append(denom)
            self.gamma.append(gamma)

    # ------------------------------------------------------------ scoring

    def _rows(self, grams: np.ndarray) -> list[np.ndarray]:
        """(M, m) n-gram ids -> for k = 0..m, the table row of each one's last k tokens (-1 where unseen)."""
        M, m = grams.shape
        B = len(self.words)
        out = [np.zeros(M, dtype=np.int64)]
        cur, ok = out[0].copy(), np.ones(M, dtype=bool)
        for k in range(1, m + 1):
            keys = self.keys[k]
            key = cur * B + grams[:, m - k]
            pos = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
            ok &= keys[pos] == key
            cur = np.where(ok, pos, 0)
            out.append(np.where(ok, pos, -1))
        return out

    def _prob(self, grams: np.ndarray) -> np.ndarray:
        """P_m(w | h) for each row h + [w] of an (M, m) matrix, m ≤ N: the interpolation from order 1 up to m."""
        grams = np.asarray(grams, dtype=np.int64)
        g, h = self._rows(grams), self._rows(grams[:, :-1])
        # The order below order 1: uniform, except under maximum likelihood, which has nothing below its counts.
        p = np.full(len(grams), 0.0 if self.unsmoothed else 1.0 / self.vocab_size)
        for n in range(1, grams.shape[1] + 1):
            hid = np.maximum(h[n - 1], 0)
            den = np.where(h[n - 1] >= 0, self.denom[n - 1][hid], 0.0)
            c = np.where(g[n] >= 0, self.count[n][np.maximum(g[n], 0)], 0)
            alpha = (c - self.discount[n, np.minimum(c, 3)]) / np.where(den > 0, den, 1.0)
            p = np.where(den > 0, alpha + self.gamma[n - 1][hid] * p, p)
        return p

    def _history(self, history) -> np.ndarray:
        N = self.cfg.order
        h = [int(x) for x in history][-(N - 1):] if N > 1 else []
        if any(not 0 <= x <= self.bos for x in h):
            raise ValueError(f"history ids must be n-gram ids in 0..{self.bos} (see word_id), got {h}")
        return np.array([self.bos] * (N - 1 - len(h)) + h, dtype=np.int64)

    def logprobs(self, history) -> np.ndarray:
        """log P(w | history) for every w in V (ids 0..|V|-1); a history shorter than N-1 is padded with <s>."""
        V = self.vocab_size
        grams = np.concatenate([np.tile(self._history(history), (V, 1)), np.arange(V)[:, None]], axis=1)
        with np.errstate(divide="ignore"):  # log 0 = -inf: an event the unsmoothed model never saw
            return np.log(self._prob(grams))

    def prob(self, history_ids, word_id: int) -> float:
        """P(word | history) with n-gram ids (see `word_id`); a short history is padded with <s>."""
        if not 0 <= word_id < self.vocab_size:
            raise ValueError(f"word_id must be in 0..{self.vocab_size - 1} (<s> is never predicted), got {word_id}")
        return float(self._prob(np.append(self._history(history_ids), word_id)[None])[0])

    def score(self, words: np.ndarray, lengths: np.ndarray, chunk: int = 1 << 18) -> tuple[float, int, int]:
        """(summed NLL in nats, predicted tokens, of which <unk>) of sentences given as n-gram ids; the NLL is
        inf when a token has probability 0 (see `score_parts`)."""
        nll, n, oov, zero = self.score_parts(words, lengths, chunk)
        return (math.inf if zero else nll), n, oov

    def score_parts(self, words: np.ndarray, lengths: np.ndarray, chunk: int = 1 << 18) -> tuple[float, int, int, int]:
        """(summed NLL in nats of the tokens with P > 0, predicted tokens, of which <unk>, of which P = 0)."""
        N = self.cfg.order
        flat, _ = self._pad(np.asarray(words, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        ends = np.flatnonzero(flat != self.bos)
        windows = np.lib.stride_tricks.sliding_window_view(flat, N)
        nll, zero = 0.0, 0
        for i in range(0, len(ends), chunk):
            p = self._prob(windows[ends[i:i + chunk] - (N - 1)])
            seen = p > 0
            zero += int(len(p) - np.count_nonzero(seen))
            nll -= float(np.log(p[seen]).sum())
        return nll, len(ends), int(np.count_nonzero(flat[ends] == UNK)), zero

    def generation_session(self, prompts: list[list[int]]) -> "NGramSession":
        """`plm generate`'s decoding session (see plmcli.generate) over prompts given as tokenizer ids."""
        return NGramSession(self, [self.to_ids(p).tolist() for p in prompts])

    # ------------------------------------------------------------ fit / save / load

    def fit(self, data_dir, recipe, run_dir, console=None) -> dict:
        """Count the train split of a `plm tokenize` dir, write RUN/model.npz, score the validation split."""
        from plmcli.data.tokenizers import load_tokenizer

        started = time.monotonic()
        tok = load_tokenizer(Path(data_dir) / "tokenizer.json")
        from plmcli.data.store import load_meta

        unk = load_meta(data_dir)["tokenizer"]["special_token_ids"].get("unk")
        ids, lengths = read_sentences(data_dir, "train")
        if len(lengths) == 0:
            raise PlmError(f"the train split of {data_dir} has no sentences", "add text (one sentence per line)")
        names = [""] * tok.get_vocab_size()
        for t, i in tok.get_vocab().items():
            names[i] = t
        self._build_vocab(np.bincount(ids, minlength=len(names)), names, unk)
        t0 = time.monotonic()
        self._count(self.to_ids(ids), lengths)
        count_s = time.monotonic() - t0
        self.save(run_dir)
        summary = {"steps": 0, "tokens": int(lengths.sum() + len(lengths)), "sentences": int(len(lengths)),
                   "vocab": self.vocab_size, "ngrams": [int((c > 0).sum()) for c in self.count[1:]],
                   "count_s": round(count_s, 3), "stop_reason": "fit"}
        if self.cfg.smoothing == "kneser-ney":
            summary["discounts"] = self.discount[1:, 1:].round(6).tolist()
            if self.fallback:
                summary["discount_fallback"] = self.fallback
        v_ids, v_len = read_sentences(data_dir, "validation")
        if len(v_len):
            nll, n, oov, zero = self.score_parts(self.to_ids(v_ids), v_len)
            loss = math.inf if zero else nll / n
            summary.update(val_loss=loss, val_ppl=math.exp(loss), val_oov_rate=oov_rate(oov, n, len(v_len)))
            if self.unsmoothed:
                summary["val_zero_prob_tokens"] = zero
        summary["elapsed_s"] = time.monotonic() - started
        if console is not None:
            grams = " ".join(f"{i + 1}:{c:,}" for i, c in enumerate(summary["ngrams"]))
            console.print(f"counted {summary['tokens']:,} tokens in {count_s:.2f}s — |V| {self.vocab_size:,}, n-grams {grams}")
        return summary

    def fit_sentences(self, sentences: list[list[str]]) -> "NGramLM":
        """Fit on sentences given as lists of words (no tokenizer, nothing written): for tests and notebooks."""
        sentences = [sent for sent in sentences if sent]  # a blank line is not a sentence (as in `fit`)
        names = list(dict.fromkeys(w for sent in sentences for w in sent))
        index = {w: i for i, w in enumerate(names)}
        ids = np.array([index[w] for sent in sentences for w in sent], dtype=np.int64)
        self._build_vocab(np.bincount(ids, minlength=len(names)), names, None)
        self._count(self.to_ids(ids), np.array([len(sent) for sent in sentences], dtype=np.int64))
        return self

    def save(self, run_dir) -> Path:
        N = self.cfg.order
        blob = [w.encode("utf-8") for w in self.words]
        arrays = {"order": np.array(N), "words_utf8": np.frombuffer(b"".join(blob), dtype=np.uint8),
                  "word_offsets": np.cumsum([0] + [len(b) for b in blob]), "tok_map": self.tok_map,
                  "discount": self.discount}
        for n in range(1, N + 1):
            arrays[f"keys_{n}"], arrays[f"count_{n}"] = self.keys[n], self.count[n]
        for n in range(N):
            arrays[f"denom_{n}"], arrays[f"gamma_{n}"] = self.denom[n], self.gamma[n]
        from plmcli.data.store import atomic_path

        path = Path(run_dir) / WEIGHTS
        with atomic_path(path, path.with_name(f".{path.name}.tmp")) as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return path

    def load_run_weights(self, run_dir) -> None:
        path = Path(run_dir) / WEIGHTS
        if not path.is_file():
            raise PlmError(f"run {run_dir} has no {WEIGHTS}", "re-run `plm pretrain` with an n-gram recipe")
        with np.load(path, allow_pickle=False) as z:
            N = int(z["order"])
            if N != self.cfg.order:
                raise PlmError(f"{path} holds an order-{N} model but config.json says {self.cfg.order}",
                               "the run directory is inconsistent: re-run `plm pretrain`")
            raw, off = z["words_utf8"].tobytes(), z["word_offsets"]
            self.words = [raw[a:b].decode("utf-8") for a, b in zip(off[:-1], off[1:])]
            self.tok_map, self.discount = z["tok_map"], z["discount"]
            self.keys = [np.zeros(1, dtype=np.int64)] + [z[f"keys_{n}"] for n in range(1, N + 1)]
            self.count = [None] + [z[f"count_{n}"] for n in range(1, N + 1)]
            self.denom = [z[f"denom_{n}"] for n in range(N)]
            self.gamma = [z[f"gamma_{n}"] for n in range(N)]
        self.__dict__.pop("word_index", None)

    # ------------------------------------------------------------ ARPA

    def write_arpa(self, path) -> Path:
        """Write the model as an ARPA file that standard back-off readers (KenLM, SRILM) score identically.

        Every n-gram with a count is listed with the model's interpolated log10 P(w|h) and, as back-off, the
        log10 γ of the n-gram as a history (0 where it is none). A reader starts each sentence from the single
        context `<s>`, which is what the padding amounts to (see `_estimate`); `<s>` itself has log10 P -99.
        ARPA has no log10 0: a probability or back-off weight of 0 (the unsmoothed model's) is written -99, the
        convention SRILM and KenLM use for `<s>`, so a reader gives every such event log10 P ≤ -99.
        """
        N, B = self.cfg.order, len(self.words)
        bad = [w for w in self.words if not w or any(ch.isspace() for ch in w)]
        if bad:
            raise PlmError(f"the vocabulary has {len(bad)} word(s) with whitespace (e.g. {bad[0]!r}), which ARPA cannot hold",
                           "train the n-gram with the word tokenizer (tokenizer.kind: word)")
        log10 = lambda x: np.where(x > 0, np.log10(np.maximum(x, 1e-300)), -99.0)  # noqa: E731

        def backoff(n, rows):  # log10 γ of order-n table rows as histories (-1: not a history), None at the top order
            if n >= N:
                return None
            ok = rows >= 0
            ok[ok] = self.denom[n][rows[ok]] > 0
            return np.where(ok, log10(np.where(ok, self.gamma[n][np.maximum(rows, 0)], 1.0)), 0.0)

        grams = [None, self.keys[1][:, None]]  # each entry's tokens, rebuilt from the reversed trie
        for n in range(2, N + 1):
            grams.append(np.concatenate([(self.keys[n] % B)[:, None], grams[n - 1][self.keys[n] // B]], axis=1))
        uni = np.arange(B)[:, None]  # all of V, then <s>
        lp = log10(self._prob(uni[:-1]))
        sections = [(uni, np.append(lp, -99.0), backoff(1, self._rows(uni)[1]))]
        for n in range(2, N + 1):
            keep = np.flatnonzero(self.count[n] > 0)
            sections.append((grams[n][keep], log10(self._prob(grams[n][keep])), backoff(n, keep)))

        from plmcli.data.store import atomic_path

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        words = np.array(self.words, dtype=object)
        with atomic_path(path, path.with_name(f".{path.name}.tmp")) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write("\\data\\\n")
            f.writelines(f"ngram {n}={len(toks)}\n" for n, (toks, _, _) in enumerate(sections, start=1))
            for n, (toks, lp, bo) in enumerate(sections, start=1):
                f.write(f"\n\\{n}-grams:\n")
                text = [" ".join(ws) for ws in words[toks].tolist()]
                if bo is None:
                    f.writelines(f"{p:.7g}\t{t}\n" for p, t in zip(lp.tolist(), text))
                else:
                    f.writelines(f"{p:.7g}\t{t}\t{b:.7g}\n" for p, t, b in zip(lp.tolist(), text, bo.tolist()))
            f.write("\n\\end\\\n")
        return path


class NGramSession:
    """Rows of n-gram histories for plmcli.generate's strategies: logits() are log P(w | the row's last N-1
    words) over V, so greedy, beam and sampling decode the n-gram distribution itself. Each prompt is the
    start of a sentence (after <s>); generation stops at </s>. Tokens are n-gram ids (<unk> may be drawn:
    it holds the mass of every word the model never saw), and the output is its words joined by spaces.

    The unsmoothed model (k = 0) gives no word any probability after a context it never saw: a prompt that
    ends in one is refused. Decoding never reaches another such context — each word it picks was seen after
    its context, so the new context was seen too — except in a beam that already scores -inf (a filler
    candidate); that row gets flat logits, so its log-softmax stays finite and its score stays -inf."""

    eos = EOS

    def __init__(self, model: NGramLM, histories: list[list[int]]):
        self.model, self.rows, self._logits, self._prompted = model, histories, None, False

    def logits(self):
        import torch

        if self._logits is None:
            logp = np.stack([self.model.logprobs(h) for h in self.rows])
            dead = ~np.isfinite(logp).any(axis=1)
            if dead.any() and not self._prompted:
                raise self._unseen_prompt(self.rows[int(np.flatnonzero(dead)[0])])
            logp[dead] = 0.0
            self._logits = torch.from_numpy(logp)
            self._prompted = True
        return self._logits

    def _unseen_prompt(self, history) -> PlmError:
        N = self.model.cfg.order
        context = " ".join((["<s>"] * N + [self.model.words[i] for i in history])[len(history) + 1:])
        return PlmError(f"the unsmoothed n-gram (model.k 0) never saw the context '{context}' in training, "
                        "so every next word has probability 0", "prompt with text whose last words occur in the "
                        "training data, or train with model.k > 0 (add-λ) or model.smoothing=kneser-ney")

    def push(self, tokens) -> None:
        self.rows = [h + [int(t)] for h, t in zip(self.rows, tokens.tolist())]
        self._logits = None

    def select(self, index) -> None:
        keep = index.tolist()
        self.rows = [self.rows[i] for i in keep]
        self._logits = None if self._logits is None else self._logits[index.cpu()]

    def decode(self, new_ids: list[int]) -> str:
        return " ".join(self.model.words[i] for i in new_ids)


def oov_rate(oov, predicted, sentences) -> float:
    """The share of the text's words that are <unk>: the scored </s> of each sentence is no word, so the
    denominator is the words alone, as kenlm's query counts them (and eval-ppl's other families)."""
    return float(oov / max(predicted - sentences, 1))


def read_sentences(corpus_dir, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, sentence lengths) of a split of a `plm tokenize` dir: each line of each document a sentence."""
    from datasets import load_from_disk

    ds = load_from_disk(str(Path(corpus_dir) / "dataset" / split))
    ids, lengths = [], []
    for tbl in ds.with_format("arrow").iter(batch_size=10_000):
        col, starts = tbl["input_ids"].combine_chunks(), tbl["sentence_starts"].combine_chunks()
        doc_off = col.offsets.to_numpy() - col.offsets[0].as_py()
        s_off = starts.offsets.to_numpy() - starts.offsets[0].as_py()
        doc_of = np.repeat(np.arange(len(col)), np.diff(s_off))
        bounds = np.union1d(doc_off[doc_of] + starts.flatten().to_numpy(), doc_off)  # sentence starts + doc ends
        ids.append(col.flatten().to_numpy().astype(np.int64))
        lengths.append(np.diff(bounds))
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ids), np.concatenate(lengths)

