"""Learning-rate schedules: linear warmup, then a decay, as a LambdaLR multiplier on the base lr.

Warmup follows nanoGPT: factor (step + 1) / (warmup + 1) for step < warmup, so the very first
optimizer step already moves the weights (an lr of exactly 0 would waste it). `step` is the
scheduler's count: the k-th optimizer step (from 0) runs at factor(k) when `scheduler.step()`
is called after each `optimizer.step()`.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from plmcli.errors import PlmError

SCHEDULES: tuple[str, ...] = ("linear", "cosine", "constant", "inverse-sqrt", "polynomial")
_DECAYING = ("linear", "cosine", "polynomial")


class LrFactor:
    """The multiplier at a step. A plain class (not a closure) so the scheduler pickles and its
    state_dict carries these fields: LambdaLR saves `__dict__` of callable objects, not functions."""

    def __init__(self, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float, power: float):
        self.name = name
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self.power = power

    def __call__(self, step: int) -> float:
        warmup, floor = self.warmup_steps, self.min_lr_ratio
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if self.name == "constant":
            return 1.0
        if self.name == "inverse-sqrt":
            # Vaswani et al.: peak at the end of warmup, then ∝ 1/√step. With no warmup the decay
            # is counted from step 1 so the first step runs at the full lr rather than at 0.
            scale = max(warmup, 1)
            return max(floor, math.sqrt(scale / max(step, scale)))
        if step >= self.total_steps:
            return floor
        progress = (step - warmup) / (self.total_steps - warmup)
        if self.name == "linear":
            remaining = 1.0 - progress
        elif self.name == "cosine":
            remaining = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:  # polynomial, as in the LAMB paper's BERT runs
            remaining = (1.0 - progress) ** self.power
        return floor + remaining * (1.0 - floor)

    def __repr__(self) -> str:
        return (
            f"LrFactor({self.name!r}, warmup_steps={self.warmup_steps}, total_steps={self.total_steps}, "
            f"min_lr_ratio={self.min_lr_ratio}, power={self.power})"
        )


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.0,
    power: float = 1.0,
) -> LambdaLR:
    """A LambdaLR for schedule `name` (one of SCHEDULES).

    linear, cosine and polynomial decay from the base lr at the end of warmup to
    base lr · min_lr_ratio at total_steps and stay there; constant holds the base lr after warmup;
    inverse-sqrt ignores total_steps and never goes below min_lr_ratio.
    """
    key = name.lower().strip()
    if key not in SCHEDULES:
        raise PlmError(f"unknown lr schedule {name!r}", f"use one of: {', '.join(SCHEDULES)}")
    if warmup_steps < 0 or total_steps < 0:
        raise PlmError(
            f"warmup_steps ({warmup_steps}) and total_steps ({total_steps}) must not be negative",
            "set them to 0 or more",
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise PlmError(f"min_lr_ratio must be between 0 and 1, got {min_lr_ratio}", "e.g. 0.1 decays to a tenth of lr")
    if key in _DECAYING:
        if total_steps < 1:
            raise PlmError(f"the {key} schedule needs total_steps ≥ 1, got {total_steps}", "set train.max_steps")
        if warmup_steps > total_steps:
            raise PlmError(
                f"warmup_steps ({warmup_steps}) is longer than total_steps ({total_steps})",
                "lower the warmup or raise the number of steps",
            )
    if key == "polynomial" and power <= 0.0:
        raise PlmError(f"polynomial power must be positive, got {power}", "1.0 is linear decay")
    factor = LrFactor(key, int(warmup_steps), int(total_steps), float(min_lr_ratio), float(power))
    return LambdaLR(optimizer, factor)
