"""Linear layers whose fp32 matmuls run on oneDNN on a CPU, with the activation after them fused in.

torch sends an fp32 `F.linear` on a CPU to MKL's sgemm. oneDNN's fp32 matmul (the library torch already
runs bf16 matmuls and Inductor's fused linears on) is faster at a Transformer's shapes on the AMD EPYC
(Zen 4) we measure on: x · Wᵀ with 1,024–2,048 rows and 256–1,024 columns at 203–219 GFLOP/s where MKL
reaches 164–203, and a large 2,048² product at 206–212 against 182–185 (2 threads). Without a gradient
it also applies the activation that follows (GELU, ReLU, SiLU) while the output is in cache: a
feed-forward's tanh-GELU then costs 0.6 ms over (2,048 × 1,024) instead of a 3 ms pass of its own.

With a gradient the forward and the input gradient (g · W) run on oneDNN and the weight gradient
(gᵀ · x) on MKL: oneDNN takes those transposed operands 20–40% slower. Anything else (autocast, bf16,
fp64, a GPU, jagged tensors, a compiled graph, a torch without the op) takes `F.linear` as before.
The numbers are the same product's up to rounding (the summation order differs, as between any two BLAS).
`PLM_ONEDNN=0` in the environment keeps every fp32 linear on `F.linear`, for a CPU where torch's own
GEMM is the faster one (only measured on the Zen 4 above).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from plmcli.models import device as devices

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

_enabled = [_onednn_linear is not None and os.environ.get("PLM_ONEDNN", "1") != "0"]


def onednn_enabled() -> bool:
    """Whether fp32 linears on a CPU run on oneDNN here: torch has the op, and neither `PLM_ONEDNN=0` (read at
    import) nor `onednn(False)` has turned it off."""
    return _enabled[0]


@contextmanager
def onednn(enabled: bool):
    """Within: oneDNN's linears on (where they apply) or off (torch's own `F.linear`), e.g. to compare the two."""
    saved = _enabled[0]
    _enabled[0] = enabled and _onednn_linear is not None
    try:
        yield
    finally:
        _enabled[0] = saved


_packed: list[dict | None] = [None]


@contextmanager
def packed_weights():
    """Within: the weights do not change (a scoring or evaluation pass), so a linear without a gradient copies
    each parameter once into oneDNN's blocked layout and reuses the copy: oneDNN then skips reordering the
    plain weight on every call (x · Wᵀ 2–4% faster at a Transformer's shapes, on AMD EPYC Zen 4). The same
    numbers, for one more copy of the weights' memory while the outermost context lasts. Not for sharded
    weights (FSDP, ZeRO-3), which are gathered into new memory at every forward."""
    saved = _packed[0]
    _packed[0] = {} if saved is None else saved
    try:
        yield
    finally:
        _packed[0] = saved


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
    return (onednn_enabled() and devices.cpu_kernels(x.device) and x.dtype == weight.dtype == torch.float32
            and (bias is None or bias.dtype == torch.float32) and not x.is_nested and x.dim() >= 2
            and x.shape[-1] > 0  # oneDNN has no inner product over 0 features; F.linear gives the bias
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


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
        if _packed[0] is not None:
            weight = _packed_weight(_packed[0], weight, x)
        return _onednn_linear(x, weight, bias, attr, [], algorithm)
    return y if activation is None else ACTIVATIONS[activation](y)


class Linear(nn.Linear):
    """nn.Linear through `linear` (same parameters and names: checkpoints and transformers interop unchanged).
    `activation` (a name in ACTIVATIONS) is applied to the output, fused into the matmul where it can be."""

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.bias, activation)
