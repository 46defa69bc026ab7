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
from typing import ClassVar

import torch
from torch import nn

from plmcli.config_schema import Count, Heads, NonNegative, Positive, Probability, Size
from plmcli.errors import PlmError
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.bert import absolute_embeddings
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.kernels import Linear
from plmcli.models.hf_names import HF_ACTIVATION, activation_from_hf, owned, require_hf
from plmcli.models.layers import (ACTIVATIONS, Activation, Block, Dropout, MultiHeadAttention, bidirectional, init_weights,
                                   require_vocab)
from plmcli.models.vocab import PadsVocab, VocabHead

PARTS = ("generator", "discriminator")


@dataclass
class ElectraConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: Size = 512
    """Rows of the learned position table (shared by both networks)."""
    type_vocab_size: Count = 2
    """Segment (token type) embeddings: 2 for sentence pairs, 0 = none."""
    n_layer: Size = 12
    """Transformer layers, in the discriminator and in the generator alike."""
    n_head: Heads = 12
    """Discriminator attention heads per layer."""
    d_model: Size = 768
    """Discriminator hidden size."""
    d_ff: Count = 0
    """Discriminator feed-forward inner size; 0 = 4 × d_model."""
    embedding_size: Count = 0
    """Width of the shared embeddings; 0 = d_model. Small: 128 (projected up to each network's width)."""
    generator_size: float = 0.25
    """Generator hidden size, FFN size and heads as a fraction of the discriminator's, in (0, 1)."""
    dropout: Probability = 0.1
    """Dropout on embeddings and residual branches."""
    attn_dropout: Probability = 0.1
    """Dropout on attention probabilities."""
    activation: Activation = "gelu"
    """gelu (exact, as ELECTRA) | gelu_tanh | relu | silu; also the heads' nonlinearity."""
    layer_norm_eps: Positive = 1e-12
    """LayerNorm epsilon."""
    init_std: NonNegative = 0.02
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


class Transformer(CheckpointedBlocks, nn.Module):
    """One of ELECTRA's two networks: embeddings_project (where widths differ) + post-LN blocks."""

    def __init__(self, cfg: ElectraConfig, embedding_size: int, d_model: int, n_head: int, d_ff: int):
        super().__init__()
        self.embeddings_project = Linear(embedding_size, d_model) if embedding_size != d_model else None
        self.blocks = nn.ModuleList(
            Block(d_model, n_head, d_ff, cfg.activation, True, cfg.dropout, cfg.attn_dropout,
                  norm_position="post", layer_norm_eps=cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None, states: list | None = None) -> torch.Tensor:
        """`states` (a list): the (projected) embeddings and each block's output are appended to it."""
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)  # (B, T, E) -> (B, T, C)
        if states is not None:
            states.append(x)
        return bidirectional(self._blocks, x, attention_mask, states)

    def _blocks(self, x, mask, states: list | None = None):
        for block in self.blocks:
            x = self.run_block(block, x, causal=False, attn_mask=mask)
            if states is not None:
                states.append(x)
        return x


class GeneratorHead(nn.Module):
    """generator_predictions: dense to embedding_size -> activation -> LayerNorm -> decoder (+ its own bias)."""

    def __init__(self, cfg: ElectraConfig, d_model: int, embedding_size: int):
        super().__init__()
        self.dense = Linear(d_model, embedding_size)
        self.act = ACTIVATIONS[cfg.activation]
        self.ln = nn.LayerNorm(embedding_size, eps=cfg.layer_norm_eps)
        self.decoder = VocabHead(embedding_size, cfg.vocab_size, cfg.padded_vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.ln(self.act(self.dense(h))))


class DiscriminatorHead(nn.Module):
    """discriminator_predictions: dense -> activation -> dense(1), one logit per token."""

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = Linear(cfg.d_model, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]
        self.dense_prediction = Linear(cfg.d_model, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(h))).squeeze(-1)  # (B, T)


