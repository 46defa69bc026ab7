"""A linear-chain conditional random field over per-word tag scores (Lafferty et al. 2001), the layer
BiLSTM-CRF taggers put on top of their encoder (Huang et al. 2015; Lample et al. 2016).

    score(x, y) = start[y_1] + Σ_t emissions[t, y_t] + Σ_{t>1} transitions[y_{t-1}, y_t] + end[y_n]
    p(y | x)    = exp score(x, y) / Z(x)

log Z by the forward algorithm in log space, the best path by Viterbi; both batched over right-padded
rows (mask (B, T): each row a prefix of ones, at least one). Everything runs in fp32 with autocast off:
log Z is a difference of large sums, where bf16's 8 bits of mantissa would swamp the loss.

Constraints (`bio_constraints`: I-X only after B-X or I-X, never first) make a disallowed transition
score NEG in training (allennlp's constraint mask: finite, so log Z stays finite and the gradient of a
disallowed entry is exactly zero) and -inf in decoding, so Viterbi can only return a valid sequence.
"""

from __future__ import annotations

import torch
from torch import nn

NEG = -1e4
"""A disallowed transition's score while training: exp(-10^4) is 0 in fp32, yet never NaN."""


def bio_constraints(tags) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed (K, K) with allowed[i, j] = tag j may follow tag i, start_allowed (K,)) for IOB2 tags.

    I-X may follow only B-X or I-X and may not begin a sentence; O and B-X are allowed anywhere.
    """
    K = len(tags)
    allowed = torch.ones(K, K, dtype=torch.bool)
    start = torch.ones(K, dtype=torch.bool)
    for j, tag in enumerate(tags):
        if tag.startswith("I-"):
            kind = tag[2:]
            start[j] = False
            for i, prev in enumerate(tags):
                allowed[i, j] = prev in (f"B-{kind}", f"I-{kind}")
    return allowed, start


class LinearChainCRF(nn.Module):
    """Transition scores between K tags, plus scores for the first and the last tag of a sequence."""

    def __init__(self, num_tags: int, allowed: torch.Tensor | None = None, start_allowed: torch.Tensor | None = None,
                 end_allowed: torch.Tensor | None = None):
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags))  # [from, to]
        self.start_transitions = nn.Parameter(torch.empty(num_tags))
        self.end_transitions = nn.Parameter(torch.empty(num_tags))
        for p in (self.transitions, self.start_transitions, self.end_transitions):
            nn.init.uniform_(p, -0.1, 0.1)  # as pytorch-crf: small, so the emissions decide at first
        ones = lambda *s: torch.ones(*s, dtype=torch.bool)  # noqa: E731
        # Not persistent: they follow from the tag set, which the finetuned run's config.json records.
        self.register_buffer("allowed", ones(num_tags, num_tags) if allowed is None else allowed.bool(), persistent=False)
        self.register_buffer("start_allowed", ones(num_tags) if start_allowed is None else start_allowed.bool(),
                             persistent=False)
        self.register_buffer("end_allowed", ones(num_tags) if end_allowed is None else end_allowed.bool(), persistent=False)

    def _potentials(self, disallowed: float):
        """(start (K,), transitions (K, K), end (K,)) in fp32 with disallowed entries set to `disallowed`."""
        return (self.start_transitions.float().masked_fill(~self.start_allowed, disallowed),
                self.transitions.float().masked_fill(~self.allowed, disallowed),
                self.end_transitions.float().masked_fill(~self.end_allowed, disallowed))

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z (B,) of emissions (B, T, K) under mask (B, T): the forward algorithm."""
        with torch.autocast(emissions.device.type, enabled=False):
            em, mask = emissions.float(), mask.bool()
            start, trans, end = self._potentials(NEG)
            alpha = start + em[:, 0]  # (B, K): log-sum of every path ending in each tag
            for t in range(1, em.shape[1]):
                # (B, K_prev, 1) + (K_prev, K) + (B, 1, K) -> sum out the previous tag
                nxt = torch.logsumexp(alpha[:, :, None] + trans + em[:, t, None, :], dim=1)
                alpha = torch.where(mask[:, t, None], nxt, alpha)  # a padded step changes nothing
            return torch.logsumexp(alpha + end, dim=1)

    def path_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """score(x, y) (B,) of tag sequences `tags` (B, T); entries under mask 0 are ignored."""
        with torch.autocast(emissions.device.type, enabled=False):
            em, m = emissions.float(), mask.bool()
            start, trans, end = self._potentials(NEG)
            y = tags.masked_fill(~m, 0).long()
            emit = em.gather(2, y[..., None]).squeeze(-1)  # (B, T)
            step = trans[y[:, :-1], y[:, 1:]]  # (B, T-1): transition into position t
            last = y.gather(1, (m.sum(1).long() - 1).clamp(min=0)[:, None]).squeeze(1)  # (B,)
            mf = m.float()
            return start[y[:, 0]] + (emit * mf).sum(1) + (step * mf[:, 1:]).sum(1) + end[last]

    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """-log p(tags | emissions) per sequence, (B,)."""
        return self.log_partition(emissions, mask) - self.path_score(emissions, tags, mask)

    @torch.no_grad()
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Viterbi: the highest-scoring valid tag sequence per row, (B, T) with -1 under mask 0."""
        with torch.autocast(emissions.device.type, enabled=False):
            em, mask = emissions.float(), mask.bool()
            B, T, K = em.shape
            start, trans, end = self._potentials(float("-inf"))
            score = start + em[:, 0]  # (B, K): best path ending in each tag
            keep = torch.arange(K, device=em.device).expand(B, K)
            backpointers = []
            for t in range(1, T):
                best, prev = (score[:, :, None] + trans).max(dim=1)  # (B, K) over the previous tag
                on = mask[:, t, None]
                score = torch.where(on, best + em[:, t], score)
                backpointers.append(torch.where(on, prev, keep))  # padded steps point to themselves
            tag = (score + end).argmax(dim=1)  # (B,)
            path = [tag]
            for bp in reversed(backpointers):
                tag = bp.gather(1, tag[:, None]).squeeze(1)
                path.append(tag)
            out = torch.stack(path[::-1], dim=1)  # (B, T)
            return out.masked_fill(~mask, -1)
