"""The one shape of every finetuning model: a pretrained network, dropout, and one linear layer over its
features, initialised as BERT's task layers are (weights N(0, init_std), zero bias).

The heads (classify.py's SequenceClassifier and CausalTransfer, qa.py's SpanExtractor, tagging.py's
TokenClassifier; choice.py scores with SequenceClassifier or CausalTransfer) say only what differs: the name
of the network (finetuned runs on disk hold `encoder.*` or `backbone.*` and `head.*` weights), the features' width, the
default dropout, and which features `forward` reads. Backbone and head live in one module, so the loop,
best-weight selection and load_finetuned handle it whole.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ClassVar

import torch
from torch import nn

from plmcli.errors import PlmError
from plmcli.models.base import (Encodes, HasHidden, HasLayerStates, HasTaskHead, HasTokenStates,
                                head_dropout, head_init_std, traits_of, uses_token_types)
from plmcli.kernels import Linear
from plmcli.models.elmo import ELMoTaskHead
from plmcli.models.layers import Dropout, ScalarMix
from plmcli.models.registry import families_that, named

def gives_states(model_cls) -> bool:
    """Whether runs of `model_cls` give a task head every token's state: a bidirectional encoder (`encode`) or a
    family that reads one example at a time (`HasTokenStates`)."""
    return (model_cls.traits.bidirectional and issubclass(model_cls, Encodes)) or issubclass(model_cls, HasTokenStates)


def needs_states() -> str:
    """What a head that reads every token (tagging) or pools a row's states can be finetuned from, named from the
    registry (imports every family: for an error's wording only)."""
    encoders = families_that(lambda c: c.traits.bidirectional and gives_states(c))
    per_row = families_that(lambda c: not c.traits.bidirectional and gives_states(c))
    return f"an encoder run ({named(encoders)}) or a run with per-token states ({named(per_row)})"


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


def states_problem(model_cls, needs: Callable[[], str] = needs_states) -> str | None:
    """Why runs of `model_cls` give no per-token states to a task head, or None when they do: bidirectional
    encoders (`encode`) and families that read one example at a time (`HasTokenStates`). GPT-style transfer
    (`hidden` alone) reads its last token only; the reasons for the rest say what to use instead (`needs`)."""
    traits = model_cls.traits
    if gives_states(model_cls):
        return None
    if traits.counts:
        return "counts n-grams and has no learned states to finetune; it needs " + needs()
    if traits.scoring == "fixed_context":
        return ("is a fixed-window LM: each prediction sees only its n-1 previous tokens, no state reads a whole "
                "example; it needs " + needs())
    if traits.causal and not issubclass(model_cls, HasHidden):
        return "is a causal LM without per-position hidden states to transfer; it needs " + needs()
    if traits.causal:
        return "is a causal LM; it needs " + needs()
    if traits.seq2seq:
        return "is an encoder-decoder whose encoder gives no per-token states (token_states); it needs " + needs()
    return "has no encoder to finetune; it needs " + needs()


def token_states(network: nn.Module, input_ids, token_type_ids=None, attention_mask=None):
    """(hidden (B, T, C), pooled (B, C) | None) of a backbone, through the primitive it declares: a family's
    `token_states` (one example at a time), an encoder's `encode`, a causal LM's `hidden`."""
    if isinstance(network, HasTokenStates):  # before Encodes: an encoder-decoder's `encode` starts decoding
        return network.token_states(input_ids, attention_mask), None
    if isinstance(network, HasHidden) and not traits_of(network).bidirectional:
        return network.hidden(input_ids), None
    return network.encode(input_ids, token_type_ids, attention_mask)


def real_positions(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(N, T) True at the real tokens of right-padded rows (N, T, C) with `lengths` real tokens."""
    return torch.arange(hidden.shape[1], device=hidden.device)[None, :] < lengths[:, None]


def pool(hidden: torch.Tensor, lengths: torch.Tensor, how: str) -> torch.Tensor:
    """(N, T, C) states of right-padded rows with `lengths` real tokens -> (N, C) features (`how`: models.base's
    Pooling but cls): last = each row's last real state; mean; concat = ULMFiT's [last; max-pool; mean-pool] (N, 3C)."""
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if how == "last":
        return last
    real = real_positions(hidden, lengths)[..., None]  # (N, T, 1)
    mean = (hidden * real).sum(1) / lengths[:, None].to(hidden.dtype)
    if how == "mean":
        return mean
    if how != "concat":
        raise ValueError(f"pooling must be last, mean or concat, not {how!r}")
    top = hidden.masked_fill(~real, float("-inf")).amax(1)
    return torch.cat([last, top, mean], -1)


class ConvPooling(nn.Module):
    """Kim's (2014) CNN over a row's states: for each filter width k, `maps` feature maps over every window of k
    tokens, ReLU, then the largest value over the row (max-over-time pooling): (N, T, C) -> (N, maps · len(widths)).

    For states that see no neighbour (word2vec's vectors): a filter reads the words of a window in order ("不 好",
    "not good"), which their mean loses. A row's features are its own tokens' alone, however far the batch pads it:
    every window starts at a real token, and one that reaches past the row's end reads zeros there (Kim's sentences
    are zero-padded so).
    """

    widths: ClassVar[tuple[int, ...]] = (3, 4, 5)
    maps: ClassVar[int] = 100
    dropout: ClassVar[float] = 0.5
    """Kim's dropout on the pooled maps, before the output layer: the head's when the task sets none."""

    def __init__(self, width: int):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(width, self.maps, k) for k in self.widths)

    @classmethod
    def out_width(cls) -> int:
        return cls.maps * len(cls.widths)

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        real = real_positions(hidden, lengths)  # (N, T)
        x = (hidden * real[..., None]).transpose(1, 2)  # (N, C, T), zeros past each row's end
        # right-padded by k - 1 zeros, one window starts at every position; after the ReLU, a window starting past
        # the row's end counts as 0, which no real window's maximum (≥ 0) is below
        maps = (torch.relu(conv(nn.functional.pad(x, (0, conv.kernel_size[0] - 1)))).masked_fill(~real[:, None], 0.0)
                for conv in self.convs)
        return torch.cat([m.amax(-1) for m in maps], -1)


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
    """network -> features -> [Linear -> ReLU -> dropout] × the family's head_layers -> dropout -> Linear(width,
    num_outputs)."""

    network_name: ClassVar[str] = "encoder"
    """The attribute (and state-dict prefix) that holds the pretrained network."""
    default_dropout: ClassVar[float | None] = None
    """Dropout when the task sets none; None: the network's own (models.base.head_dropout)."""
    feature_based: bool = False
    """The family built the head itself (ELMo's scalar mix + BiLSTM): it reads the network on its own."""
    per_token: ClassVar[bool] = False
    """The head scores every token's own state (tagging, span QA): the family's head_layers, which deepen a
    pooled row's features, are not built (see `hidden_layers`)."""

    def __init__(self, network: nn.Module, num_outputs: int, dropout: float | None = None, width: int | None = None,
                 head: nn.Module | None = None):
        """`width`: of the features (the network's d_model when None); `head`: a head the family builds itself
        (ELMo's scalar mix), used as is instead of dropout + Linear."""
        super().__init__()
        setattr(self, self.network_name, network)
        self.frozen: list[str] = []
        self.features = "last"
        """What the head reads (model.features, set by `configure_features`): the last layer, a scalar mix of
        every layer, or the last four layers concatenated."""
        self.mix: ScalarMix | None = None
        self.frozen_backbone = False
        """model.freeze: the network runs in eval mode under no_grad; only the head (and mix) train."""
        # One segment embedding (RoBERTa) or none: pairs are told apart by [SEP] alone.
        self.use_types = uses_token_types(network)
        if head is not None:
            self.head = head
            return
        if dropout is None:
            dropout = head_dropout(network) if self.default_dropout is None else self.default_dropout
        self.dropout = Dropout(dropout)
        width = network.cfg.d_model if width is None else width
        # the family's hidden layers (under word2vec's window tagger; none for most): PyTorch's default init,
        # whose scale carries a signal through ReLU layers where BERT's N(0, 0.02) would shrink it layer by layer
        self.deep = nn.Sequential(*(m for _ in range(self.hidden_layers(traits_of(network)))
                                    for m in (Linear(width, width), nn.ReLU(), Dropout(dropout))))
        self.head = Linear(width, num_outputs)
        nn.init.normal_(self.head.weight, std=head_init_std(network))  # as BERT's task layers
        nn.init.zeros_(self.head.bias)

    def hidden_layers(self, traits) -> int:
        """How many of the family's head_layers this head builds: all over a pooled row, none per token."""
        return 0 if self.per_token else traits.head_layers

    def output(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., width) -> the family's hidden layers (if any) -> dropout -> the output layer."""
        return self.head(self.dropout(self.deep(features)))

    @property
    def network(self) -> nn.Module:
        return self.get_submodule(self.network_name)

    @property
    def max_positions(self) -> int:
        return self.network.max_positions

    def states(self, input_ids, token_type_ids=None, attention_mask=None):
        """The backbone's (hidden (B, T, C), pooled (B, C) | None) through its declared primitive (`token_states`),
        or the features `self.features` names (pooled None)."""
        types = token_type_ids if self.use_types else None
        if self.features != "last":
            return self.layer_features(input_ids, types, attention_mask), None
        with self.backbone_grad():
            return token_states(self.network, input_ids, types, attention_mask)

    def encoded(self, input_ids, token_type_ids=None, attention_mask=None):
        """The encoder's (hidden (B, T, C), pooled (B, C) | None); segment ids only where it has segments.
        With features other than `last` the pretrained pooler is not used: pooled is None for [CLS]-first
        encoders (heads read hidden[:, 0]) and each row's last real state for [CLS]-last ones (XLNet)."""
        types = token_type_ids if self.use_types else None
        if self.features == "last":
            with self.backbone_grad():
                return self.network.encode(input_ids, types, attention_mask)
        hidden = self.layer_features(input_ids, types, attention_mask)
        if traits_of(self.network).pair_layout != "cls_last":
            return hidden, None
        lengths = attention_mask.sum(-1) if attention_mask is not None else torch.full_like(input_ids[:, 0], input_ids.shape[1])
        return hidden, pool(hidden, lengths, "last")

    def layer_features(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """(B, T, C') per-token features from every layer's states: γ·Σ softmax(s)_j h_j (scalar_mix, C' = C)
        or [h_{L-3}; h_{L-2}; h_{L-1}; h_L] (concat_last_four, C' = 4C: BERT's best feature-based NER, §5.3)."""
        with self.backbone_grad():
            layers = self.network.layer_states(input_ids, token_type_ids, attention_mask)
        return self.mix(layers) if self.features == "scalar_mix" else torch.cat(layers[-4:], -1)

    def backbone_grad(self):
        """no_grad around a frozen backbone: no graph is kept, nothing runs backward through it."""
        return torch.no_grad() if self.frozen_backbone else nullcontext()

    def train(self, mode: bool = True):
        """A frozen backbone stays in eval mode (no dropout): its features are the same every epoch."""
        super().train(mode)
        if self.frozen_backbone:
            self.network.eval()
        return self

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




def features_problem(network: nn.Module, features: str = "last", elmo_at_output: bool = False) -> tuple[str, str] | None:
    """(what is wrong, how to fix) when `network` cannot give `features` or ELMo-at-output, else None: checked
    by finetune before anything is written, and again by configure_features."""
    kind = type(network).__name__
    if elmo_at_output and not isinstance(network, HasTaskHead):
        return (f"--elmo-at-output: {kind} is not ELMo (no ELMo task model to add ELMo to)",
                "finetune an elmo run on a classification / pair / regression task, or leave it out")
    if features == "last":
        return None
    if not isinstance(network, HasLayerStates):
        return (f"--features {features}: {kind} gives no per-layer states",
                f"leave --features out (last), or finetune a {named(families_that(lambda c: issubclass(c, HasLayerStates)))} run")
    n = _layer_count(network)
    if features == "concat_last_four" and n < 4:
        return (f"--features concat_last_four: {kind} has {n} layer states (embeddings included), fewer than 4",
                "use --features scalar_mix, or a model with ≥ 3 layers")
    return None


def configure_features(model: TaskHead, features: str = "last", freeze: bool = False, elmo_at_output: bool = False) -> None:
    """Set what a built task model reads and trains (model.features, model.freeze, model.elmo_at_output).

    features: `last` (the head as built), `scalar_mix` (a learned ScalarMix over every `layer_states` entry,
    embeddings included) or `concat_last_four` (the last four entries concatenated: the head's input width
    ×4, the Linear rebuilt with the same init). freeze: every network parameter stops training and the
    network runs under no_grad in eval mode; `model.frozen` then names them all. The weights stay in the
    model, so the saved file holds the whole network and loads back as is. elmo_at_output: ELMo's own
    classifier also mixes ELMo's layers into its BiLSTM's output (ELMoTaskHead.add_output_mix).
    """
    net = model.network
    problem = features_problem(net, features, elmo_at_output)
    if problem is None and elmo_at_output and not isinstance(model.head, ELMoTaskHead):
        problem = (f"--elmo-at-output: {type(net).__name__}'s task model here is not ELMo's BiLSTM classifier",
                   "use it on a classification / pair / regression task, or leave it out")
    if problem:
        raise PlmError(*problem)
    if elmo_at_output:
        model.head.add_output_mix()
    if features != "last" and not model.feature_based:
        model.features = features
        if features == "scalar_mix":
            model.mix = ScalarMix(_layer_count(net)).to(next(net.parameters()).device)
        else:
            old = model.head
            model.head = Linear(4 * old.in_features, old.out_features).to(old.weight.device)
            nn.init.normal_(model.head.weight, std=head_init_std(net))
            nn.init.zeros_(model.head.bias)
    if freeze:
        for p in net.parameters():
            p.requires_grad_(False)
        model.frozen = sorted(set(model.frozen) | {f"{model.network_name}.{n}" for n, _ in net.named_parameters()})
        model.frozen_backbone = True
        model.train(model.training)


def _layer_count(network: nn.Module) -> int:
    """How many states `layer_states` gives (embeddings + layers), asked of the network on a two-token row."""
    p0 = next(network.parameters())
    was_training = network.training
    network.eval()
    with torch.no_grad():
        ids = torch.zeros(1, 2, dtype=torch.long, device=p0.device)
        n = len(network.layer_states(ids, None, torch.ones_like(ids)))
    network.train(was_training)
    return n


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
