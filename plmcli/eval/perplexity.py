"""What every perplexity scorer shares: the report, how a file becomes tokens, and sliding windows.

The scorers, one per protocol (plmcli.models.base.Scoring), are the other modules of plmcli.eval, chosen
by plmcli.eval.scoring. The sliding windows below are the causal LMs' (window), and also serve the NNLM
(fixed_context) and XLNet (left_to_right).

Sliding windows score every token exactly once.

Conventions (also in `plm eval-ppl --help`): the model reads windows of at most L = max_length tokens,
starting every S = stride tokens. The first window scores all its predictions; each later one scores
only the tokens no earlier window scored, so each of those sees between L-S and L tokens of context. The text's
first token is scored conditioned on the tokenizer's BOS (or EOS) when it has one, else it only serves
as context. stride = L gives non-overlapping windows; stride = 1 scores each token with the full L.

The default window is the length the run was trained on (config.json's seq_len), capped by the model's
positions: a model has only ever seen positions below seq_len, so a longer window feeds it positions it
never trained (perplexity then gets worse with more context, not better).

Bits per byte divide by the UTF-8 bytes of the text as it is scored: each line ending in one "\\n" (a CRLF
file counts as its LF copy, a missing final newline as present, a UTF-8 BOM not at all; .gz files
decompressed), the convention of tools that read text in Python's text mode. That text is what the model
is charged for, so the `bytes` reported are its size, not the file's.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.models.base import traits_of


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


def scores_labels(model) -> bool:
    """Whether `model` takes objective clm's protocol, `model(ids, labels=...)` -> the mean NLL of the
    labelled positions: a causal, stateless LM module (what clm trains). Such a model computes its
    output layer only where a label is scored (GPT: plmcli.models.lm_loss), not over the whole window."""
    traits = traits_of(model)
    return traits.causal and not traits.stateful


@torch.no_grad()
def sequence_nll(model: Callable[[torch.Tensor], torch.Tensor], seq: np.ndarray, max_length: int, stride: int,
                 batch_size: int = 8, device="cpu", on_batch: Callable[[int], None] | None = None) -> tuple[float, int]:
    """Summed NLL (nats) and count of the scored tokens of `seq` (all but its first).

    `model`: a causal LM module (`scores_labels`), or any function (B, T) ids -> (B, T, V) next-token logits.
    """
    if not 1 <= stride <= max_length:
        raise ValueError("stride must be in [1, max_length]")
    fused = scores_labels(model)
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
        n = int((y != -100).sum())
        if fused:  # the mean over the scored positions, back to their sum
            nll = model(x.to(device), labels=y.to(device)).double() * n
        else:
            logits = model(x.to(device)).float()
            nll = F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), ignore_index=-100, reduction="sum")
        total += nll.item()
        count += n
        if on_batch:
            on_batch(sum(k for _, _, k in group))
    return total, count


@torch.no_grad()
def carried_nll(seq: np.ndarray, chunk: int, step, device="cpu") -> tuple[float, int]:
    """Summed NLL of seq[1:] given everything before, `chunk` tokens per forward pass, the model's state
    (hidden state, memory) carried from one chunk to the next: `step(x (1, t), y (t,), state) -> (nll, state)`."""
    seq_t = torch.as_tensor(np.asarray(seq, dtype=np.int64), device=device)
    total, state = 0.0, None
    for i in range(0, len(seq_t) - 1, chunk):
        x = seq_t[i : min(i + chunk, len(seq_t) - 1)][None]  # (1, t)
        nll, state = step(x, seq_t[i + 1 : i + 1 + x.shape[1]], state)
        total += nll.sum().item()
    return total, len(seq_t) - 1


@torch.no_grad()
def window_logprobs(logits_fn: Callable[[torch.Tensor], torch.Tensor], seq: np.ndarray, max_length: int, stride: int,
                    batch_size: int = 8, device="cpu", tail: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per token of seq[1:], in `sequence_nll`'s windows: (log p(token | its window before it), whether the token
    is the argmax there). `logits_fn`: (B, T) ids -> (B, T, V) next-token logits. tail: only the last `tail`
    tokens are wanted; windows scoring none of them are not run (their tokens read nan, False)."""
    seq_t = torch.as_tensor(np.asarray(seq, dtype=np.int64))
    n = len(seq_t)
    lp, hit = np.full(max(n - 1, 0), np.nan), np.zeros(max(n - 1, 0), dtype=bool)
    first = 0 if tail is None else n - tail  # the least target position wanted
    pending = [w for w in windows(n, max_length, stride) if w[1] >= first]
    for b in range(0, len(pending), batch_size):
        group = pending[b : b + batch_size]
        x = torch.zeros(len(group), max(e - s for s, e, _ in group), dtype=torch.long)  # right padding, never scored
        for r, (s, e, _) in enumerate(group):
            x[r, : e - s] = seq_t[s:e]
        logits = logits_fn(x.to(device)).float().cpu()
        for r, (s, e, k) in enumerate(group):
            rows, targets = logits[r, e - s - k : e - s], seq_t[e - k + 1 : e + 1]
            lp[e - k : e] = torch.log_softmax(rows, -1).gather(1, targets[:, None])[:, 0].double().numpy()
            hit[e - k : e] = (rows.argmax(-1) == targets).numpy()
    return lp, hit


