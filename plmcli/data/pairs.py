"""How a text, or a pair of texts, becomes one model input: the one place every layout is written.

A family declares its layout (`Traits.pair_layout`, plmcli/models/base.py); a `Frame` holds the special
tokens that layout puts before the texts, between them and after them:

  cls_first  [CLS] a [SEP]          [CLS] a [SEP] b [SEP]      BERT and most encoders
  cls_last   a [SEP] [CLS]          a [SEP] b [SEP] [CLS]      XLNet: <cls> last, where it sees everything
  causal     <s> a <e>              <s> a $ b <e>              GPT's transfer (Radford et al. 2018, §3.3)

Segment ids: the first text and what precedes it (its separator included) are segment 0, the second text
and what follows it segment 1. Finetuning (encode_pairs / encode_framed), span QA's windows, tagging's
rows, HF export's tokenizer templates and the analysis commands all build rows from a Frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

LAYOUTS = ("cls_first", "cls_last", "causal")
ENCODER_LAYOUTS = ("cls_first", "cls_last")
"""The layouts built from a tokenizer's cls and sep tokens."""


@dataclass(frozen=True)
class Frame:
    """The special tokens (ids, or token strings for a tokenizer template) around the texts of one row."""

    layout: str
    before: tuple
    middle: tuple
    after: tuple

    @property
    def extra(self) -> int:
        """Special tokens in a pair's row (a single text's row has len(before) + len(after))."""
        return len(self.before) + len(self.middle) + len(self.after)

    def single(self, a: Sequence) -> list:
        return [*self.before, *a, *self.after]

    def pair(self, a: Sequence, b: Sequence) -> list:
        return [*self.before, *a, *self.middle, *b, *self.after]

    def second_start(self, len_a: int):
        """Where the second text begins in a pair's row (its first segment-1 token); works on arrays too."""
        return len(self.before) + len_a + len(self.middle)

    def cls_position(self, row_len: int) -> int:
        """Where an encoder layout's [CLS] sits in a row of `row_len` tokens."""
        return row_len - 1 if self.layout == "cls_last" else 0

    def hf_template(self, type_b: int) -> tuple[str, str]:
        """(single, pair) templates of tokenizers' TemplateProcessing, for a Frame of token strings."""
        zero = lambda toks: [f"{x}:0" for x in toks]  # noqa: E731
        single = [*zero(self.before), "$A:0", *zero(self.after)]
        pair = [*zero(self.before), "$A:0", *zero(self.middle), f"$B:{type_b}", *[f"{x}:{type_b}" for x in self.after]]
        return " ".join(single), " ".join(pair)


def encoder_frame(layout: str, cls, sep) -> Frame:
    """[CLS] a [SEP] (b [SEP]) for "cls_first", a [SEP] (b [SEP]) [CLS] for "cls_last"."""
    if layout not in ENCODER_LAYOUTS:
        raise ValueError(f"layout must be one of {ENCODER_LAYOUTS}, not {layout!r}")
    if layout == "cls_last":
        return Frame(layout, (), (sep,), (sep, cls))
    return Frame(layout, (cls,), (sep,), (sep,))


def causal_frame(start: int, delimiter: Sequence[int], extract: int) -> Frame:
    """GPT's transforms: <s> a <e>, <s> a $ b <e> ($ may be several tokens)."""
    return Frame("causal", (start,), tuple(delimiter), (extract,))


def truncate_pair(len_a: np.ndarray, len_b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Longest-first truncation (BERT's _truncate_seq_pair) in closed form.

    Popping one token at a time from the longer side (from b on ties) leaves the shorter side whole
    when it fits in half the budget, else a = ⌈budget/2⌉ and b = ⌊budget/2⌋.
    """
    new_a = np.minimum(len_a, np.maximum(budget - len_b, -(-budget // 2)))
    new_b = np.minimum(len_b, budget - new_a)
    return new_a, new_b


def encode_framed(tokenizer, frame: Frame, texts_a: list[str], texts_b: list[str] | None, max_seq_len: int,
                  chunk: int = 8192) -> dict[str, np.ndarray]:
    """Each example as `frame` lays it out, truncated longest-first to `max_seq_len`.

    Returns flat arrays: `ids` (all tokens), `offsets` (n+1), `type_start` (where segment 1 begins
    in each row; = row length for single texts), `truncated` (bool per row). Encodes in chunks,
    so memory stays at the size of the result (MNLI: 393k pairs).
    """
    ids, lengths, type_start, truncated = [], [], [], []
    for lo in range(0, len(texts_a), chunk):
        enc_a = [e.ids for e in tokenizer.encode_batch(texts_a[lo:lo + chunk], add_special_tokens=False)]
        la = np.array([len(x) for x in enc_a], dtype=np.int64)
        if texts_b is None:
            na = np.minimum(la, max_seq_len - len(frame.before) - len(frame.after))
            rows = [frame.single(a[:n]) for a, n in zip(enc_a, na)]
            truncated.append(na < la)
        else:
            enc_b = [e.ids for e in tokenizer.encode_batch(texts_b[lo:lo + chunk], add_special_tokens=False)]
            lb = np.array([len(x) for x in enc_b], dtype=np.int64)
            na, nb = truncate_pair(la, lb, max_seq_len - frame.extra)
            rows = [frame.pair(a[:n], b[:m]) for a, b, n, m in zip(enc_a, enc_b, na, nb)]
            truncated.append((na < la) | (nb < lb))
        n_tok = np.array([len(r) for r in rows], dtype=np.int64)
        ids.append(np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(n_tok.sum())))
        lengths.append(n_tok)
        type_start.append(n_tok if texts_b is None else frame.second_start(na))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dtype=dt)  # noqa: E731
    lengths = cat(lengths, np.int64)
    return {"ids": cat(ids, np.int32), "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "type_start": cat(type_start, np.int64), "truncated": cat(truncated, bool)}
