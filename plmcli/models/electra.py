"""ELECTRA (Clark et al. 2020): a small masked-LM generator and a discriminator that spots its replacements.

Both networks live in one module, so the one loop (one prepared model, one optimizer) trains them
together. The `rtd` objective calls `forward` twice per step, both times through the (possibly
DDP-wrapped) module: part="generator" on the masked ids, then part="discriminator" on the ids with
the generator's samples written in.

Shared, as in the released code (both networks are built under one "electra/embeddings" scope): the
token, position and segment embeddings and their LayerNorm. Not shared: each network's
`embeddings_project`, a Linear from embedding_size to its own hidden size, present only where the two
differ (as HF's ElectraModel). The generator is a BERT-style encoder whose hidden size, FFN size and
head count are `generator_size` × the discriminator's (paper Table 6: 1/4 for Small, 1/3 for Base),
with the same depth; its MLM head (dense -> GELU -> LayerNorm to embedding_size) decodes with the
shared word embeddings. The discriminator's head is dense -> GELU -> dense(1), one logit per token.

Finetuning reads the discriminator only (`encode`): its [CLS] state feeds the classifier, as ELECTRA's
own finetuning code does (dropout + linear on the first token; HF's extra dense+GELU is not used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plmcli.errors import PlmError
from plmcli.models.layers import ACTIVATIONS, Block, init_weights, require_vocab

PARTS = ("generator", "discriminator")


@dataclass
class ElectraConfig:
    vocab_size: int = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: int = 512
    """Rows of the learned position table (shared by both networks)."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings: 2 for sentence pairs, 0 = none."""
    n_layer: int = 12
    """Transformer layers, in the discriminator and in the generator alike."""
    n_head: int = 12
    """Discriminator attention heads per layer."""
    d_model: int = 768
    """Discriminator hidden size."""
    d_ff: int = 0
    """Discriminator feed-forward inner size; 0 = 4 × d_model."""
    embedding_size: int = 0
    """Width of the shared embeddings; 0 = d_model. Small: 128 (projected up to each network's width)."""
    generator_size: float = 0.25
    """Generator hidden size, FFN size and heads as a fraction of the discriminator's, in (0, 1)."""
    dropout: float = 0.1
    """Dropout on embeddings and residual branches."""
    attn_dropout: float = 0.1
    """Dropout on attention probabilities."""
    activation: str = "gelu"
    """gelu (exact, as ELECTRA) | gelu_tanh | relu | silu; also the heads' nonlinearity."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init (initializer_range)."""

    def __post_init__(self):
        if not 0 < self.generator_size < 1:
            raise PlmError(f"model.generator_size {self.generator_size} must be in (0, 1): a fraction of the discriminator",
                           "e.g. --set model.generator_size=0.25 (ELECTRA-Small) or 0.33333 (ELECTRA-Base)")
        if self.n_head < 1 or self.d_model % self.n_head:
            raise PlmError(f"model.d_model {self.d_model} is not divisible by model.n_head {self.n_head}",
                           "pick n_head dividing d_model, e.g. 64-wide heads")
        d, h, _ = self.generator_dims()
        if d < 1 or d % h:
            raise PlmError(f"the generator's hidden size {d} (generator_size × d_model) does not split into its {h} heads",
                           "pick generator_size so that generator_size × d_model is a multiple of generator_size × n_head")

    def generator_dims(self) -> tuple[int, int, int]:
        """(hidden, heads, FFN) of the generator: the discriminator's scaled by generator_size, at least one head."""
        g = self.generator_size
        d_ff = self.d_ff or 4 * self.d_model
        return round(self.d_model * g), max(1, round(self.n_head * g)), max(1, round(d_ff * g))


@dataclass
class ElectraOutput:
    hidden: torch.Tensor
    """(B, T, C) final hidden states of the network that ran."""
    mlm_logits: torch.Tensor | None
    """Generator: (N, V) at the N requested flat positions, or (B, T, V) at every position; else None."""
    rtd_logits: torch.Tensor | None
    """Discriminator: (B, T) logits of "this token was replaced"; else None."""


