"""A training run's health, counted on the device: skipped (non-finite) optimizer steps and fp16's loss scale.

A GPU queues work ahead of the host; any read of a device value makes the host wait until everything queued
is done, and the GPU then idles while the next step is queued. So the loop decides a step's skip on the
device (the optimizer's `found_inf`, as GradScaler does with torch's fused kernels) and only counts it here;
the counts reach the host without waiting: each step queues a copy into host memory, and the host looks at a
copy once it has arrived (a step or so later on a GPU, at once on a CPU). Logging, evaluation and checkpoint
steps read them exactly (`read`), where the loop waits anyway.
"""

from __future__ import annotations

import torch

# The slots of the device vector.
TOTAL, RUN, FIRST, FIRST_LOSS, SCALE, STEP = range(6)


class StepHealth:
    """Device-side counters of skipped steps; `update` per optimizer step, `arrived` / `read` on the host."""

    def __init__(self, device: torch.device, step: int, nonfinite_steps: int = 0):
        self.device = device
        # float64: step numbers and counts stay exact; one vector, so one copy brings all of them.
        self.vec = torch.zeros(6, dtype=torch.float64, device=device)
        self.vec[TOTAL], self.vec[STEP] = nonfinite_steps, step
        self.cuda = device.type == "cuda"
        self.pending: list = []

    def update(self, skipped: torch.Tensor, loss: torch.Tensor, scale: torch.Tensor | None) -> None:
        """One optimizer step: `skipped` (0-dim bool) was decided on the device; no host read here."""
        v, bad = self.vec, skipped.to(torch.float64)
        step = v[STEP] + 1
        starts = bad * (v[RUN] == 0)  # the first skipped step of a streak: remember where and its loss
        new = torch.stack([v[TOTAL] + bad, (v[RUN] + 1) * bad,
                           torch.where(starts.bool(), step, v[FIRST]),
                           torch.where(starts.bool(), loss.detach().to(torch.float64), v[FIRST_LOSS]),
                           v[SCALE] if scale is None else scale.detach().to(torch.float64), step])
        self.vec = new
        if self.cuda:  # pinned memory and a recorded event: the copy lands while the GPU works on
            host = torch.empty(6, dtype=torch.float64, pin_memory=True)
            host.copy_(new, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self.pending.append((host, done))

    def arrived(self) -> dict | None:
        """The latest counts that already reached the host, without waiting for the device; None if none has."""
        if not self.cuda:
            return _named(self.vec.tolist())
        ready = None
        while self.pending and self.pending[0][1].query():
            ready = self.pending.pop(0)[0]
        return None if ready is None else _named(ready.tolist())

    def read(self) -> dict:
        """The counts after the last step, waiting for the device (logging, evaluation and checkpoint steps)."""
        self.pending.clear()
        return _named(self.vec.tolist())


def _named(v: list) -> dict:
    return {"nonfinite_steps": int(v[TOTAL]), "run": int(v[RUN]), "first": int(v[FIRST]), "loss": v[FIRST_LOSS],
            "scale": v[SCALE], "step": int(v[STEP])}


def loss_scale(scaler) -> torch.Tensor | None:
    """fp16's current loss scale as a device tensor (GradScaler.get_scale() reads it on the host), or None."""
    if scaler is None or not scaler.is_enabled():
        return None
    # torch keeps the scale in `_scale` and offers no public tensor accessor; get_scale() would sync.
    return scaler._scale
