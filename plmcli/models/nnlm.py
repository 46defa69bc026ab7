"""NNLM: Bengio, Ducharme, Vincent & Jauvin 2003, "A Neural Probabilistic Language Model" (JMLR 3).

P(w_t | w_{t-n+1} .. w_{t-1}) = softmax(b + W·x + U·tanh(d + H·x)), where x is the concatenation of the
n-1 previous words' feature vectors C(w) (m each). W is the paper's optional "direct connections" from
the word features to the output; h is the hidden size. Names follow the paper: n = order, m = d_embed,
h = d_hidden.

It is an ordinary causal LM over a whole sequence: position t predicts t+1 from tokens t-n+2 .. t, so the
`clm` objective trains it unchanged. At the start of a sequence the missing words are zero vectors.
There are no positions, so any length is fine (max_positions is only a large bound for callers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Count, NonNegative, Probability, Range, Size
from plmcli.models.base import LanguageModel, Traits
from plmcli.kernels import Linear
from plmcli.models.layers import Dropout, require_vocab
from plmcli.models.vocab import PadsVocab, VocabHead


@dataclass
class NNLMConfig(PadsVocab):
    vocab_size: Count = 0
    """Vocabulary size; 0 = take it from the tokenizer."""
    order: Annotated[int, Range(2)] = 5
    """n: each word is predicted from the n-1 words before it."""
    d_embed: Size = 60
    """m: word feature vector size."""
    d_hidden: Size = 50
    """h: tanh hidden units."""
    direct: bool = True
    """Direct connections W from the concatenated word features to the output (the paper's W)."""
    dropout: Probability = 0.0
    """Dropout on the concatenated features and the hidden layer (not in the paper; 0 = off)."""
    init_range: NonNegative = 0.1
    """Embeddings start uniform in ±init_range; linear layers use torch's fan-in default."""


class NNLM(LanguageModel):
    traits = Traits(causal=True, scoring="fixed_context")
    Config = NNLMConfig
    tiny = ("model.d_embed=8", "model.d_hidden=16", "model.vocab_size=50")
    max_positions = 1 << 20

    def __init__(self, cfg: NNLMConfig):
        super().__init__()
        require_vocab(cfg)
        if cfg.order < 2:
            raise ValueError(f"order must be ≥ 2 (a word predicted from at least one previous word), not {cfg.order}")
        self.cfg = cfg
        d_in = (cfg.order - 1) * cfg.d_embed
        V, rows = cfg.vocab_size, cfg.padded_vocab
        self.wte = nn.Embedding(rows, cfg.d_embed)  # C
        self.hidden = Linear(d_in, cfg.d_hidden)  # d + H·x
        self.lm_head = VocabHead(cfg.d_hidden, V, rows)  # b + U·a
        self.direct = VocabHead(d_in, V, rows, bias=False) if cfg.direct else None  # W·x
        self.drop = Dropout(cfg.dropout)
        nn.init.uniform_(self.wte.weight, -cfg.init_range, cfg.init_range)
        if self.direct is not None:
            nn.init.zeros_(self.direct.weight)  # start as the plain MLP; the shortcut is learned

    def context(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, (n-1)·m): at t, the features of tokens t-n+2 .. t, oldest first."""
        B, T = input_ids.shape
        n1, m = self.cfg.order - 1, self.cfg.d_embed
        e = self.wte(input_ids)  # (B, T, m)
        e = F.pad(e, (0, 0, n1 - 1, 0))  # (B, T+n-2, m): zero vectors before the first token
        return e.unfold(1, n1, 1).transpose(2, 3).reshape(B, T, n1 * m)  # windows (B, T, m, n-1) -> (B, T, (n-1)m)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) -> (B, T, V) next-token logits; with `labels` (B, T) (-100 = not scored) their mean
        cross-entropy, as objective `clm` asks of every causal LM."""
        x = self.drop(self.context(input_ids))  # (B, T, (n-1)m)
        a = self.drop(torch.tanh(self.hidden(x)))  # (B, T, h)
        logits = self.lm_head(a)  # (B, T, V)
        if self.direct is not None:
            logits = logits + self.direct(x)
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per weight (forward + backward), the embedding lookup excluded."""
        return 6 * (sum(p.numel() for p in self.parameters()) - self.wte.weight.numel())