class Transformer(nn.Module):
    """One of ELECTRA's two networks: embeddings_project (where widths differ) + post-LN blocks."""

    def __init__(self, cfg: ElectraConfig, embedding_size: int, d_model: int, n_head: int, d_ff: int):
        super().__init__()
        self.embeddings_project = nn.Linear(embedding_size, d_model) if embedding_size != d_model else None
        self.blocks = nn.ModuleList(
            Block(d_model, n_head, d_ff, cfg.activation, True, cfg.dropout, cfg.attn_dropout,
                  norm_position="post", layer_norm_eps=cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)  # (B, T, E) -> (B, T, C)
        for block in self.blocks:
            x = block(x, causal=False, attn_mask=mask)
        return x


class GeneratorHead(nn.Module):
    """generator_predictions: dense to embedding_size -> activation -> LayerNorm -> decoder (+ its own bias)."""

    def __init__(self, cfg: ElectraConfig, d_model: int, embedding_size: int):
        super().__init__()
        self.dense = nn.Linear(d_model, embedding_size)
        self.act = ACTIVATIONS[cfg.activation]
        self.ln = nn.LayerNorm(embedding_size, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(embedding_size, cfg.vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.ln(self.act(self.dense(h))))


class DiscriminatorHead(nn.Module):
    """discriminator_predictions: dense -> activation -> dense(1), one logit per token."""

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]
        self.dense_prediction = nn.Linear(cfg.d_model, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(h))).squeeze(-1)  # (B, T)


