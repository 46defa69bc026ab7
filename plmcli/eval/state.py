"""Carried state: one stream per file, the hidden state carried across all of it (RNN / LSTM / GRU LMs).

The text is fed in chunks of --max-length tokens (default 1024); that only bounds memory, the result does
not depend on it. --stride and --batch-size do not apply. Line ends: <eos> after every non-blank line,
scored like any word (Mikolov's and Zaremba's PTB convention; plmcli.eval.perplexity.eval_files).
The model: `model(ids (1, t), state) -> ((1, t, V) logits, next state)`, state None at the start.
"""

from __future__ import annotations

import numpy as np
import torch

from plmcli.config_schema import Range, check_option
from plmcli.eval.perplexity import carried_logprobs, eval_files, from_start


@torch.no_grad()
def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of a stateful LM over `files`."""
    chunk = 1024 if max_length is None else max_length  # 0 is a value (refused below), not the default
    check_option("--max-length", chunk, Range(1), "it is only the chunk size: e.g. --max-length 1024")
    model.to(device).eval()
    return eval_files(files, tok, cfg, lambda seq: stream_nll(model, seq, chunk, device), chunk, chunk,
                      context="the whole text before it (hidden state carried)")


def stream_nll(model, seq: np.ndarray, chunk: int, device="cpu") -> tuple[float, int]:
    """Summed NLL of seq[1:] given everything before, reading `chunk` tokens per forward pass."""
    lp, _ = carried_logprobs(seq, chunk, model, device)
    return -float(lp.sum()), len(lp)


def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """plmcli.eval.scoring.token_logprobs for this protocol: the state carried over the whole text, 1,024 tokens a
    chunk, the first token after the run's bos/eos (`from_start`)."""
    model.to(device).eval()
    return from_start(lambda seq: carried_logprobs(seq, 1024, model, device), ids, cfg)
