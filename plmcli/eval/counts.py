"""Counts: sentence by sentence from an n-gram's tables (plmcli.models.ngram).

Each non-blank line is a sentence, padded as in training (n-1 <s> before it, </s> after, </s> scored), so
a word's context never crosses a line. --max-length and --stride do not apply (the window is the order).
The model: `to_ids(tokenizer ids) -> n-gram ids`, `score_parts(words, lengths) -> (NLL of the tokens with
P > 0, predicted, <unk>, tokens with P = 0)` and `cfg.order`.

Zero probabilities (the unsmoothed model, model.k 0) are reported, not smoothed away: one such token makes
the NLL, perplexity and bits per byte inf; `zero_prob_tokens` counts them, and `ppl_excluding_zero_prob` is
the perplexity of the other tokens alone (exp of their mean NLL) — a number for comparing unsmoothed
models on the same text, not a perplexity of the text.
"""

from __future__ import annotations

import math

import numpy as np

from plmcli.errors import PlmError
from plmcli.eval.perplexity import report
from plmcli.models.ngram import UNK, oov_rate


def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int | None = None, device=None) -> dict:
    """eval-ppl's report of an n-gram over `files`; adds oov_rate, sentences, zero_prob_tokens and
    ppl_excluding_zero_prob."""
    from plmcli.data.text import iter_text_lines

    N = model.cfg.order
    for name, value in (("--max-length", max_length), ("--stride", stride)):
        if value is not None and value != N:
            raise PlmError(f"{name} {value} does not apply to an n-gram model: it always reads the {N - 1} "
                           f"previous words of the same sentence", f"drop {name} (or pass {N})")
    totals, per_file = np.zeros(7), []
    for f in files:
        lines = list(iter_text_lines([f]))
        n_bytes, n_words = sum(len(ln.encode("utf-8")) for ln in lines), sum(len(ln.split()) for ln in lines)
        encs = [e for e in tok.encode_batch(lines, add_special_tokens=False) if e.ids] if lines else []
        if not encs:  # blank lines are not sentences (as in training)
            raise PlmError(f"{f} has no words to score", "pass a file with text, one sentence per line")
        ids = model.to_ids(np.concatenate([e.ids for e in encs]))
        if np.all(ids == UNK):
            raise PlmError(f"every word of {f} is out of vocabulary (OOV rate 100%: all {len(ids):,} words "
                           "read as <unk>)", "score text in the training data's language and tokenization")
        nll, n, oov, zero = model.score_parts(ids, np.array([len(e.ids) for e in encs]))
        row = np.array([nll, n, n_bytes, n_words, oov, len(encs), zero])
        per_file.append({"file": f, **counts_report(row, N)})
        totals += row
    res = counts_report(totals, N)
    res["first_token"] = f"conditioned on {N - 1} <s> (each line a sentence; </s> scored)"
    res["files"] = per_file
    return res


def counts_report(row, order: int) -> dict:
    """`report` of (nll of the tokens with P > 0, predicted, bytes, words, <unk>, sentences, tokens with P = 0),
    the window being the order."""
    nll, n, n_bytes, n_words, oov, sentences, zero = row
    kept = int(n - zero)
    return {**report(math.inf if zero else float(nll), int(n), int(n_bytes), int(n_words), order, order),
            "oov_rate": oov_rate(oov, n, sentences), "sentences": int(sentences), "zero_prob_tokens": int(zero),
            "ppl_excluding_zero_prob": math.exp(float(nll) / kept) if kept else math.nan}


def token_logprobs(model, ids, cfg: dict, *, batch_size: int | None = None, device=None, tail: int | None = None):
    """Per token of the text `ids` (tokenizer ids): (log P(word | the n-1 words before it, <s> before the
    first), whether it is the most likely word), the text read as one sentence. tail: only the last `tail`."""
    words = model.to_ids(np.asarray(ids, dtype=np.int64))
    lp, hit = np.full(len(words), np.nan), np.zeros(len(words), dtype=bool)
    for i in range(0 if tail is None else max(0, len(words) - tail), len(words)):
        dist = model.logprobs(words[:i])
        lp[i], hit[i] = dist[words[i]], int(np.argmax(dist)) == words[i]
    return lp, hit