class Electra(nn.Module):
    Config = ElectraConfig
    causal = False
    encoder = True
    replaced_token_detection = True
    """Has a generator and a discriminator (what the rtd objective needs)."""
    mlm_fraction = 0.15
    """Share of tokens the generator's MLM head runs at, for flops_per_token (ELECTRA's mask_prob)."""

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        require_vocab(cfg)
        self.cfg = cfg
        E = cfg.embedding_size or cfg.d_model
        g_d, g_h, g_ff = cfg.generator_dims()
        self.wte = nn.Embedding(cfg.vocab_size, E)
        self.wpe = nn.Embedding(cfg.max_positions, E)
        self.wtt = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.ln_emb = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.generator = Transformer(cfg, E, g_d, g_h, g_ff)
        self.discriminator = Transformer(cfg, E, cfg.d_model, cfg.n_head, cfg.d_ff or 4 * cfg.d_model)
        self.mlm = GeneratorHead(cfg, g_d, E)
        self.rtd = DiscriminatorHead(cfg)
        init_weights(self, cfg.init_std)  # N(0, 0.02), zero biases, as BERT and ELECTRA
        # The generator decodes with the shared input embeddings (ELECTRA ties them; it keeps its own bias).
        self.mlm.decoder.weight = self.wte.weight

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def _embed(self, input_ids, token_type_ids, attention_mask):
        """Shared embeddings (B, T, E) and the SDPA key mask (None without padding)."""
        B, T = input_ids.shape
        if T > self.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.max_positions}")
        x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))  # (B, T, E)
        if self.wtt is not None:
            x = x + (self.wtt(token_type_ids) if token_type_ids is not None else self.wtt.weight[0])
        x = self.drop(self.ln_emb(x))
        # As Bert: a boolean key mask (B, 1, 1, T) only when there is padding, so SDPA keeps its fast kernels.
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = attention_mask.bool()[:, None, None, :]
        return x, mask

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        """(B, T) ids -> ((B, T, C) discriminator states, None): there is no pooler; use [CLS]'s state."""
        x, mask = self._embed(input_ids, token_type_ids, attention_mask)
        return self.discriminator(x, mask), None

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None,
                part: str = "generator") -> ElectraOutput:
        """Run one network. part="generator": MLM logits at `mlm_positions` (flat b·T + t; None = every
        position), so `model(ids)` is a masked LM. part="discriminator": one replaced-token logit per token."""
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        x, mask = self._embed(input_ids, token_type_ids, attention_mask)
        if part == "discriminator":
            h = self.discriminator(x, mask)
            return ElectraOutput(h, None, self.rtd(h))
        h = self.generator(x, mask)
        at = h if mlm_positions is None else h.flatten(0, 1).index_select(0, mlm_positions)
        return ElectraOutput(h, self.mlm(at), None)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of both networks, 6N + 12·L·T·C each (as Bert.flops_per_token).

        Per token: both projections, both bodies and the discriminator head; the generator's MLM
        head (dense C_g×E and decoder E×V) only for the masked share `mlm_fraction`.
        """
        c = self.cfg
        E = c.embedding_size or c.d_model
        g_d = c.generator_dims()[0]
        per_token = sum(p.numel() for m in (self.generator, self.discriminator, self.rtd) for p in m.parameters())
        head = g_d * E + E * c.vocab_size
        return 6 * (per_token + self.mlm_fraction * head) + 12 * c.n_layer * seq_len * (c.d_model + g_d)

    # ------------------------------------------------------------ transformers interop

    @classmethod
    def from_hf_state_dict(cls, cfg: ElectraConfig, generator: dict, discriminator: dict) -> "Electra":
        """Build from the state dicts of transformers' ElectraForMaskedLM (generator) and
        ElectraForPreTraining (discriminator). The shared embeddings are the discriminator's (in
        Google's checkpoints both hold the same tensors)."""
        model = cls(cfg)
        d = discriminator
        sd = {"wte.weight": d["electra.embeddings.word_embeddings.weight"],
              "mlm.decoder.weight": d["electra.embeddings.word_embeddings.weight"],
              "wpe.weight": d["electra.embeddings.position_embeddings.weight"],
              "ln_emb.weight": d["electra.embeddings.LayerNorm.weight"], "ln_emb.bias": d["electra.embeddings.LayerNorm.bias"],
              "rtd.dense.weight": d["discriminator_predictions.dense.weight"],
              "rtd.dense.bias": d["discriminator_predictions.dense.bias"],
              "rtd.dense_prediction.weight": d["discriminator_predictions.dense_prediction.weight"],
              "rtd.dense_prediction.bias": d["discriminator_predictions.dense_prediction.bias"]}
        if model.wtt is not None:
            sd["wtt.weight"] = d["electra.embeddings.token_type_embeddings.weight"]
        g = generator
        sd |= {"mlm.dense.weight": g["generator_predictions.dense.weight"], "mlm.dense.bias": g["generator_predictions.dense.bias"],
               "mlm.ln.weight": g["generator_predictions.LayerNorm.weight"], "mlm.ln.bias": g["generator_predictions.LayerNorm.bias"],
               "mlm.decoder.bias": g["generator_lm_head.bias"]}
        for ours, hf in (("generator", g), ("discriminator", d)):
            if "electra.embeddings_project.weight" in hf:
                sd[f"{ours}.embeddings_project.weight"] = hf["electra.embeddings_project.weight"]
                sd[f"{ours}.embeddings_project.bias"] = hf["electra.embeddings_project.bias"]
            for i in range(cfg.n_layer):
                sd |= _block_from_hf(hf, f"electra.encoder.layer.{i}.", f"{ours}.blocks.{i}.")
        model.load_state_dict({k: v.detach().clone() for k, v in sd.items()})  # copies in place: the tie stays
        return model


def _block_from_hf(hf: dict, src: str, dst: str) -> dict:
    """HF query / key / value -> our fused qkv; post-LN attention / output LayerNorm -> ln_1 / ln_2."""
    get = lambda name: hf[src + name]  # noqa: E731
    return {
        dst + "attn.qkv.weight": torch.cat([get(f"attention.self.{n}.weight") for n in ("query", "key", "value")]),
        dst + "attn.qkv.bias": torch.cat([get(f"attention.self.{n}.bias") for n in ("query", "key", "value")]),
        dst + "attn.proj.weight": get("attention.output.dense.weight"), dst + "attn.proj.bias": get("attention.output.dense.bias"),
        dst + "ln_1.weight": get("attention.output.LayerNorm.weight"), dst + "ln_1.bias": get("attention.output.LayerNorm.bias"),
        dst + "mlp.fc.weight": get("intermediate.dense.weight"), dst + "mlp.fc.bias": get("intermediate.dense.bias"),
        dst + "mlp.proj.weight": get("output.dense.weight"), dst + "mlp.proj.bias": get("output.dense.bias"),
        dst + "ln_2.weight": get("output.LayerNorm.weight"), dst + "ln_2.bias": get("output.LayerNorm.bias"),
    }
