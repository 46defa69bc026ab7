"""Typed recipe sections. Attribute docstrings double as the reference in `plm recipes show --help`.

A field's allowed values are declared in its type, and config.build_section checks them when a recipe
(or a run's config.json) is loaded: `Literal[...]` for a choice, `Annotated[int, Range(1)]` for an
interval, `Divides("d_model")` for a count that must split another field (attention heads). The name
lists of the settings that pick an implementation (optimizer, schedule, tokenizer) live here, at the
bottom, so a recipe is checked against them before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional


@dataclass(frozen=True)
class Range:
    """The interval a number must lie in; None = unbounded on that side."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, v, values: dict) -> bool:
        return ((self.lo is None or (v > self.lo if self.lo_open else v >= self.lo))
                and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)))

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '≥'} {self.lo:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


@dataclass(frozen=True)
class Divides:
    """An integer that must divide the field `other` of the same section (heads split the hidden size),
    unless the field `unless` is set (a model with an explicit head size)."""

    other: str
    unless: str | None = None

    def holds(self, v, values: dict) -> bool:
        return bool(self.unless and values.get(self.unless)) or values[self.other] % v == 0


@dataclass(frozen=True)
class Folded:
    """A choice also read case-blind and without surrounding spaces ("AdamW" is adamw), as the optimizer
    and schedule names were before their fields became choices."""


Size = Annotated[int, Range(1)]
"""A count or width that must be ≥ 1."""
Count = Annotated[int, Range(0)]
"""≥ 0, where 0 means none, off, or "take it from elsewhere" (the field's docstring says which)."""
Probability = Annotated[float, Range(0, 1, hi_open=True)]
"""Dropout and other rates: 0 ≤ p < 1 (p = 1 would drop or replace everything)."""
Fraction = Annotated[float, Range(0, 1)]
"""A share: 0 ≤ x ≤ 1."""
Positive = Annotated[float, Range(0, lo_open=True)]
NonNegative = Annotated[float, Range(0)]
Heads = Annotated[int, Range(1), Divides("d_model")]
"""Attention heads: each gets d_model / n_head of the hidden size."""
OptimizerName = Literal["adamw", "adam", "lamb", "sgd"]
"""optim.name: what train/optim.build_optimizer builds."""
ScheduleName = Literal["linear", "cosine", "constant", "inverse-sqrt", "polynomial", "step"]
"""optim.schedule: what train/schedule.build_scheduler builds."""
TokenizerKind = Literal["wordpiece", "bpe", "bytelevel-bpe", "unigram", "char", "word"]
"""tokenizer.kind: what data/tokenizers.train_tokenizer trains."""


@dataclass
class TokenizerConfig:
    kind: TokenizerKind = "bytelevel-bpe"
    """wordpiece | bpe | bytelevel-bpe | unigram | char | word."""
    vocab_size: Size = 8192
    """Target vocabulary size, special tokens included (char/word: an upper bound)."""
    min_frequency: Count = 2
    """Pieces (or words, chars) seen fewer times than this are not added."""
    lowercase: bool = False
    """Lower-case (and for wordpiece, strip accents) before tokenizing."""
    special_tokens: dict = field(default_factory=lambda: {"eos": "<|endoftext|>"})
    """Role -> token string, roles from: bos eos pad unk mask cls sep. The same string may fill several roles."""
    path: Optional[str] = None
    """Load this tokenizer.json instead of training one."""


@dataclass
class DataConfig:
    path: Optional[str] = None
    """Text file(s)/dir or a `plm tokenize` output dir; empty = the small corpus shipped with plm."""
    default_data: Optional[str] = None
    """The shipped sample (a file in plmcli/corpus/) used when neither --data nor path is given; empty = the objective's."""
    text_column: str = "text"
    """The column that holds the text in JSON Lines / CSV / Parquet files, saved datasets and Hub datasets."""
    doc_per_line: bool = False
    """Each line is a document (else documents are separated by blank lines and lines are sentences)."""
    split_sentences: bool = False
    """Cut lines into sentences at sentence-final punctuation (plmcli/data/sentences.py), for text that is not
    one sentence per line: NSP/SOP pairs and make-mlm-data's segments are built from those sentences."""
    val_fraction: Probability = 0.05
    """Share of documents (taken from the end of the corpus) held out for validation."""
    num_proc: Size = 1
    """Worker processes for tokenization."""
