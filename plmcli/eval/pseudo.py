"""Pseudo-perplexity of masked LMs (Salazar, Liang, Nguyen & Kirchhoff 2020, "Masked Language Model Scoring").

The model: `forward(ids, types, mask, mlm_positions).mlm_logits` (every masked-LM family; ELECTRA runs its
generator, a small masked LM, when forward is not told otherwise, so its pseudo-perplexity is the generator's).

A masked LM has no left-to-right factorisation, so it gets the pseudo-log-likelihood instead: each line
of the text is a sentence; every token w_t of it (not [CLS], [SEP] or padding) is replaced by [MASK] in
its own copy of the sentence and scored, PLL(W) = Σ_t log P(w_t | W without t). Pseudo-perplexity =
exp(−Σ PLL / N) over the N scored tokens of the corpus (Salazar et al. §2.3).

Batching: a sentence of n tokens becomes n masked copies of one length; a batch holds whole sentences
(all their copies) up to a token budget, the MLM head runs at the one masked position of each copy
(`mlm_positions`), and sentences are sorted by length first so batches carry little padding.

Windows: a sentence longer than the model reads (max_length, [CLS] and [SEP] included, so W =
max_length − 2 text tokens) is scored token by token in windows of W tokens centred on the token,
pinned to the sentence's start or end near its edges, each wrapped in [CLS] … [SEP] as the training
windows of objective `mlm` are. So every token sees W − 1 others: as many on each side as the sentence allows.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch

from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError

DEFAULT_TOKENS_PER_BATCH = 8192
"""Input tokens (rows × padded length) per forward pass: a few tens of MB of activations at BERT-base."""


def window_starts(n: int, width: int) -> np.ndarray:
    """(n,) first token of the window of `width` tokens that scores each of n tokens: centred on the
    token, pinned inside the sentence (all 0 when the sentence fits)."""
    width = min(width, n)
    return np.clip(np.arange(n) - width // 2, 0, n - width)


def masked_copies(ids: np.ndarray, width: int, mask_id: int, cls: int | None, sep: int | None,
                  first: int = 0, end: int | None = None):
    """The copies that score tokens first..end-1 of a sentence: ((k, w + specials) input ids, (k,)
    masked position in each row).

    Row t is the window of token t (see window_starts) wrapped in cls … sep, with token t masked.
    """
    n = len(ids)
    w = min(width, n)
    t = np.arange(first, n if end is None else end)
    starts = window_starts(n, width)[t]
    rows = ids[starts[:, None] + np.arange(w)[None, :]]  # (k, w), a copy
    pos = t - starts
    rows[np.arange(len(t)), pos] = mask_id
    left = [np.full((len(t), 1), cls, dtype=ids.dtype)] if cls is not None else []
    right = [np.full((len(t), 1), sep, dtype=ids.dtype)] if sep is not None else []
    return np.concatenate(left + [rows] + right, axis=1), pos + (cls is not None)


def plan_batches(lengths: Iterable[int], row_len: Callable[[int], int], budget: int) -> list[list[tuple[int, int, int]]]:
    """Group the copies of sentences into forward passes: lists of (sentence, first copy, end copy).

    Sentences go in order of length, whole, while rows × longest row stays within `budget`; one whose
    copies alone exceed it is split over batches of its own.
    """
    lengths = list(lengths)
    batches, cur, cur_rows = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        n, width = lengths[i], row_len(lengths[i])  # rows are sorted by width, so width is the batch's longest
        if n == 0:
            continue
        if cur and (cur_rows + n) * width > budget:
            batches.append(cur)
            cur, cur_rows = [], 0
        per = max(1, budget // width)
        if n > per:  # too long to share: chunks of its own
            batches.extend([(i, a, min(a + per, n))] for a in range(0, n, per))
            continue
        cur.append((i, 0, n))
        cur_rows += n
    if cur:
        batches.append(cur)
    return batches


@torch.no_grad()
def sentence_pll(model, sentences: list[np.ndarray], mask_id: int, max_length: int, cls: int | None = None,
                 sep: int | None = None, pad: int = 0, max_tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
                 device="cpu") -> np.ndarray:
    """(S,) pseudo-log-likelihood (natural log) of each sentence of token ids (specials not included).

    `model(input_ids, None, attention_mask, mlm_positions).mlm_logits` must give (N, V) logits at the N
    flat positions (b·T + t), as every masked-LM family's forward does.
    """
    n_special = (cls is not None) + (sep is not None)
    width = max_length - n_special
    if width < 1:
        raise ValueError(f"max_length {max_length} leaves no room for a token beside {n_special} special tokens")
    sentences = [np.asarray(s, dtype=np.int64) for s in sentences]
    pll = np.zeros(len(sentences), dtype=np.float64)
    plan = plan_batches((len(s) for s in sentences), lambda n: min(n, width) + n_special, max_tokens_per_batch)
    for batch in plan:
        parts = []
        for i, a, b in batch:
            rows, pos = masked_copies(sentences[i], width, mask_id, cls, sep, a, b)
            parts.append((i, rows, pos, sentences[i][a:b]))
        T = max(part[1].shape[1] for part in parts)
        R = sum(len(part[1]) for part in parts)
        x = np.full((R, T), pad, dtype=np.int64)
        attn = np.zeros((R, T), dtype=np.int64)
        flat, target, owner, r = [], [], [], 0
        for i, rows, pos, tokens in parts:
            k, w = rows.shape
            x[r : r + k, :w] = rows
            attn[r : r + k, :w] = 1
            flat.append((r + np.arange(k)) * T + pos)
            target.append(tokens)
            owner.append(np.full(k, i))
            r += k
        flat_t = torch.from_numpy(np.concatenate(flat)).to(device)
        logits = model(torch.from_numpy(x).to(device), None, torch.from_numpy(attn).to(device), flat_t).mlm_logits
        logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        scored = logp.gather(1, torch.from_numpy(np.concatenate(target)).to(device)[:, None])[:, 0]
        np.add.at(pll, np.concatenate(owner), scored.double().cpu().numpy())
    return pll


def read_sentences(path: str, tok, batch_lines: int = 1024) -> tuple[list[np.ndarray], int, int]:
    """(token ids of each non-blank line, without special tokens; UTF-8 bytes; whitespace words) of a
    file. Bytes and words count every line as read, as eval-ppl's causal path does (line ends included)."""
    from plmcli.data.text import iter_text_lines

    sentences, n_bytes, n_words, batch = [], 0, 0, []

    def flush():
        sentences.extend(np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch(batch, add_special_tokens=False))
        batch.clear()

    for line in iter_text_lines([path]):
        n_bytes += len(line.encode("utf-8"))
        n_words += len(line.split())
        if line.strip():
            batch.append(line.strip())  # the sentence, not its line end or surrounding blanks
        if len(batch) == batch_lines:
            flush()
    if batch:
        flush()
    sentences = [s for s in sentences if len(s)]
    if not sentences:
        raise PlmError(f"{path} has no tokens to score", "pass a file with text")
    return sentences, n_bytes, n_words


