"""ELMo: a bidirectional LSTM language model whose layers are features (Peters et al. 2018, "Deep
contextualized word representations"; the biLM of Józefowicz et al. 2016).

token encoder (word embeddings, or a character CNN over each token's UTF-8 bytes: char embeddings →
convolutions of widths 1–7 → max-pool over the chars → highway layers → linear projection)
→ L forward LSTM layers and L backward LSTM layers, each LSTM projected to d_proj (LSTMP), with a
residual connection from layer 2 on → one softmax over the vocabulary, shared by both directions
(`share_softmax`). The forward LM predicts token t+1 from tokens ≤ t, the backward LM token t-1 from
tokens ≥ t; training (objective `bilm`) minimises the sum of both NLLs.

Features: `layers(ids)` gives the paper's 2L+1 representations {x, →h_j, ←h_j} as its L+1 layers
h_0 = [x; x], h_j = [→h_j; ←h_j] (each (B, T, 2·d_proj)), and `ScalarMix` the task-weighted
γ·Σ_{j=0..L} softmax(s)_j h_j (ELMo eq. 1).

The character table. A char-CNN needs each token id's characters: `char_ids` is a (V, max_chars)
buffer saved with the weights. The `bilm` objective fills it from the tokenizer's vocabulary
(`set_token_strings`) right after the model is built; until then it holds the id's decimal digits, so a
model built without a tokenizer (recipe tests, parameter counts) still tells tokens apart.

Not done: the paper's sampled softmax (the full softmax is used), cell / projection clipping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Count, Probability, Rule, Size
from plmcli.models.base import LanguageModel, Traits
from plmcli.kernels import Linear
from plmcli.models.layers import Dropout, ScalarMix, require_vocab

PAD_CHAR, BOW, EOW, BYTE0 = 0, 1, 2, 3  # char ids: padding, begin / end of word, then the 256 byte values
N_CHARS = BYTE0 + 256


HOLDS_FILTERS = Rule(lambda n, c: c["token_encoder"] != "char"
                     or (n >= 3 and c["filters"] and all(w <= n for w, _ in c["filters"])),
                     "must be ≥ 3 and ≥ every width of {where}.filters {filters} ([width, n_filters] pairs, at least one)",
                     "e.g. --set {where}.max_chars=50")


@dataclass
class ELMoConfig:
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    token_encoder: Literal["char", "word"] = "char"
    """char (character CNN, as the paper) | word (an embedding per token)."""
    d_proj: Size = 512
    """Token representation and LSTM projection size; every layer feature is 2·d_proj."""
    n_layer: Size = 2
    """biLSTM layers (per direction)."""
    d_hidden: Size = 4096
    """LSTM hidden (cell) size before the projection to d_proj."""
    d_char: Size = 16
    """Character embedding size (char encoder)."""
    max_chars: Annotated[Size, HOLDS_FILTERS] = 50
    """Characters per token, begin / end of word marks included; longer tokens are cut."""
    filters: list = field(default_factory=lambda: [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]])
    """[width, n_filters] of each character convolution (char encoder)."""
    n_highway: Count = 2
    """Highway layers after the convolutions (char encoder)."""
    residual: bool = True
    """Add each LSTM layer's input to its output (from the second layer on, as the paper)."""
    share_softmax: bool = True
    """One softmax for both directions (the paper); false = one per direction."""
    dropout: Probability = 0.1
    """Dropout on the token representation, between layers and before the softmax."""
    max_positions: Size = 1_000_000
    """An LSTM has no position table: only a bound for tools that ask."""

    @property
    def d_model(self) -> int:
        """The feature size, 2·d_proj (what a classifier head over `encode` reads)."""
        return 2 * self.d_proj


class Highway(nn.Module):
    """y = g·relu(W_h x) + (1-g)·x, g = σ(W_g x) (Srivastava et al. 2015), the carry gate biased open."""

    def __init__(self, d: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Linear(d, 2 * d) for _ in range(n_layers))
        for lin in self.layers:
            nn.init.constant_(lin.bias[d:], -1.0)  # gate starts mostly carrying x through (as bilm-tf)

    def forward(self, x):
        for lin in self.layers:
            h, g = lin(x).chunk(2, dim=-1)
            g = torch.sigmoid(g)
            x = g * F.relu(h) + (1 - g) * x
        return x


class CharCNN(nn.Module):
    """(…, max_chars) char ids -> (…, d_out): embed, convolve, max-pool over chars, highway, project."""

    def __init__(self, cfg: ELMoConfig):
        super().__init__()
        self.embed = nn.Embedding(N_CHARS, cfg.d_char, padding_idx=PAD_CHAR)
        self.convs = nn.ModuleList(nn.Conv1d(cfg.d_char, n, w) for w, n in cfg.filters)
        d = sum(n for _, n in cfg.filters)
        self.highway = Highway(d, cfg.n_highway)
        self.proj = Linear(d, cfg.d_proj)

    def forward(self, chars):
        shape = chars.shape[:-1]
        x = self.embed(chars.flatten(0, -2).long()).transpose(1, 2)  # (N, d_char, max_chars)
        # max over positions of each filter: a token's best-matching n-gram of each width
        x = torch.cat([torch.relu(conv(x).amax(dim=-1)) for conv in self.convs], dim=-1)  # (N, Σ filters)
        return self.proj(self.highway(x)).view(*shape, -1)  # (…, d_proj)


