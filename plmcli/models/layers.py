"""Shared Transformer pieces: attention through SDPA, the feed-forward, blocks with pre/post LN."""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from plmcli import kernels
from plmcli.kernels import ACTIVATIONS, Dropout, Linear, linear
from plmcli.models import device as devices

Activation = Literal[tuple(ACTIVATIONS)]
"""A recipe's model.activation: one of ACTIVATIONS, checked when the recipe loads."""
NormPosition = Literal["pre", "post"]
"""A recipe's model.norm_position: pre, x + f(LN(x)); post, LN(x + f(x))."""


def require_vocab(cfg) -> None:
    """Every family's config leaves vocab_size at 0 until the tokenizer is known (objective.configure_model)."""
    if cfg.vocab_size < 1:
        raise ValueError(f"{type(cfg).__name__}.vocab_size must be set (from the tokenizer) before building")


_recording: ContextVar[list | None] = ContextVar("plm_record_attention", default=None)
"""The list `record_attention` is filling, else None: a context variable, so a recording in one thread does not
catch another thread's forward passes."""


def recording() -> list | None:
    """The list the innermost `record_attention` fills, else None (always None in a torch.compile graph, which
    records nothing and whose tracer does not read context variables)."""
    return None if torch.compiler.is_compiling() else _recording.get()


@contextmanager
def record_attention():
    """While active, every MultiHeadAttention (NEZHA's RelativeAttention too) appends its attention
    probabilities (B, H, T, T), detached and before dropout, to the yielded list in call order: layers in
    depth order, ALBERT's shared layer once per use. SDPA does not return them, so recorded attention
    is computed explicitly (slower, same outputs); outside the context SDPA runs as always.
    This thread (or asyncio task) only: record one forward pass at a time."""
    maps: list = []
    token = _recording.set(maps)
    try:
        yield maps
    finally:
        _recording.reset(token)


def recorded(p: torch.Tensor) -> torch.Tensor:
    """`p` (attention probabilities), noted when record_attention is active."""
    maps = recording()
    if maps is not None:
        maps.append(p.detach())
    return p


def unpadded_attention(device: torch.device) -> bool:
    """Whether an encoder should run its padded batches unpadded (`unpad`, the blocks, `repad`) on `device`.

    On CUDA jagged SDPA runs flash / memory-efficient variable-length kernels, so the linear layers and
    attention spend nothing on padding (NVIDIA's unpadded BERT); on a CPU it attends row by row and is
    no faster than padding. Not while record_attention wants (B, H, T, T) maps. On a CPU whose own kernels are
    switched off (`kernels.enabled`, a test of the CUDA path) it runs too.
    """
    generic_cpu = device.type == "cpu" and not kernels.enabled(device) and not torch.compiler.is_compiling()
    return (device.type == "cuda" or generic_cpu) and recording() is None


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1 = token / 0 = padding -> a boolean key mask (B, 1, 1, T), or None when nothing is padded.

    Without a mask SDPA can take its fastest kernels. A padded query row still attends to the real
    tokens, so nothing is NaN.
    """
    if attention_mask is None or not is_padded(attention_mask):
        return None
    return attention_mask.bool()[:, None, None, :]


def is_padded(attention_mask: torch.Tensor) -> bool:
    """Whether a (..., T) mask (1 = token) pads anything: from the rows' lengths where the host knows them
    (models/device.py), else read back on a CPU. On a GPU that read would wait for every queued kernel, and
    attending through a mask that pads nothing changes no result, so there a mask given counts as padding."""
    lengths = devices.lengths_of(attention_mask)
    if lengths is not None:
        return len(lengths) > 0 and int(lengths.min()) < attention_mask.shape[-1]
    return not kernels.enabled(attention_mask.device) or not bool(attention_mask.all())


def bidirectional(layers, x: torch.Tensor, attention_mask: torch.Tensor | None,
                  states: list | None = None) -> torch.Tensor:
    """Run an encoder's stack, `layers(x, attn_mask)`, over padded (B, T, C) states.

    A batch with padding runs unpadded where `unpadded_attention` says that pays (jagged states, no mask;
    padding positions come back as zeros), otherwise padded with a key mask. The stack must be made of
    Blocks / MultiHeadAttention and position-wise layers, which take both forms.
    `states` (a list): the stack is called `layers(x, attn_mask, states)` and appends each layer's output
    there; they come back padded (B, T, C) as the result does (the feature-based `layer_states`).
    """
    mask = padding_mask(attention_mask)
    extra = () if states is None else (states,)
    if mask is None or not unpadded_attention(x.device):
        return layers(x, mask, *extra)
    lengths = devices.lengths_of(attention_mask)
    n = 0 if states is None else len(states)
    out = repad(layers(unpad(x, attention_mask, lengths), None, *extra), attention_mask, lengths)
    if states is not None:
        states[n:] = [repad(h, attention_mask, lengths) for h in states[n:]]
    return out


def unpad(x: torch.Tensor, attention_mask: torch.Tensor, lengths=None) -> torch.Tensor:
    """(B, T, C) states and their (B, T) attention_mask (1 = token) -> a jagged nested tensor (B, j, C) of
    each row's tokens in order. Block and MultiHeadAttention take it as they take padded input (without
    attn_mask): Linear, LayerNorm, dropout and residual sums act on the tokens alone.

    `lengths`: each row's real tokens as the host counted them (models/device.py: lengths_of). Then nothing is
    read back from the device: their sum sizes the tokens' tensor, and the longest and shortest row, which
    SDPA's variable-length kernels need, come with it. Without them the mask is read (a GPU waits for it)."""
    keep = attention_mask.bool()
    offsets = F.pad(keep.sum(1).cumsum(0), (1, 0))
    if lengths is None:
        return torch.nested.nested_tensor_from_jagged(x[keep], offsets)
    values = x.flatten(0, 1).index_select(0, token_index(keep, lengths))
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=int(lengths.min()),
                                                  max_seqlen=int(lengths.max()))


