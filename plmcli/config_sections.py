"""Typed recipe sections. Attribute docstrings double as the reference in `plm recipes show --help`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TokenizerConfig:
    kind: str = "bytelevel-bpe"
    """wordpiece | bpe | bytelevel-bpe | unigram | char | word."""
    vocab_size: int = 8192
    """Target vocabulary size, special tokens included (char/word: an upper bound)."""
    min_frequency: int = 2
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
    val_fraction: float = 0.05
    """Share of documents (taken from the end of the corpus) held out for validation."""
    num_proc: int = 1
    """Worker processes for tokenization."""
