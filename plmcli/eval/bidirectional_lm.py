"""Bidirectional LM: forward, backward and their average perplexity (ELMo, Peters et al. 2018).

The text (encoded as in training, see plmcli.eval.perplexity.eval_files: <eos> after every line) is cut
into windows of --max-length + 1 tokens (default 256) that overlap by one token and do not otherwise
overlap: each token after the first is predicted once by the forward LM, each before the last once by the
backward LM, both from context inside its window only. `ppl` / `nll` / `bpb` are of the average of the two
directions' NLL; `fwd_ppl` and `bwd_ppl` are each direction's. --stride does not apply.

The model: `model(ids (B, T)) -> (forward logits, backward logits)`, each (B, T, V): forward[:, t]
predicts token t+1, backward[:, t] token t-1 (objective bilm's contract).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.config_schema import Range, check_option
from plmcli.eval.perplexity import eval_files


@torch.no_grad()
def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of a bidirectional LM over `files`; adds fwd_ppl, bwd_ppl, avg_ppl and `windows`."""
    L = 256 if max_length is None else max_length  # 0 is a value (refused below), not the default
    check_option("--max-length", L, Range(1), "e.g. --max-length 256")
    check_option("--batch-size", batch_size, Range(1), "e.g. --batch-size 8")
    model.to(device).eval()
    per_file = []

    def nll_fn(seq):
        fwd, bwd, n = window_nll(model, seq, L, batch_size, device)
        per_file.append((fwd, bwd, n))
        return (fwd + bwd) / 2, n

    context = f"windows of {L}+1 tokens, no overlap (each token scored once per direction)"
    res = eval_files(files, tok, cfg, nll_fn, L, L, context=context)
    for entry, (fwd, bwd, n) in zip(res["files"], per_file):
        entry.update(fwd_ppl=float(np.exp(fwd / max(n, 1))), bwd_ppl=float(np.exp(bwd / max(n, 1))))
    n = sum(p[2] for p in per_file)
    res["fwd_ppl"] = float(np.exp(sum(p[0] for p in per_file) / max(n, 1)))
    res["bwd_ppl"] = float(np.exp(sum(p[1] for p in per_file) / max(n, 1)))
    res["avg_ppl"] = res["ppl"]
    res["windows"] = "non-overlapping windows; ppl is exp of the mean of the forward and backward NLL"
    return res


@torch.no_grad()
def window_nll(model, seq: np.ndarray, L: int, batch_size: int, device="cpu") -> tuple[float, float, int]:
    """(forward NLL summed over seq[1:], backward NLL summed over seq[:-1], len(seq) - 1)."""
    seq_t = torch.as_tensor(np.asarray(seq, dtype=np.int64), device=device)
    starts = list(range(0, len(seq_t) - 1, L))
    fwd = bwd = 0.0
    full = [s for s in starts if s + L + 1 <= len(seq_t)]
    groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + [[s] for s in starts[len(full):]]
    for group in groups:
        x = torch.stack([seq_t[s : s + L + 1] for s in group])  # (b, t+1)
        f, b = model(x)
        fwd += F.cross_entropy(f[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum").item()
        bwd += F.cross_entropy(b[:, 1:].flatten(0, 1).float(), x[:, :-1].flatten(), reduction="sum").item()
    return fwd, bwd, len(seq_t) - 1
