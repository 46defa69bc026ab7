"""BERT (Devlin et al. 2018) and RoBERTa (Liu et al. 2019): a bidirectional Transformer encoder.

One class serves both; the recipe chooses the differences as data:
BERT = segment embeddings + pooler/NSP head; RoBERTa = one segment, positions offset by 2 (fairseq's
padding_idx + 1), no pooler. Both: post-LN blocks, exact GELU, an MLM head whose decoder is the word
embedding matrix. The MLM head runs only at the masked positions: at 15% masking that skips ~85% of
the largest matmul in the model (d × vocab per token).

`MaskedLMEncoder` (the heads on top of `encode`) and `MLMHead` are shared with ALBERT and NEZHA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plmcli.models.layers import ACTIVATIONS, Block, init_weights, require_vocab


@dataclass
class BertConfig:
    vocab_size: int = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: int = 512
    """Rows of the learned position table (RoBERTa: 514, of which the first position_offset are unused)."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings: 2 for sentence pairs (BERT), 1 (RoBERTa), 0 = none."""
    n_layer: int = 12
    """Transformer layers."""
    n_head: int = 12
    """Attention heads per layer."""
    d_model: int = 768
    """Hidden size."""
    d_ff: int = 0
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: float = 0.1
    """Dropout on embeddings and residual branches."""
    attn_dropout: float = 0.1
    """Dropout on attention probabilities."""
    activation: str = "gelu"
    """gelu (exact, as BERT) | gelu_tanh | relu | silu; also the MLM head's transform."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (BERT 1e-12, RoBERTa 1e-5)."""
    init_std: float = 0.02
    """Std of the normal init (BERT's initializer_range)."""
    position_offset: int = 0
    """Position t reads row t + offset of the table (RoBERTa: 2, with max_positions 514)."""
    nsp_head: bool = True
    """A pooler (tanh on the [CLS] state) and a 2-way next-sentence / sentence-order classifier."""
    tie_embeddings: bool = True
    """The MLM decoder shares the word embedding matrix (it keeps its own bias)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""


@dataclass
class BertOutput:
    hidden: torch.Tensor
    """(B, T, C) final hidden states."""
    pooled: torch.Tensor | None
    """(B, C) tanh(W·h[CLS] + b), or None without a pooler."""
    mlm_logits: torch.Tensor | None
    """(N, V) at the N requested flat positions, or (B, T, V) at every position."""
    nsp_logits: torch.Tensor | None
    """(B, 2) next-sentence (or sentence-order) logits, or None without the head."""


class MLMHead(nn.Module):
    """BERT's cls.predictions: dense -> activation -> LayerNorm -> decoder (+ its own bias).

    `d_embed` is the width of the transform and of the decoder's input (default d_model); ALBERT sets
    it to its factorised embedding size E, so the decoder can share the V × E word embedding.
    """

    def __init__(self, cfg: BertConfig, d_embed: int | None = None):
        super().__init__()
        d_embed = d_embed or cfg.d_model
        self.dense = nn.Linear(cfg.d_model, d_embed, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.ln = nn.LayerNorm(d_embed, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.decoder = nn.Linear(d_embed, cfg.vocab_size, bias=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.ln(self.act(self.dense(h))))


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1 = token / 0 = padding -> a boolean key mask (B, 1, 1, T), or None when nothing is padded.

    Without a mask SDPA can take its fastest kernels. A padded query row still attends to the real
    tokens, so nothing is NaN.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


class MaskedLMEncoder(nn.Module):
    """What objective `mlm` and `plm finetune` call on every BERT-style family (BERT, ALBERT, NEZHA).

    A subclass builds `mlm` (an MLMHead) and `nsp` (a 2-way head on the pooled state, or None) and
    implements `encode`; `forward` runs the heads on top.
    """

    causal = False
    encoder = True
    masked_lm = True
    """forward returns BertOutput (mlm_logits at mlm_positions, nsp_logits): what objective `mlm` reads."""
    mlm_fraction = 0.15
    """Share of tokens the MLM head is computed at, for flops_per_token (BERT's mask_prob)."""

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        raise NotImplementedError

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None) -> BertOutput:
        """Encode, then the heads.

        mlm_positions: 1-D LongTensor of flat indices into B·T (b·T + t) of the masked tokens ->
        mlm_logits (N, V) at those positions only; None -> mlm_logits (B, T, V) at every position.
        """
        h, pooled = self.encode(input_ids, token_type_ids, attention_mask)
        if mlm_positions is None:
            mlm_logits = self.mlm(h)  # (B, T, V)
        else:
            mlm_logits = self.mlm(h.flatten(0, 1).index_select(0, mlm_positions))  # (N, V)
        nsp_logits = self.nsp(pooled) if self.nsp is not None else None  # (B, 2)
        return BertOutput(h, pooled, mlm_logits, nsp_logits)


class Bert(MaskedLMEncoder):
    Config = BertConfig

    def __init__(self, cfg: BertConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.max_positions <= cfg.position_offset:
            raise ValueError(f"max_positions {cfg.max_positions} leaves no room after position_offset {cfg.position_offset}")
        self.cfg = cfg
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        # BERT normalizes the embedding sum: with post-LN blocks every block input is normalized.
        self.ln_emb = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_head, d_ff, cfg.activation, cfg.bias, cfg.dropout, cfg.attn_dropout,
                  norm_position="post", layer_norm_eps=cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias) if cfg.nsp_head else None
        self.nsp = nn.Linear(cfg.d_model, 2, bias=cfg.bias) if cfg.nsp_head else None
        self.mlm = MLMHead(cfg)
        # BERT has no residual-scaled init (that is GPT-2's): N(0, 0.02) everywhere, zero biases.
        init_weights(self, cfg.init_std)
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.wte.weight

    @property
    def max_positions(self) -> int:
        """The longest sequence the model can read (the table minus RoBERTa's offset)."""
        return self.cfg.max_positions - self.cfg.position_offset

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        """(B, T) ids -> ((B, T, C) hidden states, (B, C) pooled [CLS] or None).

        attention_mask (B, T): 1 = token, 0 = padding (padding is never attended to).
        """
        B, T = input_ids.shape
        if T > self.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.max_positions}")
        pos = torch.arange(self.cfg.position_offset, self.cfg.position_offset + T, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)  # (B, T, C)
        if self.wtt is not None:
            # No segment ids = all segment 0: add its row instead of looking up B·T zeros.
            x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        x = self.drop(self.ln_emb(x))
        mask = padding_mask(attention_mask)
        for block in self.blocks:
            x = block(x, causal=False, attn_mask=mask)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, C)
        return x, pooled

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward ≈ 3× forward), 6N + 12·L·T·C as for GPT.

        N counts the encoder matmuls for every token, but the MLM head (transform d×d and decoder
        d×V) only for the predicted share of tokens, `mlm_fraction` (15%, BERT's masking rate):
        the head runs at masked positions only. Embedding lookups, the pooler and NSP (once per
        sequence) are left out.
        """
        c = self.cfg
        body = sum(p.numel() for p in self.blocks.parameters())
        head = c.d_model * c.d_model + c.d_model * c.vocab_size
        return 6 * (body + self.mlm_fraction * head) + 12 * c.n_layer * seq_len * c.d_model
