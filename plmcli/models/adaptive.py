"""Adaptive input (Baevski & Auli 2019) and adaptive softmax (Grave et al. 2017), as Transformer-XL uses them.

The vocabulary, sorted by frequency, is cut at `cutoffs` into clusters: the head (most frequent words)
and tail clusters of rarer words. Cluster i gets an embedding of size d_embed // div_val**i and a
projection to d_proj, so rare words spend fewer parameters. The softmax mirrors it: the head scores its
words plus one logit per tail cluster; a tail word's log-probability is log p(cluster) + log p(word |
cluster). Training only computes the tail clusters its targets fall in, which is what makes a 267k
vocabulary (WikiText-103) affordable.

With `tie_weights` the softmax reuses the embedding matrices, and with `tie_projs` their projections
(Transformer-XL ties both). Our vocabularies come from `tokenizers`, whose ids are not frequency sorted:
the word-level tokenizer assigns ids by descending count after the special tokens, which is what the
cutoffs assume (plmcli.data.tokenizers).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.models import device as devices
from plmcli.kernels import linear
from plmcli.models.vocab import real_columns


def cluster_bounds(vocab_size: int, cutoffs) -> list[int]:
    """[0, c1, c2, ..., vocab_size]; cutoffs must be increasing and inside the vocabulary."""
    bounds = [0, *cutoffs, vocab_size]
    if any(b >= c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(f"cutoffs {list(cutoffs)} must increase strictly and stay below vocab_size {vocab_size}")
    return bounds


def cluster_rows(ids: torch.Tensor, bounds: list[int]) -> list[torch.Tensor | None]:
    """Per cluster [lo, hi) of `bounds`: the flat positions of `ids` that fall in it, ascending (None: none do).

    How many fall in each cluster sizes the tensors that follow; it is counted on the host, from the host's copy of
    the ids where the batch brought one (models/device.py: values_of), else from a copy read back from the device
    (one read, where a boolean mask per cluster would make a GPU report its count for each)."""
    host = devices.values_of(ids)
    if host is None:
        host = ids.cpu().numpy()
    counts = np.bincount(np.searchsorted(bounds, host.ravel(), side="right") - 1, minlength=len(bounds) - 1)
    flat = ids.flatten()
    return [torch.nonzero_static((flat >= lo) & (flat < hi), size=int(n)).squeeze(1) if n else None
            for lo, hi, n in zip(bounds, bounds[1:], counts)]


class AdaptiveEmbedding(nn.Module):
    """(B, T) ids -> (B, T, d_proj) embeddings, scaled by √d_proj as Transformer-XL."""

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs=(), div_val: int = 1, init_std: float = 0.02):
        super().__init__()
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.d_proj, self.scale = d_proj, d_proj**0.5
        dims = [d_embed // div_val**i for i in range(len(self.bounds) - 1)]
        self.layers = nn.ModuleList(nn.Embedding(hi - lo, d) for lo, hi, d in zip(self.bounds, self.bounds[1:], dims))
        # A projection only where the cluster's size differs from d_proj (Transformer-XL's rule).
        self.projs = nn.ParameterList(
            nn.Parameter(torch.empty(d_proj, d)) if d != d_proj else nn.Parameter(torch.empty(0)) for d in dims
        )
        for emb in self.layers:
            nn.init.normal_(emb.weight, 0.0, init_std)
        for p in self.projs:
            if p.numel():
                nn.init.normal_(p, 0.0, init_std / 2)  # Transformer-XL's proj_init_std 0.01 at init_std 0.02

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if len(self.layers) == 1:
            x = self.layers[0](ids)
            return self._project(x, 0) * self.scale
        out = torch.zeros(ids.numel(), self.d_proj, dtype=self.layers[0].weight.dtype, device=ids.device)
        flat = ids.flatten()
        for i, (lo, rows) in enumerate(zip(self.bounds, cluster_rows(ids, self.bounds))):
            if rows is not None:
                out.index_put_((rows,), self._project(self.layers[i](flat.index_select(0, rows) - lo), i).to(out.dtype))
        return out.view(*ids.shape, self.d_proj) * self.scale

    def _project(self, x, i):
        p = self.projs[i]
        return linear(x, p) if p.numel() else x


class AdaptiveSoftmax(nn.Module):
    """Hidden states (N, d_proj) -> log-probabilities, for all words or for given targets only."""

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs=(), div_val: int = 1, init_std: float = 0.02,
                 tie_to: AdaptiveEmbedding | None = None, tie_projs: bool = True, padded_vocab: int = 0):
        """`padded_vocab` > vocab_size: a full softmax (no cutoffs) with that many rows, its logits cut back to
        vocab_size (plmcli.models.vocab); clusters are sized by the words themselves, so they take no padding."""
        super().__init__()
        if padded_vocab > vocab_size and cutoffs:
            raise ValueError(f"an adaptive softmax (cutoffs {list(cutoffs)}) takes no vocabulary padding")
        self.vocab_size = vocab_size
        self.bounds = cluster_bounds(max(vocab_size, padded_vocab), cutoffs)
        self.n_clusters = len(self.bounds) - 2
        dims = [d_embed // div_val**i for i in range(len(self.bounds) - 1)]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(hi - lo)) for lo, hi in zip(self.bounds, self.bounds[1:]))
        self.projs = nn.ParameterList()
        for i, d in enumerate(dims):
            size = self.bounds[i + 1] - self.bounds[i]
            w = tie_to.layers[i].weight if tie_to is not None else nn.Parameter(torch.randn(size, d) * init_std)
            self.weights.append(w)
            if d == d_proj:
                self.projs.append(nn.Parameter(torch.empty(0)))
            elif tie_to is not None and tie_projs:
                self.projs.append(tie_to.projs[i])
            else:
                self.projs.append(nn.Parameter(torch.randn(d_proj, d) * init_std / 2))
        # One extra head logit per tail cluster: log p(cluster | h).
        self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, dims[0]))
        self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))

    def flops_per_token(self) -> float:
        """Training FLOPs per scored token (6 per multiply-add): the head for every token, tail cluster i for
        the share of tokens whose target falls in it. Vocabularies for adaptive softmax are sorted by
        frequency, so that share is taken from Zipf's law, P(rank r) ∝ 1/r (WikiText-103's cutoffs
        20k/40k/200k send 5.3% and 12.3% of tokens to the last two clusters), not from a corpus the model has not seen."""
        def harmonic(n: int) -> float:
            return math.log(n) + 0.5772156649 + 1 / (2 * n) if n else 0.0

        V = self.bounds[-1]
        macs = 0.0
        for i in range(self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            d = self.weights[i].shape[1]
            per = self.projs[i].numel() + d * (hi - lo + (self.n_clusters if i == 0 else 0))
            macs += per * (1.0 if i == 0 else (harmonic(hi) - harmonic(lo)) / harmonic(V))
        return 6 * macs

    def _logits(self, h, i):
        p = self.projs[i]
        if p.numel():
            h = h @ p  # (N, d_proj) @ (d_proj, d_i): into the cluster's embedding space
        w, b = self.weights[i], self.biases[i]
        if i == 0 and self.n_clusters:
            w, b = torch.cat([w, self.cluster_weight]), torch.cat([b, self.cluster_bias])
        return linear(h, w, b) if self.n_clusters else real_columns(linear(h, w, b), self.vocab_size)

    def log_prob(self, h: torch.Tensor) -> torch.Tensor:
        """(N, d_proj) -> (N, V) log-probabilities of every word (evaluation, generation)."""
        head = F.log_softmax(self._logits(h, 0).float(), -1)
        if not self.n_clusters:
            return head
        parts = [head[:, : self.bounds[1]]]
        for i in range(1, self.n_clusters + 1):
            cluster = head[:, self.bounds[1] + i - 1 : self.bounds[1] + i]  # (N, 1) log p(cluster i)
            parts.append(cluster + F.log_softmax(self._logits(h, i).float(), -1))
        return torch.cat(parts, -1)

    def nll(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(N, d_proj), (N,) -> (N,) negative log-likelihoods; tail clusters run only on their own targets."""
        head = F.log_softmax(self._logits(h, 0).float(), -1)
        if not self.n_clusters:
            return -head.gather(1, target[:, None]).squeeze(1)
        in_head = target < self.bounds[1]
        nll = -head.gather(1, torch.where(in_head, target, 0)[:, None]).squeeze(1) * in_head
        for i, rows in enumerate(cluster_rows(target, self.bounds)[1:], start=1):
            if rows is None:
                # A zero that still reaches the cluster's weights: DDP waits for a gradient of every
                # parameter, and a batch without rare words would otherwise leave this cluster out.
                nll = nll + 0.0 * self._logits(h[:1], i).sum()
                continue
            tail = F.log_softmax(self._logits(h.index_select(0, rows), i).float(), -1)
            word = tail.gather(1, (target.index_select(0, rows) - self.bounds[i])[:, None]).squeeze(1)
            nll = nll.index_put((rows,), -(head[rows, self.bounds[1] + i - 1] + word))
        return nll

