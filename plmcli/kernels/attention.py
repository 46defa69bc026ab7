"""Attention with dropout on a CPU: `attention`, F.scaled_dot_product_attention computed explicitly.

With dropout on a CPU SDPA falls back to a general composite that draws torch's Bernoulli masks (~20 ns an
element), scales k, builds the causal mask and guards against all-masked rows on every call; this one does less
and draws its masks with `kernels.dropout`. A caller that wants the probabilities themselves (recorded attention
maps) gets them from the same explicit path, on any device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from plmcli.kernels.dropout import dropout
from plmcli.kernels.switch import enabled


@functools.lru_cache(maxsize=16)
def future_mask(T: int, device: torch.device) -> torch.Tensor:
    """(T, T) boolean, True above the diagonal: the keys a causal query must not see (built once per T and
    device; never written, so one cached copy serves every caller)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, *, causal: bool = False, scale: float | None = None,
              probabilities: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal=causal, scale=scale) for
    (B, H, T, D) heads. `probabilities`: called with the attention probabilities (B, H, T, S) before dropout,
    its result used in their place; the explicit path then runs whatever the switch says."""
    if probabilities is None and (dropout_p == 0.0 or not enabled(q.device)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
                                              scale=scale)
    # scaled on the (B, H, T, D) side, the smaller one
    scores = (q * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)) @ k.transpose(-1, -2)
    # In place: the matmul's backward needs its inputs, not its output.
    if causal:
        scores.masked_fill_(future_mask(q.shape[-2], q.device), torch.finfo(scores.dtype).min)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:  # SDPA's boolean mask: True = attend
        scores.masked_fill_(~attn_mask, torch.finfo(scores.dtype).min)
    elif attn_mask is not None:  # a float mask is added
        scores.add_(attn_mask)
    p = F.softmax(scores, dim=-1)
    return dropout(p if probabilities is None else probabilities(p), dropout_p) @ v
