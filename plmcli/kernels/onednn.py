"""Linear layers whose fp32 matmuls run on oneDNN on a CPU, with the activation after them fused in.

torch sends an fp32 `F.linear` on a CPU to MKL's sgemm. oneDNN's fp32 matmul (the library torch already
runs bf16 matmuls and Inductor's fused linears on) is faster at a Transformer's shapes on the AMD EPYC
(Zen 4) we measure on: x · Wᵀ with 1,024–2,048 rows and 256–1,024 columns at 203–219 GFLOP/s where MKL
reaches 164–203, and a large 2,048² product at 206–212 against 182–185 (2 threads). Without a gradient
it also applies the activation that follows (GELU, ReLU, SiLU) while the output is in cache: a
feed-forward's tanh-GELU then costs 0.6 ms over (2,048 × 1,024) instead of a 3 ms pass of its own.

With a gradient the forward and the input gradient (g · W) run on oneDNN and the weight gradient
(gᵀ · x) on MKL: oneDNN takes those transposed operands 20–40% slower. Anything else (the switch off,
autocast, bf16, fp64, a GPU, jagged tensors, a compiled graph, a torch without the op) takes `F.linear`.
The numbers are the same product's up to rounding (the summation order differs, as between any two BLAS).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from plmcli.kernels.switch import enabled, switched_on

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    # GPT-2's "gelu_new": the tanh approximation, as one fused kernel instead of HF's seven ops.
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
"""A model's activation by its recipe name (model.activation)."""


def _mkldnn_op(name: str):
    """torch.ops.mkldnn.<name>, or None on a torch without oneDNN or without that op."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return getattr(torch.ops.mkldnn, name)
    except (AttributeError, RuntimeError):
        return None


_onednn_linear = _mkldnn_op("_linear_pointwise")
"""oneDNN's linear with a fused post-op (the op Inductor's CPU linears call)."""
_onednn_reorder = _mkldnn_op("_reorder_linear_weight") if _onednn_linear is not None else None
"""Copies a linear's weight into oneDNN's blocked layout (as Inductor's frozen CPU linears do)."""

ONEDNN_ACTIVATIONS = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"),
                      "relu": ("relu", ""), "silu": ("swish", "")}
"""ACTIVATIONS' names -> oneDNN's post-op (attr, algorithm)."""


def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear op (fixed at import)."""
    return _onednn_linear is not None


def onednn_enabled() -> bool:
    """Whether fp32 linears on a CPU run on oneDNN here: torch has the op and the kernels' switch is on."""
    return _onednn_linear is not None and switched_on()


_packed: ContextVar[dict | None] = ContextVar("plm_packed_weights", default=None)
"""The cache of `packed_weights` this thread or task is inside, else None: a context variable, so a pass with
packed weights in one thread does not pack (and pin) another thread's training weights."""


@contextmanager
def packed_weights():
    """Within: the weights do not change (a scoring or evaluation pass), so a linear without a gradient copies
    each parameter once into oneDNN's blocked layout and reuses the copy: oneDNN then skips reordering the
    plain weight on every call (x · Wᵀ 2–4% faster at a Transformer's shapes, on AMD EPYC Zen 4). The same
    numbers, for one more copy of the weights' memory while the outermost context lasts. Not for sharded
    weights (FSDP, ZeRO-3), which are gathered into new memory at every forward."""
    token = _packed.set({} if _packed.get() is None else _packed.get())
    try:
        yield
    finally:
        _packed.reset(token)


def packed_cache() -> dict | None:
    """The innermost `packed_weights` cache ((data_ptr, shape, version) -> (weight, its packed copy)), else None."""
    return _packed.get()


def _packed_weight(cache: dict, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's layout from `cache`, made on first use. Only a parameter or a view of one is
    copied: a weight computed in the forward pass would be new memory each time (and could reuse a freed
    weight's address). A parameter changed in place (its version) or another view of the same memory gets
    its own copy; the entry holds the weight, so its memory cannot be freed and reused while cached."""
    if _onednn_reorder is None or not weight.is_contiguous() or not (
            isinstance(weight, nn.Parameter) or isinstance(weight._base, nn.Parameter)):
        return weight
    key = (weight.data_ptr(), tuple(weight.shape), weight._version)
    entry = cache.get(key)
    if entry is None:
        entry = cache[key] = (weight, _onednn_reorder(weight, max(1, x.numel() // x.shape[-1])))  # rows: a hint
    return entry[1]


def takes_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `linear(x, weight, bias)` runs on oneDNN."""
    return (_onednn_linear is not None and enabled(x.device) and x.dtype == weight.dtype == torch.float32
            and (bias is None or bias.dtype == torch.float32) and not x.is_nested and x.dim() >= 2
            and x.shape[-1] > 0  # oneDNN has no inner product over 0 features; F.linear gives the bias
            and not torch.is_autocast_enabled("cpu"))


class _Linear(torch.autograd.Function):
    """x · Wᵀ + b with oneDNN's forward and input gradient, MKL's weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = _onednn_linear(grad, weight.t(), None, "none", [], "") if need_x else None
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_w = torch.mm(g2.t(), x.reshape(-1, x.shape[-1])) if need_w else None
        grad_b = g2.sum(0) if need_b and ctx.has_bias else None
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """activation(x · weightᵀ + bias): `F.linear` then the named activation (ACTIVATIONS), on oneDNN
    where it applies, the activation fused into the matmul when no gradient is needed."""
    if not takes_onednn(x, weight, bias):
        y = F.linear(x, weight, bias)
    elif torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                      or bias is not None and bias.requires_grad):
        y = _Linear.apply(x, weight, bias)
    else:
        attr, algorithm = ONEDNN_ACTIVATIONS[activation]
        cache = _packed.get()
        if cache is not None:
            weight = _packed_weight(cache, weight, x)
        return _onednn_linear(x, weight, bias, attr, [], algorithm)
    return y if activation is None else ACTIVATIONS[activation](y)


class Linear(nn.Linear):
    """nn.Linear through `linear` (same parameters and names: checkpoints and transformers interop unchanged).
    `activation` (a name in ACTIVATIONS) is applied to the output, fused into the matmul where it can be."""

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, activation)
