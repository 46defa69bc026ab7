"""ALBERT (Lan et al. 2019): BERT with a factorised embedding and parameters shared across layers.

Two changes cut BERT's parameters (ALBERT-base: 12M against BERT-base's 110M), §3.1 of the paper:
- Factorised embedding: tokens, positions and segments are embedded in E = `embedding_size`
  dimensions (128 ≪ H) and one Linear projects the sum to the hidden size H: V·E + E·H instead of V·H.
- Cross-layer sharing: the n_layer layers reuse weights. `share` picks what (Table 4 compares them):
  all (ALBERT), attention (the attention sublayers only), ffn (the feed-forward sublayers only) or
  none (BERT with a factorised embedding). A sublayer is its weights plus the post-LN LayerNorm after it.
The MLM head maps H back down to E before the decoder, which is the V × E word embedding (tied, with
its own bias). The 2-way head on the pooled [CLS] state is trained on sentence order (SOP): the data
decides what the label means (objective `mlm` with `pairs: sop`), so it is BERT's NSP head, named `nsp`.
GELU is the tanh approximation by default: Google's ALBERT code computes it that way (HF's "gelu_new").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plmcli.errors import PlmError
from plmcli.models.bert import BertConfig, MaskedLMEncoder, MLMHead, padding_mask
from plmcli.models.layers import FeedForward, MultiHeadAttention, init_weights, require_vocab

SHARES = ("all", "attention", "ffn", "none")


@dataclass
class AlbertConfig(BertConfig):
    activation: str = "gelu_tanh"
    """gelu_tanh (Google's ALBERT code; HF's gelu_new) | gelu | relu | silu; also the MLM head's transform."""
    embedding_size: int = 128
    """E: width of the word / position / segment embeddings, projected to d_model (H) by one Linear."""
    share: str = "all"
    """Cross-layer parameter sharing: all (ALBERT) | attention | ffn | none."""

    def __post_init__(self):
        if self.share not in SHARES:
            raise PlmError(f"model.share '{self.share}' is not one of {', '.join(SHARES)}",
                           "e.g. --set model.share=all (ALBERT: every layer reuses one set of weights)")
        if self.embedding_size < 1:
            raise PlmError(f"model.embedding_size {self.embedding_size} must be ≥ 1", "e.g. --set model.embedding_size=128")


class PostNorm(nn.Module):
    """A post-LN sublayer, LN(x + f(x)), with f an attention or a feed-forward (BERT's layer is two)."""

    def __init__(self, fn: nn.Module, d_model: int, eps: float, bias: bool):
        super().__init__()
        self.fn = fn
        self.ln = nn.LayerNorm(d_model, eps=eps, bias=bias)

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        return self.ln(x + self.fn(x, *args))