def repad(x: torch.Tensor, attention_mask: torch.Tensor, lengths=None) -> torch.Tensor:
    """The inverse of `unpad`: (B, j, C) jagged -> (B, T, C) with zeros at the padding."""
    keep = attention_mask.bool()
    values = x.values()
    if lengths is None:
        return values.new_zeros(*keep.shape, values.shape[-1]).index_put((keep,), values)
    flat = values.new_zeros(keep.numel(), values.shape[-1]).index_copy(0, token_index(keep, lengths), values)
    return flat.view(*keep.shape, values.shape[-1])


def token_index(keep: torch.Tensor, lengths) -> torch.Tensor:
    """The flat positions (b·T + t, ascending) of a (B, T) boolean mask's True entries, sum(lengths) of them:
    `nonzero` sized on the host, so a GPU need not report how many there are (nor gather by a boolean mask,
    which is nonzero again)."""
    return torch.nonzero_static(keep.flatten(), size=int(lengths.sum())).squeeze(1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, *, causal: bool = False, scale: float | None = None,
           record: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal=causal, scale=scale) for
    (B, H, T, D) heads (`kernels.attention`: explicit, with faster dropout masks, on a CPU); `record`: the
    probabilities go to `record_attention` when it is active."""
    return kernels.attention(q, k, v, attn_mask, dropout_p, causal=causal, scale=scale,
                             probabilities=recorded if record and recording() is not None else None)


class MultiHeadAttention(nn.Module):
    """Self-attention with a fused QKV projection; `causal` uses SDPA's built-in causal mask."""

    def __init__(self, d_model: int, n_head: int, bias: bool = True, attn_dropout: float = 0.0, resid_dropout: float = 0.0):
        super().__init__()
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
        self.n_head = n_head
        self.qkv = Linear(d_model, 3 * d_model, bias=bias)
        self.proj = Linear(d_model, d_model, bias=bias)
        self.attn_dropout = attn_dropout
        self.resid_dropout = Dropout(resid_dropout)

    def forward(self, x: torch.Tensor, causal: bool = False, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if x.is_nested:
            return self._jagged(x, causal, attn_mask)
        B, T, C = x.shape
        # unbind(2), not a permute to (3, B, H, T, D): backward then stacks the q/k/v gradients straight into
        # the projection's (B, T, 3, H, D) layout instead of stacking them and copying once more.
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).unbind(2))
        y = attend(q, k, v, attn_mask, self.attn_dropout if self.training else 0.0,
                   causal=causal and attn_mask is None, record=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def causal_tail(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Causal attention's output at positions ≥ `start` only, (B, T - start, C): queries from those
        rows, keys and values from all. Scoring needs no more of a model's last layer than this."""
        B, T, C = x.shape
        if type(self.qkv) is Linear:  # plm's own: the query rows of the tail only
            w, b = self.qkv.weight, self.qkv.bias
            q = linear(x[:, start:], w[:C], None if b is None else b[:C])
            kv = linear(x, w[C:], None if b is None else b[C:])
        else:  # a module put in its place (LoRA, a quantised linear) computes every row, as in forward
            qkv = self.qkv(x)
            q, kv = qkv[:, start:, :C], qkv[..., C:]
        k, v = kv.reshape(B, T, 2, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # 2 × (B, H, T, D)
        q = q.reshape(B, T - start, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T - start, D)
        # query i is position start + i: it sees keys 0 .. start + i (SDPA's is_causal aligns to the top left)
        mask = torch.ones(T - start, T, dtype=torch.bool, device=x.device).tril(start)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T - start, C)))

    def cached(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], keep: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Causal self-attention of T new positions x (B, T, C) over the keys and values `cache`d for the t positions
        before them (each (B, H, t, D); t may be 0) and over themselves -> (output (B, T, C), the cache with the new
        positions' keys and values appended): incremental decoding computes each position's keys and values once.
        `keep` (B, t + T), False at padding: those keys get no attention. A padding query attends to itself alone:
        with every key masked its output would be NaN, and a NaN value times a zero probability is still NaN in the
        real rows that mask it."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # 3 × (B, H, T, D)
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        t0 = cache[0].shape[2]
        # New position t0 + i sees the cached positions and the new ones up to itself.
        ones = torch.ones(T, t0 + T, dtype=torch.bool, device=x.device)
        causal = ones.tril(t0)
        mask = None if T == 1 else causal
        if keep is not None:
            real = keep[:, None, None, :]
            mask = real if mask is None else (causal & real) | (causal & ~ones.tril(t0 - 1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C))), (k, v)

    def _jagged(self, x, causal: bool, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, j, C) from `unpad`: each row attends within its own tokens, none spent on padding."""
        if causal or attn_mask is not None or recording() is not None:
            # Jagged SDPA has no causal kernel on a CPU, and recorded maps are (B, H, T, T): both take padded input.
            raise ValueError("unpadded (jagged) input takes unmasked bidirectional attention; pass padded input "
                             "with attn_mask for causal attention or record_attention")
        C = x.shape[-1]
        # SDPA wants each head's rows contiguous in the jagged values: a copy, where padded input has a view.
        q, k, v = (t.unflatten(-1, (self.n_head, C // self.n_head)).contiguous().transpose(1, 2)  # 3 × (B, H, j, D)
                   for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).flatten(-2)))


class FeedForward(nn.Module):
    """Linear -> activation -> (dropout: Transformer-XL's `inner_dropout`) -> Linear -> dropout."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0,
                 inner_dropout: float = 0.0):
        super().__init__()
        self.fc = Linear(d_model, d_ff, bias=bias)
        self.proj = Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self.inner = Dropout(inner_dropout) if inner_dropout > 0 else nn.Identity()
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Called as a module, so its hooks run and a module put in its place (LoRA, float8, a quantised linear)
        # is what computes: plm's own Linear fuses the activation in where it can; another is activated after.
        h = self.fc(x, self.activation) if type(self.fc) is Linear else ACTIVATIONS[self.activation](self.fc(x))
        return self.dropout(self.proj(self.inner(h)))


