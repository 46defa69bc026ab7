"""RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015).

Encoder: a (bi)directional LSTM/GRU over the source; a bidirectional encoder gives each direction
d_hidden/2 units, so its outputs (the memory) and its final states (fwd ‖ bwd, per layer, which start
the decoder) are d_hidden wide, as in OpenNMT's brnn.

Decoder (Luong's global attention, as OpenNMT): at step t the RNN reads the previous target token
(and, with input feeding, the previous attentional vector h̃_{t-1}); its output h_t scores every
memory position m_s with
    dot       h_t · m_s
    general   h_t · W m_s
    additive  v · tanh(W_q h_t + W_k m_s)        (Bahdanau's "concat"/MLP score)
padding excluded; a_t = softmax of the scores, c_t = Σ_s a_ts m_s, h̃_t = tanh(W_c [c_t; h_t]) and
the next-token logits come from h̃_t. Training is teacher-forced: the decoder reads the gold target.

Decoder (Bahdanau et al. 2015, §3.1 and eq. 4; `decoder: bahdanau`): attention comes BEFORE the RNN step.
At step t the score reads the previous decoder state s_{t-1} (the top layer's; s_0 is the encoder's final
state), e_tj = score(s_{t-1}, m_j) — the paper's vᵀ tanh(W s_{t-1} + U h_j) with `attention: additive` —,
c_t = Σ_j α_tj m_j enters the RNN together with the embedding of y_{t-1}: s_t = f(s_{t-1}, [E y_{t-1}; c_t]),
and the logits come from g(y_{t-1}, s_t, c_t) = tanh(W_o [c_t; s_t; E y_{t-1}]). Every step waits for the
one before it (its query is the last step's state), so `input_feeding` does not apply.

Transfer: the encoder alone (`token_states`: its outputs, the memory the decoder attends to) serves the task
heads. It has no [CLS] and no single summary state — a bidirectional encoder's last position has read the whole
row forwards but only itself backwards — so a sequence head reads the mean of its states over the real tokens
(`pooling="mean"`, as a Transformer's encoder; ULMFiT's concat would add that lopsided last state and triple the
head's width), and tagging every token's state. Its tokenizer has no [CLS]/[SEP]: examples are framed as GPT's
transfer frames them (`<s> a $ b <e>`, `pair_layout="causal"`), which its bos/eos spell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
from torch import nn

from plmcli.config_schema import Count, NonNegative, Probability, Rule, Size
from plmcli.models import device as devices
from plmcli.models.base import LanguageModel, Traits
from plmcli.kernels import Linear, linear
from plmcli.models.layers import Dropout, require_vocab
from plmcli.models.vocab import PadsVocab, VocabHead, real_columns
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}
SCORES = ("dot", "general", "additive")


SPLITS_IN_TWO = Rule(lambda d, c: not c["bidirectional"] or d % 2 == 0,
                     "is odd, and a bidirectional encoder splits d_hidden between its two directions",
                     "pick an even {where}.d_hidden, or --set {where}.bidirectional=false")


@dataclass
class Seq2SeqConfig(PadsVocab):
    vocab_size: Count = 0
    """Shared source/target vocabulary; 0 = take it from the tokenizer."""
    max_positions: Size = 512
    """Longest source or target sequence accepted (RNNs have no position table; this bounds
    train.seq_len and generation)."""
    cell: Literal["lstm", "gru"] = "lstm"
    """lstm | gru."""
    n_layer: Size = 1
    """Stacked RNN layers in the encoder and in the decoder."""
    d_embed: Size = 256
    """Token embedding size (one matrix for source and target)."""
    d_hidden: Annotated[Size, SPLITS_IN_TWO] = 512
    """Decoder hidden size = memory width (a bidirectional encoder gives each direction half)."""
    bidirectional: bool = True
    """Bidirectional encoder."""
    attention: Literal["dot", "general", "additive"] = "general"
    """dot | general | additive (Bahdanau)."""
    d_attention: Count = 0
    """Additive score's inner size; 0 = d_hidden."""
    decoder: Literal["luong", "bahdanau"] = "luong"
    """luong (attend from the RNN's new state h_t, then combine: Luong et al. 2015) | bahdanau (attend from
    the previous state s_{t-1} and feed the context c_t into the RNN step: Bahdanau et al. 2015, §3.1)."""
    input_feeding: bool = True
    """decoder luong: feed h̃_{t-1} into the decoder RNN with the next token (Luong §3.3); off, the decoder
    RNN runs over the whole target at once (faster). decoder bahdanau always feeds its context c_t."""
    dropout: Probability = 0.2
    """Dropout on embeddings, between RNN layers and on h̃ before the output layer."""
    tie_embeddings: bool = True
    """The output layer shares the embedding matrix (through a d_hidden→d_embed projection if they differ)."""
    init_range: NonNegative = 0.1
    """Parameters start uniform in ±init_range (Luong et al.)."""