def digit_chars(vocab_size: int, max_chars: int) -> np.ndarray:
    """A stand-in table: each id spelled as its decimal digits between BOW and EOW."""
    ids = np.arange(vocab_size)
    n_digits = 1 if vocab_size <= 1 else len(str(vocab_size - 1))
    table = np.zeros((vocab_size, max_chars), dtype=np.int16)
    table[:, 0] = BOW
    for k in range(min(n_digits, max_chars - 2)):
        table[:, 1 + k] = BYTE0 + ord("0") + (ids // 10 ** (n_digits - 1 - k)) % 10
    table[:, min(n_digits, max_chars - 2) + 1] = EOW
    return table


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Reverse each row's first `lengths` steps of (B, T, …), leaving the padding after them in place."""
    if lengths is None:
        return x.flip(1)
    T = x.shape[1]
    t = torch.arange(T, device=x.device)[None]  # (1, T)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # (B, T)
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x))


class ELMoTaskHead(nn.Module):
    """Feature-based transfer (Peters et al. 2018, §3.3): the biLM stays frozen; the task learns its own
    scalar mix (s, γ), reads [x; ELMo_task] with a small BiLSTM, pools (max and mean over real tokens)
    and classifies. `add_output_mix` also puts ELMo at the task BiLSTM's output: h_k -> [h_k; ELMo'_k]
    with a second mix of its own (§3.3, "another set of output specific linear weights")."""

    def __init__(self, elmo: "ELMo", num_labels: int, dropout: float = 0.5, d_lstm: int = 0):
        super().__init__()
        d_proj, n_layers = elmo.cfg.d_proj, elmo.cfg.n_layer + 1
        d_lstm = d_lstm or d_proj
        self.mix = ScalarMix(n_layers)
        self.drop = Dropout(dropout)
        self.lstm = nn.LSTM(3 * d_proj, d_lstm, batch_first=True, bidirectional=True)
        self.out = Linear(4 * d_lstm, num_labels)
        self.mix_out: ScalarMix | None = None

    def add_output_mix(self) -> None:
        """ELMo at the output too: a second ScalarMix whose vectors (2·d_proj) join the BiLSTM's states before
        pooling; the classifier is rebuilt for the wider [max; mean] (same default init as nn.Linear's)."""
        n_layers, d_elmo = len(self.mix.scalars), 2 * self.lstm.input_size // 3
        self.mix_out = ScalarMix(n_layers).to(self.mix.scalars.device)
        self.out = Linear(self.out.in_features + 2 * d_elmo, self.out.out_features).to(self.out.weight.device)

    def forward(self, elmo: "ELMo", input_ids, attention_mask=None) -> torch.Tensor:
        lengths = attention_mask.sum(1).long() if attention_mask is not None else None
        with torch.no_grad():  # frozen biLM: features only
            layers = elmo.layers(input_ids, lengths)
        x = layers[0][..., : elmo.cfg.d_proj]  # the context-free token representation
        h, _ = self.lstm(self.drop(torch.cat([x, self.mix(layers)], -1)))  # (B, T, 2·d_lstm)
        if self.mix_out is not None:
            h = torch.cat([h, self.mix_out(layers)], -1)  # (B, T, 2·d_lstm + 2·d_proj)
        m = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).bool()[..., None]
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1)
        top = h.masked_fill(~m, float("-inf")).amax(1)
        return self.out(self.drop(torch.cat([top, mean], -1)))  # (B, num_labels)


