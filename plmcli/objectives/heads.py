"""The one shape of every finetuning model: a pretrained network, dropout, and one linear layer over its
features, initialised as BERT's task layers are (weights N(0, init_std), zero bias).

The heads (classify.py's SequenceClassifier and CausalTransfer, qa.py's SpanExtractor, tagging.py's
TokenClassifier; choice.py scores with SequenceClassifier or CausalTransfer) say only what differs: the name
of the network (finetuned runs on disk hold `encoder.*` or `backbone.*` and `head.*` weights), the features' width, the
default dropout, and which features `forward` reads. Backbone and head live in one module, so the loop,
best-weight selection and load_finetuned handle it whole.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from plmcli.models.base import Encodes, HasHidden, HasTokenStates, HasWordVectors, head_dropout, head_init_std, traits_of, uses_token_types

NEEDS_STATES = ("an encoder run (bert) or a run with per-token states (rnn / lstm / gru, transformer_xl, "
                "transformer, seq2seq)")
"""What a head that reads every token (tagging) or pools a row's states can be finetuned from."""


def encoder_problem(model_cls) -> str | None:
    """Why runs of `model_cls` are not encoders, or None when they are: for objectives that need every
    token's bidirectional state (tagging, span QA), which GPT-style transfer does not give."""
    if model_cls.traits.bidirectional:
        return None
    if model_cls.traits.causal:
        return "is a causal LM; it needs an encoder run"
    if model_cls.traits.seq2seq:  # its encoder serves the sequence and tagging heads, framed as GPT's transfer
        return ("is an encoder-decoder: its tokenizer has no [CLS]/[SEP] to frame span QA's [CLS] question [SEP] "
                "passage [SEP] windows; it needs an encoder run")
    return "has no encoder to finetune; it needs an encoder run"


def states_problem(model_cls, needs: str = NEEDS_STATES) -> str | None:
    """Why runs of `model_cls` give no per-token states to a task head, or None when they do: bidirectional
    encoders (`encode`) and families that read one example at a time (`HasTokenStates`). GPT-style transfer
    (`hidden` alone) reads its last token only; the reasons for the rest say what to use instead (`needs`)."""
    traits = model_cls.traits
    if (traits.bidirectional and issubclass(model_cls, Encodes)) or issubclass(model_cls, HasTokenStates):
        return None
    if issubclass(model_cls, HasWordVectors):
        return "gives one static vector per word, no contextual states to finetune; it needs " + needs
    if traits.counts:
        return "counts n-grams and has no learned states to finetune; it needs " + needs
    if traits.scoring == "fixed_context":
        return ("is a fixed-window LM: each prediction sees only its n-1 previous tokens, no state reads a whole "
                "example; it needs " + needs)
    if traits.causal and not issubclass(model_cls, HasHidden):
        return "is a causal LM without per-position hidden states to transfer; it needs " + needs
    if traits.causal:
        return "is a causal LM; it needs " + needs
    if traits.seq2seq:
        return "is an encoder-decoder whose encoder gives no per-token states (token_states); it needs " + needs
    return "has no encoder to finetune; it needs " + needs


def token_states(network: nn.Module, input_ids, token_type_ids=None, attention_mask=None):
    """(hidden (B, T, C), pooled (B, C) | None) of a backbone, through the primitive it declares: a family's
    `token_states` (one example at a time), an encoder's `encode`, a causal LM's `hidden`."""
    if isinstance(network, HasTokenStates):  # before Encodes: an encoder-decoder's `encode` starts decoding
        return network.token_states(input_ids, attention_mask), None
    if isinstance(network, HasHidden) and not traits_of(network).bidirectional:
        return network.hidden(input_ids), None
    return network.encode(input_ids, token_type_ids, attention_mask)


def pool(hidden: torch.Tensor, lengths: torch.Tensor, how: str) -> torch.Tensor:
    """(N, T, C) states of right-padded rows with `lengths` real tokens -> (N, C) features (`how`: models.base's
    Pooling but cls): last = each row's last real state; mean; concat = ULMFiT's [last; max-pool; mean-pool] (N, 3C)."""
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if how == "last":
        return last
    real = (torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None])[..., None]  # (N, T, 1)
    mean = (hidden * real).sum(1) / lengths[:, None].to(hidden.dtype)
    if how == "mean":
        return mean
    if how != "concat":
        raise ValueError(f"pooling must be last, mean or concat, not {how!r}")
    top = hidden.masked_fill(~real, float("-inf")).amax(1)
    return torch.cat([last, top, mean], -1)


def state_width(network: nn.Module) -> int:
    """The width of a backbone's per-token states (d_model for most, d_hidden for RNNs, 2·d_proj for ELMo):
    asked of the network on a two-token row, not guessed from its config."""
    p0 = next(network.parameters())
    was_training = network.training
    network.eval()
    with torch.no_grad():
        ids = torch.zeros(1, 2, dtype=torch.long, device=p0.device)
        hidden, _ = token_states(network, ids, None, torch.ones_like(ids))
    network.train(was_training)
    return hidden.shape[-1]


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

    def states(self, input_ids, token_type_ids=None, attention_mask=None):
        """The backbone's (hidden (B, T, C), pooled (B, C) | None) through its declared primitive (`token_states`)."""
        return token_states(self.network, input_ids, token_type_ids if self.use_types else None, attention_mask)

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
