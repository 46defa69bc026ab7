"""The one switch of plm's CPU kernels: `enabled(device)`, `PLM_CPU_KERNELS=0`, `switched(on)`."""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar

import torch

ENV = "PLM_CPU_KERNELS"
"""`PLM_CPU_KERNELS=0` in the environment (read at import) keeps every kernel off: plain torch ops only."""

_on: ContextVar[bool] = ContextVar("plm_cpu_kernels", default=os.environ.get(ENV, "1") != "0")
"""A context variable, not a module global: `switched` in one thread (or asyncio task) leaves the others alone."""


def enabled(device: torch.device) -> bool:
    """Whether work on `device` takes plm's CPU kernels rather than the plain, device-generic torch ops: on a CPU,
    with the switch on, outside a torch.compile graph (Dynamo traces neither numpy nor host reads, and Inductor
    writes its own kernels). The compile check comes before the context variable, which Dynamo does not trace."""
    return device.type == "cpu" and not torch.compiler.is_compiling() and _on.get()


def switched_on() -> bool:
    """The switch itself, whatever the device (`PLM_CPU_KERNELS`, or the innermost `switched`)."""
    return _on.get()


@contextmanager
def switched(on: bool):
    """Within (this thread or task only): plm's CPU kernels on, or off so a CPU runs the plain torch ops a GPU
    runs (a conformance test, a count of the generic path's host reads, a CPU where torch's own GEMM wins)."""
    token = _on.set(on)
    try:
        yield
    finally:
        _on.reset(token)