class Attention(nn.Module):
    """Scores queries (B, T, Dq) against a memory (B, S, Dk); returns contexts (B, T, Dk) and weights (B, T, S)."""

    def __init__(self, score: str, d_query: int, d_key: int, d_attention: int = 0):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"attention must be one of {', '.join(SCORES)}, not {score!r}")
        if score == "dot" and d_query != d_key:
            raise ValueError(f"dot attention needs equal query and key sizes ({d_query} vs {d_key})")
        self.score = score
        if score == "general":
            self.w = Linear(d_key, d_query, bias=False)
        elif score == "additive":
            d_attention = d_attention or d_query
            self.w_q = Linear(d_query, d_attention, bias=False)
            self.w_k = Linear(d_key, d_attention, bias=True)
            self.v = Linear(d_attention, 1, bias=False)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """The query-independent part of the score, computed once per source."""
        if self.score == "dot":
            return memory
        return self.w(memory) if self.score == "general" else self.w_k(memory)

    def forward(self, query, keys, memory, mask):
        """query (B, T, Dq), keys = self.keys(memory), memory (B, S, Dk), mask (B, S) True at real tokens."""
        if self.score == "additive":
            scores = self.v(torch.tanh(self.w_q(query)[:, :, None, :] + keys[:, None, :, :])).squeeze(-1)
        else:
            scores = query @ keys.transpose(1, 2)  # (B, T, S)
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        weights = scores.float().softmax(-1).to(memory.dtype)
        return weights @ memory, weights


