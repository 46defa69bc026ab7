"""Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost") for the
Transformer families: train.activation_checkpointing.

A Transformer's training memory is mostly the activations autograd keeps for backward: per block, the
attention probabilities (B, H, T, T), the feed-forward's (B, T, d_ff) and every LayerNorm and dropout
input. Checkpointing keeps only each block's inputs and runs the block's forward once more during backward,
one block at a time: activation memory falls from ~L blocks' worth to L block inputs plus one block's worth,
for one more forward pass (~1/3 more compute per step). It is what lets a large model, a long sequence or a
larger micro-batch fit on one GPU.

torch's non-reentrant checkpoint is used: it takes any arguments (memories, masks, None, a second stream),
works under DDP and torch.compile, and restores the RNG state of the CPU and of the inputs' devices before
recomputing, so every dropout mask (plm's own `layers.dropout` seeds its masks from torch's generator)
comes out the same and the gradients equal the plain path's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from plmcli.errors import PlmError
from plmcli.models.base import CheckpointsActivations, LanguageModel


class CheckpointedBlocks:
    """Implements base.CheckpointsActivations for a family (or a network inside one, ELECTRA's two) whose block
    loop calls `run_block(block, ...)` for each block: mixed into an nn.Module."""

    activation_checkpointing: bool = False
    """Whether `run_block` recomputes its block in backward (set by `checkpoint_activations`)."""

    def checkpoint_activations(self, on: bool) -> None:
        # The networks inside (ELECTRA's generator and discriminator) run blocks of their own.
        for m in self.modules():
            if isinstance(m, CheckpointedBlocks):
                m.activation_checkpointing = on

    def run_block(self, block, *args, **kwargs):
        """block(*args, **kwargs) — a module or any function of tensors — its activations dropped after the
        forward and recomputed in backward when checkpointing is on. Without autograd recording (evaluation,
        scoring, generation) there is nothing to keep, so nothing to recompute: the block just runs."""
        if self.activation_checkpointing and torch.is_grad_enabled():
            # determinism_check compares every recomputed tensor's .shape with the first forward's, which the strided
            # nested tensors of a CPU's jagged attention (the unpadded encoder path) do not have; the recomputation
            # is the same by construction (RNG restored) and tests/models/test_activation_checkpointing.py checks it.
            return checkpoint(block, *args, use_reentrant=False, determinism_check="none", **kwargs)
        return block(*args, **kwargs)


def apply_activation_checkpointing(model: nn.Module, on: bool) -> None:
    """train.activation_checkpointing on `model`: a family, a finetune's task model around one, or either wrapped
    (DDP, accelerate, compile). Every family in it checkpoints its blocks (`on`) or keeps every activation
    (not `on`). Call it before torch.compile traces the model. `on` for a model without blocks is a PlmError."""
    families = [m for m in model.modules() if isinstance(m, LanguageModel)]
    for m in families:
        if isinstance(m, CheckpointsActivations):
            m.checkpoint_activations(on)
        elif on:
            _refuse(type(m))
    if on and not families:
        _refuse(type(model))


def _refuse(cls: type):
    from plmcli.models.registry import FAMILIES, model_class

    # the registry's name of the family (a user never saw the class name); any other module by its class
    name = next((f for f, path in FAMILIES.items() if path == f"{cls.__module__}:{cls.__qualname__}"), cls.__name__)
    able = [f for f in FAMILIES if issubclass(model_class(f), CheckpointsActivations)]
    raise PlmError(f"train.activation_checkpointing needs a Transformer family; {name} has no blocks to checkpoint",
                   f"--set train.activation_checkpointing=false, or train one of: {', '.join(able)}")