class Albert(MaskedLMEncoder):
    Config = AlbertConfig

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.max_positions <= cfg.position_offset:
            raise ValueError(f"max_positions {cfg.max_positions} leaves no room after position_offset {cfg.position_offset}")
        self.cfg = cfg
        C, E = cfg.d_model, cfg.embedding_size
        d_ff = cfg.d_ff or 4 * C
        self.wte = nn.Embedding(cfg.vocab_size, E)
        self.wpe = nn.Embedding(cfg.max_positions, E)
        self.wtt = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.ln_emb = nn.LayerNorm(E, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.emb_proj = nn.Linear(E, C, bias=cfg.bias)  # E -> H, HF's embedding_hidden_mapping_in
        # One module per distinct set of weights; layer i uses module i % len (the only one when shared).
        n_attn = 1 if cfg.share in ("all", "attention") else cfg.n_layer
        n_ffn = 1 if cfg.share in ("all", "ffn") else cfg.n_layer
        self.attention = nn.ModuleList(
            PostNorm(MultiHeadAttention(C, cfg.n_head, cfg.bias, cfg.attn_dropout, cfg.dropout), C, cfg.layer_norm_eps, cfg.bias)
            for _ in range(n_attn))
        self.ffn = nn.ModuleList(
            PostNorm(FeedForward(C, d_ff, cfg.activation, cfg.bias, cfg.dropout), C, cfg.layer_norm_eps, cfg.bias)
            for _ in range(n_ffn))
        self.pooler = nn.Linear(C, C, bias=cfg.bias) if cfg.nsp_head else None
        self.nsp = nn.Linear(C, 2, bias=cfg.bias) if cfg.nsp_head else None  # the SOP classifier
        self.mlm = MLMHead(cfg, d_embed=E)  # H -> E -> V
        init_weights(self, cfg.init_std)  # as BERT: N(0, 0.02), zero biases
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.wte.weight

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions - self.cfg.position_offset

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        """(B, T) ids -> ((B, T, H) hidden states, (B, H) pooled [CLS] or None). attention_mask: 1 = token, 0 = padding."""
        B, T = input_ids.shape
        if T > self.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.max_positions}")
        pos = torch.arange(self.cfg.position_offset, self.cfg.position_offset + T, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)  # (B, T, E)
        if self.wtt is not None:
            x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        x = self.emb_proj(self.drop(self.ln_emb(x)))  # (B, T, H)
        mask = padding_mask(attention_mask)
        for i in range(self.cfg.n_layer):
            x = self.attention[i % len(self.attention)](x, False, mask)
            x = self.ffn[i % len(self.ffn)](x)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, H)
        return x, pooled

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6N + 12·L·T·H as for BERT. Sharing saves parameters, not compute:
        N counts one layer's weights n_layer times, the E -> H projection, and the MLM head (H×E + E×V)
        at the masked share of tokens."""
        c = self.cfg
        layer = sum(p.numel() for m in (self.attention[0], self.ffn[0]) for p in m.parameters())
        head = c.d_model * c.embedding_size + c.embedding_size * c.vocab_size
        body = c.n_layer * layer + c.embedding_size * c.d_model
        return 6 * (body + self.mlm_fraction * head) + 12 * c.n_layer * seq_len * c.d_model


def from_hf_state_dict(sd: dict) -> dict:
    """A transformers AlbertForPreTraining (or AlbertModel) state dict -> this module's, for share=all.

    HF stores ALBERT as layer groups; the released models use one group of one layer, which is
    share=all. More groups or layers per group have no equivalent here and are refused.
    """
    sd = {k.removeprefix("albert."): v for k, v in sd.items()}
    if any(".albert_layer_groups.1." in k or ".albert_layers.1." in k for k in sd):
        raise ValueError("only ALBERT with num_hidden_groups=1 and inner_group_num=1 (share=all) maps onto Albert")
    layer = "encoder.albert_layer_groups.0.albert_layers.0."
    att = layer + "attention."
    out = {"wte.weight": sd["embeddings.word_embeddings.weight"], "wpe.weight": sd["embeddings.position_embeddings.weight"],
           "wtt.weight": sd["embeddings.token_type_embeddings.weight"]}
    names = {"ln_emb": "embeddings.LayerNorm", "emb_proj": "encoder.embedding_hidden_mapping_in",
             "attention.0.fn.proj": att + "dense", "attention.0.ln": att + "LayerNorm",
             "ffn.0.fn.fc": layer + "ffn", "ffn.0.fn.proj": layer + "ffn_output", "ffn.0.ln": layer + "full_layer_layer_norm",
             "pooler": "pooler", "nsp": "sop_classifier.classifier", "mlm.dense": "predictions.dense",
             "mlm.ln": "predictions.LayerNorm"}
    for ours, theirs in names.items():
        for p in ("weight", "bias"):
            if f"{theirs}.{p}" in sd:
                out[f"{ours}.{p}"] = sd[f"{theirs}.{p}"]
    for p in ("weight", "bias"):  # HF's separate query / key / value -> our fused (3H, H) projection
        out[f"attention.0.fn.qkv.{p}"] = torch.cat([sd[f"{att}{n}.{p}"] for n in ("query", "key", "value")])
    if "predictions.bias" in sd:
        out["mlm.decoder.bias"] = sd["predictions.bias"]
        out["mlm.decoder.weight"] = sd.get("predictions.decoder.weight", out["wte.weight"])  # tied in both
    return out
