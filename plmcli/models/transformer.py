"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need"): an encoder-decoder for translation.

Base model: 6 encoder + 6 decoder layers, d_model 512, d_ff 2048, 8 heads, ReLU, post-LN
(x = LN(x + sublayer(x))), dropout 0.1 on every sublayer output and on embeddings + positions,
sinusoidal positions, and one embedding matrix shared by the source, the target and the output
softmax, multiplied by √d_model on input (§3.4) so that it is not drowned by the unit-scale
positions. Built from the shared layers: the encoder is `layers.Block`, the decoder adds
`layers.CrossAttention`. Generation decodes incrementally, caching each layer's self-attention keys
and values and the memory's cross-attention keys and values.

Transfer: the encoder alone (`token_states`) is a bidirectional encoder without a [CLS] of its own, so a
sequence task head reads the mean of its states over the real tokens (`pooling="mean"`) and tagging every
token's state. Its tokenizer has no [CLS]/[SEP]: examples are framed as GPT's transfer frames them
(`<s> a $ b <e>`, `pair_layout="causal"`), which its bos/eos spell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from plmcli.config_schema import Count, Heads, Positive, Probability, Size
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.kernels import linear
from plmcli.models.layers import (Activation, Block, CrossAttention, Dropout, FeedForward, MultiHeadAttention,
                                   NormPosition, require_vocab)
from plmcli.models.vocab import PadsVocab, VocabHead, real_columns


@dataclass
class TransformerConfig(PadsVocab):
    vocab_size: Count = 0
    """Shared source/target vocabulary; 0 = take it from the tokenizer."""
    max_positions: Size = 1024
    """Longest source or target sequence (rows of the sinusoid table)."""
    n_encoder_layers: Size = 6
    """Encoder layers."""
    n_decoder_layers: Size = 6
    """Decoder layers."""
    d_model: Size = 512
    """Hidden size."""
    d_ff: Size = 2048
    """Feed-forward inner size."""
    n_head: Heads = 8
    """Attention heads."""
    dropout: Probability = 0.1
    """Dropout on sublayer outputs and on embeddings + positions (the paper's P_drop)."""
    attn_dropout: Probability = 0.0
    """Dropout on attention probabilities (not in the paper; tensor2tensor later used 0.1)."""
    activation: Activation = "relu"
    """relu (the paper) | gelu | gelu_tanh | silu."""
    norm_position: NormPosition = "post"
    """post (the paper: LN(x + f(x))) | pre (x + f(LN(x)), with a final LN on each stack)."""
    layer_norm_eps: Positive = 1e-5
    """LayerNorm epsilon."""
    share_embeddings: bool = True
    """Source and target share one embedding matrix (needs the shared vocabulary plm builds)."""
    tie_output: bool = True
    """The output softmax uses the target embedding matrix (§3.4)."""
    scale_embeddings: bool = True
    """Multiply embeddings by √d_model before adding positions (§3.4)."""


