"""RoBERTa's FULL-SENTENCES and DOC-SENTENCES rows (Liu et al. 2019 §4.2) over a tokenized corpus.

A row is a range [start, start + length) of `token_stream(corpus, split, sep)` — the documents' tokens with a
separator after each — that starts at a sentence start and holds whole sentences, up to `cap` tokens
(seq_len - 2: the row becomes [CLS] s1 s2 ... [SEP]). FULL-SENTENCES packs across documents, so a row may
hold a separator between two documents' sentences; DOC-SENTENCES ends a row where its document ends.
The packing is greedy in corpus order (fairseq's TokenBlockDataset, break modes "complete" and
"complete_doc"): a row takes sentences while they fit, and the next row starts at the first that does not.
As the paper words it, a separator stands only between documents ("add an extra separator token between
documents"); fairseq's binarized data instead ends every line with </s>, so its rows hold one per sentence.

A sentence longer than `cap` is cut into pieces of `cap` tokens (the last one shorter), and each piece is
packed as a sentence of its own: the text is kept whole rather than dropped or truncated, and only the
rows that begin such a piece start mid-sentence (fairseq "complete" would make an over-long row instead).

The rows are fixed, as RoBERTa's are (the masks are what changes per epoch): computed once per
(split, separator, mode, cap) in a pass over the dataset in batches (memory: one batch of sentences and
the rows), and cached next to the tokens as `{split}.{sep}.{mode}-{cap}.rows.npy`, written atomically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PACKINGS = ("window", "full_sentences", "doc_sentences")
"""window: fixed windows of the token stream (rows start anywhere); the other two: whole sentences."""


def sentence_rows(corpus_dir: str | Path, split: str, sep_id: int, cap: int, cross_documents: bool) -> np.ndarray:
    """(R, 2) int64 rows [start, length] into `token_stream(corpus_dir, split, sep_id)` (see the module doc)."""
    from plmcli.data.corpus import require_meta
    from plmcli.data.store import atomic_path

    if cap < 1:
        raise ValueError(f"a row holds at least one token, not {cap}")
    corpus_dir = Path(corpus_dir)
    require_meta(corpus_dir)
    mode = "full" if cross_documents else "doc"
    path = corpus_dir / f"{split}.{sep_id}.{mode}-{cap}.rows.npy"
    if not path.is_file():
        rows = _pack(_sentences(corpus_dir, split), cap, cross_documents)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, rows)
    return np.load(path, mmap_mode="r")  # read where used: memory flat in corpus size


def _sentences(corpus_dir: Path, split: str):
    """Per dataset batch: (start, end, document) of every non-empty sentence, in token-stream positions."""
    import pyarrow.compute as pc
    from datasets import load_from_disk

    ds = load_from_disk(str(corpus_dir / "dataset" / split)).with_format("arrow")
    at, doc0 = 0, 0  # stream position and index of the batch's first document
    for tbl in ds.iter(batch_size=10_000):
        doc_len = pc.list_value_length(tbl["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int64)
        per_doc = pc.list_value_length(tbl["sentence_starts"]).to_numpy(zero_copy_only=False).astype(np.int64)
        rel = pc.list_flatten(tbl["sentence_starts"]).to_numpy(zero_copy_only=False).astype(np.int64)
        doc_at = at + np.cumsum(doc_len + 1) - (doc_len + 1)  # each document is followed by its separator
        d = np.repeat(np.arange(len(doc_len)), per_doc)
        start = doc_at[d] + rel
        end = np.append(start[1:], 0)
        last = np.cumsum(per_doc) - 1
        has = per_doc > 0
        end[last[has]] = (doc_at + doc_len)[has]
        keep = end > start
        yield start[keep], end[keep], d[keep] + doc0
        at += int((doc_len + 1).sum())
        doc0 += len(doc_len)


def _pieces(start: np.ndarray, end: np.ndarray, doc: np.ndarray, cap: int):
    """Sentences longer than `cap` cut into consecutive pieces of `cap` tokens."""
    n = -(-(end - start) // cap)
    idx = np.repeat(np.arange(len(start)), n)
    within = np.arange(len(idx)) - np.repeat(np.cumsum(n) - n, n)
    s = start[idx] + within * cap
    return s, np.minimum(s + cap, end[idx]), doc[idx]


def _pack(batches, cap: int, cross_documents: bool) -> np.ndarray:
    """Greedy rows over the sentence pieces of all batches; the row still open at a batch's end carries
    its pieces into the next batch (it may take more sentences there)."""
    rows: list[np.ndarray] = []
    carry = (np.zeros(0, np.int64),) * 3
    for batch in batches:
        s, e, d = (np.concatenate([c, x]) for c, x in zip(carry, _pieces(*batch, cap)))
        starts, ends, k = _greedy(s, e, d, cap, cross_documents)
        rows.append(np.stack([starts, ends - starts], axis=1))
        carry = (s[k:], e[k:], d[k:])
    if len(carry[0]):
        starts, ends, _ = _greedy(*carry, cap, cross_documents, final=True)
        rows.append(np.stack([starts, ends - starts], axis=1))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 2), np.int64)


def _greedy(s, e, d, cap: int, cross_documents: bool, final: bool = False):
    """Rows from pieces (s, e, d) in order: (row starts, row ends, index of the first piece left open).
    A row from piece i takes pieces i..j-1, j the first that would end past s[i] + cap (or, DOC-SENTENCES,
    the first of another document). Unless `final`, the last row is left open (its first piece returned)."""
    n = len(s)
    doc_end = np.searchsorted(d, d, side="right").tolist() if not cross_documents else None
    starts, ends, i = [], [], 0
    s_l, e_l = s.tolist(), e.tolist()
    while i < n:
        j = int(np.searchsorted(e, s_l[i] + cap, side="right"))
        if doc_end is not None:
            j = min(j, doc_end[i])
        if j >= n and not final:
            break
        starts.append(s_l[i])
        ends.append(e_l[j - 1])
        i = j
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), i