class ELMo(LanguageModel):
    traits = Traits(bidirectional=True, bilm=True, scoring="bidirectional_lm")
    Config = ELMoConfig
    tiny = ("model.d_proj=8", "model.d_hidden=16", "model.d_char=4", "model.max_chars=8",
            "model.filters=[[1,4],[2,4]]", "model.vocab_size=50")

    def __init__(self, cfg: ELMoConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.token_encoder not in ("char", "word"):
            raise ValueError(f"token_encoder must be char or word, not {cfg.token_encoder!r}")
        if cfg.n_layer < 1:
            raise ValueError("n_layer must be ≥ 1")
        self.cfg = cfg
        if cfg.token_encoder == "char":
            if cfg.max_chars < 3 or not cfg.filters or any(w > cfg.max_chars for w, _ in cfg.filters):
                raise ValueError("max_chars must be ≥ 3 and ≥ every filter width")
            self.char_cnn = CharCNN(cfg)
            self.register_buffer("char_ids", torch.from_numpy(digit_chars(cfg.vocab_size, cfg.max_chars)))
        else:
            self.wte = nn.Embedding(cfg.vocab_size, cfg.d_proj)
        # nn.LSTM's proj_size is the LSTMP projection h = W_hr (o ⊙ tanh c): hidden d_hidden, output d_proj.
        def stack():
            return nn.ModuleList(nn.LSTM(cfg.d_proj, cfg.d_hidden, batch_first=True, proj_size=cfg.d_proj)
                                 for _ in range(cfg.n_layer))
        self.fwd_lstm, self.bwd_lstm = stack(), stack()
        self.drop = Dropout(cfg.dropout)
        self.softmax = Linear(cfg.d_proj, cfg.vocab_size)
        self.bwd_softmax = None if cfg.share_softmax else Linear(cfg.d_proj, cfg.vocab_size)
        self.mix = ScalarMix(cfg.n_layer + 1)  # the default (equal) mix `encode` uses; learned when finetuned

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    @torch.no_grad()
    def set_token_strings(self, strings: list[str]) -> None:
        """Fill the character table from the tokenizer's vocabulary (id -> token string)."""
        if self.cfg.token_encoder != "char":
            return
        table = np.zeros((self.cfg.vocab_size, self.cfg.max_chars), dtype=np.int16)
        for i, s in enumerate(strings[: self.cfg.vocab_size]):
            b = list(s.encode("utf-8")[: self.cfg.max_chars - 2])
            table[i, : len(b) + 2] = [BOW, *(BYTE0 + c for c in b), EOW]
        self.char_ids.copy_(torch.from_numpy(table))

    def embed_tokens(self, input_ids):
        """(B, T) ids -> (B, T, d_proj), the context-free layer 0."""
        if self.cfg.token_encoder == "char":
            return self.char_cnn(self.char_ids[input_ids])
        return self.wte(input_ids)

    def _directions(self, input_ids, lengths=None):
        """(token layer, [forward layer outputs], [backward layer outputs]), each (B, T, d_proj)."""
        x = self.embed_tokens(input_ids)  # (B, T, P)
        outs = []
        for lstms, rev in ((self.fwd_lstm, False), (self.bwd_lstm, True)):
            # The backward LM is a forward LSTM over the reversed text; its outputs are reversed back.
            h = reverse_padded(x, lengths) if rev else x
            hs = []
            for i, lstm in enumerate(lstms):
                o, _ = lstm(self.drop(h))  # (B, T, P)
                h = o + h if (self.cfg.residual and i > 0) else o
                hs.append(reverse_padded(h, lengths) if rev else h)
            outs.append(hs)
        return x, outs[0], outs[1]

    def forward(self, input_ids: torch.Tensor):
        """(B, T) ids -> (fwd logits, bwd logits), each (B, T, V): fwd[:, t] predicts token t+1, bwd[:, t] t-1."""
        _, f, b = self._directions(input_ids)
        bwd_head = self.bwd_softmax or self.softmax
        return self.softmax(self.drop(f[-1])), bwd_head(self.drop(b[-1]))

    def layers(self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None) -> list[torch.Tensor]:
        """ELMo's 2L+1 representations as its L+1 layers, each (B, T, 2·d_proj): [x; x], then [→h_j; ←h_j].

        With `lengths` (B,), the backward LM reads each row's first lengths[b] tokens only (right padding).
        """
        x, f, b = self._directions(input_ids, lengths)
        return [torch.cat([x, x], -1)] + [torch.cat([fj, bj], -1) for fj, bj in zip(f, b)]

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """`layers` read with the rows' lengths (HasLayerStates): [x; x], then [→h_j; ←h_j]."""
        lengths = attention_mask.sum(1).long() if attention_mask is not None else None
        return self.layers(input_ids, lengths)

    def task_head(self, num_labels: int, dropout: float | None = None) -> ELMoTaskHead:
        """What `plm finetune` trains over this model instead of a linear head on a pooled vector."""
        for p in self.parameters():
            p.requires_grad_(False)
        return ELMoTaskHead(self, num_labels, 0.5 if dropout is None else dropout)

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        """The finetune interface: (scalar-mixed features (B, T, 2·d_proj), their mean over real tokens (B, 2·d_proj))."""
        lengths = attention_mask.sum(1).long() if attention_mask is not None else None
        hidden = self.mix(self.layers(input_ids, lengths))
        m = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).to(hidden.dtype)[..., None]
        return hidden, (hidden * m).sum(1) / m.sum(1).clamp(min=1)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per weight (forward + backward); embeddings and char table excluded.

        A shared softmax runs twice per token, once for each direction's prediction, so it counts twice
        (with share_softmax false each direction's own softmax is already among the parameters).
        """
        n = sum(p.numel() for p in self.parameters())
        n -= self.wte.weight.numel() if self.cfg.token_encoder == "word" else 0
        if self.bwd_softmax is None:
            n += sum(p.numel() for p in self.softmax.parameters())
        return 6 * n
