"""GPT (Radford et al. 2018) and GPT-2 (2019): a decoder-only Transformer LM.

One class serves both; the recipe chooses the differences as data:
GPT-1 = post-LN, no final LN, GELU; GPT-2 = pre-LN + final LN, tanh-GELU, residual init scaled by 1/√(2L).
`to_hf` / `from_hf` convert to and from transformers' GPT-2 and OpenAI GPT checkpoints (plmcli.interop.hf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from plmcli.config_schema import Count, Heads, NonNegative, Positive, Probability, Size
from plmcli.errors import PlmError
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.models.hf_names import HF_ACTIVATION, activation_from_hf, owned, require_hf, without_prefix
from plmcli.models.layers import (Activation, Block, Dropout, MultiHeadAttention, NormPosition, init_weights,
                                   require_vocab, scale_residual_init)
from plmcli.models.lm_loss import IGNORE_INDEX, linear_cross_entropy
from plmcli.models.vocab import PadsVocab, VocabHead


@dataclass
class GPTConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: Size = 1024
    """Learned position embeddings: the longest sequence the model can read."""
    n_layer: Size = 12
    """Transformer layers."""
    n_head: Heads = 12
    """Attention heads per layer."""
    d_model: Size = 768
    """Hidden size."""
    d_ff: Count = 0
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: Probability = 0.1
    """Dropout on embeddings, residual branches."""
    attn_dropout: Probability = 0.1
    """Dropout on attention probabilities."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""
    norm_position: NormPosition = "pre"
    """pre (GPT-2) | post (GPT-1)."""
    final_norm: bool = True
    """A LayerNorm after the last block (GPT-2)."""
    activation: Activation = "gelu_tanh"
    """gelu | gelu_tanh | relu | silu."""
    layer_norm_eps: Positive = 1e-5
    """LayerNorm epsilon."""
    tie_embeddings: bool = True
    """The output projection shares the token embedding matrix."""
    init_std: NonNegative = 0.02
    """Std of the normal init."""
    scaled_residual_init: bool = True
    """Residual projections start at init_std/√(2·n_layer) (GPT-2)."""


