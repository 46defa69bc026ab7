"""Transformer-XL (Dai et al. 2019): a causal Transformer LM with segment-level recurrence.

Each layer attends over [SG(memory); current segment]: the memory holds the `mem_len` most recent
hidden states that entered the layer in earlier segments, cut from the graph (SG = stop-gradient), so
context reaches back n_layer × mem_len tokens while backprop stays inside one segment. Absolute positions
would collide between segments, so the score of query i on key j uses the distance i - j only:

    A_rel[i, j] = q_i·k_j          (a) content
                + q_i·W_R R_{i-j}  (b) content-dependent position bias
                + u·k_j            (c) global content bias
                + v·W_R R_{i-j}    (d) global position bias

with R the sinusoid table and u, v learned. (a)+(c) = (q_i + u)·k_j is an ordinary attention score, so
it runs in PyTorch's fused attention (SDPA); (b)+(d) = (q_i + v)·W_R R_{i-j} is computed against every
distance once, aligned with the relative-shift trick, and enters SDPA as an additive bias.

The model is stateful like the RNN LMs: forward(ids, state) returns the next memory, the `bptt` objective
carries it between consecutive segments of parallel token streams, and eval-ppl carries it across the
whole text (plmcli.eval.memory: segments of tgt_len tokens, mem_len of memory), each token scored once.

Transfer (GPT-style, from the last token): `token_states` reads every example from an empty memory, so its
features never depend on the examples before it; a row longer than `eval_tgt_len` (when set) is read in
segments of that many tokens, each attending to the memory the ones before it left.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Count, Divides, NonNegative, Positive, Probability, Range, Rule, Size
from plmcli.models.adaptive import AdaptiveEmbedding, AdaptiveSoftmax
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.kernels import Linear, linear
from plmcli.models.layers import Dropout, FeedForward, NormPosition, attend, require_vocab, sinusoid_table
from plmcli.models.vocab import PadsVocab


CLUSTERS = Rule(lambda cut, c: all(0 < a < b for a, b in zip(cut, [*cut[1:], c["vocab_size"] or float("inf")])),
                "must increase strictly from above 0 and stay below the vocabulary ({where}.vocab_size {vocab_size}; 0: the tokenizer's)",
                "e.g. --set {where}.cutoffs=[]  (one full softmax), or [20000, 40000, 200000] as for WikiText-103")


@dataclass
class TransformerXLConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    n_layer: Size = 16
    """Transformer layers."""
    n_head: Annotated[int, Range(1), Divides("d_model", unless="d_head")] = 10
    """Attention heads per layer."""
    d_model: Size = 410
    """Hidden size."""
    d_head: Count = 0
    """Size of each head; 0 = d_model // n_head (WT103 base: 41)."""
    d_ff: Size = 2100
    """Feed-forward inner size."""
    d_embed: Count = 0
    """Word embedding size before the projection to d_model; 0 = d_model."""
    dropout: Probability = 0.1
    """Dropout on embeddings, positions, residual branches and inside the feed-forward."""
    attn_dropout: Probability = 0.0
    """Dropout on attention probabilities (the paper's dropatt)."""
    mem_len: Count = 150
    """Hidden states per layer kept as memory for the next segment in training; 0 = no recurrence."""
    clamp_len: Count = 0
    """Distances beyond clamp_len use R_clamp_len (0 = no clamp)."""
    same_length: bool = False
    """Every query attends to the same number of keys (the earliest ones of a long memory are cut)."""
    eval_tgt_len: Count = 0
    """eval-ppl: tokens per segment; 0 = the training seq_len."""
    eval_mem_len: Count = 0
    """eval-ppl: memory length; 0 = mem_len (the paper evaluates WT103 with 1600)."""
    eval_clamp_len: Count = 0
    """eval-ppl: clamp_len for evaluation; 0 = clamp_len."""
    eval_same_length: bool = False
    """eval-ppl: same_length for evaluation (the paper's WT103 evaluation sets it)."""
    cutoffs: Annotated[list, CLUSTERS] = field(default_factory=list)
    """Adaptive input / softmax cluster boundaries in the frequency-sorted vocabulary; [] = one full softmax."""
    div_val: Size = 1
    """Adaptive input / softmax: cluster i embeds in d_embed // div_val**i dimensions."""
    tie_embeddings: bool = True
    """The softmax shares the embedding matrices."""
    tie_projs: bool = True
    """With adaptive clusters: the softmax also shares the embedding projections."""
    untie_r: bool = False
    """Each layer has its own u and v (False: one pair for all layers, as the paper's PyTorch code)."""
    norm_position: NormPosition = "post"
    """post (the paper) | pre."""
    layer_norm_eps: Positive = 1e-5
    """LayerNorm epsilon."""
    init_std: NonNegative = 0.02
    """Std of the normal init."""

    @property
    def padded_vocab(self) -> int:
        """A full softmax's rows, padded; an adaptive one (cutoffs) is cut into clusters sized by the words, and
        pad_vocab_multiple leaves it as it is (so a recipe's padding stays harmless when cutoffs are set)."""
        return self.vocab_size if self.cutoffs else super().padded_vocab


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(…, T, K) scores against distances K-1 … 0 per column -> (…, T, K) scores against key j.

    Query i sits at key index K-T+i, so key j is at distance K-T+i-j, found in column T-1-i+j. Padding one
    zero column and reading the buffer with rows one longer moves row i left by T-1-i without a gather.
    Entries for j > K-T+i (the future) come out as garbage and must be masked.
    """
    *lead, T, K = x.shape
    x = F.pad(x, (1, 0)).view(*lead, K + 1, T)
    return x[..., 1:, :].reshape(*lead, T, K)


class RelPartialLearnableAttention(nn.Module):
    """Multi-head attention over [memory; segment] with the relative score A_rel above."""

    def __init__(self, d_model, n_head, d_head, dropout, attn_dropout, pre_norm, eps, untie_r):
        super().__init__()
        self.n_head, self.d_head, self.pre_norm = n_head, d_head, pre_norm
        self.qkv = Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = Linear(d_model, n_head * d_head, bias=False)  # W_{k,R}
        self.o = Linear(n_head * d_head, d_model, bias=False)
        self.ln = nn.LayerNorm(d_model, eps=eps)
        self.drop = Dropout(dropout)
        self.attn_dropout = attn_dropout
        self.u = nn.Parameter(torch.zeros(n_head, d_head)) if untie_r else None
        self.v = nn.Parameter(torch.zeros(n_head, d_head)) if untie_r else None

    def forward(self, x, mem, r, blocked, u, v):
        """x (B, T, C), mem (B, M, C) or None, r (K, C) sinusoids for distances K-1 … 0, blocked (T, K)
        True where a query may not look; u, v (H, D) the shared biases unless this layer has its own."""
        B, T, C = x.shape
        H, D = self.n_head, self.d_head
        u, v = (self.u, self.v) if self.u is not None else (u, v)
        cat = x if mem is None else torch.cat([mem, x], 1)  # (B, K, C)
        K = cat.shape[1]
        if self.pre_norm:
            cat = self.ln(cat)
        if type(self.qkv) is Linear:  # plm's own: queries of the segment's rows only, not of the memory's
            w_q, w_kv = self.qkv.weight.split([H * D, 2 * H * D])
            q, kv = linear(cat[:, -T:], w_q), linear(cat, w_kv)
        else:  # a module put in its place (LoRA, a quantised linear) is called, on every row
            qkv = self.qkv(cat)
            q, kv = qkv[:, -T:, : H * D], qkv[..., H * D :]
        q = q.reshape(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k, val = kv.reshape(B, K, 2, H, D).permute(2, 0, 3, 1, 4)  # 2 × (B, H, K, D)
        r_k = self.r_net(r).view(K, H, D).transpose(0, 1)  # (H, K, D)
        bd = rel_shift(torch.matmul(q + v[:, None], r_k.transpose(1, 2)))  # (B, H, T, K): terms (b) + (d)
        bias = (bd * (1.0 / math.sqrt(D))).masked_fill(blocked, float("-inf"))
        y = attend(q + u[:, None], k, val, bias, self.attn_dropout if self.training else 0.0)  # terms (a) + (c)
        out = self.drop(self.o(y.transpose(1, 2).reshape(B, T, H * D)))
        return x + out if self.pre_norm else self.ln(x + out)


class TXLLayer(nn.Module):
    def __init__(self, cfg: TransformerXLConfig, d_head: int):
        super().__init__()
        pre = cfg.norm_position == "pre"
        self.attn = RelPartialLearnableAttention(cfg.d_model, cfg.n_head, d_head, cfg.dropout, cfg.attn_dropout,
                                                 pre, cfg.layer_norm_eps, cfg.untie_r)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, "relu", True, cfg.dropout, inner_dropout=cfg.dropout)
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.pre_norm = pre

    def forward(self, x, mem, r, blocked, u, v):
        x = self.attn(x, mem, r, blocked, u, v)
        return x + self.ff(self.ln(x)) if self.pre_norm else self.ln(x + self.ff(x))


class TransformerXL(CheckpointedBlocks, LanguageModel):
    traits = Traits(causal=True, stateful=True, has_memory=True, scoring="memory")
    Config = TransformerXLConfig
    tiny = ("model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_head=0",
            "model.d_ff=64", "model.mem_len=8", "model.cutoffs=[]", "model.vocab_size=50")
    state_batch_dim = 0
    """The memory is n_layer tensors (B, M, C): generation selects beams along dim 0."""

    def __init__(self, cfg: TransformerXLConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be pre or post, not {cfg.norm_position!r}")
        if cfg.mem_len < 0 or cfg.clamp_len < 0:
            raise ValueError("mem_len and clamp_len must be ≥ 0")
        self.cfg = cfg
        self.d_head = cfg.d_head or cfg.d_model // cfg.n_head
        d_embed = cfg.d_embed or cfg.d_model
        self.emb = AdaptiveEmbedding(cfg.padded_vocab, d_embed, cfg.d_model, cfg.cutoffs, cfg.div_val, cfg.init_std)
        self.drop = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TXLLayer(cfg, self.d_head) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm_position == "pre" else nn.Identity()
        self.u = nn.Parameter(torch.zeros(cfg.n_head, self.d_head))
        self.v = nn.Parameter(torch.zeros(cfg.n_head, self.d_head))
        self.softmax = AdaptiveSoftmax(cfg.vocab_size, d_embed, cfg.d_model, cfg.cutoffs, cfg.div_val, cfg.init_std,
                                       tie_to=self.emb if cfg.tie_embeddings else None, tie_projs=cfg.tie_projs,
                                       padded_vocab=cfg.padded_vocab)
        self._init(cfg.init_std)
        # What hidden() reads: the training values, the evaluation ones within evaluation_memory().
        self.mem_len, self.clamp_len, self.same_length = cfg.mem_len, cfg.clamp_len, cfg.same_length

    @contextmanager
    def evaluation_memory(self, mem_len: int):
        """Within: keep `mem_len` states per layer, with the config's evaluation clamp_len and same_length (the
        paper evaluates with a longer memory than it trains with); the training settings again after."""
        c = self.cfg
        saved = self.mem_len, self.clamp_len, self.same_length
        self.mem_len, self.clamp_len, self.same_length = mem_len, c.eval_clamp_len or c.clamp_len, c.eval_same_length
        try:
            yield self
        finally:
            self.mem_len, self.clamp_len, self.same_length = saved

    def _init(self, std):
        for name, p in self.named_parameters():
            if name.startswith(("emb.", "softmax.")):
                continue  # the adaptive modules initialise themselves (embeddings N(0, std), projections std/2)
            if p.dim() >= 2 or name.endswith((".u", ".v")) or name in ("u", "v"):
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("ln.weight") or name.endswith("ln_f.weight"):
                nn.init.normal_(p, 1.0, std)  # Transformer-XL's LayerNorm init
            else:
                nn.init.zeros_(p)

    @property
    def max_positions(self) -> int:
        """Relative positions: no table bounds the length (memory is what costs)."""
        return 2**31 - 1

    def adapter_modules(self) -> list[nn.Module]:
        """AdaptsAttention: each layer's relative attention (its qkv, r_net and o)."""
        return [layer.attn for layer in self.layers]

    def hidden(self, input_ids: torch.Tensor, mems=None, states: list | None = None):
        """(B, T) ids, memory from the previous segment (a list of n_layer (B, M, C) tensors, or None) ->
        ((B, T, C) final hidden states, the new memory or None when mem_len is 0). `states` (a list): the
        embeddings, each layer's output and the final states are appended (L+1 entries)."""
        B, T = input_ids.shape
        M = 0 if mems is None else mems[0].shape[1]
        K = M + T
        x = self.drop(self.emb(input_ids))  # (B, T, C)
        ones = torch.ones(T, K, dtype=torch.bool, device=input_ids.device)
        blocked = ones.triu(1 + M)  # query i (at key index M+i) sees keys ≤ M+i
        if self.same_length:
            # …and only the last mem_len distances (when the keys outnumber them), so every query sees the
            # same span instead of the first ones of a segment seeing less (the paper's evaluation setting).
            over = K - self.mem_len
            blocked = blocked | ones.tril(-(T - over) if over > 0 else -T)
        pos = torch.arange(K - 1, -1, -1, device=input_ids.device)
        if self.clamp_len > 0:
            pos = pos.clamp(max=self.clamp_len)
        r = self.drop(sinusoid_table(pos, self.cfg.d_model).to(x.dtype))  # (K, C)
        layer_inputs = []
        for i, layer in enumerate(self.layers):
            layer_inputs.append(x)
            x = self.run_block(layer, x, None if mems is None else mems[i], r, blocked, self.u, self.v)
        x = self.drop(self.ln_f(x))
        if states is not None:
            states.extend([*layer_inputs, x])
        return x, self._update(mems, layer_inputs)

    def _update(self, mems, layer_inputs):
        """The last mem_len states that entered each layer, cut from the graph (SG in the paper)."""
        if self.mem_len == 0:
            return None
        with torch.no_grad():
            cat = layer_inputs if mems is None else [torch.cat([m, h], 1) for m, h in zip(mems, layer_inputs)]
            return [c[:, -self.mem_len :].detach() for c in cat]

    def token_states(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, T) ids -> (B, T, C) final states, every row from an empty memory (the memory is reset per example).

        Segments of `eval_tgt_len` tokens (0: the whole row at once), each attending to mem_len states of the
        segments before it, as eval-ppl reads a text; with mem_len ≥ the row that is the whole row's causal
        attention. Padding sits on the right, after every real token, so no real position sees it.
        """
        return self.segment_states(input_ids)[-1]

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """[embeddings, each layer's output] (B, T, C) each, read as `token_states` reads a row (HasLayerStates)."""
        return self.segment_states(input_ids, every_layer=True)

    def segment_states(self, input_ids: torch.Tensor, every_layer: bool = False) -> list:
        """token_states' segment loop: [final states], or every layer's (`every_layer`), each (B, T, C)."""
        seg = self.cfg.eval_tgt_len or input_ids.shape[1]
        mems, out = None, []
        for lo in range(0, input_ids.shape[1], seg):
            states = [] if every_layer else None
            h, mems = self.hidden(input_ids[:, lo:lo + seg], mems, states)
            out.append(states if every_layer else [h])
        return [torch.cat(parts, 1) for parts in zip(*out)]

    def state_logits(self, states: torch.Tensor) -> torch.Tensor:
        """(B, T, C) states -> (B, T, V) next-token log-probabilities through the (adaptive) softmax."""
        return self.softmax.log_prob(states.flatten(0, 1)).view(*states.shape[:2], -1)

    def forward(self, input_ids: torch.Tensor, state=None, labels: torch.Tensor | None = None):
        """(B, T) ids, memory -> ((B, T, V) log-probabilities, memory); with labels (B, T) -> ((B, T) NLL, memory).

        The output layer may be an adaptive softmax, so the model itself scores labels: training then
        computes only the tail clusters its targets fall in. Log-probabilities are valid logits.
        """
        h, state = self.hidden(input_ids, state)
        if labels is None:
            return self.state_logits(h), state
        return self.softmax.nll(h.flatten(0, 1), labels.flatten()).view(labels.shape), state

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per weight of the layers, the (adaptive) softmax's share (its tail
        clusters only for the tokens that fall in them), plus the attention scores against
        seq_len + mem_len keys (content and position terms)."""
        n = sum(p.numel() for p in self.layers.parameters())
        keys = seq_len + self.cfg.mem_len
        return 6 * n + self.softmax.flops_per_token() + 6 * 3 * self.cfg.n_layer * self.cfg.n_head * self.d_head * keys
