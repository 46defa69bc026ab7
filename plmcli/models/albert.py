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
from typing import ClassVar, Literal

import torch
from torch import nn

from plmcli.errors import PlmError
from plmcli.models.bert import BertConfig, MaskedLMEncoder, MLMHead, absolute_embeddings
from plmcli.kernels import Linear
from plmcli.models.hf_names import HF_ACTIVATION, activation_from_hf, owned, require_hf
from plmcli.models.layers import (Activation, Dropout, FeedForward, MultiHeadAttention, bidirectional, init_weights,
                                  require_vocab)

SHARES = ("all", "attention", "ffn", "none")


@dataclass
class AlbertConfig(BertConfig):
    activation: Activation = "gelu_tanh"
    """gelu_tanh (Google's ALBERT code; HF's gelu_new) | gelu | relu | silu; also the MLM head's transform."""
    embedding_size: int = 128
    """E: width of the word / position / segment embeddings, projected to d_model (H) by one Linear."""
    share: Literal[SHARES] = "all"
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
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64",
            "model.embedding_size=16", "model.max_positions=16", "model.vocab_size=50")
    probe_layers = ("attention", "ffn")  # a layer runs attention[i % n] then ffn[i % n] (plmcli.analysis.hidden)

    def __init__(self, cfg: AlbertConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.max_positions <= cfg.position_offset:
            raise ValueError(f"max_positions {cfg.max_positions} leaves no room after position_offset {cfg.position_offset}")
        self.cfg = cfg
        C, E = cfg.d_model, cfg.embedding_size
        d_ff = cfg.d_ff or 4 * C
        self.wte = nn.Embedding(cfg.padded_vocab, E)
        self.wpe = nn.Embedding(cfg.max_positions, E)
        self.wtt = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.ln_emb = nn.LayerNorm(E, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.drop = Dropout(cfg.dropout)
        self.emb_proj = Linear(E, C, bias=cfg.bias)  # E -> H, HF's embedding_hidden_mapping_in
        # One module per distinct set of weights; layer i uses module i % len (the only one when shared).
        n_attn = 1 if cfg.share in ("all", "attention") else cfg.n_layer
        n_ffn = 1 if cfg.share in ("all", "ffn") else cfg.n_layer
        self.attention = nn.ModuleList(
            PostNorm(MultiHeadAttention(C, cfg.n_head, cfg.bias, cfg.attn_dropout, cfg.dropout), C, cfg.layer_norm_eps, cfg.bias)
            for _ in range(n_attn))
        self.ffn = nn.ModuleList(
            PostNorm(FeedForward(C, d_ff, cfg.activation, cfg.bias, cfg.dropout), C, cfg.layer_norm_eps, cfg.bias)
            for _ in range(n_ffn))
        self.pooler = Linear(C, C, bias=cfg.bias) if cfg.nsp_head else None
        self.nsp = Linear(C, 2, bias=cfg.bias) if cfg.nsp_head else None  # the SOP classifier
        self.mlm = MLMHead(cfg, d_embed=E)  # H -> E -> V
        init_weights(self, cfg.init_std)  # as BERT: N(0, 0.02), zero biases
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.wte.weight

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, states: list | None = None):
        """(B, T) ids -> ((B, T, H) hidden states, (B, H) pooled [CLS] or None). attention_mask: 1 = token, 0 = padding.
        `states`: the projected embeddings and each layer's output are appended to it (layer_states)."""
        x = absolute_embeddings(self, input_ids, token_type_ids, self.cfg.position_offset)  # (B, T, E)
        x = self.emb_proj(self.drop(self.ln_emb(x)))  # (B, T, H)
        if states is not None:
            states.append(x)
        x = bidirectional(self._layers, x, attention_mask, states)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, H)
        return x, pooled

    def _layers(self, x, mask, states: list | None = None):
        for i in range(self.cfg.n_layer):
            x = self.run_block(self.layer, i, x, mask)
            if states is not None:
                states.append(x)
        return x

    def layer(self, i: int, x, mask):
        """Layer i: attention[i % n] then ffn[i % n] (one module of each when shared)."""
        x = self.attention[i % len(self.attention)](x, False, mask)
        return self.ffn[i % len(self.ffn)](x)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, 6N + 12·L·T·H as for BERT. Sharing saves parameters, not compute:
        N counts one layer's weights n_layer times, the E -> H projection, and the MLM head (H×E + E×V)
        at the masked share of tokens."""
        c = self.cfg
        layer = sum(p.numel() for m in (self.attention[0], self.ffn[0]) for p in m.parameters())
        head = c.d_model * c.embedding_size + c.embedding_size * c.vocab_size
        body = c.n_layer * layer + c.embedding_size * c.d_model
        return 6 * (body + self.mlm_fraction * head) + 12 * c.n_layer * seq_len * c.d_model


    # ------------------------------------------------------------ transformers interop

    hf_model_types: ClassVar[tuple[str, ...]] = ("albert",)
    """transformers config.json model_type values that from_hf reads."""

    def to_hf(self, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        """(config.json, state dict) of transformers' AlbertForPreTraining, or AlbertForMaskedLM without the SOP head.

        HF shares whole layers in groups: share=all is one group, share=none one group per layer.
        """
        c = self.cfg
        for refused, message, hint in (
            (c.share not in ("all", "none"), f"model.share '{c.share}'",
             "transformers' ALBERT shares whole layers: share=all or none"),
            (c.position_offset != 0, f"model.position_offset {c.position_offset}",
             "transformers' ALBERT reads positions from 0"),
            (not c.bias, "model.bias false", "transformers' ALBERT has biases in every Linear and LayerNorm"),
            (not c.type_vocab_size, "model.type_vocab_size 0", "transformers' ALBERT always adds segment embeddings"),
        ):
            if refused:
                raise PlmError(f"{message} has no transformers equivalent, so this run cannot be exported", hint)
        ids = run_config.get("tokenizer", {}).get("special_token_ids", {})
        config = {
            "model_type": "albert", "architectures": ["AlbertForPreTraining" if c.nsp_head else "AlbertForMaskedLM"],
            "vocab_size": c.vocab_size, "embedding_size": c.embedding_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layer, "num_hidden_groups": len(self.attention), "inner_group_num": 1,
            "num_attention_heads": c.n_head, "intermediate_size": c.d_ff or 4 * c.d_model,
            "hidden_act": HF_ACTIVATION[c.activation], "hidden_dropout_prob": c.dropout,
            "attention_probs_dropout_prob": c.attn_dropout, "max_position_embeddings": c.max_positions,
            "type_vocab_size": c.type_vocab_size, "initializer_range": c.init_std, "layer_norm_eps": c.layer_norm_eps,
            "tie_word_embeddings": c.tie_embeddings,
            # ALBERT's released configs name [CLS] and [SEP] as bos and eos.
            "pad_token_id": ids.get("pad"), "bos_token_id": ids.get("cls"), "eos_token_id": ids.get("sep"),
        }
        sd = self.state_dict()
        names, fused = _hf_names(len(self.attention), c.nsp_head)
        out = {theirs: sd[ours] for ours, theirs in names.items()}
        for ours, parts in fused.items():
            out |= dict(zip(parts, sd[ours].chunk(3)))
        out["predictions.bias"] = sd["mlm.decoder.bias"]
        # A tied decoder (and HF's decoder.bias, always tied to predictions.bias then) is left out: HF re-ties
        # both on loading, and safetensors refuses two names for one storage.
        if not c.tie_embeddings:
            out |= {"predictions.decoder.weight": sd["mlm.decoder.weight"], "predictions.decoder.bias": sd["mlm.decoder.bias"]}
        return config, owned(out)

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict[str, torch.Tensor]) -> tuple[AlbertConfig, dict[str, torch.Tensor]]:
        """(our config, our state dict) from a transformers ALBERT checkpoint (AlbertForPreTraining, ForMaskedLM,
        AlbertModel, a finetuned one...). Heads it lacks are left out; a pooler makes nsp_head true."""
        hc = hf_config
        L, groups = hc.get("num_hidden_layers", 12), hc.get("num_hidden_groups", 1)
        require_hf(hc, "inner_group_num", (1,), 1)  # a layer here is one attention + one FFN
        require_hf(hc, "num_hidden_groups", (1, L), 1)  # share=all (the released models) or share=none
        require_hf(hc, "position_embedding_type", ("absolute",), "absolute")
        sd = {f"albert.{k}" if k.startswith(("embeddings.", "encoder.", "pooler.")) else k: v
              for k, v in state_dict.items()}  # a bare AlbertModel's names lack the "albert." prefix
        cfg = AlbertConfig(
            vocab_size=hc["vocab_size"], max_positions=hc.get("max_position_embeddings", 512),
            type_vocab_size=hc.get("type_vocab_size", 2), n_layer=L, n_head=hc.get("num_attention_heads", 64),
            d_model=hc.get("hidden_size", 4096), d_ff=hc.get("intermediate_size", 16384),
            dropout=hc.get("hidden_dropout_prob", 0.0), attn_dropout=hc.get("attention_probs_dropout_prob", 0.0),
            activation=activation_from_hf(hc, "hidden_act"),
            layer_norm_eps=hc.get("layer_norm_eps", 1e-12), init_std=hc.get("initializer_range", 0.02),
            nsp_head="albert.pooler.weight" in sd, tie_embeddings=hc.get("tie_word_embeddings", True),
            embedding_size=hc.get("embedding_size", 128), share="all" if groups == 1 else "none")
        names, fused = _hf_names(groups, cfg.nsp_head)
        out = {ours: sd[theirs] for ours, theirs in names.items() if theirs in sd}
        for ours, parts in fused.items():
            if all(p in sd for p in parts):
                out[ours] = torch.cat([sd[p] for p in parts])  # HF's query / key / value -> our fused (3H, H)
        bias = sd.get("predictions.decoder.bias", sd.get("predictions.bias"))
        decoder = out.get("wte.weight") if cfg.tie_embeddings else sd.get("predictions.decoder.weight")
        out |= {k: v for k, v in (("mlm.decoder.bias", bias), ("mlm.decoder.weight", decoder)) if v is not None}
        return cfg, owned(out)


def _hf_names(groups: int, nsp_head: bool) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Our name -> transformers' AlbertForPreTraining name, and our fused qkv -> HF's query, key, value.
    Layer group g of HF is our attention[g] + ffn[g]. The MLM decoder is mapped by the callers (tying)."""
    names = {"wte.weight": "albert.embeddings.word_embeddings.weight",
             "wpe.weight": "albert.embeddings.position_embeddings.weight",
             "wtt.weight": "albert.embeddings.token_type_embeddings.weight"}
    modules = {"ln_emb": "albert.embeddings.LayerNorm", "emb_proj": "albert.encoder.embedding_hidden_mapping_in",
               "mlm.dense": "predictions.dense", "mlm.ln": "predictions.LayerNorm"}
    if nsp_head:
        modules |= {"pooler": "albert.pooler", "nsp": "sop_classifier.classifier"}
    fused = {}
    for g in range(groups):
        layer = f"albert.encoder.albert_layer_groups.{g}.albert_layers.0."
        modules |= {f"attention.{g}.fn.proj": layer + "attention.dense", f"attention.{g}.ln": layer + "attention.LayerNorm",
                    f"ffn.{g}.fn.fc": layer + "ffn", f"ffn.{g}.fn.proj": layer + "ffn_output",
                    f"ffn.{g}.ln": layer + "full_layer_layer_norm"}
        for p in ("weight", "bias"):
            fused[f"attention.{g}.fn.qkv.{p}"] = [f"{layer}attention.{n}.{p}" for n in ("query", "key", "value")]
    for ours, theirs in modules.items():
        names |= {f"{ours}.{p}": f"{theirs}.{p}" for p in ("weight", "bias")}
    return names, fused
