"""SpanBERT (Joshi et al. 2020): BERT pretrained on masked spans, with a span boundary objective (SBO).

The encoder and the MLM head are BERT's. SpanBERT adds one head that predicts every token x_i of a
masked span x_s..x_e a second time, from outside the span only (paper §3.2):

    h0  = [x_{s-1}; x_{e+1}; p_{i-s+1}]           the two boundary encodings and a relative position
    y_i = LN(GeLU(W2 · LN(GeLU(W1 · h0))))        a 2-layer feed-forward network
    logits_i = y_i · Eᵀ + b                        the MLM decoder's output embeddings E (shared)

What a span is comes from the batch alone: a maximal run of masked positions in a row. SpanBERT's own
code merges touching spans the same way (`merge_intervals`) before building SBO targets, so the head
needs nothing beyond `mlm_positions` and every masking strategy works with it. Sizes follow that code
(pair_bert.py and the pretraining command in its README): p has its own width (200) and 15 rows; a
token further than 15 into its span gets no SBO prediction (the code truncates those targets too). The
decoder keeps its own bias, as there.

transformers has no SpanBERT class: `to_hf` (inherited) exports the encoder and MLM head as a BERT MLM
(as the released SpanBERT checkpoints are loaded there), without the SBO head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from plmcli.config_sections import Size
from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig, BertOutput
from plmcli.models.dense import Linear, linear
from plmcli.models.layers import ACTIVATIONS, init_weights


@dataclass
class SpanBertConfig(BertConfig):
    nsp_head: bool = False
    """A pooler and NSP head; SpanBERT trains on single segments without NSP (§3.3), so none."""
    sbo_max_span: Size = 15
    """Relative positions p_1..p_n the SBO head embeds: a token further into its span gets no SBO loss
    (the released pretraining command's max-pair-targets, 15)."""
    sbo_d_position: Size = 200
    """Width of the SBO position embedding, concatenated to the two boundary states (released code: 200)."""


@dataclass
class SpanBertOutput(BertOutput):
    sbo_logits: torch.Tensor | None = None
    """(M, V) span-boundary predictions of the masked tokens that have one; None without mlm_positions."""
    sbo_index: torch.Tensor | None = None
    """(M,) which of the N mlm_positions each row of sbo_logits predicts (its label is mlm_labels[sbo_index])."""


def span_boundaries(positions: torch.Tensor, seq_len: int, max_span: int):
    """The SBO inputs of masked tokens given as flat indices b·T + t (any order).

    A span is a maximal run of consecutive masked positions within one row. Returns (index, left, right,
    offset), each (M,): which entries of `positions` get an SBO prediction, the flat positions of their
    span's boundaries x_{s-1} and x_{e+1}, and their offset i − s (p_{i-s+1} is row i − s). A token whose
    span touches the row's edge (no boundary) or lies max_span or more into its span is left out.
    """
    order = torch.argsort(positions)
    p = positions[order]
    n = p.numel()
    new = torch.ones(n, dtype=torch.bool, device=p.device)  # True where a run starts
    new[1:] = (p[1:] != p[:-1] + 1) | (p[1:] // seq_len != p[:-1] // seq_len)
    last = torch.ones_like(new)
    last[:-1] = new[1:]  # True where a run ends
    run = torch.cumsum(new, 0) - 1
    start, end = p[new][run], p[last][run]  # (N,) first and last masked position of each token's run
    offset = p - start
    ok = (start % seq_len > 0) & (end % seq_len < seq_len - 1) & (offset < max_span)
    return order[ok], start[ok] - 1, end[ok] + 1, offset[ok]


class SBOHead(nn.Module):
    """f(x_{s-1}, x_{e+1}, p_{i-s+1}): Linear -> GeLU -> LayerNorm, twice (the released MLPWithLayerNorm)."""

    def __init__(self, cfg: SpanBertConfig):
        super().__init__()
        C = cfg.d_model
        self.position = nn.Embedding(cfg.sbo_max_span, cfg.sbo_d_position)
        self.fc1 = Linear(2 * C + cfg.sbo_d_position, C, bias=cfg.bias)
        self.ln1 = nn.LayerNorm(C, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.fc2 = Linear(C, C, bias=cfg.bias)
        self.ln2 = nn.LayerNorm(C, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))  # its decoder's own bias; the weight is the MLM decoder's

    def forward(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        h = torch.cat([left, right, self.position(offset)], dim=-1)  # (M, 2C + P)
        return self.ln2(self.act(self.fc2(self.ln1(self.act(self.fc1(h))))))  # (M, C)


class SpanBert(Bert):
    Config = SpanBertConfig
    hf_model_types: ClassVar[tuple[str, ...]] = ()
    """Exports as BERT; an HF BERT checkpoint imports as family bert (it has no SBO head to bring)."""

    def __init__(self, cfg: SpanBertConfig):
        if cfg.sbo_max_span < 1 or cfg.sbo_d_position < 1:
            raise PlmError(f"model.sbo_max_span ({cfg.sbo_max_span}) and model.sbo_d_position ({cfg.sbo_d_position}) "
                           "must be ≥ 1", "SpanBERT: sbo_max_span 15, sbo_d_position 200")
        super().__init__(cfg)
        self.sbo = SBOHead(cfg)
        init_weights(self.sbo, cfg.init_std)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None,
                mlm_labels=None) -> SpanBertOutput:
        """BERT's outputs; with mlm_positions, also the SBO logits of the masked tokens (see span_boundaries)."""
        out = super().forward(input_ids, token_type_ids, attention_mask, mlm_positions, mlm_labels)
        sbo_logits = sbo_index = None
        if mlm_positions is not None:
            sbo_index, left, right, offset = span_boundaries(mlm_positions, input_ids.shape[1], self.cfg.sbo_max_span)
            flat = out.hidden.flatten(0, 1)  # (B·T, C)
            y = self.sbo(flat.index_select(0, left), flat.index_select(0, right), offset)  # (M, C)
            sbo_logits = linear(y, self.mlm.decoder.weight, self.sbo.bias)  # (M, V)
        return SpanBertOutput(**vars(out), sbo_logits=sbo_logits, sbo_index=sbo_index)

    def flops_per_token(self, seq_len: int) -> float:
        """BERT's count plus the SBO head (two layers and a decoder) at the masked share of tokens."""
        c = self.cfg
        sbo = (2 * c.d_model + c.sbo_d_position) * c.d_model + c.d_model * c.d_model + c.d_model * c.vocab_size
        return super().flops_per_token(seq_len) + 6 * self.mlm_fraction * sbo

    def hf_export_notes(self) -> list[str]:
        return super().hf_export_notes() + ["span-boundary (SBO) head dropped: transformers has no SpanBERT class"]
