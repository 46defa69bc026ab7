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

from plmcli.config_schema import Size
from plmcli.errors import PlmError
from plmcli import kernels
from plmcli.models.bert import Bert, BertConfig, BertOutput
from plmcli.kernels import Linear, linear
from plmcli.models.layers import ACTIVATIONS, init_weights
from plmcli.models.vocab import real_columns


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
    sbo_keep: torch.Tensor | None = None
    """(M,) True at the rows of sbo_logits that are SBO predictions, False at rows to ignore; None: every row is
    one. Off a CPU every masked token gets a row (M = N, see span_targets), so no shape waits on the device."""


def span_boundaries(positions: torch.Tensor, seq_len: int, max_span: int):
    """The SBO inputs of masked tokens given as flat indices b·T + t (any order).

    A span is a maximal run of consecutive masked positions within one row. Returns (index, left, right,
    offset), each (M,): which entries of `positions` get an SBO prediction, the flat positions of their
    span's boundaries x_{s-1} and x_{e+1}, and their offset i − s (p_{i-s+1} is row i − s). A token whose
    span touches the row's edge (no boundary) or lies max_span or more into its span is left out.
    """
    order, left, right, offset, keep = span_targets(positions, seq_len, max_span)
    return order[keep], left[keep], right[keep], offset[keep]


def span_targets(positions: torch.Tensor, seq_len: int, max_span: int):
    """span_boundaries with a row for every entry of `positions`: (index, left, right, offset, keep), each (N,),
    `keep` True where the row is an SBO prediction; elsewhere the boundaries and offset are in range but
    meaningless. No shape depends on the data, so a GPU need not report how many predictions there are."""
    order = torch.argsort(positions)
    p = positions[order]
    n = p.numel()
    new = torch.ones(n, dtype=torch.bool, device=p.device)  # True where a run starts
    new[1:] = (p[1:] != p[:-1] + 1) | (p[1:] // seq_len != p[:-1] // seq_len)
    last = torch.ones_like(new)
    last[:-1] = new[1:]  # True where a run ends
    i = torch.arange(n, device=p.device)
    first_of_run = torch.where(new, i, 0).cummax(0).values  # the latest run start at or before i
    last_of_run = torch.where(last, i, n - 1).flip(0).cummin(0).values.flip(0)  # the first run end at or after i
    start, end = p[first_of_run], p[last_of_run]  # (N,) first and last masked position of each token's run
    offset = p - start
    keep = (start % seq_len > 0) & (end % seq_len < seq_len - 1) & (offset < max_span)
    return order, torch.where(keep, start - 1, start), torch.where(keep, end + 1, end), offset * keep, keep


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
        self.bias = nn.Parameter(torch.zeros(cfg.padded_vocab))  # its decoder's own bias; the weight is the MLM decoder's

    def forward(self, left: torch.Tensor, right: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        h = torch.cat([left, right, self.position(offset)], dim=-1)  # (M, 2C + P)
        return self.ln2(self.act(self.fc2(self.ln1(self.act(self.fc1(h))))))  # (M, C)


class SpanBert(Bert):
    Config = SpanBertConfig
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64",
            "model.max_positions=16", "model.sbo_d_position=8", "model.vocab_size=50")
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
        sbo_logits = sbo_index = keep = None
        if mlm_positions is not None:
            sbo_index, left, right, offset, keep = span_targets(mlm_positions, input_ids.shape[1], self.cfg.sbo_max_span)
            if kernels.enabled(mlm_positions.device):  # a CPU reads the mask at no cost: the head skips the rest
                sbo_index, left, right, offset, keep = sbo_index[keep], left[keep], right[keep], offset[keep], None
            flat = out.hidden.flatten(0, 1)  # (B·T, C)
            y = self.sbo(flat.index_select(0, left), flat.index_select(0, right), offset)  # (M, C)
            sbo_logits = real_columns(linear(y, self.mlm.decoder.weight, self.sbo.bias), self.cfg.vocab_size)  # (M, V)
        return SpanBertOutput(**vars(out), sbo_logits=sbo_logits, sbo_index=sbo_index, sbo_keep=keep)

    def flops_per_token(self, seq_len: int) -> float:
        """BERT's count plus the SBO head (two layers and a decoder) at the masked share of tokens."""
        c = self.cfg
        sbo = (2 * c.d_model + c.sbo_d_position) * c.d_model + c.d_model * c.d_model + c.d_model * c.vocab_size
        return super().flops_per_token(seq_len) + 6 * self.mlm_fraction * sbo

    def hf_export_notes(self) -> list[str]:
        return super().hf_export_notes() + ["span-boundary (SBO) head dropped: transformers has no SpanBERT class"]
