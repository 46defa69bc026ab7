"""The per-head statistics of `plm attention` (Clark et al. 2019, "What Does BERT Look At?", §3–4).

Each is a mean over query positions, summed batch by batch (token-weighted over a whole corpus):
    entropy           −Σ_j α_ij ln α_ij in nats, over every real query
    next / previous   α_i,i+1 / α_i,i−1, over the queries that have that neighbour (next: encoders only)
    cls / sep / self  Σ α_ij over the [CLS] / [SEP] keys, α_ii, over every real query
    same_token        Σ α_ij over the other positions j ≠ i holding the same token id, over the queries
                      whose token occurs again (a causal query: earlier, the only keys it sees). Special
                      tokens ([CLS], [SEP], bos/eos, pad) are neither such queries nor such keys: the
                      [SEP] pattern counts them.
    same_token_other  the same, counting only occurrences in the other sentence of a pair (segment ids
                      differ); over the queries whose token occurs in the other sentence
    same_word(_other) the same for words: Σ α_ij over the tokens of the other occurrences of the word that
                      query i's token belongs to (its own word's other pieces do not count). Words are the
                      tokenizer's pre-tokens ("cats" = ca ##ts in WordPiece, " cat" in byte-level BPE; a
                      character tokenizer's words are its characters), one word = one decoded text, so the
                      leading space of a byte-level BPE word does not make it another word
    same_word_pieces  Σ α_ij over the other pieces of query i's own word (straw ↔ ##berries, §4: heads that
                      join a split word), over the queries whose word has another piece (causal: an earlier one)
    punct             Σ α_ij over punctuation keys, over every real query: a token is punctuation when its
                      decoded text is every character in a Unicode punctuation category (P*: . , ; ! ? «
                      — 。 、 …); symbols ($ + =, category S*) are not
    breadth           mean entropy / mean entropy of uniform attention over the same queries (ln of the
                      keys each query sees: ln T for an encoder row, ln(i + 1) at causal row i): 1 is
                      uniform ("bag of vectors", §3.3), 0 one-hot. A head is broad at ≥ BROAD.
Conditioning same_token on the queries that have another occurrence keeps the number readable as "when
the token recurs, this share of attention goes to its twin", not diluted by how often text repeats.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

import torch

PATTERNS = ("entropy", "next", "previous", "cls", "sep", "self", "same_token", "same_token_other", "same_word",
            "same_word_other", "same_word_pieces", "punct", "breadth")
BROAD = 0.9
"""A head whose mean entropy reaches this share of uniform attention's entropy is listed as broad."""


def is_punctuation(text: str) -> bool:
    """Every character of the token's text (surrounding whitespace dropped) is in a Unicode P* category."""
    text = text.strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def punctuation_ids(tok, ids: Iterable[int], special: Iterable[int]) -> list[int]:
    """The ids among `ids` whose decoded text is punctuation. Decoded, not the vocabulary entry: byte-level
    BPE writes " ," as "Ġ," and SentencePiece as "▁,", and neither marker is punctuation."""
    special = set(special)
    return sorted(i for i in set(ids) if i not in special and is_punctuation(tok.decode([i], skip_special_tokens=False)))


def word_classes(tok, texts: list[str], classes: dict[str, int]) -> list[tuple[list[int], list[int]]]:
    """Per text, for each of its tokens (as encoded without special tokens): the class of the word it belongs
    to (an id per distinct decoded word text, kept in `classes` across calls) and which word of the text it
    is (0, 1, …); −1 for both on a token of no word (a whitespace character)."""
    out = []
    for e in tok.encode_batch(texts, add_special_tokens=False):
        spans: dict[int, list[int]] = {}  # word index -> its token positions
        for t, w in enumerate(e.word_ids):
            if w is not None:
                spans.setdefault(w, []).append(t)
        words = list(spans.values())
        names = tok.decode_batch([[e.ids[t] for t in span] for span in words], skip_special_tokens=False) if words else []
        cls, occ = [-1] * len(e.ids), [-1] * len(e.ids)
        for k, (span, name) in enumerate(zip(words, names)):
            if name.strip():
                for t in span:
                    cls[t], occ[t] = classes.setdefault(name.strip(), len(classes)), k
        out.append((cls, occ))
    return out


