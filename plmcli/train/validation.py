"""The loop's evaluation pass: token-weighted means of the objective's metrics over the validation stream, and on
a mix (data/mixing.py) each source's loss apart (`val_loss/NAME`).

Sums stay on the device through the pass (no host read per batch) and are read once at the end, after one
reduction over every process: the pooled sums and each source's, stacked in one tensor.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from plmcli.data.batching import to_device
from plmcli.data.mixing import SOURCE
from plmcli.kernels import packed_weights
from plmcli.train.distributed import sharded

PER_SOURCE = "loss"
"""The metric reported per source of a mix: val_loss/NAME."""


def evaluate(accelerator, model, objective, stream, max_batches: int, sources: list[str] | None = None) -> dict:
    """Token-weighted mean of the objective's metrics over the validation stream.

    An objective's own `evaluate` (task metrics that need all predictions, such as MCC or F1) answers
    instead when it has one. `max_batches` counts micro-batches over all processes (rounded up to a
    multiple of their number): N processes score the samples one does. `sources`: the names of a mix's
    sources, whose batches say which one they hold (data/mixing.py SOURCE): each gets `val_loss/NAME`.
    """
    # The weights hold still for the pass: each is laid out for oneDNN once (not when sharded: FSDP and
    # ZeRO-3 gather them into new memory at every forward).
    with nullcontext() if sharded(accelerator) else packed_weights():
        return _evaluate(accelerator, model, objective, stream, max_batches, sources or [])


def _evaluate(accelerator, model, objective, stream, max_batches: int, sources: list[str]) -> dict:
    if max_batches:
        max_batches = -(-max_batches // accelerator.num_processes)
    model.eval()
    try:
        own = objective.evaluate(accelerator, model, stream, max_batches)
    finally:
        model.train()
    if own is not None:
        return own
    model.eval()
    sums: dict = {}
    count = torch.zeros((), device=accelerator.device)
    # per source: (its PER_SOURCE sum, its count), summed on the device
    apart = torch.zeros((len(sources), 2), device=accelerator.device)
    state = objective.init_state()
    n = stream.batches_per_epoch()
    n = min(n, max_batches) if max_batches else n
    # FSDP / ZeRO-3 gather the weights inside forward, so a process whose share of the split ran out
    # still runs forward (on a batch it already scored, not counted) while the others finish theirs.
    shard, filler = sharded(accelerator), None
    with torch.no_grad():
        for k in range(n):
            batch = stream[k]
            if batch is None and not (shard and filler is not None):
                continue
            filler = batch if filler is None else filler
            with accelerator.autocast():
                out = objective.step(model, to_device(filler if batch is None else batch, accelerator.device), state)
            if batch is None:
                continue
            state = out.state
            for name, v in out.metrics.items():
                sums[name] = sums.get(name, 0) + v.float()
            count += out.count
            if sources and PER_SOURCE in out.metrics:
                src = batch[SOURCE]  # a host int the stream put there: indexing by it reads nothing back
                apart[src] += torch.stack([out.metrics[PER_SOURCE].float(), out.count.float()])
    model.train()
    keys = sorted(sums)
    if not keys:
        return {}
    vec = accelerator.reduce(torch.cat([torch.stack([sums[k] for k in keys] + [count]), apart.flatten()]),
                             reduction="sum")
    each = vec[len(keys) + 1 :].view(-1, 2)
    # the means divided on the device (as one corpus' always were), then the pass's one read of it
    values = torch.cat([vec[: len(keys)] / vec[len(keys)], each[:, 0] / each[:, 1].clamp(min=1), each[:, 1]]).tolist()
    res = {f"val_{k}": values[i] for i, k in enumerate(keys)}
    key = f"val_{objective.ppl_metric}"
    if key in res:
        res["val_ppl"] = math.exp(min(res[key], 50.0))
    for i, name in enumerate(sources):
        if values[len(keys) + len(sources) + i]:  # a source with no validation batch in this pass has no loss
            res[f"val_{PER_SOURCE}/{name}"] = values[len(keys) + i]
    return res
