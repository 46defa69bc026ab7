"""make-mlm-data's instances: BERT's create_pretraining_data pairing (NSP / SOP) and RoBERTa's packing
(FULL-SENTENCES / DOC-SENTENCES) as token ranges, and their assembly into padded [CLS] A [SEP] B [SEP] rows.

`flat` is one split of the corpus as flat arrays (`mlm_data._Flat`): tokens, word starts (ws), sentence
start offsets (sent, then the end) and each document's first sentence (doc, then the end). Instances are
(a_start, a_len, b_start, b_len, label) arrays of offsets into `flat.tokens`.
"""

from __future__ import annotations

import numpy as np


def pair_instances(flat, lo: int, hi: int, rng: np.random.Generator, cfg: dict):
    """NSP/SOP instances of documents lo..hi-1 as (a_start, a_len, b_start, b_len, label) arrays.

    Everything is per sentence or per chunk in numpy; the one sequential part — where the next chunk starts,
    which depends on whether this one put sentences back — is a scalar loop over pre-drawn numbers.
    """
    max_tokens = cfg["max_seq_len"] - 3
    sop = cfg["pairs"] == "sop"
    doc = np.asarray(flat.doc[lo: hi + 1])
    st = np.asarray(flat.sent[doc[0]: doc[-1] + 1])  # sentence starts of the shard, then its end
    S = len(st) - 1
    per_doc = np.diff(doc)
    doc_end = np.repeat(doc[1:] - doc[0], per_doc)  # per sentence: its document's end (local sentence index)
    target = np.full(hi - lo, max_tokens, dtype=np.int64)
    short = rng.random(hi - lo) < cfg["short_seq_prob"]  # once per document, as in Google's code
    target[short] = rng.integers(2, max_tokens + 1, int(short.sum()))
    target = np.repeat(target, per_doc)
    # A chunk starting at sentence i runs until its length reaches the target (or the document ends).
    chunk_end = np.minimum(np.searchsorted(st, st[:-1] + target), doc_end)
    u_split, u_random = rng.random(S), rng.random(S)  # per sentence: each starts at most one chunk
    m_all = chunk_end - np.arange(S)
    if sop:
        starts = _chain(chunk_end)  # no sentences go back: chunk starts follow from the ends alone
        random_b = np.zeros(len(starts), dtype=bool)
    else:
        # NSP: a one-sentence chunk, or half the others, takes a random B and puts the unused sentences back.
        split_at = np.arange(S) + np.where(m_all >= 2, 1 + (u_split * (m_all - 1)).astype(np.int64), 1)
        random_b = (m_all == 1) | (u_random < 0.5)
        starts = _chain(np.where(random_b, split_at, chunk_end))
        random_b = random_b[starts]
    m, e = m_all[starts], chunk_end[starts]
    a_end = starts + np.where(m >= 2, 1 + (u_split[starts] * (m - 1)).astype(np.int64), 1)
    a_s, a_l = st[starts], st[a_end] - st[starts]
    b_s, b_l = st[a_end], st[e] - st[a_end]
    label = np.zeros(len(starts), dtype=np.int64)
    if sop:
        one = m == 1  # one sentence: split it at a random word boundary
        cut = _split_points(flat, a_s[one], a_l[one], rng)
        b_s[one], b_l[one], a_l[one] = a_s[one] + cut, a_l[one] - cut, cut
        keep = ~one
        keep[one] = cut > 0  # a one-token sentence cannot be split
        label = (rng.random(len(starts)) < 0.5).astype(np.int64)  # swapped order is the negative
        a_s, a_l, b_s, b_l = (np.where(label == 1, y, x) for x, y in ((a_s, b_s), (a_l, b_l), (b_s, a_s), (b_l, a_l)))
        a_s, a_l, b_s, b_l, label = (x[keep] for x in (a_s, a_l, b_s, b_l, label))
    else:
        label[random_b] = 1  # B is a random segment of another document
        d = np.searchsorted(doc[1:] - doc[0], starts[random_b], side="right") + lo
        b_s[random_b], b_l[random_b] = _random_segments(flat, d, target[starts[random_b]] - a_l[random_b], rng)
    _truncate_pairs(a_s, a_l, b_s, b_l, max_tokens, rng)
    return a_s, a_l, b_s, b_l, label


def _chain(nxt: np.ndarray) -> np.ndarray:
    """Chunk starts 0, nxt[0], nxt[nxt[0]], ... below len(nxt): the walk is sequential, so plain Python ints."""
    step, out, i, n = nxt.tolist(), [], 0, len(nxt)
    while i < n:
        out.append(i)
        i = step[i]
    return np.array(out, dtype=np.int64)


def _split_points(flat, start: np.ndarray, length: np.ndarray, rng) -> np.ndarray:
    """A random word boundary strictly inside each range (any token boundary when the range is one word); 0 when length < 2."""
    cut = np.zeros(len(start), dtype=np.int64)
    u = rng.random(len(start))
    for r in np.flatnonzero(length >= 2).tolist():  # one-sentence chunks are rare: a loop over them is cheap
        s, n = int(start[r]), int(length[r])
        cuts = np.flatnonzero(flat.ws[s + 1: s + n]) + 1
        if not len(cuts):
            cuts = np.arange(1, n)
        cut[r] = cuts[int(u[r] * len(cuts))]
    return cut


