"""Fixed context: every token sees exactly its n-1 predecessors (the feed-forward NNLM, Bengio et al. 2003).

Windows of --max-length tokens (default 512) advance by max_length - (n-2), so each scored token has its
n-1 predecessors inside its window: the result equals one pass over the whole text. --stride does not
apply. Line ends as for the recurrent LMs: <eos> after every line, scored (plmcli.eval.perplexity.eval_files).
The model: `model(ids, labels=...)` as objective clm trains it, and `model.cfg.order` (n).
"""

from __future__ import annotations

import torch

from plmcli.errors import PlmError
from plmcli.eval.perplexity import eval_files, from_start, sequence_nll, window_logprobs


@torch.no_grad()
def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of an NNLM over `files` (`context`: how many tokens each prediction reads)."""
    L = 512 if max_length is None else max_length  # 0 is a value (refused below), not the default
    n1 = model.cfg.order - 1
    if L < n1:
        raise PlmError(f"--max-length {L} is shorter than the model's context of {n1} words", f"use --max-length ≥ {n1}")
    S = L - (n1 - 1)
    model.to(device).eval()
    return eval_files(files, tok, cfg, lambda seq: sequence_nll(model, seq, L, S, batch_size, device), L, S,
                      context=f"the {n1} previous tokens")


def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """plmcli.eval.scoring.token_logprobs for this protocol: a window of 512 tokens (at least n-1) moving by all but
    the n-2 it carries over, the first token after the run's bos/eos (`from_start`)."""
    L = max(512, model.cfg.order - 1)
    model.to(device).eval()
    return from_start(lambda seq: window_logprobs(model, seq, L, L - (model.cfg.order - 2), batch_size, device, tail),
                      ids, cfg)
