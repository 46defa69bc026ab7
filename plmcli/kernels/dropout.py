"""Dropout whose masks are drawn with numpy on a CPU: `dropout`, `Dropout`.

torch's CPU dropout draws one Bernoulli variate per element from its Mersenne Twister, serially (MKL's
vectorised generator only serves Intel CPUs): ~20 ns an element, ~10% of a small Transformer's training step.
Here each mask is 16 random bits per element from numpy's SFC64, seeded by one draw from torch's generator, so
`torch.manual_seed` still fixes every mask and a resumed run (which restores torch's RNG state) draws the same
ones. P(drop) = round(p·2¹⁶)/2¹⁶, within 8e-6 of p (FlashAttention's dropout rounds p to 8 bits); kept
elements are scaled by 1/(1 − p) as torch does. 16 bits from SFC64 cost 0.45 ns an element where 32 from PCG64
cost 1.5 (AMD EPYC): ~4% of a bert-mini step. Elsewhere (the switch off, CUDA's fused kernel, jagged tensors,
torch.compile graphs) this is F.dropout.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.kernels.switch import enabled

BITS = 16
"""Random bits per element: the drop probability is a multiple of 2⁻¹⁶."""


def drop_probability(p: float) -> float:
    """The probability with which `dropout` on a CPU drops an element when asked for `p` (0 < p < 1)."""
    return min(round(p * 2**BITS), 2**BITS - 1) / 2**BITS


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """F.dropout(x, p, training): each element zeroed with probability p (`drop_probability`), the rest scaled by
    1/(1 − p); the masks drawn with numpy where the kernels are on."""
    if not training or p == 0.0:
        return x
    if not enabled(x.device) or x.is_nested or p >= 1.0:
        return F.dropout(x, p, training)
    n = x.numel()
    seed = int(torch.randint(0, 2**62, (1,)))
    bits = np.random.SFC64(seed).random_raw((n + 3) // 4).view(np.uint16)[:n]
    keep = bits >= np.uint16(min(round(p * 2**BITS), 2**BITS - 1))
    if x.dtype == torch.float32:
        noise = np.empty(n, dtype=np.float32)
        np.multiply(keep, np.float32(1 / (1 - p)), out=noise)
        return x * torch.from_numpy(noise).view(x.shape)
    # bf16, fp16, fp64: x · 1/(1 − p) in the scalar arithmetic torch's own dropout uses; a mask in x's dtype
    # would round the scale itself (bf16: 1.109375 for 1/0.9, every kept activation 0.16% small)
    return (x * torch.from_numpy(keep).view(x.shape)).mul_(1 / (1 - p))


class Dropout(nn.Dropout):
    """nn.Dropout through `dropout` (same module, no state: checkpoints and names are unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