def sinusoids(n: int, d: int) -> torch.Tensor:
    """(n, d) positions: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # 10000^(-2i/d)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, feed-forward; each a residual sublayer."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d, eps = cfg.d_model, cfg.layer_norm_eps
        self.pre_norm = cfg.norm_position == "pre"
        self.self_attn = MultiHeadAttention(d, cfg.n_head, True, cfg.attn_dropout, cfg.dropout)
        self.cross_attn = CrossAttention(d, cfg.n_head, True, cfg.attn_dropout, cfg.dropout)
        self.mlp = FeedForward(d, cfg.d_ff, cfg.activation, True, cfg.dropout)
        self.ln_1, self.ln_2, self.ln_3 = (nn.LayerNorm(d, eps=eps) for _ in range(3))

    def _sub(self, x, ln, f):
        return x + f(ln(x)) if self.pre_norm else ln(x + f(x))

    def forward(self, x, memory_kv, memory_mask, cache=None):
        """x (B, T, C). With `cache` (this layer's (k, v) of earlier positions, each (B, H, t, D)), x holds
        only the new positions and the updated cache comes back; without it, x is the whole prefix."""
        new_cache = None
        if cache is None:
            x = self._sub(x, self.ln_1, lambda h: self.self_attn(h, causal=True))
        else:
            def attend(h):
                nonlocal new_cache
                y, new_cache = self.self_attn.cached(h, cache)
                return y
            x = self._sub(x, self.ln_1, attend)
        x = self._sub(x, self.ln_2, lambda h: self.cross_attn(h, memory_kv, memory_mask))
        x = self._sub(x, self.ln_3, self.mlp)
        return x, new_cache

    def teacher_forced(self, x, memory, memory_mask):
        """forward over the whole prefix x (B, T, C) attending to the encoder's output `memory` (B, S, C): its
        keys and values are made here, so a checkpointed layer recomputes them instead of keeping them."""
        return self(x, self.cross_attn.memory_kv(memory), memory_mask)[0]


class Transformer(CheckpointedBlocks, LanguageModel):
    traits = Traits(seq2seq=True, scoring="conditional", pair_layout="causal", pooling="mean")
    Config = TransformerConfig
    tiny = ("model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32",
            "model.n_head=2", "model.d_ff=64", "model.max_positions=16", "model.vocab_size=50")

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be pre or post, not {cfg.norm_position!r}")
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.padded_vocab, d)  # target side (and source, and output, when shared)
        self.src_embed = self.embed if cfg.share_embeddings else nn.Embedding(cfg.padded_vocab, d)
        self.register_buffer("pe", sinusoids(cfg.max_positions, d), persistent=False)
        self.scale = math.sqrt(d) if cfg.scale_embeddings else 1.0
        self.drop = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(
            Block(d, cfg.n_head, cfg.d_ff, cfg.activation, True, cfg.dropout, cfg.attn_dropout, cfg.norm_position,
                  cfg.layer_norm_eps) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        pre = cfg.norm_position == "pre"  # pre-LN stacks end un-normalized: add the final LN
        self.enc_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else nn.Identity()
        self.out = None if cfg.tie_output else VocabHead(d, cfg.vocab_size, cfg.padded_vocab, bias=False)
        self._init_weights()

    def _init_weights(self):
        # The paper gives no init; this is fairseq's: Xavier-uniform matrices, zero biases, and
        # embeddings N(0, d^-1/2) so that √d-scaled embeddings start at unit variance like the positions.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for emb in {id(e): e for e in (self.embed, self.src_embed)}.values():
            nn.init.normal_(emb.weight, 0.0, self.cfg.d_model ** -0.5)

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def adapter_modules(self) -> list[nn.Module]:
        """AdaptsAttention: the encoder's self-attention, what a finetuned task runs (its heads read the encoder's
        states, framed as GPT's transfer); the decoder serves translation alone."""
        return [block.attn for block in self.encoder]

    def embed_tokens(self, emb: nn.Embedding, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """(B, T) ids at positions offset.. -> (B, T, C): √d · embedding + sinusoid, then dropout."""
        T = ids.shape[1]
        if offset + T > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + T} tokens exceeds max_positions={self.cfg.max_positions}")
        return self.drop(emb(ids) * self.scale + self.pe[offset : offset + T])

    def encode_hidden(self, src_ids: torch.Tensor, src_mask: torch.Tensor, states: list | None = None) -> torch.Tensor:
        """(B, S) source ids, (B, S) bool mask (True = real token) -> (B, S, C) memory. `states` (a list): the
        embeddings and each encoder layer's output are appended, the last one after the final norm."""
        x = self.embed_tokens(self.src_embed, src_ids)
        attn_mask = src_mask[:, None, None, :]  # padding keys get no attention
        if states is not None:
            states.append(x)
        for block in self.encoder:
            x = self.run_block(block, x, attn_mask=attn_mask)
            if states is not None:
                states.append(x)
        x = self.enc_norm(x)
        if states is not None:
            states[-1] = x
        return x

    def token_states(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, S) ids, (B, S) mask (1 = real token; None: all real) -> (B, S, C) the encoder's states, for transfer."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return self.encode_hidden(input_ids, mask)

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """The encoder's [embeddings, each layer's output] (B, S, C) each, the last = token_states (HasLayerStates)."""
        states: list = []
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.encode_hidden(input_ids, mask, states)
        return states

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return real_columns(linear(h, self.embed.weight), self.cfg.vocab_size) if self.out is None else self.out(h)

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_in_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: (B, S) source, (B, S) mask, (B, T) decoder input -> (B, T, V) next-token logits."""
        memory = self.encode_hidden(src_ids, src_mask)
        x = self.embed_tokens(self.embed, tgt_in_ids)
        for layer in self.decoder:
            x = self.run_block(layer.teacher_forced, x, memory, src_mask)
        return self.logits(self.dec_norm(x))

    # ------------------------------------------------------------ incremental decoding

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> dict:
        """The decoder's starting state for `decode_step`: every tensor batch-first, so a beam search can
        reorder the state with index_select on dim 0."""
        memory = self.encode_hidden(src_ids, src_mask)
        B, H = src_ids.shape[0], self.cfg.n_head
        empty = memory.new_zeros(B, H, 0, self.cfg.d_model // H)
        return {"mask": src_mask, "cross": [layer.cross_attn.memory_kv(memory) for layer in self.decoder],
                "self": [(empty, empty) for _ in self.decoder]}

    def decode_step(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """Feed one token per row (B,) -> ((B, V) logits for the next token, new state)."""
        pos = state["self"][0][0].shape[2] if state["self"] else 0
        x = self.embed_tokens(self.embed, tokens[:, None], offset=pos)
        caches = []
        for layer, kv, cache in zip(self.decoder, state["cross"], state["self"]):
            x, cache = layer(x, kv, state["mask"], cache=cache)
            caches.append(cache)
        return self.logits(self.dec_norm(x))[:, 0], {**state, "self": caches}
