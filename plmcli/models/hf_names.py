"""transformers' names for what a family computes, and the checks its `to_hf` / `from_hf` share.

Conversion lives on each family's class (see plmcli/models/bert.py); plmcli.interop.hf drives it. These
helpers sit with the models, below interop, so that a model file imports nothing above its layer. plm never
imports transformers itself: the HF configs are plain JSON written by hand, with the keys HF's config classes read.
"""

from __future__ import annotations

import torch

from plmcli.errors import PlmError

HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
"""Our activation -> the name in transformers' ACT2FN that computes the same function (hidden_act,
activation_function). gelu_new is GPT-2's tanh approximation, the formula our gelu_tanh computes."""

FROM_HF_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                      "silu": "silu", "swish": "silu"}
"""transformers' ACT2FN names we compute exactly -> ours (gelu_fast, quick_gelu, ... are other functions)."""


def activation_from_hf(hf_config: dict, key: str, table: dict | None = None) -> str:
    """Our activation for hf_config[key]; PlmError naming the field when we have no exact equivalent."""
    table = table or FROM_HF_ACTIVATION
    value = hf_config.get(key, "gelu")
    if value not in table:
        raise PlmError(f"the HF config's {key} '{value}' has no exact plm equivalent",
                       f"plm computes: {', '.join(sorted(table))}")
    return table[value]


def require_hf(hf_config: dict, key: str, supported, default=None) -> None:
    """PlmError naming `key` when the HF config sets it to something the family cannot represent."""
    value = hf_config.get(key, default)
    if value not in supported:
        raise PlmError(f"the HF config's {key} = {value!r} cannot be represented by plm",
                       f"supported: {', '.join(repr(v) for v in supported)}")


def owned(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous copies: safetensors refuses tensors that share storage (tied weights, views of a fused QKV)."""
    return {k: v.detach().contiguous().clone() for k, v in tensors.items()}


def without_prefix(state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """HF's task classes nest the base model under a prefix ("bert.", "transformer."), its bare
    base-model class does not: the keys with `prefix` removed where present."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state_dict.items()}
