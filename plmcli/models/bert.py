"""BERT (Devlin et al. 2018) and RoBERTa (Liu et al. 2019): a bidirectional Transformer encoder.

One class serves both; the recipe chooses the differences as data:
BERT = segment embeddings + pooler/NSP head; RoBERTa = one segment, positions offset by 2 (fairseq's
padding_idx + 1), no pooler. Both: post-LN blocks, exact GELU, an MLM head whose decoder is the word
embedding matrix. The MLM head runs only at the masked positions: at 15% masking that skips ~85% of
the largest matmul in the model (d × vocab per token).

`MaskedLMEncoder` (the heads on top of `encode`) and `MLMHead` are shared with ALBERT and NEZHA.
`to_hf` / `from_hf` convert to and from transformers' BERT and RoBERTa checkpoints (plmcli.interop.hf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from torch import nn

from plmcli.config_schema import Count, Heads, NonNegative, Positive, Probability, Rule, Size
from plmcli.errors import PlmError
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.kernels import Linear
from plmcli.models.hf_names import HF_ACTIVATION, activation_from_hf, owned, require_hf, without_prefix
from plmcli.models.layers import (ACTIVATIONS, Activation, Block, Dropout, MultiHeadAttention, NormPosition,
                                   bidirectional, init_weights, require_vocab)
from plmcli.models.lm_loss import linear_cross_entropy
from plmcli.models.vocab import PadsVocab, VocabHead


LEAVES_POSITIONS = Rule(lambda offset, c: offset < c["max_positions"],
                        "leaves no room in {where}.max_positions {max_positions} (the first position_offset rows are unused)")


@dataclass
class BertConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    max_positions: Size = 512
    """Rows of the learned position table (RoBERTa: 514, of which the first position_offset are unused)."""
    type_vocab_size: Count = 2
    """Segment (token type) embeddings: 2 for sentence pairs (BERT), 1 (RoBERTa), 0 = none."""
    n_layer: Size = 12
    """Transformer layers."""
    n_head: Heads = 12
    """Attention heads per layer."""
    d_model: Size = 768
    """Hidden size."""
    d_ff: Count = 0
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: Probability = 0.1
    """Dropout on embeddings and residual branches."""
    attn_dropout: Probability = 0.1
    """Dropout on attention probabilities."""
    activation: Activation = "gelu"
    """gelu (exact, as BERT) | gelu_tanh | relu | silu; also the MLM head's transform."""
    layer_norm_eps: Positive = 1e-12
    """LayerNorm epsilon (BERT 1e-12, RoBERTa 1e-5)."""
    init_std: NonNegative = 0.02
    """Std of the normal init (BERT's initializer_range)."""
    position_offset: Annotated[Count, LEAVES_POSITIONS] = 0
    """Position t reads row t + offset of the table (RoBERTa: 2, with max_positions 514)."""
    nsp_head: bool = True
    """A pooler (tanh on the [CLS] state) and a 2-way next-sentence / sentence-order classifier."""
    tie_embeddings: bool = True
    """The MLM decoder shares the word embedding matrix (it keeps its own bias)."""
    bias: bool = True
    """Biases in linear layers and LayerNorms."""
    norm_position: NormPosition = "post"
    """post: LN(x + f(x)) as BERT. pre: x + f(LN(x)) and a final LayerNorm before the heads, as Geiping &
    Goldstein's "Cramming" BERT (2022): stable at a high learning rate with a short warmup, which is what
    a small compute budget needs; transformers' BERT classes are post-LN, so such runs do not export."""
    reorder_classes: Count = 0
    """ERNIE 2.0's sentence reordering head on the pooled [CLS]: Σ_{n=1}^{m} n! permutation classes of m
    segments (m = 3: 9); 0 = none. Objective ernie2 sets it from objective.reorder_segments."""
    distance_classes: Count = 0
    """ERNIE 2.0's sentence distance head on the pooled [CLS] (adjacent / same document / other document:
    3); 0 = none. Objective ernie2 sets it."""


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
    reorder_logits: torch.Tensor | None = None
    """(B, reorder_classes) ERNIE 2.0 sentence reordering logits, or None without the head."""
    distance_logits: torch.Tensor | None = None
    """(B, distance_classes) ERNIE 2.0 sentence distance logits, or None without the head."""
    mlm_loss: torch.Tensor | None = None
    """Mean cross-entropy of the masked tokens when `mlm_labels` were given (mlm_logits is None then)."""