@torch.no_grad()
def carried_logprobs(seq: np.ndarray, chunk: int, step, device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """Per token of seq[1:] given everything before, the state carried as in `carried_nll`: (log-probability,
    whether it is the argmax). `step(x (1, t), state) -> ((1, t, V) next-token logits, state)`."""
    seq_t = torch.as_tensor(np.asarray(seq, dtype=np.int64), device=device)
    lps, hits, state = [], [], None
    for i in range(0, len(seq_t) - 1, chunk):
        x = seq_t[i : min(i + chunk, len(seq_t) - 1)][None]  # (1, t)
        y = seq_t[i + 1 : i + 1 + x.shape[1]]
        logits, state = step(x, state)
        logits = logits[0].float()
        lps.append(torch.log_softmax(logits, -1).gather(1, y[:, None])[:, 0].double().cpu())
        hits.append((logits.argmax(-1) == y).cpu())
    if not lps:
        return np.zeros(0), np.zeros(0, dtype=bool)
    return torch.cat(lps).numpy(), torch.cat(hits).numpy()


def start_role(cfg: dict) -> str | None:
    """Which special token a text's first token is scored after: "bos", else "eos"; None when the run's tokenizer
    has neither."""
    ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    return next((r for r in ("bos", "eos") if r in ids), None)


def start_token(cfg: dict) -> int | None:
    """The id of the `start_role` token, or None."""
    role = start_role(cfg)
    return None if role is None else int(cfg["tokenizer"]["special_token_ids"][role])


def from_start(fn: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], ids, cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """`fn` (per token of seq[1:]: log-probabilities, argmax hits) over the text `ids` after the run's start token
    (`start_token`), aligned with `ids`: without a start token the first token is context only (nan, False)."""
    start = start_token(cfg)
    seq = np.asarray(([start] if start is not None else []) + [int(i) for i in ids], dtype=np.int64)
    lp, hit = fn(seq) if len(seq) > 1 else (np.zeros(0), np.zeros(0, dtype=bool))
    if start is None and len(ids):
        lp, hit = np.concatenate([[np.nan], lp]), np.concatenate([[False], hit])
    return lp, hit


def check_lengths(**flags) -> None:
    """Refuse a window, stride, segment, memory or batch length below its least value, before a scorer
    reads 0 as "not given" (`x or default`) or loops without moving. `flags`: option name (max_length
    for --max-length) -> (value or None, least value)."""
    from plmcli.config_schema import Range, check_option

    examples = {"max_length": 128, "stride": 64, "tgt_len": 128, "mem_len": 128, "batch_size": 8,
                "max_tokens_per_batch": 8192}
    for name, (value, least) in flags.items():
        flag = "--" + name.replace("_", "-")
        check_option(flag, value, Range(least), f"leave {flag} out for the default, or pass e.g. {flag} {examples.get(name, least)}")


def window_length(max_length: int | None, positions: int, seq_len: int | None) -> tuple[int, str]:
    """(tokens per window, why that many): --max-length when given, else the run's training seq_len
    capped by the model's positions (see the module docstring), else the positions."""
    if max_length is not None:
        return max_length, "--max-length"
    if seq_len and seq_len <= positions:
        return seq_len, f"training seq_len; the model has {positions} positions"
    if seq_len:
        return positions, f"the model's positions, below training seq_len {seq_len}"
    return positions, "the model's positions; the run records no training seq_len"


def report(nll: float, tokens: int, n_bytes: int, n_words: int, stride: int, max_length: int) -> dict:
    """Token perplexity, bits per byte (tokenizer-independent; `bytes`: the UTF-8 bytes of the scored
    text, see the module docstring) and word-level perplexity."""
    mean = nll / max(tokens, 1)
    return {
        "ppl": math.exp(mean),
        "nll": mean,
        "tokens": tokens,
        "bpb": nll / (math.log(2) * max(n_bytes, 1)),
        "bytes": n_bytes,
        "words": n_words,
        "word_ppl": math.exp(nll / max(n_words, 1)),
        "stride": stride,
        "max_length": max_length,
    }


def encode_file(path: str, tok, prefix: int | None = None, line_end: int | None = None, by_lines: bool = False,
                batch_lines: int = 1024) -> tuple[np.ndarray, int, int]:
    """(token ids, UTF-8 bytes, whitespace words) of a file, `prefix` first when given. Streams the file
    in batches of lines.

    by_lines=False: the whole file as one text, every line as read (line ends are the tokenizer's to
    encode). by_lines=True: each non-blank line's tokens followed by `line_end` when given, as corpora
    with `data.doc_per_line` train (blank lines are not documents there either).
    """
    from plmcli.data.text import iter_text_lines
    from plmcli.errors import PlmError

    pieces = [np.asarray([prefix], dtype=np.int64)] if prefix is not None else []
    end = np.asarray([line_end] if by_lines and line_end is not None else [], dtype=np.int64)
    n_bytes, n_words, batch = 0, 0, []

    def flush():
        for e in tok.encode_batch(batch, add_special_tokens=False):
            pieces.extend((np.asarray(e.ids, dtype=np.int64), end))
        batch.clear()

    for line in iter_text_lines([path]):
        n_bytes += len(line.encode("utf-8"))
        n_words += len(line.split())
        if line.strip() or not by_lines:
            batch.append(line)
        if len(batch) == batch_lines:
            flush()
    if batch:
        flush()
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    if len(ids) - (prefix is not None) < 1:
        raise PlmError(f"{path} has no tokens to score", "pass a file with text")
    return ids, n_bytes, n_words


def sees_newlines(tok) -> bool:
    """Whether the tokenizer encodes line ends (byte-level BPE) or drops them as whitespace (word-level)."""
    return len(tok.encode("a\nb", add_special_tokens=False).ids) != len(tok.encode("a b", add_special_tokens=False).ids)


def eval_files(files, tok, cfg: dict, nll_fn: Callable[[np.ndarray], tuple[float, int]], max_length: int, stride: int,
               context: str, by_lines: bool = True) -> dict:
    """The eval-ppl report (`report` keys) of `nll_fn` over each file and in total, for the scorers that
    read each file as one token stream (state, memory, fixed context, left to right, bidirectional LM).

    by_lines: each non-blank line followed by <eos> (`encode_lines`, how doc_per_line corpora train);
    else the file as one text (`encode_file`). Adds `line_end`, `first_token`, `context` and `oov_rate`:
    the share of the text's tokens (an added <eos> not counted) that are <unk>.
    """
    from plmcli.errors import PlmError

    ids = cfg["tokenizer"].get("special_token_ids", {})
    eos, unk = ids.get("eos"), ids.get("unk")
    prefix, prefix_name = start_token(cfg), start_role(cfg)
    totals = np.zeros(6)  # nll, tokens, bytes, words, text tokens, unk
    per_file = []
    for f in files:
        seq, n_bytes, n_words = encode_file(f, tok, prefix, eos, by_lines)
        nll, n = nll_fn(seq)
        scored = seq[1:]
        n_text = int((scored != eos).sum()) if eos is not None else n
        n_unk = int((scored == unk).sum()) if unk is not None else 0
        per_file.append({"file": f, **report(nll, n, n_bytes, n_words, stride, max_length), "oov_rate": n_unk / max(n_text, 1)})
        totals += (nll, n, n_bytes, n_words, n_text, n_unk)
    nll, n, n_bytes, n_words, n_text, n_unk = totals
    if n_unk and n_unk == n_text:
        raise PlmError(f"every word of {', '.join(map(str, files))} is out of the model's vocabulary (<unk>)",
                       "evaluate text in the language, casing and tokenization of the training corpus")
    res = report(float(nll), int(n), int(n_bytes), int(n_words), stride, max_length)
    res["oov_rate"] = float(n_unk / max(n_text, 1))
    res["line_end"] = ("<eos> after every line, scored" if eos is not None else "not added (the tokenizer has no eos)") \
        if by_lines else "as the tokenizer encodes them"
    res["first_token"] = f"conditioned on {prefix_name}" if prefix_name else "not scored (tokenizer has no bos/eos)"
    res["context"] = context
    res["files"] = per_file
    return res
