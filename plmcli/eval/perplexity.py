"""Sliding-window perplexity where every token is scored exactly once.

Conventions (also in `plm eval-ppl --help`): the model reads windows of at most L = max_length tokens,
starting every S = stride tokens. The first window scores all its predictions; each later one scores
only the tokens no earlier window scored, so each of those sees between L-S and L tokens of context. The text's
first token is scored conditioned on the tokenizer's BOS (or EOS) when it has one, else it only serves
as context. stride = L gives non-overlapping windows; stride = 1 scores each token with the full L.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def windows(n: int, max_length: int, stride: int):
    """Yield (input_start, input_end, n_scored) over a sequence of n tokens (targets are positions 1..n-1).

    Windows start at 0, stride, 2·stride, … (as the transformers perplexity guide) and stop once the
    last token is scored. The input seq[input_start:input_end] predicts positions input_start+1 ..
    input_end; the last n_scored of those are counted (the ones no earlier window scored).
    """
    prev_end, start = 0, 0
    while prev_end < n - 1:
        end = min(start + max_length, n - 1)
        yield start, end, end - prev_end
        prev_end, start = end, start + stride


@torch.no_grad()
def sequence_nll(logits_fn: Callable[[torch.Tensor], torch.Tensor], seq: np.ndarray, max_length: int, stride: int,
                 batch_size: int = 8, device="cpu", on_batch: Callable[[int], None] | None = None) -> tuple[float, int]:
    """Summed NLL (nats) and count of the scored tokens of `seq` (all but its first)."""
    if not 1 <= stride <= max_length:
        raise ValueError("stride must be in [1, max_length]")
    seq_t = torch.as_tensor(np.asarray(seq, dtype=np.int64))
    total, count = 0.0, 0
    pending = list(windows(len(seq_t), max_length, stride))
    for b in range(0, len(pending), batch_size):
        group = pending[b : b + batch_size]
        width = max(e - s for s, e, _ in group)
        # Right padding is safe: a causal model's prediction at position t never sees positions > t,
        # and padded positions are never scored.
        x = torch.zeros(len(group), width, dtype=torch.long)
        y = torch.full((len(group), width), -100, dtype=torch.long)
        for r, (s, e, k) in enumerate(group):
            x[r, : e - s] = seq_t[s:e]
            y[r, e - s - k : e - s] = seq_t[e - k + 1 : e + 1]
        logits = logits_fn(x.to(device)).float()
        nll = F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), ignore_index=-100, reduction="sum")
        total += nll.item()
        count += int((y != -100).sum())
        if on_batch:
            on_batch(sum(k for _, _, k in group))
    return total, count


def report(nll: float, tokens: int, n_bytes: int, n_words: int, stride: int, max_length: int) -> dict:
    """Token perplexity, bits per byte (tokenizer-independent) and word-level perplexity."""
    mean = nll / max(tokens, 1)
    return {
        "ppl": math.exp(mean),
        "nll": mean,
        "tokens": tokens,
        "bpb": nll / (math.log(2) * max(n_bytes, 1)),
        "words": n_words,
        "word_ppl": math.exp(nll / max(n_words, 1)),
        "stride": stride,
        "max_length": max_length,
    }


def encode_file(path: str, tok, prefix: int | None = None, batch_lines: int = 1024) -> tuple[np.ndarray, int, int]:
    """(token ids of the whole file with `prefix` in front if given, UTF-8 bytes, whitespace words), streamed."""
    from plmcli.data.corpus import iter_text_lines
    from plmcli.errors import PlmError

    pieces, n_bytes, n_words, batch = [], 0, 0, []

    def flush():
        pieces.extend(np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(batch, add_special_tokens=False))
        batch.clear()

    for line in iter_text_lines([path]):
        n_bytes += len(line.encode("utf-8"))
        n_words += len(line.split())
        batch.append(line)
        if len(batch) == batch_lines:
            flush()
    if batch:
        flush()
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    if len(ids) == 0:
        raise PlmError(f"{path} has no tokens to score", "pass a file with text")
    if prefix is not None:
        ids = np.concatenate([[prefix], ids])
    return ids, n_bytes, n_words