def twin_keys(classes: torch.Tensor, occurrence: torch.Tensor, content: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, T, T) bool: key j is in another occurrence (occurrence_j ≠ occurrence_i) of query i's class
    (a token id, or a word); both are content tokens; causal: j < i only, the keys row i can see."""
    T = classes.shape[1]
    keys = ((classes[:, :, None] == classes[:, None, :]) & (occurrence[:, :, None] != occurrence[:, None, :])
            & content[:, :, None] & content[:, None, :])
    return (keys & torch.ones(T, T, dtype=torch.bool, device=classes.device).tril(-1)) if causal else keys


def piece_keys(occurrence: torch.Tensor, content: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, T, T) bool: key j ≠ i is another piece of query i's own word (the same word occurrence); both are
    content tokens; causal: j < i only."""
    T = occurrence.shape[1]
    keys = (occurrence[:, :, None] == occurrence[:, None, :]) & content[:, :, None] & content[:, None, :]
    ones = torch.ones(T, T, dtype=torch.bool, device=occurrence.device)
    return keys & (ones.tril(-1) if causal else ~ones.diag().diag_embed())  # not the query itself


class PatternSums:
    """Running sums of the patterns per layer × head, and how many queries each is averaged over."""

    def __init__(self):
        self.sums: dict[str, dict[int, torch.Tensor]] = {}  # pattern -> layer -> (H,) sums
        self.counts: dict[str, float] = {}
        self.uniform = 0.0
        """Σ over real queries of ln(keys the query sees): the entropy uniform attention would have."""

    def add(self, maps: list[torch.Tensor], real: torch.Tensor, cls_keys: torch.Tensor | None,
            sep_keys: torch.Tensor | None, causal: bool, *, ids: torch.Tensor | None = None,
            special: torch.Tensor | None = None, segments: torch.Tensor | None = None,
            words: tuple[torch.Tensor, torch.Tensor] | None = None, punct_keys: torch.Tensor | None = None) -> None:
        """maps: per layer (B, H, T, T) probabilities; real (B, T) bool, right padding; cls_keys / sep_keys
        (B, T) bool: the keys each of those patterns counts (None: n/a). ids (B, T) with special (B, T)
        bool: same_token (None: n/a); words (B, T) word class and word occurrence, −1 on tokens of no word:
        same_word and same_word_pieces; with segments (B, T) also the _other variants; punct_keys (B, T) bool."""
        terms = _terms(real, cls_keys, sep_keys, causal, punct_keys)
        if ids is not None:
            content = real if special is None else real & ~special
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # each token its own occurrence
            terms |= _twins("same_token", twin_keys(ids, positions, content, causal), segments)
        if words is not None:
            content = real & (words[0] >= 0) if special is None else real & (words[0] >= 0) & ~special
            terms |= _twins("same_word", twin_keys(*words, content, causal), segments)
            terms["same_word_pieces"] = _keyed(piece_keys(words[1], content, causal))
        for layer, A in enumerate(maps):  # one layer at a time: (L, B, H, T, T) at once can be gigabytes
            for name, (weight, value) in terms.items():
                total = (value(A) * weight).double().sum(dim=(0, 2))  # (B, H, T) -> (H,)
                self.sums.setdefault(name, {})[layer] = self.sums.get(name, {}).get(layer, 0.0) + total.cpu()
        for name, (weight, _) in terms.items():
            self.counts[name] = self.counts.get(name, 0.0) + float(weight.sum())
        T = real.shape[1]
        seen = torch.arange(1, T + 1, device=real.device)[None, :] if causal else real.sum(1, keepdim=True)
        self.uniform += float((seen.double().clamp(min=1).log() * real).sum())

    def uniform_entropy(self) -> float | None:
        """Mean over the queries of the entropy uniform attention has there (nats)."""
        return self.uniform / self.counts["entropy"] if self.counts.get("entropy") else None

    def rows(self) -> list[dict]:
        """One dict per layer × head: layer, head (from 1) and each pattern's mean (None = n/a)."""
        def mean(p, layer, head):
            return float(self.sums[p][layer][head] / self.counts[p]) if self.counts.get(p) else None

        uniform = self.uniform_entropy()
        first = self.sums["entropy"]
        rows = []
        for layer in sorted(first):
            for h in range(len(first[layer])):
                row = {"layer": layer + 1, "head": h + 1, **{p: mean(p, layer, h) for p in PATTERNS if p != "breadth"}}
                row["breadth"] = row["entropy"] / uniform if uniform else None  # one token: nothing to spread over
                rows.append(row)
        return rows


