"""What a model may know without asking the device: how long a batch's rows are, and a batch's token ids.

On a GPU every host read (`.item()`, `bool(t)`, boolean-mask indexing, `.cpu()`) waits until all queued work
has run, so a training step must not make one (ARCHITECTURE.md, "GPU first"). What keeps the models from needing to:

- Which kernels: `plmcli.kernels.enabled(device)`, the one switch between plm's CPU kernels and the
  device-generic path a GPU takes (plmcli/kernels/__init__.py). A CPU has no queue to drain, so the CPU path may
  read the host; the generic path must not (tests/train/test_host_syncs.py switches the kernels off on a CPU and
  counts its host reads).
- `row_lengths` / `lengths_of`: a right-padded batch's row lengths as the host counted them when it built the
  batch. Whether a batch is padded, how many tokens to unpad (models/layers.py: bidirectional) and how to pack
  an RNN's input (models/seq2seq.py) are then answered on the host instead of read back from the device;
  `host_values` / `values_of` likewise hold the host's copy of a batch's token ids, from which an adaptive
  softmax counts the words of each cluster (models/adaptive.py).
An objective sets them around its model call from what its batches carry; a model that finds nothing there
reads the device as before (evaluation, scoring, a caller of its own).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch


_known: ContextVar[tuple] = ContextVar("plm_host_known", default=())
"""(tensor, "lengths" | "values", the host's numpy array) for each active `row_lengths` and `host_values`,
innermost last: a context variable, so one thread's batch is never taken for another's."""


@contextmanager
def row_lengths(mask: torch.Tensor | None, lengths):
    """Within: `mask` ((..., T), 1 = token, right-padded) holds lengths[r] real tokens in its r-th row of T (rows in
    memory order), `lengths` being what the batch's builder counted on the host (a list of ints, or None: not
    known). Set by an objective around its model call; read through `lengths_of`.

    A batch carries them as a list: the DataLoader turns a numpy array into a tensor, and the loop moves every
    tensor of a batch to the device, from where they would have to be read back."""
    with _knowing(mask, "lengths", lengths):
        yield


@contextmanager
def host_values(tensor: torch.Tensor | None, values):
    """Within: the host holds `tensor`'s values too (nested lists of ints in its shape, or a numpy array of them, as
    the batch's builder made them; None: it does not). Read through `values_of`."""
    with _knowing(tensor, "values", values):
        yield


@contextmanager
def _knowing(tensor, what: str, value):
    if torch.is_tensor(value):
        raise TypeError(f"the host's {what} must be ints (a list), not a tensor: that would be read back from its device")
    known = tensor is not None and value is not None and tensor.is_contiguous()
    token = _known.set(_known.get() + ((tensor, what, np.asarray(value, dtype=np.int64)),)) if known else None
    try:
        yield
    finally:
        if token is not None:
            _known.reset(token)


def lengths_of(mask: torch.Tensor | None) -> np.ndarray | None:
    """The host's row lengths (`row_lengths`) of `mask` or of a view of the same memory with the same rows (a
    (B, R, T) mask read as (B·R, T), say), else None: then only the device knows them."""
    return _held(mask, "lengths", lambda lengths: len(lengths) * mask.shape[-1])


def values_of(tensor: torch.Tensor | None) -> np.ndarray | None:
    """The host's copy (`host_values`) of `tensor` or of a view of the same memory (flattened, say), as an array in
    the held tensor's shape, else None: then only the device holds them."""
    return _held(tensor, "values", lambda values: values.size)


def _held(tensor, what: str, numel) -> np.ndarray | None:
    # compiling first: Dynamo does not trace a context variable's get
    if tensor is None or torch.compiler.is_compiling() or not tensor.is_contiguous():
        return None
    for held, kind, value in reversed(_known.get()):
        if (kind == what and held.device == tensor.device and held.dtype == tensor.dtype
                and held.data_ptr() == tensor.data_ptr() and held.numel() == tensor.numel() == numel(value)):
            return value
    return None