class Electra(CheckpointedBlocks, LanguageModel):
    traits = Traits(bidirectional=True, replaced_token_detection=True, scoring="pseudo")
    Config = ElectraConfig
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64",
            "model.embedding_size=16", "model.max_positions=16", "model.vocab_size=50")
    probe_layers = "discriminator.blocks"  # what encode() runs (plmcli.analysis.hidden)
    mlm_fraction = 0.15
    """Share of tokens the generator's MLM head runs at, for flops_per_token (ELECTRA's mask_prob)."""

    def attention_modules(self) -> list[nn.Module]:
        """RecordsAttention: the discriminator's, which `encode` runs (the generator serves pretraining alone)."""
        return [m for m in self.discriminator.modules() if isinstance(m, MultiHeadAttention)]

    adapter_modules = attention_modules  # AdaptsAttention: the same modules

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        require_vocab(cfg)
        self.cfg = cfg
        E = cfg.embedding_size or cfg.d_model
        g_d, g_h, g_ff = cfg.generator_dims()
        self.wte = nn.Embedding(cfg.padded_vocab, E)
        self.wpe = nn.Embedding(cfg.max_positions, E)
        self.wtt = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.ln_emb = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)
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

    def _embed(self, input_ids, token_type_ids):
        """The shared embeddings (B, T, E), as BERT's."""
        return self.drop(self.ln_emb(absolute_embeddings(self, input_ids, token_type_ids)))

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        """(B, T) ids -> ((B, T, C) discriminator states, None): there is no pooler; use [CLS]'s state."""
        return self.discriminator(self._embed(input_ids, token_type_ids), attention_mask), None

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """The discriminator's [embeddings, each layer's output] (B, T, C) each (HasLayerStates)."""
        states: list = []
        self.discriminator(self._embed(input_ids, token_type_ids), attention_mask, states)
        return states

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None,
                part: str = "generator") -> ElectraOutput:
        """Run one network. part="generator": MLM logits at `mlm_positions` (flat b·T + t; None = every
        position), so `model(ids)` is a masked LM. part="discriminator": one replaced-token logit per token."""
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        x = self._embed(input_ids, token_type_ids)
        if part == "discriminator":
            h = self.discriminator(x, attention_mask)
            return ElectraOutput(h, None, self.rtd(h))
        h = self.generator(x, attention_mask)
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

    hf_model_types: ClassVar[tuple[str, ...]] = ("electra",)
    """transformers config.json model_type values that from_hf reads."""

    def to_hf(self, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        """(config.json, state dict) of the discriminator as transformers' ElectraForPreTraining: the network
        people finetune. The generator is hf_extra_exports' "generator"."""
        return self._to_hf("discriminator", run_config)

    def hf_extra_exports(self, run_config: dict) -> dict[str, tuple[dict, dict[str, torch.Tensor]]]:
        """{subdirectory: (config.json, state dict)} written beside to_hf's: the generator as transformers'
        ElectraForMaskedLM in "generator/", with its own copy of the shared embeddings (as Google's releases)."""
        if self.cfg.activation != "gelu":
            raise PlmError(f"model.activation '{self.cfg.activation}' has no transformers equivalent in the generator",
                           "transformers' ElectraGeneratorPredictions always applies exact gelu: export a gelu run")
        return {"generator": self._to_hf("generator", run_config)}

    def _to_hf(self, net: str, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        c = self.cfg
        if not c.type_vocab_size:
            raise PlmError("model.type_vocab_size 0 has no transformers equivalent, so this run cannot be exported",
                           "transformers' ELECTRA always adds segment embeddings")
        d, heads, d_ff = {"discriminator": (c.d_model, c.n_head, c.d_ff or 4 * c.d_model),
                          "generator": c.generator_dims()}[net]
        config = {
            "model_type": "electra", "architectures": [HF_ARCHITECTURES[net]], "vocab_size": c.vocab_size,
            "embedding_size": c.embedding_size or c.d_model, "hidden_size": d, "num_hidden_layers": c.n_layer,
            "num_attention_heads": heads, "intermediate_size": d_ff, "hidden_act": HF_ACTIVATION[c.activation],
            "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.attn_dropout,
            "max_position_embeddings": c.max_positions, "type_vocab_size": c.type_vocab_size,
            "initializer_range": c.init_std, "layer_norm_eps": c.layer_norm_eps, "tie_word_embeddings": True,
            "pad_token_id": run_config.get("tokenizer", {}).get("special_token_ids", {}).get("pad"),
        }
        sd = self.state_dict()
        names, fused = _hf_names(net, c.n_layer, getattr(self, net).embeddings_project is not None)
        # The generator's decoder is the word embedding: HF re-ties generator_lm_head.weight on loading, and
        # safetensors refuses two names for one storage, so it is not written.
        out = {theirs: sd[ours] for ours, theirs in names.items()}
        for ours, parts in fused.items():
            out |= dict(zip(parts, sd[ours].chunk(3)))
        return config, owned(out)

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict[str, torch.Tensor],
                extras: dict[str, tuple[dict, dict[str, torch.Tensor]]] | None = None
                ) -> tuple[ElectraConfig, dict[str, torch.Tensor]]:
        """(our config, our state dict) from a transformers ELECTRA discriminator (ElectraForPreTraining,
        ElectraModel, a finetuned one), plus its generator (ElectraForMaskedLM) when extras has "generator".

        The shared embeddings are the discriminator's (in Google's checkpoints both hold the same values).
        Without a generator, generator_size is ELECTRA-Small's 1/4 and the generator's weights are left out.
        """
        hc = hf_config
        sd = _prefixed(state_dict)
        if "generator_predictions.dense.weight" in sd:
            raise PlmError("this checkpoint is an ELECTRA generator (ElectraForMaskedLM), not a discriminator",
                           "import the discriminator (ElectraForPreTraining); its generator comes along from DIR/generator/")
        require_hf(hc, "position_embedding_type", ("absolute",), "absolute")
        d, heads, d_ff = hc.get("hidden_size", 256), hc.get("num_attention_heads", 4), hc.get("intermediate_size", 1024)
        n_layer, E = hc.get("num_hidden_layers", 12), hc.get("embedding_size", 128)
        gen_config, gen_sd = (extras or {}).get("generator", ({}, None))
        size = gen_config.get("hidden_size", d) / d if gen_sd is not None else 0.25
        if not 0 < size < 1:
            raise PlmError(f"the generator's hidden_size {gen_config['hidden_size']} is not below the discriminator's {d}",
                           "plm's ELECTRA generator is a fraction of the discriminator's width (model.generator_size)")
        cfg = ElectraConfig(
            vocab_size=hc["vocab_size"], max_positions=hc.get("max_position_embeddings", 512),
            type_vocab_size=hc.get("type_vocab_size", 2), n_layer=n_layer, n_head=heads, d_model=d, d_ff=d_ff,
            embedding_size=E, generator_size=size, dropout=hc.get("hidden_dropout_prob", 0.1),
            attn_dropout=hc.get("attention_probs_dropout_prob", 0.1),
            activation=activation_from_hf(hc, "hidden_act"),
            layer_norm_eps=hc.get("layer_norm_eps", 1e-12), init_std=hc.get("initializer_range", 0.02))
        out = _from_hf(sd, *_hf_names("discriminator", n_layer, E != d))
        if gen_sd is not None:
            if cfg.activation != "gelu":
                raise PlmError(f"hidden_act '{hc['hidden_act']}' with a generator has no equivalent here",
                               "transformers' generator head applies exact gelu where plm's uses model.activation")
            g_d, g_heads, g_ff = cfg.generator_dims()
            expect = {"num_hidden_layers": n_layer, "embedding_size": E, "vocab_size": cfg.vocab_size, "hidden_size": g_d,
                      "num_attention_heads": g_heads, "intermediate_size": g_ff, "hidden_act": hc.get("hidden_act", "gelu")}
            for field, want in expect.items():
                if gen_config.get(field, want) != want:
                    raise PlmError(f"the generator's {field} {gen_config[field]} does not fit the discriminator (expected {want})",
                                   "plm's ELECTRA scales the generator's width, heads and FFN by one fraction, at the same depth")
            gen = _from_hf(_prefixed(gen_sd), *_hf_names("generator", n_layer, E != g_d))
            out |= {k: v for k, v in gen.items() if k.startswith(("generator.", "mlm."))}
        if "wte.weight" in out:
            out["mlm.decoder.weight"] = out["wte.weight"]
        return cfg, owned(out)


HF_ARCHITECTURES = {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"}
"""Our network -> the transformers class its export loads into."""


def _hf_names(net: str, n_layer: int, project: bool) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Our name -> transformers' (HF_ARCHITECTURES[net]) for one network with the shared embeddings and its head,
    and our fused qkv -> HF's query, key, value (BERT's layer layout)."""
    names = {"wte.weight": "electra.embeddings.word_embeddings.weight",
             "wpe.weight": "electra.embeddings.position_embeddings.weight",
             "wtt.weight": "electra.embeddings.token_type_embeddings.weight"}
    heads = {"discriminator": {"rtd.dense": "discriminator_predictions.dense",
                               "rtd.dense_prediction": "discriminator_predictions.dense_prediction"},
             "generator": {"mlm.dense": "generator_predictions.dense", "mlm.ln": "generator_predictions.LayerNorm"}}
    modules = {"ln_emb": "electra.embeddings.LayerNorm"} | heads[net]
    if net == "generator":
        names["mlm.decoder.bias"] = "generator_lm_head.bias"
    if project:
        modules[f"{net}.embeddings_project"] = "electra.embeddings_project"
    fused = {}
    for i in range(n_layer):
        a, b = f"{net}.blocks.{i}.", f"electra.encoder.layer.{i}."
        modules |= {a + "attn.proj": b + "attention.output.dense", a + "ln_1": b + "attention.output.LayerNorm",
                    a + "mlp.fc": b + "intermediate.dense", a + "mlp.proj": b + "output.dense",
                    a + "ln_2": b + "output.LayerNorm"}
        for p in ("weight", "bias"):
            fused[f"{a}attn.qkv.{p}"] = [f"{b}attention.self.{n}.{p}" for n in ("query", "key", "value")]
    for ours, theirs in modules.items():
        names |= {f"{ours}.{p}": f"{theirs}.{p}" for p in ("weight", "bias")}
    return names, fused


def _from_hf(sd: dict, names: dict[str, str], fused: dict[str, list[str]]) -> dict:
    """The tensors of `sd` that `names` / `fused` map, under our names (absent ones left out)."""
    out = {ours: sd[theirs] for ours, theirs in names.items() if theirs in sd}
    for ours, parts in fused.items():
        if all(p in sd for p in parts):
            out[ours] = torch.cat([sd[p] for p in parts])
    return out


def _prefixed(sd: dict) -> dict:
    """A bare ElectraModel's names lack the "electra." prefix of the models with heads."""
    return {f"electra.{k}" if k.startswith(("embeddings.", "embeddings_project.", "encoder.")) else k: v for k, v in sd.items()}