def _random_segments(flat, d: np.ndarray, want: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk of document d: sentences of another random document from a random sentence on, until
    `want` tokens (at least one sentence, at most to that document's end)."""
    if flat.n_docs > 1:
        r = rng.integers(flat.n_docs - 1, size=len(d))
        r += r >= d
    else:
        r = d.copy()
    s0, s1 = np.asarray(flat.doc[r]), np.asarray(flat.doc[r + 1])
    s = s0 + (rng.random(len(d)) * (s1 - s0)).astype(np.int64)
    sent = flat.sent
    start = np.asarray(sent[s])
    k = np.clip(np.searchsorted(sent, start + want) - s, 1, s1 - s)
    return start, np.asarray(sent[s + k]) - start


def _truncate_pairs(a_s, a_l, b_s, b_l, max_tokens: int, rng) -> None:
    """truncate_seq_pair in place: drop from the longer side (B on ties), each drop from its front or back."""
    extra = np.maximum(a_l + b_l - max_tokens, 0)
    diff = a_l - b_l
    ra = np.where(diff > 0, np.minimum(extra, diff), 0)
    rb = np.where(diff < 0, np.minimum(extra, -diff), 0)
    rest = extra - ra - rb  # once equal, drops alternate starting with B
    rb += (rest + 1) // 2
    ra += rest // 2
    a_s += rng.binomial(ra, 0.5)
    b_s += rng.binomial(rb, 0.5)
    a_l -= ra
    b_l -= rb


def packed_instances(flat, lo: int, hi: int, cfg: dict):
    """RoBERTa FULL-SENTENCES: whole sentences packed across documents, a separator between documents;
    with cfg cross_documents false, DOC-SENTENCES: blocks never cross a document boundary (shorter blocks).

    Positions are "extended": token t of document d sits at t + d, leaving a slot for the separator
    before each document, so every block is one contiguous range. Sentences longer than a block are cut.
    """
    cap = cfg["max_seq_len"] - 2
    doc = np.asarray(flat.doc[lo: hi + 1])
    st = np.asarray(flat.sent[doc[0]: doc[-1] + 1])
    d_of = np.repeat(np.arange(lo, hi), np.diff(doc))
    s_ext, e_ext = st[:-1] + d_of, st[1:] + d_of
    pieces = -(-(e_ext - s_ext) // cap)
    idx = np.repeat(np.arange(len(s_ext)), pieces)
    within = np.arange(len(idx)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    item_s = s_ext[idx] + within * cap
    item_e = np.minimum(item_s + cap, e_ext[idx])
    # DOC-SENTENCES: a block also ends where its document does (the item after is another document's first).
    stop = np.searchsorted(d_of[idx], d_of[idx], side="right").tolist() if not cfg.get("cross_documents", True) else None
    starts_l, ends_l = item_s.tolist(), item_e.tolist()
    blocks = []
    i, n = 0, len(item_s)
    while i < n:
        j = int(np.searchsorted(item_e, starts_l[i] + cap, side="right"))
        if stop is not None:
            j = min(j, stop[i])
        blocks.append((starts_l[i], ends_l[j - 1]))
        i = j
    a_s = np.array([b[0] for b in blocks], dtype=np.int64)
    a_l = np.array([b[1] - b[0] for b in blocks], dtype=np.int64)
    zeros = np.zeros(len(blocks), dtype=np.int64)
    return a_s, a_l, zeros, zeros, zeros - 1


# ----------------------------------------------------------------------------- assembling and masking


def assemble(flat, a_s, a_l, b_s, b_l, paired: bool, lo: int, hi: int, ids: dict, words: bool = True):
    """Padded (N, T) ids, special, word starts (None unless `words`), the flat token types of the real
    tokens, and the lengths of [CLS] A [SEP] (B [SEP]).

    Every content slot reads flat.tokens[c + offset] with one offset per segment, so the whole batch is
    one gather; the few special slots are then written by column.
    """
    lengths = 2 + a_l + (b_l + 1 if paired else 0)
    N, T = len(a_s), int(lengths.max())
    # Offsets into the split's token array: int32 while they fit (half the memory traffic of int64).
    dtype = np.int32 if len(flat.tokens) + T < 2**31 else np.int64
    c = np.arange(T, dtype=dtype)
    al, rows = a_l[:, None], np.arange(N)
    off_a, off_b = (a_s - 1).astype(dtype), (b_s - a_l - 2).astype(dtype)
    src = c + np.where(c <= al, off_a[:, None], off_b[:, None])  # A's slots, then B's
    special = c >= lengths[:, None]  # padding
    special[:, 0] = True
    special[rows, a_l + 1] = True
    if paired:
        special[rows, a_l + b_l + 2] = True
    is_sep = None
    if not paired:  # extended positions -> token offsets, and the separator slots between documents
        doc = np.asarray(flat.doc[lo: hi + 1])
        doc_tok = np.asarray(flat.sent[doc])
        doc_ext = doc_tok[:-1] + np.arange(lo, hi)
        content = ~special
        ext = src[content]
        k = np.searchsorted(doc_ext, ext, side="right") - 1
        ext -= k + lo
        is_sep = np.zeros_like(special)
        is_sep[content] = ext >= doc_tok[k + 1]
        src[content] = ext
        special |= is_sep
    # Special slots read any token (overwritten below); only past the array's end would they fail.
    np.minimum(src, max(len(flat.tokens) - 1, 0), out=src)
    out = flat.tokens[src]
    ws = flat.ws[src] if words else None
    out[special] = ids.get("pad", 0)
    if is_sep is not None:
        out[is_sep] = ids["sep"]
    out[:, 0] = ids["cls"]
    out[rows, a_l + 1] = ids["sep"]
    if paired:
        out[rows, a_l + b_l + 2] = ids["sep"]
        # Segment ids of the real tokens, row after row: a_l + 2 zeros ([CLS] A [SEP]), b_l + 1 ones (B [SEP]).
        types = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), N), np.stack([a_l + 2, b_l + 1], 1).ravel())
    else:
        types = np.zeros(int(lengths.sum()), dtype=np.int8)
    return out, special, ws, types, lengths
