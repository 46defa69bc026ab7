"""Recurrent LMs: Elman RNN (tanh), LSTM and GRU, trained with truncated BPTT (objective `bptt`).

embedding → n_layer recurrent layers → (projection) → softmax, as in Zaremba, Sutskever & Vinyals 2014,
"Recurrent Neural Network Regularization". Dropout sits only on the non-recurrent connections (the
embeddings, between layers, before the softmax): dropping h_{t-1} → h_t would erase the memory at
every step, which is why plain dropout did not work for RNNs before that paper.

The model is stateful: forward(input_ids, state) returns the next state, the objective carries it
from one BPTT segment to the next, and eval-ppl carries it across the whole text (no windows: plmcli.eval.state).

Transfer (ULMFiT, Howard & Ruder 2018): `token_states` reads each example from a zero state; a sequence
task head concatenates the last state with the max- and mean-pooled states over the real tokens
(`pooling="concat"`), tagging reads every token's state.

Line ends. The `word` tokenizer drops newlines, so a line end must be a token: as Mikolov's and
Zaremba's PTB setup, <eos> ends every line. In training that is `data.doc_per_line: true` (every line a
document, the token stream puts eos after each); eval-ppl appends eos after every non-blank line and
scores it like any word (the PTB convention: the 82,430 test tokens are 78,669 words + 3,761 <eos>).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from plmcli.config_schema import Count, NonNegative, Probability, Size
from plmcli.models.base import LanguageModel, Traits
from plmcli.kernels import Linear
from plmcli.models.layers import Dropout, require_vocab
from plmcli.models.vocab import PadsVocab, VocabHead

CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


@dataclass
class RNNConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    cell: Literal["rnn", "lstm", "gru"] = "lstm"
    """rnn (Elman, tanh) | lstm | gru."""
    n_layer: Size = 2
    """Stacked recurrent layers."""
    d_embed: Size = 200
    """Word embedding size."""
    d_hidden: Size = 200
    """Hidden (and LSTM cell) size of every layer."""
    dropout_embed: Probability = 0.0
    """Dropout on the embeddings entering the first layer."""
    dropout_hidden: Probability = 0.0
    """Dropout between recurrent layers (never on the recurrent connection itself)."""
    dropout_output: Probability = 0.0
    """Dropout on the last layer's output, before the softmax."""
    tie_embeddings: bool = False
    """The softmax shares the embedding matrix (Press & Wolf 2017); with d_embed ≠ d_hidden a linear
    projection d_hidden → d_embed comes first."""
    init_range: NonNegative = 0.1
    """Every parameter starts uniform in ±init_range (Zaremba: 0.1 small, 0.05 medium, 0.04 large)."""


class RNNLM(LanguageModel):
    traits = Traits(causal=True, stateful=True, scoring="state", pooling="concat")
    Config = RNNConfig
    tiny = ("model.d_embed=16", "model.d_hidden=16", "model.vocab_size=50")

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, not {cfg.cell!r}")
        if cfg.n_layer < 1:
            raise ValueError("n_layer must be ≥ 1")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_embed)
        self.drop_embed = Dropout(cfg.dropout_embed)
        # One multi-layer module: torch's fused kernels; its `dropout` is exactly the between-layer one.
        self.rnn = CELLS[cfg.cell](cfg.d_embed, cfg.d_hidden, num_layers=cfg.n_layer, batch_first=True,
                                   dropout=cfg.dropout_hidden if cfg.n_layer > 1 else 0.0)
        self.drop_output = Dropout(cfg.dropout_output)
        d_out = cfg.d_hidden
        self.proj = None
        if cfg.tie_embeddings and cfg.d_embed != cfg.d_hidden:
            self.proj = Linear(cfg.d_hidden, cfg.d_embed, bias=False)
            d_out = cfg.d_embed
        self.lm_head = VocabHead(d_out, cfg.vocab_size, cfg.padded_vocab)
        for p in self.parameters():
            nn.init.uniform_(p, -cfg.init_range, cfg.init_range)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: torch.Tensor, state=None, labels: torch.Tensor | None = None):
        """(B, T) ids, state from the previous segment (None = zeros) -> ((B, T, V) logits, new state);
        with labels (B, T): ((B, T) per-token NLL, new state), the protocol of stateful LMs (objective bptt).

        The state is (h, c), each (n_layer, B, d_hidden), for an LSTM, and h alone for rnn / gru.
        """
        h, state = self.rnn(self.drop_embed(self.wte(input_ids)), state)  # (B, T, H)
        logits = self.state_logits(h)  # (B, T, V)
        if labels is None:
            return logits, state
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view(labels.shape), state

    def token_states(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """(B, T) ids -> (B, T, d_hidden) last-layer states, every row from a zero state: an example's features
        never depend on the rows beside or before it. Right padding comes after every real step of a
        left-to-right RNN, so no mask is needed."""
        return self.rnn(self.drop_embed(self.wte(input_ids)))[0]

    def layer_states(self, input_ids, token_type_ids=None, attention_mask=None) -> list:
        """Each recurrent layer's outputs (B, T, d_hidden), read as `token_states` reads a row (HasLayerStates);
        the embeddings (d_embed wide) are not among them. The fused multi-layer module hides its inner layers,
        so each layer runs as a one-layer module of the same kind on that layer's weights (built on the meta
        device: no memory, no random draws); the last output is token_states' exactly."""
        cfg = self.cfg
        h, states = self.drop_embed(self.wte(input_ids)), []
        for k in range(cfg.n_layer):
            with torch.device("meta"):
                one = CELLS[cfg.cell](cfg.d_embed if k == 0 else cfg.d_hidden, cfg.d_hidden, batch_first=True)
            weights = {f"{n}_l0": getattr(self.rnn, f"{n}_l{k}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            if k > 0:  # the fused module's between-layer dropout
                h = F.dropout(h, cfg.dropout_hidden, self.training)
            h = functional_call(one, weights, (h,))[0]
            states.append(h)
        return states

    def state_logits(self, states: torch.Tensor) -> torch.Tensor:
        """(B, T, d_hidden) states -> (B, T, V) next-token logits (the projection first, when tied through one)."""
        h = self.proj(states) if self.proj is not None else states
        return self.lm_head(self.drop_output(h))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per weight (forward + backward), the embedding lookup excluded."""
        return 6 * (sum(p.numel() for p in self.parameters()) - self.wte.weight.numel() * (not self.cfg.tie_embeddings))