def score(model, files: list[str], tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu", max_tokens_per_batch: int | None = None) -> dict:
    """eval-ppl's report (plmcli.eval.perplexity.report keys, `pseudo: True`) of a masked LM over `files`.
    `batch_size` does not apply: a forward pass holds up to `max_tokens_per_batch` input tokens."""
    from plmcli.eval.perplexity import report, window_length

    ids = cfg["tokenizer"].get("special_token_ids", {})
    if "mask" not in ids:
        raise PlmError("pseudo-perplexity masks each token in turn, and the run's tokenizer has no mask token",
                       "evaluate a run trained with a mask token (tokenizer.special_tokens.mask)")
    cls, sep = ids.get("cls"), ids.get("sep")
    n_special = (cls is not None) + (sep is not None)
    positions = model.max_positions
    L, window_from = window_length(max_length, positions, cfg.get("seq_len"))
    if not n_special < L <= positions:
        raise PlmError(f"--max-length {L} is outside {n_special + 1}..{positions} (room for a token beside "
                       f"{n_special} special tokens, within the model's positions)", f"use --max-length ≤ {positions}")
    if stride not in (None, 1):
        raise PlmError(f"--stride {stride} does not apply to pseudo-perplexity: each token is scored in its own "
                       "window, centred on it", "leave --stride out (it is reported as 1); --max-length sets the window")
    budget = DEFAULT_TOKENS_PER_BATCH if max_tokens_per_batch is None else max_tokens_per_batch
    check_option("--max-tokens-per-batch", budget, Range(1), f"e.g. --max-tokens-per-batch {DEFAULT_TOKENS_PER_BATCH}")

    model.to(device).eval()
    totals, per_file = np.zeros(4), []  # nll, tokens, bytes, words
    for f in files:
        sentences, n_bytes, n_words = read_sentences(f, tok)
        pll = sentence_pll(model, sentences, ids["mask"], L, cls, sep, ids.get("pad", 0), budget, device)
        nll, n = -float(pll.sum()), sum(len(s) for s in sentences)
        per_file.append({"file": f, **report(nll, n, n_bytes, n_words, 1, L), "pseudo": True, "sentences": len(sentences)})
        totals += (nll, n, n_bytes, n_words)
    nll, n, n_bytes, n_words = totals
    res = report(float(nll), int(n), int(n_bytes), int(n_words), 1, L)
    res["pseudo"] = True
    res["window_from"] = window_from
    res["sentences"] = sum(r["sentences"] for r in per_file)
    wrap = " … ".join(tok.id_to_token(i) for i in (cls, sep) if i is not None)
    res["context"] = (f"each line a sentence; every token masked in turn and scored with up to {L - n_special - 1} "
                      f"other tokens of its line, centred on it" + (f", inside {wrap}" if wrap else ""))
    res["files"] = per_file
    return res
