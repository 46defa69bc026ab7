"""Learning-rate schedules: linear warmup, then a decay, as a LambdaLR multiplier on the base lr.

Warmup follows nanoGPT: factor (step + 1) / (warmup + 1) for step < warmup, so the very first
optimizer step already moves the weights (an lr of exactly 0 would waste it). `step` is the
scheduler's count: the k-th optimizer step (from 0) runs at factor(k) when `scheduler.step()`
is called after each `optimizer.step()`.
"""

from __future__ import annotations

import math
from typing import get_args

import torch
from torch.optim.lr_scheduler import LambdaLR

from plmcli.config_sections import ScheduleName
from plmcli.errors import PlmError

SCHEDULES: tuple[str, ...] = get_args(ScheduleName)
_DECAYING = ("linear", "cosine", "polynomial")


class LrFactor:
    """The multiplier at a step. A plain class (not a closure) so the scheduler pickles and its
    state_dict carries these fields: LambdaLR saves `__dict__` of callable objects, not functions."""

    def __init__(self, name: str, warmup_steps: int, total_steps: int, min_lr_ratio: float, power: float,
                 decay_factor: float = 0.5, decay_every: int = 1000, decay_start: int = 0):
        self.name = name
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self.power = power
        self.decay_factor = decay_factor
        self.decay_every = decay_every
        self.decay_start = decay_start

    def __call__(self, step: int) -> float:
        warmup, floor = self.warmup_steps, self.min_lr_ratio
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if self.name == "constant":
            return 1.0
        if self.name == "step":
            # Zaremba et al. 2014: full lr for decay_start steps, then × decay_factor at the start of
            # every block of decay_every steps (their "0.5 per epoch after epoch 4").
            if step < self.decay_start:
                return 1.0
            return max(floor, self.decay_factor ** (1 + (step - self.decay_start) // self.decay_every))
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
            f"min_lr_ratio={self.min_lr_ratio}, power={self.power}, decay_factor={self.decay_factor}, "
            f"decay_every={self.decay_every}, decay_start={self.decay_start})"
        )


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float = 0.0,
    power: float = 1.0,
    *,
    decay_factor: float = 0.5,
    decay_every: int = 1000,
    decay_start: int = 0,
) -> LambdaLR:
    """A LambdaLR for schedule `name` (one of SCHEDULES).

    linear, cosine and polynomial decay from the base lr at the end of warmup to
    base lr · min_lr_ratio at total_steps and stay there; constant holds the base lr after warmup;
    inverse-sqrt ignores total_steps and never goes below min_lr_ratio; step holds the base lr for
    decay_start steps, then multiplies it by decay_factor every decay_every steps (the first decay at
    step decay_start), never below min_lr_ratio, and ignores total_steps.
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
    if key == "step":
        if not 0.0 < decay_factor <= 1.0:
            raise PlmError(f"decay_factor must be in (0, 1], got {decay_factor}", "e.g. optim.decay_factor=0.5 halves the lr")
        if decay_every < 1 or decay_start < 0:
            raise PlmError(f"decay_every ({decay_every}) must be ≥ 1 and decay_start ({decay_start}) ≥ 0",
                           "e.g. decay_every = steps per epoch, decay_start = 4 epochs of steps")
    factor = LrFactor(key, int(warmup_steps), int(total_steps), float(min_lr_ratio), float(power),
                      float(decay_factor), int(decay_every), int(decay_start))
    return LambdaLR(optimizer, factor)
