"""Optimizers: LAMB (You et al. 2019) and `build_optimizer`, which picks one and splits weight decay."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import get_args

import torch
from torch import nn

from plmcli.config_sections import OptimizerName
from plmcli.errors import PlmError

OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)


class Lamb(torch.optim.Optimizer):
    """LAMB, Algorithm 2 of You et al. 2019, "Large Batch Optimization for Deep Learning".

    Adam moments with bias correction give r = m̂ / (√v̂ + eps) + weight_decay·w; each parameter
    tensor then moves by lr · trust · r, with trust = ‖w‖ / ‖r‖ (φ = identity) so that every layer
    takes a step proportional to its own scale, whatever its gradient scale.

    A group with layer_adaptation=False takes the plain step lr · r (trust 1). The authors'
    implementation (tensorflow_addons LAMB: exclude_from_layer_adaptation defaults to
    exclude_from_weight_decay) and apex's FusedLAMB (use_nvlamb=False) exempt biases and LayerNorm
    parameters this way; build_optimizer does the same for its ndim < 2 group.

    max_trust_ratio clamps the trust ratio from above, as DeepSpeed's FusedLamb does (max_coeff 10),
    so a layer with a tiny update cannot take a huge step; None (the default) leaves it unclamped:
    the paper's φ = identity, as in the authors' implementation.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        max_trust_ratio: float | None = None,
        layer_adaptation: bool = True,
    ):
        if lr < 0.0:
            raise ValueError(f"invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"invalid eps: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas: {betas}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay: {weight_decay}")
        if max_trust_ratio is not None and max_trust_ratio <= 0.0:
            raise ValueError(f"invalid max_trust_ratio: {max_trust_ratio}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            max_trust_ratio=max_trust_ratio,
            layer_adaptation=layer_adaptation,
        )
        super().__init__(params, defaults)

    # GradScaler hands a step its scale and overflow flag as tensors (optimizer.grad_scale / found_inf), and the
    # loop its own non-finite flag, instead of reading them on the host: the step never waits for the device.
    _step_supports_amp_scaling = True
    grad_scale: torch.Tensor | None = None
    found_inf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale, found_inf = self.grad_scale, self.found_inf  # set by GradScaler or the loop around a step

        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    # On the parameter's device, as torch's fused Adam keeps it: the bias correction of a
                    # step that may be skipped (found_inf) is then computed there, with no host read.
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                _lamb_group(params, grads, exp_avgs, exp_avg_sqs, steps, group, grad_scale, found_inf)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        # torch's loader leaves `step` where it was saved (the CPU, or a checkpoint from before it moved).
        for p, state in self.state.items():
            if "step" in state:
                state["step"] = state["step"].to(device=p.device, dtype=torch.float32)


def _lamb_group(params, grads, exp_avgs, exp_avg_sqs, steps, group, grad_scale=None, found_inf=None) -> None:
    """One LAMB step of a parameter group. `grad_scale`: gradients are still multiplied by it (fp16 loss
    scaling); `found_inf` (0-dim tensor, 1 = a gradient was not finite): the step is skipped on the device —
    weights, moments and step count stay as they were."""
    beta1, beta2 = group["betas"]
    lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
    max_trust = group["max_trust_ratio"]
    if grad_scale is not None:
        grads = torch._foreach_div(grads, grad_scale.to(grads[0].device))
    if found_inf is None:
        torch._foreach_add_(steps, 1.0)
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)  # m = β1·m + (1-β1)·g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        keep = None
    else:
        # keep = 0 turns every update into the identity; a non-finite gradient is zeroed first, since 0·nan is nan.
        # Only list ⊗ list and list × 0-dim-tensor foreach ops: a 0-dim tensor where torch expects a Python
        # scalar (lerp's weight, add's other) would be read on the host.
        skip = found_inf.to(grads[0].device).bool()
        keep = (~skip).to(grads[0].dtype)
        grads = [torch.where(skip, torch.zeros((), dtype=g.dtype, device=g.device), g) for g in grads]
        torch._foreach_add_(steps, [keep.to(t.dtype) for t in steps])
        dm = torch._foreach_sub(grads, exp_avgs)  # m += (1-β1)·keep·(g - m)
        torch._foreach_mul_(dm, keep)
        torch._foreach_add_(exp_avgs, dm, alpha=1.0 - beta1)
        dv = torch._foreach_mul(exp_avg_sqs, beta2 - 1.0)  # v += keep·((β2-1)·v + (1-β2)·g²)
        torch._foreach_addcmul_(dv, grads, grads, value=1.0 - beta2)
        torch._foreach_mul_(dv, keep)
        torch._foreach_add_(exp_avg_sqs, dv)
        del dm, dv

    # Parameters in a group may have been added at different times, so each keeps its own step.
    if group["bias_correction"]:
        # In float64: 1 - 0.999^t in float32 keeps only ~4 digits at small t (cancellation).
        bc1 = [1.0 - torch.pow(beta1, t.double()) for t in steps]
        bc2 = [1.0 - torch.pow(beta2, t.double()) for t in steps]
    else:
        bc1 = bc2 = [torch.ones((), device=t.device) for t in steps]
    updates = []
    for m, v, b1, b2 in zip(exp_avgs, exp_avg_sqs, bc1, bc2):
        denom = (v / b2).sqrt_().add_(eps)
        updates.append((m / b1).div_(denom))
    if weight_decay != 0.0:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    if keep is not None:
        torch._foreach_mul_(updates, keep)
    # .get: groups restored from a state_dict saved before this option existed lack the key.
    if not group.get("layer_adaptation", True):
        torch._foreach_add_(params, updates, alpha=-lr)
        return

    w_norms = torch._foreach_norm(params)
    r_norms = torch._foreach_norm(updates)
    for p, r, w_norm, r_norm in zip(params, updates, w_norms, r_norms):
        # Kept as tensors (torch.where, not `if`) so that CUDA never has to sync per tensor.
        trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
        if max_trust is not None:
            trust = trust.clamp(max=max_trust)
        p.addcmul_(r, trust.to(r.dtype), value=-lr)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (linear, embedding, conv kernels); never biases or norm gains (ndim < 2).

    Decaying a bias or a LayerNorm/RMSNorm gain pulls it toward 0, which shrinks the signal instead
    of regularising a mapping; this is the split BERT, GPT-2 and nanoGPT use.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # named_parameters dedups tied weights
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    momentum: float = 0.0,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer `name` (one of OPTIMIZERS) over model's trainable parameters.

    Two groups: ndim ≥ 2 parameters get `weight_decay`, biases and norm gains get none.
    `fused=None` picks torch's fused AdamW/Adam/SGD kernel when every parameter is on CUDA or the CPU (torch ≥ 2.4
    has both: one pass over each tensor, where the multi-tensor (foreach) kernel makes about ten; on the CPU
    it halved the optimizer's share of a small GPT step) and the foreach one otherwise. The fused kernels
    (and LAMB) also skip a non-finite step on the device (`skips_on_device`).
    """
    key = name.lower().strip()
    if key not in OPTIMIZERS:
        raise PlmError(f"unknown optimizer {name!r}", f"use one of: {', '.join(OPTIMIZERS)}")
    groups = _param_groups(model, weight_decay)
    if not groups:
        raise PlmError("the model has no trainable parameters", "unfreeze some before training")

    params = [p for g in groups for p in g["params"]]
    if fused is None:
        fused = all(p.device.type in ("cuda", "cpu") for p in params)
    # torch rejects fused=True together with foreach=True
    kernel = {"fused": True} if fused else {"foreach": True}

    try:
        if key == "adamw":
            return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **kernel)
        if key == "adam":
            # Adam's weight_decay is coupled L2 (added to the gradient); adamw decouples it.
            return torch.optim.Adam(groups, lr=lr, betas=tuple(betas), eps=eps, **kernel)
        if key == "lamb":
            # Biases and norm gains (the ndim < 2 group) take plain Adam steps, as in the authors'
            # implementation: a trust ratio ties a step to the tensor's own norm, so a bias that
            # starts at 0 could only grow by a factor (1 + lr) per step.
            for g in groups:
                g["layer_adaptation"] = g["params"][0].ndim >= 2
            return Lamb(groups, lr=lr, betas=tuple(betas), eps=eps)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, **kernel)
    except (ValueError, RuntimeError) as e:
        raise PlmError(f"cannot build optimizer {key!r}: {e}", "check the optim section of the recipe") from e


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` honours a `found_inf` tensor set on it (skipping the update on the device, as
    GradScaler asks of torch's fused kernels): fused AdamW / Adam / SGD, and LAMB. The foreach kernels (a
    device with no fused kernel) do not: the loop then reads the flag on the host, one sync a step."""
    return isinstance(optimizer, Lamb) or bool(optimizer.defaults.get("fused"))
