"""Per-layer hidden states of any Transformer family, read with forward hooks, no model code copied.

A family opts in with one class attribute, `probe_layers`: the dotted name of the ModuleList its
layers run from (GPT, BERT, NEZHA, XLNet: "blocks"; ELECTRA: "discriminator.blocks"), or a pair
(where a layer starts, where it ends) when one layer is two modules (ALBERT: ("attention", "ffn")).
Layer 0 is the input the first layer receives (the embeddings as the family feeds them on: BERT's
after its LayerNorm, ALBERT's and ELECTRA's after the projection to the hidden size); layer i is
what the i-th layer call returns. Hooks fire once per call, so ALBERT's one shared layer, applied
n_layer times, yields n_layer states like any other stack.

The states are the layers' outputs as they are, residual stream included: for a pre-LN GPT-2 the
last one comes before the final LayerNorm (`ln_f`), so it is not `hidden()`'s output, which is.
"""

from __future__ import annotations

import torch
from torch import nn


def layer_spec(model_cls) -> tuple[str, str] | None:
    """(module list a layer starts at, module list a layer ends at), or None: the family declares none."""
    spec = model_cls.probe_layers
    if spec is None:
        return None
    return (spec, spec) if isinstance(spec, str) else tuple(spec)


def families_with_layers() -> list[str]:
    """The registered families whose layers can be read (their class declares `probe_layers`)."""
    from plmcli.models.registry import FAMILIES, model_class

    return sorted(f for f in FAMILIES if layer_spec(model_class(f)) is not None)


def run_backbone(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
    """One forward pass that reaches every layer: an encoder's `encode`; a causal LM's `hidden` where it
    has one (no logits: GPT-2's would be B × T × 50k floats), else its forward.

    A causal LM takes no mask: with padding on the right, no real position ever attends to it.
    """
    from plmcli.models.base import HasHidden

    if type(model).traits.bidirectional:
        model.encode(input_ids, None, attention_mask)
    elif isinstance(model, HasHidden):
        model.hidden(input_ids)
    else:
        model(input_ids)


@torch.no_grad()
def hidden_states(model: nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """(B, T) ids -> [layer 0 (embeddings), layer 1, ..., layer L], each (B, T, C)."""
    spec = layer_spec(type(model))
    if spec is None:
        raise ValueError(f"{type(model).__name__} declares no probe_layers")
    starts, ends = (model.get_submodule(name) for name in spec)
    states: list[torch.Tensor] = []

    def on_start(module, args):
        if not states:  # only the first layer's input; later layers' inputs are earlier outputs
            states.append(args[0])

    def on_end(module, args, out):
        states.append(out[0] if isinstance(out, tuple) else out)  # XLNet's blocks return (h, g)

    handles = [m.register_forward_pre_hook(on_start) for m in starts]
    handles += [m.register_forward_hook(on_end) for m in ends]
    try:
        run_backbone(model, input_ids, attention_mask)
    finally:
        for h in handles:
            h.remove()
    return states
