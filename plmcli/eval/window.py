"""Sliding windows over the whole file, every token scored once (causal LMs: GPT).

Windows of L = --max-length tokens (default: the run's training seq_len, capped by the model's positions)
start every S = --stride tokens (default L/2); the conventions are plmcli.eval.perplexity's. The model
reads windows only: `model(ids, labels=...)` (objective clm's protocol) or `model(ids)` -> logits.
"""

from __future__ import annotations

from plmcli.errors import PlmError
from plmcli.eval.perplexity import (encode_file, from_start, report, sequence_nll, start_role, start_token,
                                   window_length, window_logprobs)


def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of a causal LM over `files`: each file one text, its first token conditioned on bos
    (or eos) when the tokenizer has one; adds `window_from` (why L tokens) and `first_token`."""
    positions = model.max_positions
    L, window_from = window_length(max_length, positions, cfg.get("seq_len"))
    if not 1 <= L <= positions:
        raise PlmError(f"--max-length {L} is outside 1..{positions} (the model's positions)", f"use --max-length ≤ {positions}")
    S = max(1, L // 2) if stride is None else stride
    if not 1 <= S <= L:
        raise PlmError(f"--stride {S} must be between 1 and --max-length {L}", f"e.g. --stride {max(1, L // 2)}")
    prefix, prefix_name = start_token(cfg), start_role(cfg)

    model.to(device)
    total_nll, total_tok, total_bytes, total_words, per_file = 0.0, 0, 0, 0, []
    for f in files:
        seq, n_bytes, n_words = encode_file(f, tok, prefix)
        nll, n = sequence_nll(model, seq, L, S, batch_size, device)
        per_file.append({"file": f, **report(nll, n, n_bytes, n_words, S, L)})
        total_nll, total_tok, total_bytes, total_words = total_nll + nll, total_tok + n, total_bytes + n_bytes, total_words + n_words
    res = report(total_nll, total_tok, total_bytes, total_words, S, L)
    res["window_from"] = window_from
    res["first_token"] = f"conditioned on {prefix_name}" if prefix_name else "not scored (tokenizer has no bos/eos)"
    res["files"] = per_file
    return res


def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """plmcli.eval.scoring.token_logprobs for this protocol: windows of the training seq_len moving by half of it, the
    first token after the run's bos/eos (`from_start`)."""
    L, _ = window_length(None, model.max_positions, cfg.get("seq_len"))
    model.to(device).eval()
    return from_start(lambda seq: window_logprobs(model, seq, L, max(1, L // 2), batch_size, device, tail), ids, cfg)