class Block(nn.Module):
    """One Transformer layer. pre-LN (GPT-2): x + f(LN(x)); post-LN (GPT-1, BERT): LN(x + f(x))."""

    def __init__(self, d_model, n_head, d_ff, activation="gelu", bias=True, dropout=0.0, attn_dropout=0.0,
                 norm_position="pre", layer_norm_eps=1e-5):
        super().__init__()
        self.pre_norm = norm_position == "pre"
        self.ln_1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.attn = MultiHeadAttention(d_model, n_head, bias, attn_dropout, dropout)
        self.ln_2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.mlp = FeedForward(d_model, d_ff, activation, bias, dropout)

    def forward(self, x, causal=False, attn_mask=None):
        if self.pre_norm:
            x = x + self.attn(self.ln_1(x), causal, attn_mask)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, causal, attn_mask))
        return self.ln_2(x + self.mlp(x))

    def causal_tail(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """The causal block's output at positions ≥ `start` only (MultiHeadAttention.causal_tail): a
        model's last layer when only those positions are read."""
        if self.pre_norm:
            x = x[:, start:] + self.attn.causal_tail(self.ln_1(x), start)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x[:, start:] + self.attn.causal_tail(x, start))
        return self.ln_2(x + self.mlp(x))

    def cached(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], keep: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The causal block over T new positions x (B, T, C) after the `cache`d ones (MultiHeadAttention.cached):
        (output (B, T, C), the layer's cache with the new positions)."""
        if self.pre_norm:
            y, cache = self.attn.cached(self.ln_1(x), cache, keep)
            x = x + y
            return x + self.mlp(self.ln_2(x)), cache
        y, cache = self.attn.cached(x, cache, keep)
        x = self.ln_1(x + y)
        return self.ln_2(x + self.mlp(x)), cache


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT/BERT init: N(0, std) for matrices and embeddings, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def scale_residual_init(blocks, std: float, n_layer: int) -> None:
    """GPT-2: residual projections start at std/√(2L) so the residual stream's variance does not grow with depth."""
    for b in blocks:
        for lin in (b.attn.proj, b.mlp.proj):
            nn.init.normal_(lin.weight, 0.0, std / math.sqrt(2 * n_layer))


class CrossAttention(nn.Module):
    """Attention from queries x (B, T, C) to a memory (B, S, C): the encoder-decoder attention of an
    encoder-decoder Transformer. Keys and values come from the memory; `memory_kv` computes them once
    so incremental decoding does not redo them at every step."""

    def __init__(self, d_model: int, n_head: int, bias: bool = True, attn_dropout: float = 0.0, resid_dropout: float = 0.0):
        super().__init__()
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
        self.n_head = n_head
        self.q = Linear(d_model, d_model, bias=bias)
        self.kv = Linear(d_model, 2 * d_model, bias=bias)
        self.proj = Linear(d_model, d_model, bias=bias)
        self.attn_dropout = attn_dropout
        self.resid_dropout = Dropout(resid_dropout)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, C) memory -> keys and values, each (B, H, S, D)."""
        B, S, C = memory.shape
        k, v = self.kv(memory).view(B, S, 2, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`memory_mask` (B, S) is True at real memory positions; padding gets no attention."""
        B, T, C = x.shape
        k, v = memory_kv
        q = self.q(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        mask = memory_mask[:, None, None, :] if memory_mask is not None else None
        y = attend(q, k, v, mask, self.attn_dropout if self.training else 0.0)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))


def sinusoid_table(pos: torch.Tensor, d: int) -> torch.Tensor:
    """(K,) positions -> (K, d): [sin(p·f) | cos(p·f)] with f = 10000^(-2i/d), halves concatenated
    (Transformer-XL's and XLNet's layout, not Vaswani's interleaving)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32, device=pos.device) / d))
    angles = pos.float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ScalarMix(nn.Module):
    """γ · Σ_j softmax(s)_j h_j over n layer representations, s and γ learned (ELMo eq. 1): ELMo's task
    features, and any family's `--features scalar_mix` over its `layer_states`."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        w = torch.softmax(self.scalars, dim=0)
        return self.gamma * sum(wj * h for wj, h in zip(w, layers))
