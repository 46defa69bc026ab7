"""XLNet (Yang et al. 2019): a Transformer-XL encoder trained as a permutation language model.

The pieces, and why they are there:
- Relative positions (Transformer-XL): no position table. The score of query i on key j is
      (q_i + u)·k_j              content
    + (q_i + v)·W_{k,R} R_{i-j}  position: a sinusoid of the distance, projected per layer
    + (q_i + b)·s_ij             segment: s+ when i and j share a segment, s- when not (§2.5)
  with u, v, b (r_w_bias, r_r_bias, r_s_bias) and s± learned per layer. The content term runs in SDPA;
  the other two enter it as an additive bias.
- Memory (§2.4): each layer also attends to the cached inputs of that layer from the previous segment,
  cut from the graph, so gradients never flow into it. Pretraining caches the first `reuse_len` states.
- Two streams (§2.3): the content stream h_t sees x_t itself (it is what later positions read); the query
  stream g_t starts from a learned vector w (`mask_emb`) and sees the content of the positions before t in
  the factorisation order, but not x_t, so it can predict x_t. Both streams share every weight; only the
  `num_predict` target rows run a query stream. perm_mask[b, i, j] = 1: position i may not attend to j.
- Post-LN blocks, GELU feed-forward, an LM head tied to the word embedding with its own bias (as
  transformers' XLNetLMHeadModel). Table 7 has no dropout inside the feed-forward ("GeLU dropout 0").
`plm finetune` reads `encode`: the content stream alone, pooled at the last real token, where XLNet's
<cls> sits (a <sep> b <sep> <cls>, `pair_layout = "cls_last"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from plmcli.config_schema import Count, Heads, NonNegative, Positive, Probability, Size
from plmcli.models.base import LanguageModel, Traits
from plmcli.models.checkpointing import CheckpointedBlocks
from plmcli.kernels import Linear, linear
from plmcli.models.hf_names import HF_ACTIVATION, activation_from_hf, owned, require_hf
from plmcli.models.layers import (Activation, Dropout, FeedForward, attend, init_weights, is_padded, require_vocab,
                                   sinusoid_table)
from plmcli.models.vocab import PadsVocab, real_columns


@dataclass
class XLNetConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    n_layer: Size = 12
    """Transformer layers."""
    n_head: Heads = 12
    """Attention heads per layer."""
    d_model: Size = 768
    """Hidden size."""
    d_ff: Count = 3072
    """Feed-forward inner size; 0 = 4 × d_model."""
    dropout: Probability = 0.1
    """Dropout on embeddings, relative positions, residual branches and the final states."""
    attn_dropout: Probability = 0.1
    """Dropout on attention probabilities (the paper's dropatt)."""
    activation: Activation = "gelu"
    """gelu (exact, as transformers) | gelu_tanh (the TF code's approximation) | relu | silu."""
    layer_norm_eps: Positive = 1e-12
    """LayerNorm epsilon."""
    init_std: NonNegative = 0.02
    """Std of the normal init of every matrix, bias vector and embedding."""
    mem_len: Count = 0
    """Hidden states per layer kept as memory for the next segment (paper: 384); 0 = no memory."""
    max_positions: Size = 512
    """Longest sequence finetune and eval-ppl feed by default. Positions are relative, so nothing in the
    model depends on it; it only bounds the lengths asked for."""


def relative_positions(klen: int, qlen: int, d_model: int, device, bsz: int = 0, bi_data: bool = False) -> torch.Tensor:
    """Sinusoids of the distances klen, klen-1, …, 1-qlen (every distance query i - key j can take):
    (klen + qlen, C), or (B, klen + qlen, C) with `bi_data`: the second half of the batch reads its
    streams backwards, so its distances are negated."""
    pos = torch.arange(klen, -qlen, -1.0, device=device)
    if not bi_data:
        return sinusoid_table(pos, d_model)
    half = bsz // 2
    return torch.cat([sinusoid_table(pos, d_model).expand(half, -1, -1),
                      sinusoid_table(-pos, d_model).expand(bsz - half, -1, -1)])


def rel_shift(x: torch.Tensor, klen: int) -> torch.Tensor:
    """(B, H, Q, klen + Q) scores against the distances klen … 1-Q -> (B, H, Q, klen): [i, j] = x[i, j + Q - i],
    the score of key j at distance (klen - Q + i) - j. Dropping the first Q entries of the flattened
    buffer and re-reading it with rows one shorter moves row i left by Q - i, without a gather."""
    B, H, Q, R = x.shape
    return x.reshape(B, H, R, Q)[:, :, 1:].reshape(B, H, Q, R - 1)[..., :klen]


class RelativeAttention(nn.Module):
    """Relative multi-head attention + residual + post-LN, applied to one stream at a time."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        C, H = cfg.d_model, cfg.n_head
        assert C % H == 0, "d_model must be divisible by n_head"
        self.n_head, self.d_head = H, C // H
        self.q = Linear(C, C, bias=False)
        self.k = Linear(C, C, bias=False)
        self.v = Linear(C, C, bias=False)
        self.r = Linear(C, C, bias=False)  # W_{k,R}: relative-position keys
        self.o = Linear(C, C, bias=False)
        self.r_w_bias = nn.Parameter(torch.empty(H, self.d_head))  # u: global content bias
        self.r_r_bias = nn.Parameter(torch.empty(H, self.d_head))  # v: global position bias
        self.r_s_bias = nn.Parameter(torch.empty(H, self.d_head))  # b: global segment bias
        self.seg_embed = nn.Parameter(torch.empty(2, H, self.d_head))  # s+ (same segment), s- (different)
        self.ln = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)
        self.attn_dropout = cfg.attn_dropout

    def keys(self, cat: torch.Tensor, pos: torch.Tensor):
        """Keys and values of [mem; h] (B, K, C), and position keys of the sinusoids (…, R, C); shared by both streams."""
        B, K, _ = cat.shape
        H, D = self.n_head, self.d_head
        k = self.k(cat).view(B, K, H, D).transpose(1, 2)  # (B, H, K, D)
        v = self.v(cat).view(B, K, H, D).transpose(1, 2)
        kr = self.r(pos).unflatten(-1, (H, D))  # (R, H, D) or (B, R, H, D)
        return k, v, kr

    def forward(self, x, k, v, kr, seg_diff=None, blocked=None, q_pos=None):
        """x (B, Q, C): the queries' stream. seg_diff (B, Q, K): key in another segment. blocked (B, Q, K):
        True = may not attend. q_pos (B, Q): each query's position in the segment; None = 0 … T-1 (the
        content stream). Returns LN(x + attention) (B, Q, C)."""
        B, Q, C = x.shape
        H, D, K = self.n_head, self.d_head, k.shape[2]
        q = self.q(x).view(B, Q, H, D)
        # SDPA adds the bias after scaling q·k: the bias terms are scaled on the (B, Q, H, D) queries that
        # make them rather than on the (B, H, Q, K) scores.
        scale = D ** -0.5
        # Position term: every query against every distance once, then the distance of each key.
        spec = "bqhd,rhd->bhqr" if kr.dim() == 3 else "bqhd,brhd->bhqr"
        bd = torch.einsum(spec, (q + self.r_r_bias) * scale, kr)  # (B, H, Q, R)
        if q_pos is None:
            bd = rel_shift(bd, K)
        else:  # query rows at arbitrary positions p: key j sits at distance index j + T - p
            T = bd.shape[-1] - K
            idx = torch.arange(K, device=x.device) + T - q_pos[..., None]  # (B, Q, K)
            bd = bd.gather(-1, idx[:, None].expand(B, H, Q, K))
        bias = bd
        if seg_diff is not None:
            ef = torch.einsum("bqhd,shd->bhqs", (q + self.r_s_bias) * scale, self.seg_embed)  # (B, H, Q, 2)
            bias = bias + torch.where(seg_diff[:, None], ef[..., 1:], ef[..., :1])
        if blocked is not None:  # a large finite negative: a row with nothing visible stays finite
            bias = bias.masked_fill(blocked[:, None], torch.finfo(bias.dtype).min / 2)
        qc = (q + self.r_w_bias).transpose(1, 2)  # (B, H, Q, D): content term (q_i + u)·k_j
        y = attend(qc, k, v, bias.to(qc.dtype), self.attn_dropout if self.training else 0.0, scale=scale)
        return self.ln(x + self.drop(self.o(y.transpose(1, 2).reshape(B, Q, C))))


class XLNetBlock(nn.Module):
    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.attn = RelativeAttention(cfg)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff or 4 * cfg.d_model, cfg.activation, True, cfg.dropout)
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def forward(self, h, g, mem, pos, seg_h, seg_g, blocked_h, blocked_g, q_pos, content: bool = True):
        """`content` False: the content stream's output is not wanted (the last layer of a pretraining
        step, whose loss reads the query stream only), so only the keys it gives the query stream are made."""
        k, v, kr = self.attn.keys(h if mem is None else torch.cat([mem, h], 1), pos)
        if content:
            h = self.attn(h, k, v, kr, seg_h, blocked_h)
            h = self.ln(h + self.ff(h))
        if g is not None:  # the query stream reads the same keys: the content of [mem; h] as it entered the layer
            g = self.attn(g, k, v, kr, seg_g, blocked_g, q_pos)
            g = self.ln(g + self.ff(g))
        return h, g


class XLNet(CheckpointedBlocks, LanguageModel):
    traits = Traits(bidirectional=True, permutation_lm=True, has_memory=True, pair_layout="cls_last", scoring="left_to_right")
    Config = XLNetConfig
    tiny = (  # plain forward(x): the content stream's logits at every position
        "model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.mem_len=8",
        "model.vocab_size=50", "objective.reuse_len=8", "objective.num_predict=3", "objective.perm_size=0")
    probe_layers = "blocks"  # the content stream h of each block (plmcli.analysis.hidden)
    predict_fraction = 85 / 512
    """Share of tokens the query stream and LM head run at, for flops_per_token (the paper's num_predict)."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        require_vocab(cfg)
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.mask_emb = nn.Parameter(torch.empty(cfg.d_model))  # w: the query stream's input
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(XLNetBlock(cfg) for _ in range(cfg.n_layer))
        self.lm_bias = nn.Parameter(torch.zeros(cfg.padded_vocab))  # the decoder is wte itself
        # The sequence summary finetuning pools with (transformers' summary_use_proj + tanh); no
        # pretraining loss reaches it.
        self.summary = Linear(cfg.d_model, cfg.d_model)
        init_weights(self, cfg.init_std)
        for name, p in self.named_parameters():  # XLNet draws its bias vectors and w from N(0, std) too
            if name.endswith(("_bias", "seg_embed", "mask_emb")) and name != "lm_bias":
                nn.init.normal_(p, 0.0, cfg.init_std)

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    def adapter_modules(self) -> list[nn.Module]:
        """AdaptsAttention: each block's two-stream relative attention (its q, k, v, r and o; both streams use them)."""
        return [block.attn for block in self.blocks]

    # ------------------------------------------------------------------ the stack

    def stack(self, input_ids, seg=None, perm_mask=None, q_pos=None, mems=None, key_pad=None,
              reuse_len=None, mem_len=None, bi_data=False, states: list | None = None, content_out: bool = True):
        """Run both streams. input_ids, seg (B, T); perm_mask (B, T, T), 1 = i may not attend to j;
        q_pos (B, M) positions of the query-stream rows (None: no query stream); mems: per layer (B, Tm, C)
        or None; key_pad (B, T) True at padding. Returns (h (B, T, C), g (B, M, C) | None, new mems | None).
        `states` (a list): the content stream's embeddings and each layer's output are appended (layer_states).
        content_out False (with a query stream): h is not returned (None), and the last layer skips its
        content stream, which nothing downstream reads: the memory is each layer's input."""
        B, T = input_ids.shape
        mlen = mems[0].shape[1] if mems else 0
        klen = mlen + T
        h = self.drop(self.wte(input_ids))  # (B, T, C)
        g = self.drop(self.mask_emb.expand(B, q_pos.shape[1], -1)) if q_pos is not None else None  # (B, M, C)
        pos = self.drop(relative_positions(klen, T, self.cfg.d_model, h.device, B, bi_data).to(h.dtype))

        blocked_h = blocked_g = None
        if perm_mask is not None or key_pad is not None:
            blocked = torch.zeros(B, T, klen, dtype=torch.bool, device=h.device)  # memory: visible to all
            if perm_mask is not None:
                blocked[:, :, mlen:] |= perm_mask > 0
            if key_pad is not None:
                blocked[:, :, mlen:] |= key_pad[:, None, :]
            if q_pos is not None:  # the query stream: exactly what the factorisation order allows
                blocked_g = blocked.gather(1, q_pos[..., None].expand(-1, -1, klen))
            # the content stream also sees its own token
            own = torch.arange(klen, device=h.device) == torch.arange(mlen, klen, device=h.device)[:, None]  # (T, K)
            blocked_h = blocked & ~own
        seg_h = seg_g = None
        if seg is not None:  # memory counts as segment 0, as in XLNet
            cat_seg = torch.cat([seg.new_zeros(B, mlen), seg], 1) if mlen else seg
            seg_h = seg[:, :, None] != cat_seg[:, None, :]  # (B, T, K)
            if q_pos is not None:
                seg_g = seg_h.gather(1, q_pos[..., None].expand(-1, -1, klen))

        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        new_mems = [] if mem_len > 0 else None
        for i, block in enumerate(self.blocks):
            mem = mems[i] if mems else None
            if new_mems is not None:  # each layer's input is the next segment's memory for that layer
                new_mems.append(self._cache(h, mem, reuse_len, mem_len))
            if states is not None:
                states.append(h)
            content = content_out or g is None or i < len(self.blocks) - 1
            h, g = self.run_block(block, h, g, mem, pos, seg_h, seg_g, blocked_h, blocked_g, q_pos, content)
        if new_mems is not None and new_mems[0] is None:
            new_mems = None
        if not content_out and g is not None:
            return None, self.drop(g), new_mems
        h = self.drop(h)
        if states is not None:
            states.append(h)
        return h, (self.drop(g) if g is not None else None), new_mems

    @staticmethod
    def _cache(h, mem, reuse_len, mem_len):
        """New memory = cat(old memory, this segment's first reuse_len states)[-mem_len:], detached."""
        cur = h if reuse_len is None else h[:, :reuse_len]
        cat = cur if mem is None else torch.cat([mem, cur], 1)
        return cat[:, -mem_len:].detach() if cat.shape[1] else None

    # ------------------------------------------------------------------ interfaces

    def forward(self, input_ids, token_type_ids=None, perm_mask=None, target_mapping=None, mems=None,
                attention_mask=None, reuse_len=None, mem_len=None, bi_data=False):
        """Pretraining forward -> (logits, new mems).

        With target_mapping (B, M, T) (one-hot rows; all-zero rows are padding) the logits (B, M, V) are the
        query stream's at those positions; without it, the content stream's at every position (B, T, V).
        perm_mask (B, T, T): 1 = i may not attend to j. mems: the previous call's new mems. reuse_len: how
        many leading states become memory (None = all). bi_data: the second half of the batch is read backwards.
        """
        q_pos = target_mapping.argmax(-1) if target_mapping is not None else None
        key_pad = attention_mask == 0 if attention_mask is not None and is_padded(attention_mask) else None
        h, g, new_mems = self.stack(input_ids, token_type_ids, perm_mask, q_pos, mems, key_pad, reuse_len,
                                    mem_len, bi_data, content_out=q_pos is None)
        out = g if g is not None else h
        return self.lm_logits(out), new_mems

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, states: list | None = None):
        """(B, T) ids -> ((B, T, C) content states, (B, C) pooled): no memory, no permutation.

        Rows are right-padded; the last real token (XLNet's <cls>) gets a segment of its own and is pooled.
        `states`: the embeddings and each layer's content states are appended to it (layer_states).
        """
        B, T = input_ids.shape
        rows = torch.arange(B, device=input_ids.device)
        last = attention_mask.sum(1).long() - 1 if attention_mask is not None else torch.full_like(rows, T - 1)
        seg = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids.clone()
        seg[rows, last] = seg.new_full((), 2)  # made on seg's device: a Python 2 would become a host tensor first
        key_pad = attention_mask == 0 if attention_mask is not None and is_padded(attention_mask) else None
        h, _, _ = self.stack(input_ids, seg, key_pad=key_pad, mem_len=0, states=states)
        return h, torch.tanh(self.summary(h[rows, last]))

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """[embeddings, each layer's content states] (B, T, C) each, the last = encode's hidden (HasLayerStates)."""
        states: list = []
        self.encode(input_ids, token_type_ids, attention_mask, states=states)
        return states

    def freeze_summary(self) -> None:
        """Pretraining never reaches the sequence summary: frozen, DDP does not wait for its gradients."""
        self.summary.requires_grad_(False)

    def next_token_logits(self, input_ids, mems=None, mem_len=0):
        """Left-to-right factorisation (the identity permutation): (B, W) -> ((B, W, V), new mems) where [:, t]
        predicts token t+1 from the content of tokens ≤ t (and the memory).

        A dummy token is appended at position W; the perm mask is causal, so the query stream at positions
        1 … W sees exactly the tokens before it, and no one sees the dummy's content. Memory keeps the W
        real tokens' states only.
        """
        B, W = input_ids.shape
        x = torch.cat([input_ids, input_ids[:, -1:]], 1)  # (B, W + 1): the dummy's id does not matter
        causal = torch.ones(W + 1, W + 1, dtype=torch.bool, device=x.device).triu()  # j ≥ i blocked
        q_pos = torch.arange(1, W + 1, device=x.device).expand(B, W)
        _, g, new_mems = self.stack(x, torch.zeros_like(x), causal.expand(B, -1, -1), q_pos, mems,
                                    reuse_len=W, mem_len=mem_len, content_out=False)
        return self.lm_logits(g), new_mems

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(…, C) states -> (…, V) logits: the LM head is the word embedding, with its own bias."""
        return real_columns(linear(h, self.wte.weight, self.lm_bias), self.cfg.vocab_size)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of a pretraining step (forward + backward = 3× forward, 2 per multiply-add),
        counted matmul by matmul as it runs.

        Every layer projects keys and values of [memory; segment] (klen = seq_len + mem_len rows) and the
        position keys W_{k,R} R (klen + seq_len rows, counted once per sequence); the query stream (q, o,
        feed-forward) and the LM head run at `predict_fraction` of the tokens in every layer; the content
        stream's q, o and feed-forward in every layer but the last (the loss reads the query stream only,
        so the last layer's content output is not computed). Attention per stream row: q·k and p·v over
        klen keys, q·W_R R over klen + seq_len distances.
        """
        c = self.cfg
        C, L, F_ = c.d_model, c.n_layer, c.d_ff or 4 * c.d_model
        f, klen = self.predict_fraction, seq_len + c.mem_len
        keys = 2 * C * C * klen / seq_len + C * C * (klen + seq_len) / seq_len
        rows = 2 * C * C + 2 * C * F_  # q, o and the feed-forward of one stream row
        dense = L * (keys + f * rows) + (L - 1) * rows + f * C * c.vocab_size
        return 6 * dense + 6 * C * (3 * klen + seq_len) * ((L - 1) + L * f)

    # ------------------------------------------------------------------ transformers interop

    hf_model_types: ClassVar[tuple[str, ...]] = ("xlnet",)
    """transformers config.json model_type values that from_hf reads."""

    def to_hf(self, run_config: dict) -> tuple[dict, dict[str, torch.Tensor]]:
        """(config.json, state dict) of transformers' XLNetLMHeadModel. The sequence summary stays behind: no
        pretraining loss reaches it (freeze_summary) and XLNetLMHeadModel has none; finetuning starts it afresh."""
        c = self.cfg
        ids = run_config.get("tokenizer", {}).get("special_token_ids", {})
        config = {
            "model_type": "xlnet", "architectures": ["XLNetLMHeadModel"], "vocab_size": c.vocab_size,
            "d_model": c.d_model, "n_layer": c.n_layer, "n_head": c.n_head, "d_inner": c.d_ff or 4 * c.d_model,
            "ff_activation": HF_ACTIVATION[c.activation], "attn_type": "bi", "initializer_range": c.init_std,
            "layer_norm_eps": c.layer_norm_eps, "mem_len": c.mem_len, "bi_data": False, "clamp_len": -1,
            "same_length": False, "tie_word_embeddings": True,
            # transformers has one rate for every dropout, attention probabilities included
            "dropout": c.dropout,
            "pad_token_id": ids.get("pad"), "bos_token_id": ids.get("bos"), "eos_token_id": ids.get("eos"),
        }
        sd = self.state_dict()
        # lm_loss.weight is the word embedding: HF re-ties it on loading, and safetensors refuses two names
        # for one storage, so it is not written.
        out = {hf: _hf_layout(hf, sd[ours], c.n_head) for ours, hf in _hf_key_map(c.n_layer).items()
               if not hf.startswith("sequence_summary")}
        return config, owned(out)

    def hf_export_notes(self) -> list[str]:
        """What to_hf leaves out, for the export's report."""
        return ["sequence summary not exported (pretraining never trains it; XLNetLMHeadModel has none)"]

    @classmethod
    def from_hf(cls, hf_config: dict, state_dict: dict[str, torch.Tensor]) -> tuple[XLNetConfig, dict[str, torch.Tensor]]:
        """(our config, our state dict) from a transformers XLNet checkpoint (XLNetLMHeadModel, XLNetModel,
        XLNetForSequenceClassification...): keys the checkpoint lacks (an LM model's summary) are left out.
        bi_data is a pretraining-data choice here (objective.bi_data), not part of the model."""
        from plmcli.errors import PlmError

        hc = hf_config
        require_hf(hc, "attn_type", ("bi",), "bi")
        require_hf(hc, "same_length", (False,), False)
        if hc.get("clamp_len", -1) > 0:
            raise PlmError(f"the HF config's clamp_len = {hc['clamp_len']} cannot be represented by plm",
                           "plm's XLNet never clamps relative distances (clamp_len -1)")
        n_layer = hc.get("n_layer", 24)
        cfg = XLNetConfig(
            vocab_size=hc["vocab_size"], n_layer=n_layer, n_head=hc.get("n_head", 16), d_model=hc.get("d_model", 1024),
            d_ff=hc.get("d_inner", 4096), dropout=hc.get("dropout", 0.1), attn_dropout=hc.get("dropout", 0.1),
            activation=activation_from_hf(hc, "ff_activation"),
            layer_norm_eps=hc.get("layer_norm_eps", 1e-12), init_std=hc.get("initializer_range", 0.02),
            mem_len=hc.get("mem_len", 512) or 0)
        sd = {k if k.startswith(("transformer.", "lm_loss", "sequence_summary")) else f"transformer.{k}": v
              for k, v in state_dict.items()}  # a bare XLNetModel's names lack the "transformer." prefix
        out = {ours: _our_layout(hf, sd[hf]) for ours, hf in _hf_key_map(n_layer).items() if hf in sd}
        return cfg, owned(out)


