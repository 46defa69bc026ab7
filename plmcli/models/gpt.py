"""GPT (Radford et al. 2018) and GPT-2 (2019): a decoder-only Transformer LM.

One class serves both; the recipe chooses the differences as data:
GPT-1 = post-LN, no final LN, GELU; GPT-2 = pre-LN + final LN, tanh-GELU, residual init scaled by 1/√(2L).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plmcli.models.layers import Block, init_weights, require_vocab, scale_residual_init


@dataclass
class GPTConfig:
    vocab_size: int = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: int = 1024
    """Learned position embeddings: the longest sequence the model can read."""
    n_layer: int = 12
    """Transformer layers."""
    n_head: int = 12
    """Attention heads per layer."""
    d_model: int = 768
    """Hidden size."""
    d_ff: int = 0
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: float = 0.1
    """Dropout on embeddings, residual branches."""
    attn_dropout: float = 0.1
    """Dropout on attention probabilities."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""
    norm_position: str = "pre"
    """pre (GPT-2) | post (GPT-1)."""
    final_norm: bool = True
    """A LayerNorm after the last block (GPT-2)."""
    activation: str = "gelu_tanh"
    """gelu | gelu_tanh | relu | silu."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    tie_embeddings: bool = True
    """The output projection shares the token embedding matrix."""
    init_std: float = 0.02
    """Std of the normal init."""
    scaled_residual_init: bool = True
    """Residual projections start at init_std/√(2·n_layer) (GPT-2)."""


class GPT(nn.Module):
    Config = GPTConfig
    causal = True

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be pre or post, not {cfg.norm_position!r}")
        self.cfg = cfg
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_head, d_ff, cfg.activation, cfg.bias, cfg.dropout, cfg.attn_dropout,
                  cfg.norm_position, cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std)
        if cfg.scaled_residual_init:
            scale_residual_init(self.blocks, cfg.init_std, cfg.n_layer)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, C) final hidden states; position t sees tokens ≤ t only."""
        T = input_ids.shape[1]
        if T > self.cfg.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.cfg.max_positions}")
        pos = torch.arange(T, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x, causal=True)
        return self.ln_f(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, V) next-token logits."""
        return self.lm_head(self.hidden(input_ids))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward ≈ 3× forward), PaLM's 6N + 12·L·T·C estimate."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * seq_len * self.cfg.d_model