class MLMHead(nn.Module):
    """BERT's cls.predictions: dense -> activation -> LayerNorm -> decoder (+ its own bias).

    `d_embed` is the width of the transform and of the decoder's input (default d_model); ALBERT sets
    it to its factorised embedding size E, so the decoder can share the V × E word embedding.
    """

    def __init__(self, cfg: BertConfig, d_embed: int | None = None):
        super().__init__()
        d_embed = d_embed or cfg.d_model
        self.dense = Linear(cfg.d_model, d_embed, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.ln = nn.LayerNorm(d_embed, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.decoder = VocabHead(d_embed, cfg.vocab_size, cfg.padded_vocab, bias=True)

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        """The decoder's input: dense -> activation -> LayerNorm."""
        return self.ln(self.act(self.dense(h)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h))

    def loss(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of forward(h) (N, V) against labels (N,), without the (N, V) logits kept
        for backward (plmcli.models.lm_loss)."""
        return linear_cross_entropy(self.transform(h), self.decoder.weight, labels, bias=self.decoder.bias,
                                    vocab_size=self.decoder.vocab_size)


def absolute_embeddings(model: nn.Module, input_ids, token_type_ids=None, offset: int = 0) -> torch.Tensor:
    """BERT's input before its LayerNorm: token + learned absolute position (+ segment) embeddings, from
    `model`'s `wte`, `wpe` and `wtt` (None: no segments), positions from `offset` (RoBERTa's position_offset)."""
    T = input_ids.shape[1]
    if T > model.max_positions:
        raise ValueError(f"sequence of {T} tokens exceeds max_positions={model.max_positions}")
    pos = model.wpe(torch.arange(offset, offset + T, device=input_ids.device))  # (T, C)
    if model.wtt is not None and token_type_ids is None:
        # No segment ids = all segment 0: its row joins the (T, C) positions, not the (B, T, C) sum.
        pos = pos + model.wtt.weight[0]
    x = model.wte(input_ids) + pos  # (B, T, C)
    if model.wtt is not None and token_type_ids is not None:
        x = x + model.wtt(token_type_ids)
    return x


class MaskedLMEncoder(CheckpointedBlocks, LanguageModel):
    """What objective `mlm` and `plm finetune` call on every BERT-style family (BERT, ALBERT, NEZHA).

    A subclass builds `mlm` (an MLMHead) and `nsp` (a 2-way head on the pooled state, or None) and
    implements `encode`; `forward` runs the heads on top.
    """

    traits = Traits(bidirectional=True, masked_lm=True, scoring="pseudo")
    mlm_fraction = 0.15
    """Share of tokens the MLM head is computed at, for flops_per_token (BERT's mask_prob)."""

    def attention_modules(self) -> list[nn.Module]:
        """RecordsAttention: every layer's (ALBERT's shared ones, each run once per use)."""
        return [m for m in self.modules() if isinstance(m, MultiHeadAttention)]

    adapter_modules = attention_modules  # AdaptsAttention: the same modules

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, states: list | None = None):
        """`states` (a list): the embedding output and each layer's output are appended to it (layer_states)."""
        raise NotImplementedError

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """[embedding output, each layer's output] (B, T, C) each, the last = encode's hidden (HasLayerStates)."""
        states: list = []
        self.encode(input_ids, token_type_ids, attention_mask, states=states)
        return states

    @property
    def max_positions(self) -> int:
        """The longest sequence the model can read (the table minus RoBERTa's offset)."""
        return self.cfg.max_positions - self.cfg.position_offset


    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None,
                mlm_labels=None) -> BertOutput:
        """Encode, then the heads.

        mlm_positions: 1-D LongTensor of flat indices into B·T (b·T + t) of the masked tokens ->
        mlm_logits (N, V) at those positions only; None -> mlm_logits (B, T, V) at every position.
        mlm_labels (N,) with mlm_positions: mlm_loss instead of mlm_logits, the head and the loss fused.
        Taken here rather than by the objective because sharded training (FSDP, ZeRO-3) only gathers the
        tied decoder weight inside the model's forward.
        """
        h, pooled = self.encode(input_ids, token_type_ids, attention_mask)
        mlm_logits = mlm_loss = None
        if mlm_positions is None:
            mlm_logits = self.mlm(h)  # (B, T, V)
        else:
            masked = h.flatten(0, 1).index_select(0, mlm_positions)  # (N, C)
            if mlm_labels is None:
                mlm_logits = self.mlm(masked)  # (N, V)
            else:
                mlm_loss = self.mlm.loss(masked, mlm_labels)
        nsp_logits = self.nsp(pooled) if self.nsp is not None else None  # (B, 2)
        return BertOutput(h, pooled, mlm_logits, nsp_logits, mlm_loss=mlm_loss)


class Bert(MaskedLMEncoder):
    Config = BertConfig
    tiny = (  # 18 rows: RoBERTa's table starts 2 rows in (position_offset), leaving 16
        "model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=18",
        "model.vocab_size=50")
    probe_layers = "blocks"  # plmcli.analysis.hidden reads each layer's output there

    def __init__(self, cfg: BertConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.max_positions <= cfg.position_offset:
            raise ValueError(f"max_positions {cfg.max_positions} leaves no room after position_offset {cfg.position_offset}")
        self.cfg = cfg
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        # BERT normalizes the embedding sum: with post-LN blocks every block input is normalized.
        self.ln_emb = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.drop = Dropout(cfg.dropout)
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be pre or post, not {cfg.norm_position!r}")
        self.blocks = nn.ModuleList(
            Block(cfg.d_model, cfg.n_head, d_ff, cfg.activation, cfg.bias, cfg.dropout, cfg.attn_dropout,
                  norm_position=cfg.norm_position, layer_norm_eps=cfg.layer_norm_eps)
            for _ in range(cfg.n_layer)
        )
        # pre-LN leaves the residual stream unnormalized: normalize once before the heads.
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.norm_position == "pre" else None
        # ERNIE 2.0's sentence-level heads read the pooled [CLS] too: they bring the pooler without NSP.
        pooled = cfg.nsp_head or cfg.reorder_classes or cfg.distance_classes
        self.pooler = Linear(cfg.d_model, cfg.d_model, bias=cfg.bias) if pooled else None
        self.nsp = Linear(cfg.d_model, 2, bias=cfg.bias) if cfg.nsp_head else None
        self.reorder = Linear(cfg.d_model, cfg.reorder_classes, bias=cfg.bias) if cfg.reorder_classes else None
        self.distance = Linear(cfg.d_model, cfg.distance_classes, bias=cfg.bias) if cfg.distance_classes else None
        self.mlm = MLMHead(cfg)
        # BERT has no residual-scaled init (that is GPT-2's): N(0, 0.02) everywhere, zero biases.
        init_weights(self, cfg.init_std)
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.wte.weight

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None,
                mlm_labels=None) -> BertOutput:
        """MaskedLMEncoder's outputs, plus ERNIE 2.0's sentence-level logits where the heads are built."""
        out = super().forward(input_ids, token_type_ids, attention_mask, mlm_positions, mlm_labels)
        if self.reorder is not None:
            out.reorder_logits = self.reorder(out.pooled)  # (B, reorder_classes)
        if self.distance is not None:
            out.distance_logits = self.distance(out.pooled)  # (B, distance_classes)
        return out

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, states: list | None = None):
        """(B, T) ids -> ((B, T, C) hidden states, (B, C) pooled [CLS] or None).

        attention_mask (B, T): 1 = token, 0 = padding (padding is never attended to). `states`: see MaskedLMEncoder.
        """
        x = self.drop(self.ln_emb(absolute_embeddings(self, input_ids, token_type_ids, self.cfg.position_offset)))
        if states is not None:
            states.append(x)
        x = bidirectional(self._blocks, x, attention_mask, states)
        if self.ln_f is not None:
            x = self.ln_f(x)
            if states is not None:
                states[-1] = x  # pre-LN: the last layer's state is the normalized one heads read
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, C)
        return x, pooled

    def _blocks(self, x, mask, states: list | None = None):
        for block in self.blocks:
            x = self.run_block(block, x, causal=False, attn_mask=mask)
            if states is not None:
                states.append(x)
        return x

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

    # ---------------------------------------------------------------- transformers interop (plmcli.interop.hf)

    hf_model_types: ClassVar[tuple[str, ...]] = ("bert", "roberta")

    def to_hf(self, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        """(HF config.json contents, HF state dict): BertForPreTraining (with the NSP head), BertForMaskedLM,
        or RobertaForMaskedLM for a run with RoBERTa's position offset.

        RoBERTa numbers positions from pad_token_id + 1 (fairseq's padding_idx + 1) where we read row
        t + position_offset: the table is shifted so that our row `position_offset` lands at the pad id + 1.
        A tied decoder is written once, as the word embeddings (HF re-ties it: tie_word_embeddings).
        """
        c = self.cfg
        if not c.bias:
            raise PlmError("model.bias is false, and transformers' BERT and RoBERTa have biases in every layer",
                           "export a run trained with model.bias: true")
        if c.norm_position != "post":
            raise PlmError("model.norm_position is pre, and transformers' BERT and RoBERTa are post-LN",
                           "export a run trained with model.norm_position: post")
        style = "roberta" if c.position_offset else "bert"
        ids = run_config.get("tokenizer", {}).get("special_token_ids", {})
        ours = self.state_dict()
        sd = {_hf_key(f"{b}.{p}", style): ours[f"{a}.{p}"]
              for a, b in _hf_pairs(c, style, pooler=style == "bert") for p in ("weight", "bias") if f"{a}.{p}" in ours}
        for i in range(c.n_layer):
            for p in ("weight", "bias"):
                for name, part in zip(_HF_QKV, ours[f"blocks.{i}.attn.qkv.{p}"].split(c.d_model)):
                    sd[_hf_key(f"encoder.layer.{i}.{name}.{p}", style)] = part
        wpe = ours["wpe.weight"]
        if style == "roberta":
            if "pad" not in ids:
                raise PlmError("RoBERTa-style runs (position_offset > 0) need a pad token for transformers, which "
                               "numbers positions from pad_token_id + 1", "retrain with tokenizer.special_tokens.pad set")
            shift = c.position_offset - ids["pad"] - 1
            wpe = wpe[shift:] if shift >= 0 else torch.cat([wpe.new_zeros(-shift, c.d_model), wpe])
        sd[_hf_key("embeddings.position_embeddings.weight", style)] = wpe
        if not c.type_vocab_size:  # HF always adds a segment embedding: one row of zeros adds nothing
            sd[_hf_key("embeddings.token_type_embeddings.weight", style)] = wpe.new_zeros(1, c.d_model)
        head = _HF_MLM[style][2]
        sd[f"{head}.bias"] = ours["mlm.decoder.bias"]
        if not c.tie_embeddings:  # untied, HF's decoder uses its own bias and leaves `bias` idle: both written
            sd |= {f"{head}.decoder.weight": ours["mlm.decoder.weight"], f"{head}.decoder.bias": ours["mlm.decoder.bias"]}
        task = "PreTraining" if style == "bert" and c.nsp_head else "MaskedLM"
        hf = {"model_type": style, "architectures": [f"{_HF_CLASS[style]}For{task}"], "vocab_size": c.vocab_size,
              "hidden_size": c.d_model, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
              "intermediate_size": c.d_ff or 4 * c.d_model, "hidden_act": HF_ACTIVATION[c.activation],
              "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.attn_dropout,
              "max_position_embeddings": wpe.shape[0], "type_vocab_size": max(c.type_vocab_size, 1),
              "initializer_range": c.init_std, "layer_norm_eps": c.layer_norm_eps, "tie_word_embeddings": c.tie_embeddings,
              "pad_token_id": ids.get("pad"), "bos_token_id": ids.get("bos"), "eos_token_id": ids.get("eos")}
        return hf, owned(sd)

    def hf_export_notes(self) -> list[str]:
        """What `to_hf` leaves out, for the export's report."""
        notes = []
        if self.cfg.position_offset and self.cfg.nsp_head:
            notes.append("pooler and NSP head dropped (transformers' RoBERTa has neither)")
        if self.reorder is not None or self.distance is not None:
            notes.append("ERNIE 2.0's sentence reordering / distance heads dropped (transformers has no such heads)"
                         + ("" if self.cfg.nsp_head else ", and with them the pooler (BertForMaskedLM has none)"))
        return notes

    def to_hf_sequence_classification(self, run_config: dict, head: nn.Linear) -> tuple[dict, dict[str, torch.Tensor]]:
        """A finetuned classifier (plmcli.objectives.classify: pooled [CLS] -> dropout -> linear) as
        BertForSequenceClassification or RobertaForSequenceClassification, whose heads are the same
        functions given the pooler (RoBERTa's `classifier.dense` + tanh is our pooler)."""
        if self.pooler is None:
            raise PlmError("its classifier reads the [CLS] state directly, and transformers' BERT and RoBERTa "
                           "classifiers apply a tanh pooler layer first")
        hf, sd = self.to_hf(run_config)
        style = hf["model_type"]
        sd = {k: v for k, v in sd.items() if k.startswith(f"{style}.")}  # the encoder; pretraining heads dropped
        pool, out = {"bert": ("bert.pooler.dense", "classifier"),
                     "roberta": ("classifier.dense", "classifier.out_proj")}[style]
        sd |= owned({f"{pool}.weight": self.pooler.weight, f"{pool}.bias": self.pooler.bias,
                     f"{out}.weight": head.weight, f"{out}.bias": head.bias})
        ft = run_config.get("finetune") or {}
        n = head.out_features
        names = [str(x) for x in ft.get("label_names") or []]
        names = names if len(names) == n else [f"LABEL_{i}" for i in range(n)]
        hf |= {"architectures": [f"{_HF_CLASS[style]}ForSequenceClassification"],
               "id2label": dict(enumerate(names)), "label2id": {x: i for i, x in enumerate(names)},
               "problem_type": "regression" if n == 1 else "single_label_classification",
               "classifier_dropout": ft.get("classifier_dropout")}
        return hf, sd

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict[str, torch.Tensor]) -> tuple[BertConfig, dict[str, torch.Tensor]]:
        """(our Config, our state dict) from a transformers BERT or RoBERTa checkpoint (any of their
        classes: a bare BertModel has no MLM head, which is then absent from the returned dict)."""
        style = hf_config.get("model_type")
        if style not in _HF_MLM:
            raise PlmError(f"model_type '{style}' is not BERT or RoBERTa", f"this family imports: {', '.join(_HF_MLM)}")
        require_hf(hf_config, "position_embedding_type", ("absolute",), "absolute")
        require_hf(hf_config, "is_decoder", (False,), False)
        require_hf(hf_config, "add_cross_attention", (False,), False)
        sd = without_prefix(state_dict, f"{style}.")
        d = hf_config["hidden_size"]
        pad = hf_config.get("pad_token_id")
        cfg = cls.Config(
            vocab_size=hf_config["vocab_size"], max_positions=hf_config["max_position_embeddings"],
            type_vocab_size=hf_config.get("type_vocab_size", 2), n_layer=hf_config["num_hidden_layers"],
            n_head=hf_config["num_attention_heads"], d_model=d, d_ff=hf_config.get("intermediate_size", 4 * d),
            dropout=hf_config.get("hidden_dropout_prob", 0.1),
            attn_dropout=hf_config.get("attention_probs_dropout_prob", 0.1),
            activation=activation_from_hf(hf_config, "hidden_act"), layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
            init_std=hf_config.get("initializer_range", 0.02),
            position_offset=(1 if pad is None else pad) + 1 if style == "roberta" else 0,
            nsp_head="pooler.dense.weight" in sd, tie_embeddings=hf_config.get("tie_word_embeddings", True))
        out = {f"{a}.{p}": sd[f"{b}.{p}"]
               for a, b in _hf_pairs(cfg, style, pooler=True) for p in ("weight", "bias") if f"{b}.{p}" in sd}
        for i in range(cfg.n_layer):
            for p in ("weight", "bias"):
                parts = [sd.get(f"encoder.layer.{i}.{name}.{p}") for name in _HF_QKV]
                if all(x is not None for x in parts):
                    out[f"blocks.{i}.attn.qkv.{p}"] = torch.cat(parts)
        if "embeddings.position_embeddings.weight" in sd:
            out["wpe.weight"] = sd["embeddings.position_embeddings.weight"]
        head = _HF_MLM[style][2]
        order = (f"{head}.bias", f"{head}.decoder.bias")  # tied, `bias` is the decoder's; untied, the decoder's own
        bias = next((sd[k] for k in (order if cfg.tie_embeddings else order[::-1]) if k in sd), None)
        if bias is not None:
            out["mlm.decoder.bias"] = bias
        if not cfg.tie_embeddings and f"{head}.decoder.weight" in sd:
            out["mlm.decoder.weight"] = sd[f"{head}.decoder.weight"]
        return cfg, owned(out)