class GPT(CheckpointedBlocks, LanguageModel):
    traits = Traits(causal=True, scoring="window")
    Config = GPTConfig
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.max_positions=16", "model.vocab_size=50")
    probe_layers = "blocks"  # plmcli.analysis.hidden reads each layer's output there

    def attention_modules(self) -> list[nn.Module]:
        """RecordsAttention: each block's causal self-attention."""
        return [m for m in self.blocks.modules() if isinstance(m, MultiHeadAttention)]

    adapter_modules = attention_modules  # AdaptsAttention: the same modules

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be pre or post, not {cfg.norm_position!r}")
        self.cfg = cfg
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_head, d_ff, cfg.activation, cfg.bias, cfg.dropout, cfg.attn_dropout,
                  cfg.norm_position, cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.final_norm else nn.Identity()
        self.lm_head = VocabHead(cfg.d_model, cfg.vocab_size, cfg.padded_vocab, bias=False)
        init_weights(self, cfg.init_std)
        if cfg.scaled_residual_init:
            scale_residual_init(self.blocks, cfg.init_std, cfg.n_layer)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def hidden(self, input_ids: torch.Tensor, states: list | None = None, start: int = 0) -> torch.Tensor:
        """(B, T) token ids -> (B, T, C) final hidden states; position t sees tokens ≤ t only. `states` (a
        list): the embedding output and each block's output are appended, the last one after ln_f.
        `start` > 0: only positions ≥ start come out, (B, T - start, C), the last block computing no others."""
        T = input_ids.shape[1]
        if T > self.cfg.max_positions:
            raise ValueError(f"sequence of {T} tokens exceeds max_positions={self.cfg.max_positions}")
        pos = torch.arange(T, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))  # (B, T, C)
        if states is not None:
            states.append(x)
        for i, block in enumerate(self.blocks):
            last = start and i == len(self.blocks) - 1
            x = block.causal_tail(x, start) if last else self.run_block(block, x, causal=True)
            if states is not None:
                states.append(x)
        x = self.ln_f(x)
        if states is not None:
            states[-1] = x  # pre-LN: the last layer's state is the normalized one heads read
        return x

    def empty_cache(self, batch: int) -> list:
        """The key/value cache of no positions, where `decode_cached` starts: per block (keys, values) (B, H, 0, D)."""
        H = self.cfg.n_head
        empty = self.wte.weight.new_zeros(batch, H, 0, self.cfg.d_model // H)
        return [(empty, empty) for _ in self.blocks]

    def decode_cached(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: list,
                      keep: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """Incremental decoding (CachesKeysValues): (B, T) new tokens at (B, T) positions after the `cache`d ones ->
        ((B, V) next-token logits after each row's last new token, the cache with the T positions added). Each
        row counts its positions from its own first token, so left-padded rows of different lengths (`keep`
        False at the padding) decode together and every step appends at the same cache slot."""
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        new = []
        for block, kv in zip(self.blocks, cache):
            x, kv = block.cached(x, kv, keep)
            new.append(kv)
        return self.lm_head(self.ln_f(x[:, -1])), new

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """[embedding output, each block's output (the last after ln_f)] (B, T, C) each (HasLayerStates);
        causal attention: right padding never reaches a real position, so no mask is needed."""
        states: list = []
        self.hidden(input_ids, states)
        return states

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) -> (B, T, V) next-token logits; with `labels` (B, T) (-100 = not scored) the mean
        cross-entropy instead, computed without materialising the logits (plmcli.models.lm_loss).

        The loss is taken here rather than by the objective from `lm_head.weight` because sharded
        training (FSDP, ZeRO-3) only gathers that weight inside the model's forward.
        """
        if labels is None:
            return self.lm_head(self.hidden(input_ids))
        start = 0
        if not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # Scoring (eval-ppl's sliding windows): positions before the first scored one are context
            # only, and the last block and the output layer need not compute them (a host read, so not
            # in a compiled graph).
            scored = (labels != IGNORE_INDEX).any(0).nonzero()
            start = int(scored[0]) if len(scored) else 0
        h = self.hidden(input_ids, start=start)
        return linear_cross_entropy(h.flatten(0, 1), self.lm_head.weight, labels[:, start:].flatten(),
                                    vocab_size=self.cfg.vocab_size)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward ≈ 3× forward), PaLM's 6N + 12·L·T·C estimate."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * seq_len * self.cfg.d_model

    # ---------------------------------------------------------------- transformers interop (plmcli.interop.hf)

    hf_model_types: ClassVar[tuple[str, ...]] = ("gpt2", "openai-gpt")

    def to_hf(self, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        """(HF config.json contents, HF state dict): GPT2LMHeadModel for pre-LN + final LN, OpenAIGPTLMHeadModel
        for post-LN without one. Both keep linear weights in Conv1D's (in, out) layout, ours transposed;
        a tied output projection is written once, as the token embeddings (HF re-ties it)."""
        c = self.cfg
        style = {("pre", True): "gpt2", ("post", False): "openai-gpt"}.get((c.norm_position, c.final_norm))
        if style is None:
            raise PlmError(f"no transformers GPT has norm_position {c.norm_position} with final_norm {c.final_norm}",
                           "GPT-2 is pre-LN with a final LayerNorm, OpenAI GPT post-LN without one")
        if not c.bias:
            raise PlmError("model.bias is false, and transformers' GPTs have biases in every layer",
                           "export a run trained with model.bias: true")
        ids = run_config.get("tokenizer", {}).get("special_token_ids", {})
        ours = self.state_dict()
        emb, pos = _HF_EMBEDDINGS[style]
        sd = {f"transformer.{emb}.weight": ours["wte.weight"], f"transformer.{pos}.weight": ours["wpe.weight"]}
        for i in range(c.n_layer):
            for a, b in _HF_BLOCK:
                for p in ("weight", "bias"):
                    w = ours[f"blocks.{i}.{a}.{p}"]
                    sd[f"transformer.h.{i}.{b}.{p}"] = w.T if b in _CONV1D and p == "weight" else w
        if c.final_norm:
            sd |= {"transformer.ln_f.weight": ours["ln_f.weight"], "transformer.ln_f.bias": ours["ln_f.bias"]}
        if not c.tie_embeddings:
            sd["lm_head.weight"] = ours["lm_head.weight"]
        common = {"model_type": style, "vocab_size": c.vocab_size, "n_positions": c.max_positions, "n_embd": c.d_model,
                  "n_layer": c.n_layer, "n_head": c.n_head, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
                  "attn_pdrop": c.attn_dropout, "layer_norm_epsilon": c.layer_norm_eps,
                  "initializer_range": c.init_std, "tie_word_embeddings": c.tie_embeddings,
                  "bos_token_id": ids.get("bos"), "eos_token_id": ids.get("eos"), "pad_token_id": ids.get("pad")}
        if style == "gpt2":
            hf = {**common, "architectures": ["GPT2LMHeadModel"], "n_inner": c.d_ff or None,
                  "activation_function": HF_ACTIVATION[c.activation], "scale_attn_weights": True}
        else:
            afn = {v: k for k, v in _OPENAI_AFN.items()}.get(c.activation)
            if afn is None:  # OpenAIGPT's "gelu" is gelu_new; it has no exact GELU
                raise PlmError(f"transformers' OpenAI GPT has no activation computing this run's {c.activation} "
                               "(its 'gelu' is the tanh approximation)",
                               "GPT-1's released code used the tanh GELU: train with --set model.activation=gelu_tanh")
            if c.d_ff not in (0, 4 * c.d_model):
                raise PlmError(f"model.d_ff {c.d_ff}: transformers' OpenAI GPT fixes the feed-forward at 4 × d_model",
                               f"train with model.d_ff 0 or {4 * c.d_model}")
            hf = {**common, "architectures": ["OpenAIGPTLMHeadModel"], "afn": afn}
        return hf, owned(sd)

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict[str, torch.Tensor]) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
        """(our Config, our state dict) from a transformers GPT-2 or OpenAI GPT checkpoint (LM head model or bare)."""
        style = hf_config.get("model_type")
        if style not in _HF_EMBEDDINGS:
            raise PlmError(f"model_type '{style}' is not GPT-2 or OpenAI GPT", "this family imports: gpt2, openai-gpt")
        gpt2 = style == "gpt2"
        if gpt2:
            require_hf(hf_config, "scale_attn_weights", (True,), True)
            require_hf(hf_config, "scale_attn_by_inverse_layer_idx", (False,), False)
            require_hf(hf_config, "add_cross_attention", (False,), False)
        d = hf_config.get("n_embd", 768)
        cfg = cls.Config(
            vocab_size=hf_config["vocab_size"], max_positions=hf_config.get("n_positions", 1024),
            n_layer=hf_config.get("n_layer", 12), n_head=hf_config.get("n_head", 12), d_model=d,
            d_ff=(hf_config.get("n_inner") or 0) if gpt2 else 0, dropout=hf_config.get("resid_pdrop", 0.1),
            attn_dropout=hf_config.get("attn_pdrop", 0.1), bias=True, norm_position="pre" if gpt2 else "post",
            final_norm=gpt2, layer_norm_eps=hf_config.get("layer_norm_epsilon", 1e-5),
            activation=(activation_from_hf(hf_config, "activation_function") if gpt2
                        else activation_from_hf(hf_config, "afn", _OPENAI_AFN)),
            tie_embeddings=hf_config.get("tie_word_embeddings", True), init_std=hf_config.get("initializer_range", 0.02),
            scaled_residual_init=gpt2)
        sd = without_prefix(state_dict, "transformer.")
        emb, pos = _HF_EMBEDDINGS[style]
        out = {ours: sd[theirs] for ours, theirs in (("wte.weight", f"{emb}.weight"), ("wpe.weight", f"{pos}.weight"),
                                                     ("ln_f.weight", "ln_f.weight"), ("ln_f.bias", "ln_f.bias"))
               if theirs in sd and (gpt2 or not ours.startswith("ln_f"))}
        for i in range(cfg.n_layer):
            for a, b in _HF_BLOCK:
                for p in ("weight", "bias"):
                    w = sd.get(f"h.{i}.{b}.{p}")
                    if w is not None:
                        out[f"blocks.{i}.{a}.{p}"] = w.T if b in _CONV1D and p == "weight" else w
        if not cfg.tie_embeddings and "lm_head.weight" in sd:
            out["lm_head.weight"] = sd["lm_head.weight"]
        return cfg, owned(out)


_HF_EMBEDDINGS = {"gpt2": ("wte", "wpe"), "openai-gpt": ("tokens_embed", "positions_embed")}
"""Per model type: the token and position embeddings' names under `transformer.`."""
_HF_BLOCK = (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
             ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj"))
"""Our Block -> HF's (both model types). ln_1 / ln_2 sit where ours do: before (GPT-2) or after (GPT-1) each sublayer."""
_CONV1D = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}
"""HF modules that are Conv1D: weight (in, out), the transpose of our Linear's."""
_OPENAI_AFN = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
"""OpenAIGPT's `afn` -> ours: its "gelu" is gelu_new, the tanh approximation."""