# ---------------------------------------------------------------------- transformers weights

def _hf_key_map(n_layer: int) -> dict[str, str]:
    """Our parameter name -> transformers' name (XLNetLMHeadModel's; sequence_summary.* as XLNetForSequenceClassification)."""
    m = {"wte.weight": "transformer.word_embedding.weight", "mask_emb": "transformer.mask_emb", "lm_bias": "lm_loss.bias",
         "summary.weight": "sequence_summary.summary.weight", "summary.bias": "sequence_summary.summary.bias"}
    for i in range(n_layer):
        a, b = f"blocks.{i}.", f"transformer.layer.{i}."
        for w in ("q", "k", "v", "o", "r"):
            m[f"{a}attn.{w}.weight"] = f"{b}rel_attn.{w}"
        for p in ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"):
            m[f"{a}attn.{p}"] = f"{b}rel_attn.{p}"
        for p in ("weight", "bias"):
            m[f"{a}attn.ln.{p}"] = f"{b}rel_attn.layer_norm.{p}"
            m[f"{a}ln.{p}"] = f"{b}ff.layer_norm.{p}"
            m[f"{a}ff.fc.{p}"] = f"{b}ff.layer_1.{p}"
            m[f"{a}ff.proj.{p}"] = f"{b}ff.layer_2.{p}"
    return m


def _our_layout(name: str, w: torch.Tensor) -> torch.Tensor:
    """transformers keeps q/k/v/r as (C, H, D) used as x @ W, o as (C, H, D) used as y @ W^T, mask_emb as (1, 1, C)."""
    if name.endswith(("rel_attn.q", "rel_attn.k", "rel_attn.v", "rel_attn.r")):
        return w.reshape(w.shape[0], -1).t()
    if name.endswith("rel_attn.o"):
        return w.reshape(w.shape[0], -1)
    if name.endswith("mask_emb"):
        return w.reshape(-1)
    return w


def _hf_layout(name: str, w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of _our_layout."""
    if name.endswith(("rel_attn.q", "rel_attn.k", "rel_attn.v", "rel_attn.r")):
        return w.t().reshape(w.shape[1], n_head, -1)
    if name.endswith("rel_attn.o"):
        return w.reshape(w.shape[0], n_head, -1)
    if name.endswith("mask_emb"):
        return w.reshape(1, 1, -1)
    return w