class Seq2Seq(LanguageModel):
    traits = Traits(seq2seq=True, scoring="conditional", pair_layout="causal", pooling="mean")
    Config = Seq2SeqConfig
    tiny = ("model.d_embed=16", "model.d_hidden=16", "model.max_positions=16", "model.vocab_size=50")

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, not {cfg.cell!r}")
        if cfg.bidirectional and cfg.d_hidden % 2:
            raise ValueError(f"a bidirectional encoder splits d_hidden between directions: {cfg.d_hidden} is odd")
        self.cfg = cfg
        H, E, L = cfg.d_hidden, cfg.d_embed, cfg.n_layer
        rnn = CELLS[cfg.cell]
        between = cfg.dropout if L > 1 else 0.0
        self.embed = nn.Embedding(cfg.padded_vocab, E)
        self.drop = Dropout(cfg.dropout)
        self.encoder = rnn(E, H // 2 if cfg.bidirectional else H, L, batch_first=True, dropout=between,
                           bidirectional=cfg.bidirectional)
        self.bahdanau = cfg.decoder == "bahdanau"
        fed = self.bahdanau or cfg.input_feeding  # c_t (Bahdanau) or h̃_{t-1} (Luong) enters the RNN step
        self.decoder = rnn(E + (H if fed else 0), H, L, batch_first=True, dropout=between)
        self.attention = Attention(cfg.attention, H, H, cfg.d_attention)
        # Luong's W_c: [c_t; h_t] -> h̃_t; Bahdanau's readout g(y_{t-1}, s_t, c_t): [c_t; s_t; E y_{t-1}] -> h̃_t
        self.combine = Linear(2 * H + (E if self.bahdanau else 0), H, bias=False)
        if cfg.tie_embeddings:
            self.to_embed = Linear(H, E, bias=False) if H != E else nn.Identity()
            self.out_bias = nn.Parameter(torch.zeros(cfg.padded_vocab))
        else:
            self.out = VocabHead(H, cfg.vocab_size, cfg.padded_vocab)
        for p in self.parameters():
            nn.init.uniform_(p, -cfg.init_range, cfg.init_range)
        if cfg.tie_embeddings:
            nn.init.zeros_(self.out_bias)

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    @property
    def lstm(self) -> bool:
        return self.cfg.cell == "lstm"

    def logits(self, h_tilde: torch.Tensor) -> torch.Tensor:
        h = self.drop(h_tilde)
        if self.cfg.tie_embeddings:
            return real_columns(linear(self.to_embed(h), self.embed.weight, self.out_bias), self.cfg.vocab_size)
        return self.out(h)

    # ------------------------------------------------------------ encoder

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor) -> dict:
        """(B, S) source, (B, S) bool mask -> the decoder's starting state (every tensor batch-first)."""
        B, S = src_ids.shape
        memory, final = packed_rnn(self.encoder, self.drop(self.embed(src_ids)), src_mask)  # (B, S, H), zeros at padding
        finals = final if self.lstm else (final,)
        # (L·dirs, B, H/dirs) -> (B, L, H): per layer, the forward and backward final states side by side
        L, dirs = self.cfg.n_layer, 2 if self.cfg.bidirectional else 1
        h0 = [f.view(L, dirs, B, -1).permute(2, 0, 1, 3).reshape(B, L, -1) for f in finals]
        state = {"memory": memory, "keys": self.attention.keys(memory), "mask": src_mask, "h": h0[0],
                 "feed": memory.new_zeros(B, self.cfg.d_hidden)}
        if self.lstm:
            state["c"] = h0[1]
        return state

    def token_states(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, S) right-padded ids, (B, S) mask (1 = real token; None: all real) -> (B, S, d_hidden) the encoder's
        states, for transfer. Packed by length, as `encode` reads a source: each row's backward direction starts
        at its own last real token, so no real position sees the padding (whose states are zeros)."""
        return packed_rnn(self.encoder, self.drop(self.embed(input_ids)), attention_mask)[0]

    # ------------------------------------------------------------ decoder

    def _hidden(self, state):
        h = state["h"].transpose(0, 1).contiguous()  # (L, B, H) as the RNN wants it
        return (h, state["c"].transpose(0, 1).contiguous()) if self.lstm else h

    def _store(self, state, hidden):
        h, c = hidden if self.lstm else (hidden, None)
        new = {**state, "h": h.transpose(0, 1)}
        if c is not None:
            new["c"] = c.transpose(0, 1)
        return new

    def _attend(self, out, state):
        """RNN outputs (B, T, H) -> attentional vectors h̃ (B, T, H) and attention weights (B, T, S)."""
        ctx, weights = self.attention(out, state["keys"], state["memory"], state["mask"])
        return torch.tanh(self.combine(torch.cat([ctx, out], -1))), weights

    def _run(self, tgt_in_ids, state):
        """Teacher-forced decoder over (B, T) inputs -> h̃ (B, T, H), weights (B, T, S), state after the last step."""
        emb = self.drop(self.embed(tgt_in_ids))
        if self.bahdanau:
            return self._run_bahdanau(emb, state)
        if not self.cfg.input_feeding:  # no recurrence through h̃: one RNN call over the whole target
            out, hidden = self.decoder(emb, self._hidden(state))
            h_tilde, weights = self._attend(out, state)
            return h_tilde, weights, {**self._store(state, hidden), "feed": h_tilde[:, -1]}
        steps, all_w = [], []
        for t in range(emb.shape[1]):
            inp = torch.cat([emb[:, t : t + 1], state["feed"][:, None]], -1)
            out, hidden = self.decoder(inp, self._hidden(state))
            h_tilde, weights = self._attend(out, state)
            state = {**self._store(state, hidden), "feed": h_tilde[:, 0]}
            steps.append(h_tilde)
            all_w.append(weights)
        return torch.cat(steps, 1), torch.cat(all_w, 1), state

    def _run_bahdanau(self, emb, state):
        """Bahdanau's decoder over (B, T, E) embedded inputs -> h̃ (B, T, H), weights (B, T, S), the last state."""
        steps, all_w = [], []
        for t in range(emb.shape[1]):
            query = state["h"][:, -1:]  # s_{t-1}: the top layer's state before this step, (B, 1, H)
            ctx, weights = self.attention(query, state["keys"], state["memory"], state["mask"])
            x = emb[:, t : t + 1]
            out, hidden = self.decoder(torch.cat([x, ctx], -1), self._hidden(state))  # out = s_t (top layer)
            h_tilde = torch.tanh(self.combine(torch.cat([ctx, out, x], -1)))
            state = {**self._store(state, hidden), "feed": h_tilde[:, 0]}
            steps.append(h_tilde)
            all_w.append(weights)
        return torch.cat(steps, 1), torch.cat(all_w, 1), state

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor, tgt_in_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) source, (B, S) mask, (B, T) decoder input -> (B, T, V) next-token logits."""
        h_tilde, _, _ = self._run(tgt_in_ids, self.encode(src_ids, src_mask))
        return self.logits(h_tilde)

    def attention_weights(self, src_ids, src_mask, tgt_in_ids) -> torch.Tensor:
        """(B, T, S): where each target step looked in the source (for inspection and tests)."""
        return self._run(tgt_in_ids, self.encode(src_ids, src_mask))[1]

    def decode_step(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """Feed one token per row (B,) -> ((B, V) logits for the next token, new state)."""
        h_tilde, _, state = self._run(tokens[:, None], state)
        return self.logits(h_tilde)[:, 0], state


def packed_rnn(rnn: nn.RNNBase, x: torch.Tensor, mask: torch.Tensor | None):
    """A batch-first RNN over right-padded rows (B, S, E), each read to its own length (mask (B, S): 1 = token;
    None: every position; at least 1) -> (outputs (B, S, H), zeros at the padding; final states as the RNN gives
    them, rows in batch order). A backward direction so starts at each row's last real token.

    pack_padded_sequence wants the lengths on the host: they come from the host's own count where the batch
    brought one (models/device.py), and the rows are sorted by length on the device. Its enforce_sorted=False
    would sort on the host and copy the order over, and pad_packed_sequence would copy it back, each a copy a
    GPU finishes its queue for."""
    B, S = x.shape[:2]
    host = np.full(B, S, dtype=np.int64) if mask is None else devices.lengths_of(mask)
    if host is None:  # no count came with the batch: the device's (a GPU waits for it)
        host = mask.sum(1).cpu().numpy()
    order = (torch.arange(B, device=x.device) if mask is None
             else torch.sort(mask.sum(1).clamp(min=1), descending=True, stable=True).indices)
    back = torch.empty_like(order).scatter_(0, order, torch.arange(B, device=order.device))
    by_length = np.sort(np.maximum(host, 1))[::-1].copy()  # (B,) descending, as `order` puts the rows
    out, final = rnn(pack_padded_sequence(x.index_select(0, order), by_length, batch_first=True))
    out = pad_packed_sequence(out, batch_first=True, total_length=S)[0].index_select(0, back)
    final = tuple(f.index_select(1, back) for f in final) if isinstance(final, tuple) else final.index_select(1, back)
    return out, final
