"""The one shape of every finetuning model: a pretrained network, dropout, and one linear layer over its
features, initialised as BERT's task layers are (weights N(0, init_std), zero bias).

The heads (classify.py's SequenceClassifier and CausalTransfer, qa.py's SpanExtractor, tagging.py's
TokenClassifier; choice.py scores with SequenceClassifier) say only what differs: the name of the network
(finetuned runs on disk hold `encoder.*` or `backbone.*` and `head.*` weights), the features' width, the
default dropout, and which features `forward` reads. Backbone and head live in one module, so the loop,
best-weight selection and load_finetuned handle it whole.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from plmcli.models.base import head_dropout, head_init_std, uses_token_types


def encoder_problem(model_cls) -> str | None:
    """Why runs of `model_cls` are not encoders, or None when they are: for objectives that need every
    token's bidirectional state (tagging, span QA), which GPT-style transfer does not give."""
    if model_cls.traits.bidirectional:
        return None
    if model_cls.traits.causal:
        return "is a causal LM; it needs an encoder run"
    return "has no encoder to finetune; it needs an encoder run"


class TaskHead(nn.Module):
    """network -> features -> dropout -> Linear(width, num_outputs)."""

    network_name: ClassVar[str] = "encoder"
    """The attribute (and state-dict prefix) that holds the pretrained network."""
    default_dropout: ClassVar[float | None] = None
    """Dropout when the task sets none; None: the network's own (models.base.head_dropout)."""

    def __init__(self, network: nn.Module, num_outputs: int, dropout: float | None = None, width: int | None = None,
                 head: nn.Module | None = None):
        """`width`: of the features (the network's d_model when None); `head`: a head the family builds itself
        (ELMo's scalar mix), used as is instead of dropout + Linear."""
        super().__init__()
        setattr(self, self.network_name, network)
        self.frozen: list[str] = []
        # One segment embedding (RoBERTa) or none: pairs are told apart by [SEP] alone.
        self.use_types = uses_token_types(network)
        if head is not None:
            self.head = head
            return
        if dropout is None:
            dropout = head_dropout(network) if self.default_dropout is None else self.default_dropout
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(network.cfg.d_model if width is None else width, num_outputs)
        nn.init.normal_(self.head.weight, std=head_init_std(network))  # as BERT's task layers
        nn.init.zeros_(self.head.bias)

    @property
    def network(self) -> nn.Module:
        return self.get_submodule(self.network_name)

    @property
    def max_positions(self) -> int:
        return self.network.max_positions

    def encoded(self, input_ids, token_type_ids=None, attention_mask=None):
        """The encoder's (hidden (B, T, C), pooled (B, C) | None); segment ids only where it has segments."""
        return self.network.encode(input_ids, token_type_ids if self.use_types else None, attention_mask)

    def freeze_unused(self, cls_id: int, sep_id: int) -> list[str]:
        """Freeze the parameters a finetuning pass never reaches (MLM/NSP heads) and name them.

        They get no gradient anyway; frozen, the optimizer holds no state for them and DDP does not
        wait for their gradients. They stay in the saved weights, so the file loads back as is.
        """
        p0 = next(self.parameters())
        x = torch.tensor([[cls_id, sep_id, sep_id], [cls_id, sep_id, sep_id]], device=p0.device)
        types = torch.tensor([[0, 0, 1], [0, 0, 0]], device=p0.device)
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]], device=p0.device)
        return freeze_unreached(self, lambda: self(x, types, mask).float().sum())


def freeze_unreached(model: nn.Module, probe) -> list[str]:
    """Backpropagate `probe()` once (eval mode: no dropout, nothing drawn from the RNG) and freeze the
    parameters it never reaches; returns their names."""
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    probe().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    for n, p in model.named_parameters():
        if p.grad is None:
            p.requires_grad_(False)
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return unused