_HF_LAYER = (("attn.proj", "attention.output.dense"), ("ln_1", "attention.output.LayerNorm"),
             ("mlp.fc", "intermediate.dense"), ("mlp.proj", "output.dense"), ("ln_2", "output.LayerNorm"))
"""Our post-LN Block -> BertLayer: ln_1 normalizes after attention, ln_2 after the feed-forward."""
_HF_QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
"""Our fused QKV projection is these three, stacked in this order."""
_HF_MLM = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions"),
           "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head")}
"""Per model type: the MLM head's transform, its LayerNorm, and the module holding the decoder and its bias."""
_HF_CLASS = {"bert": "Bert", "roberta": "Roberta"}


def _hf_pairs(cfg: BertConfig, style: str, pooler: bool) -> list[tuple[str, str]]:
    """(our module, HF module) whose weight and bias map one to one, HF names without the `bert.` /
    `roberta.` prefix. The fused QKV, the positions and the decoder are converted apart."""
    dense, ln, _ = _HF_MLM[style]
    pairs = [("wte", "embeddings.word_embeddings"), ("ln_emb", "embeddings.LayerNorm"), ("mlm.dense", dense),
             ("mlm.ln", ln)]
    if cfg.type_vocab_size:
        pairs.append(("wtt", "embeddings.token_type_embeddings"))
    if cfg.nsp_head and pooler:
        pairs.append(("pooler", "pooler.dense"))
    if cfg.nsp_head and style == "bert":  # RoBERTa has no NSP head in transformers
        pairs.append(("nsp", "cls.seq_relationship"))
    for i in range(cfg.n_layer):
        pairs += [(f"blocks.{i}.{a}", f"encoder.layer.{i}.{b}") for a, b in _HF_LAYER]
    return pairs


def _hf_key(name: str, style: str) -> str:
    """HF's task classes hold the encoder under `bert.` / `roberta.` and the heads beside it."""
    return name if name.split(".")[0] in ("cls", "lm_head", "classifier") else f"{style}.{name}"
