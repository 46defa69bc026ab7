"""Carried state: one stream per file, the hidden state carried across all of it (RNN / LSTM / GRU LMs).

The text is fed in chunks of --max-length tokens (default 1024); that only bounds memory, the result does
not depend on it. --stride and --batch-size do not apply. Line ends: <eos> after every non-blank line,
scored like any word (Mikolov's and Zaremba's PTB convention; plmcli.eval.perplexity.eval_files).
The model: `model(ids (1, t), state) -> ((1, t, V) logits, next state)`, state None at the start.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.errors import PlmError
from plmcli.eval.perplexity import carried_nll, eval_files


@torch.no_grad()
def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of a stateful LM over `files`."""
    chunk = 1024 if max_length is None else max_length  # 0 is a value (refused below), not the default
    if chunk < 1:
        raise PlmError(f"--max-length {chunk} must be ≥ 1", "it is only the chunk size: e.g. --max-length 1024")
    model.to(device).eval()
    return eval_files(files, tok, cfg, lambda seq: stream_nll(model, seq, chunk, device), chunk, chunk,
                      context="the whole text before it (hidden state carried)")


def stream_nll(model, seq: np.ndarray, chunk: int, device="cpu") -> tuple[float, int]:
    """Summed NLL of seq[1:] given everything before, reading `chunk` tokens per forward pass."""

    def step(x, y, state):
        logits, state = model(x, state)
        return F.cross_entropy(logits[0].float(), y, reduction="sum"), state

    return carried_nll(seq, chunk, step, device)