def _terms(real, cls_keys, sep_keys, causal, punct_keys) -> dict:
    """pattern -> (weight (B, 1, T'): the queries it averages over, A (B, H, T, T) -> its value per query)."""
    q = real[:, None, :].float()  # (B, 1, T): real query rows
    terms = {"entropy": (q, lambda A: torch.special.entr(A).sum(-1)),
             "self": (q, lambda A: A.diagonal(dim1=-2, dim2=-1)),
             "previous": (q[..., 1:], lambda A: A.diagonal(-1, dim1=-2, dim2=-1))}  # α_{i+1, i}: queries 1..T−1
    if not causal:
        both = (real[:, :-1] & real[:, 1:])[:, None, :].float()  # queries whose next token is real
        terms["next"] = (both, lambda A: A.diagonal(1, dim1=-2, dim2=-1))  # α_{i, i+1}
    for name, keys in (("cls", cls_keys), ("sep", sep_keys), ("punct", punct_keys)):
        if keys is not None:
            terms[name] = (q, _mass_on(keys))
    return terms


def _twins(name: str, keys: torch.Tensor, segments: torch.Tensor | None) -> dict:
    """The pattern `name` over twin keys (B, T, T), and with segments NAME_other: only those across the [SEP]."""
    terms = {name: _keyed(keys)}
    if segments is not None:
        terms[f"{name}_other"] = _keyed(keys & (segments[:, :, None] != segments[:, None, :]))
    return terms


def _mass_on(keys: torch.Tensor):
    """Σ_j α_ij over the keys marked in (B, T)."""
    return lambda A: (A @ keys[:, None, :, None].to(A.dtype)).squeeze(-1)


def _keyed(keys: torch.Tensor):
    """(queries that have a key, Σ_j α_ij over query i's own keys) for keys (B, T, T) chosen per query."""
    return keys.any(-1)[:, None, :].float(), lambda A: torch.einsum("bhij,bij->bhi", A, keys.to(A.dtype))


def summarize(rows: list[dict]) -> dict:
    """Per pattern, the head that shows it most: {pattern: {layer, head, value}} (None when n/a);
    for entropy the broadest head, and the sharpest as entropy_min."""
    out = {}
    for p in PATTERNS:
        have = [r for r in rows if r[p] is not None]
        best = max(have, key=lambda r: r[p]) if have else None
        out[p] = {"layer": best["layer"], "head": best["head"], "value": best[p]} if best else None
    low = min(rows, key=lambda r: r["entropy"])
    out["entropy_min"] = {"layer": low["layer"], "head": low["head"], "value": low["entropy"]}
    return out


def broad_heads(rows: list[dict], threshold: float = BROAD) -> list[dict]:
    """The heads whose breadth reaches `threshold`, broadest first: {layer, head, entropy, breadth}."""
    broad = [r for r in rows if r["breadth"] is not None and r["breadth"] >= threshold]
    return [{k: r[k] for k in ("layer", "head", "entropy", "breadth")} for r in sorted(broad, key=lambda r: -r["breadth"])]
