"""NEZHA (Wei et al. 2019): BERT with functional relative positional encoding instead of a position table.

Every attention layer adds a fixed vector of the relative distance j − i to the keys and to the
values (the paper's eqs. 4–5, after Shaw et al. 2018):

    e_ij = q_i · (k_j + a_ij) / √d,        z_i = Σ_j α_ij (v_j + a_ij),

a_ij = table[clip(j − i, −K, K) + K]: one (2K+1, d_head) table of sinusoids (eqs. 6–7; K =
`max_relative_position`) shared by keys and values, heads and layers, with no parameters. So no
weight depends on the sequence length, and a sequence reads the same wherever it starts.
The rest is BERT: segment embeddings, post-LN layers, exact GELU, MLM + NSP heads; the recipes mask
whole words.

Deviation: the paper writes sin((j − i)/10000^(2k/d)); NEZHA's released code (and HF's NezhaModel)
evaluates the sinusoids at the table row, clip(j − i) + K, i.e. shifted by K. We follow the code so
its checkpoints carry over. (A shifted argument is a fixed rotation of each sin/cos pair: the two are
equally expressive.)

Cost: the a_ij terms never build a (T, T, d) tensor. Keys: q · tableᵀ once per distance (B, H, T, R),
then gathered to (B, H, T, T). Values: α summed per distance (scatter-add into (B, H, T, R)) times the
table. Attention is explicit (softmax of materialised scores): the value term needs α, which SDPA
does not return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Count, Heads, NonNegative, Positive, Probability, Rule, Size
from plmcli.models.bert import MaskedLMEncoder, MLMHead
from plmcli.kernels import Linear, dropout
from plmcli.models.layers import (Activation, Dropout, FeedForward, MultiHeadAttention, init_weights,
                                   padding_mask, recorded, require_vocab)
from plmcli.models.vocab import PadsVocab


EVEN_HEADS = Rule(lambda n, c: (c["d_model"] // n) % 2 == 0,
                  "gives an odd head size d_model {d_model} / n_head, and the relative positions are sin/cos pairs",
                  "pick n_head so that d_model / n_head is even")


@dataclass
class NezhaConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: Size = 512
    """Longest sequence accepted. No table depends on it (NEZHA has none): it caps training and finetuning lengths."""
    max_relative_position: Size = 64
    """K: relative distances are clipped to [−K, K] (the paper and the released models: 64)."""
    type_vocab_size: Count = 2
    """Segment (token type) embeddings: 2 for sentence pairs, 0 = none."""
    n_layer: Size = 12
    """Transformer layers."""
    n_head: Annotated[Heads, EVEN_HEADS] = 12
    """Attention heads per layer (the relative table has d_model / n_head columns)."""
    d_model: Size = 768
    """Hidden size."""
    d_ff: Count = 0
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: Probability = 0.1
    """Dropout on embeddings and residual branches."""
    attn_dropout: Probability = 0.1
    """Dropout on attention probabilities."""
    activation: Activation = "gelu"
    """gelu (exact, as BERT and NEZHA) | gelu_tanh | relu | silu; also the MLM head's transform."""
    layer_norm_eps: Positive = 1e-12
    """LayerNorm epsilon."""
    init_std: NonNegative = 0.02
    """Std of the normal init (BERT's initializer_range)."""
    nsp_head: bool = True
    """A pooler (tanh on the [CLS] state) and a 2-way next-sentence classifier."""
    tie_embeddings: bool = True
    """The MLM decoder shares the word embedding matrix (it keeps its own bias)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""


def relative_sinusoids(max_relative_position: int, d_head: int) -> torch.Tensor:
    """(2K+1, d_head): row r is [sin(r·w_0), cos(r·w_0), sin(r·w_1), ...], w_k = 10000^(−2k/d_head).

    Row r serves the distance r − K (NEZHA's code: the sinusoid of the row index, not of the distance).
    """
    r = torch.arange(2 * max_relative_position + 1, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    table = torch.zeros(len(r), d_head, dtype=torch.float64)
    table[:, 0::2] = torch.sin(r * w)
    table[:, 1::2] = torch.cos(r * w)
    return table.float()


class RelativeAttention(MultiHeadAttention):
    """Self-attention with a_ij added to keys and values (same weights as MultiHeadAttention: qkv, proj)."""

    def forward(self, x, table: torch.Tensor, index: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """table (R, D): the a vectors of the R distances in play; index (T, T): the row of a_ij;
        attn_mask (B, 1, 1, T) boolean, True = attend."""
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)  # 3 × (B, H, T, D)
        index = index.expand(B, H, T, T)
        scores = q @ k.transpose(-1, -2) + (q @ table.T).gather(-1, index)  # q_i·k_j + q_i·a_ij: (B, H, T, T)
        scores = scores / math.sqrt(C // H)
        if attn_mask is not None:
            # finfo.min, not −inf: a row with every key masked gets uniform weights, not NaN.
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        p = dropout(recorded(F.softmax(scores, dim=-1)), self.attn_dropout, self.training)  # α (B, H, T, T)
        per_distance = p.new_zeros(B, H, T, table.shape[0]).scatter_add_(-1, index, p)  # Σ_j α_ij per row of the table
        y = p @ v + per_distance @ table.to(p.dtype)  # Σ_j α_ij (v_j + a_ij): (B, H, T, D)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class NezhaBlock(nn.Module):
    """BERT's post-LN layer, LN(x + attn(x)) then LN(x + mlp(x)), with relative attention."""

    def __init__(self, cfg: NezhaConfig):
        super().__init__()
        C = cfg.d_model
        self.attn = RelativeAttention(C, cfg.n_head, cfg.bias, cfg.attn_dropout, cfg.dropout)
        self.ln_1 = nn.LayerNorm(C, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = FeedForward(C, cfg.d_ff or 4 * C, cfg.activation, cfg.bias, cfg.dropout)
        self.ln_2 = nn.LayerNorm(C, eps=cfg.layer_norm_eps, bias=cfg.bias)

    def forward(self, x, table, index, attn_mask=None):
        x = self.ln_1(x + self.attn(x, table, index, attn_mask))
        return self.ln_2(x + self.mlp(x))


class Nezha(MaskedLMEncoder):
    Config = NezhaConfig
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64",
            "model.max_positions=16", "model.max_relative_position=4", "model.vocab_size=50")
    probe_layers = "blocks"  # plmcli.analysis.hidden reads each layer's output there

    def __init__(self, cfg: NezhaConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.d_model % cfg.n_head or (cfg.d_model // cfg.n_head) % 2:
            raise ValueError(f"d_model {cfg.d_model} / n_head {cfg.n_head} must be an even head size (sin/cos pairs)")
        if cfg.max_relative_position < 1:
            raise ValueError(f"max_relative_position {cfg.max_relative_position} must be ≥ 1")
        self.cfg = cfg
        C = cfg.d_model
        self.wte = nn.Embedding(cfg.padded_vocab, C)
        self.wtt = nn.Embedding(cfg.type_vocab_size, C) if cfg.type_vocab_size else None
        self.ln_emb = nn.LayerNorm(C, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(NezhaBlock(cfg) for _ in range(cfg.n_layer))
        self.pooler = Linear(C, C, bias=cfg.bias) if cfg.nsp_head else None
        self.nsp = Linear(C, 2, bias=cfg.bias) if cfg.nsp_head else None
        self.mlm = MLMHead(cfg)
        init_weights(self, cfg.init_std)
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.wte.weight
        # A buffer, not a parameter, and not saved: it is a function of K and d_head alone.
        self.register_buffer("rel_table", relative_sinusoids(cfg.max_relative_position, C // cfg.n_head), persistent=False)

    @property
    def max_positions(self) -> int:
        """The configured length cap (no position table limits NEZHA)."""
        return self.cfg.max_positions

    def relative(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(table rows for the distances a length-T sequence has (R, D), (T, T) row index of each a_ij)."""
        K = self.cfg.max_relative_position
        k = min(K, T - 1)  # a short sequence never reaches the clipped rows beyond ±(T−1)
        pos = torch.arange(T, device=device)
        index = (pos[None, :] - pos[:, None]).clamp(-k, k) + k  # j − i, clipped, as a row of table[K−k : K+k+1]
        return self.rel_table[K - k: K + k + 1], index

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, states: list | None = None):
        """(B, T) ids -> ((B, T, C) hidden states, (B, C) pooled [CLS] or None). attention_mask: 1 = token, 0 = padding.
        `states`: the embedding output and each layer's output are appended to it (layer_states)."""
        B, T = input_ids.shape
        if T > self.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.max_positions}")
        x = self.wte(input_ids)  # (B, T, C): no position embedding
        if self.wtt is not None:
            x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        x = self.drop(self.ln_emb(x))
        mask = padding_mask(attention_mask)
        table, index = self.relative(T, input_ids.device)
        if states is not None:
            states.append(x)
        for block in self.blocks:
            x = self.run_block(block, x, table, index, mask)
            if states is not None:
                states.append(x)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, C)
        return x, pooled

    def flops_per_token(self, seq_len: int) -> float:
        """BERT's count (6N + 12·L·T·C, MLM head at the masked share) plus the relative terms: q·tableᵀ
        and the per-distance weights times the table, 2·C·R each per token and layer (R = 2·min(K, T−1)+1)."""
        c = self.cfg
        body = sum(p.numel() for p in self.blocks.parameters())
        head = c.d_model * c.d_model + c.d_model * c.vocab_size
        R = 2 * min(c.max_relative_position, seq_len - 1) + 1
        return 6 * (body + self.mlm_fraction * head) + 12 * c.n_layer * c.d_model * (seq_len + R)
