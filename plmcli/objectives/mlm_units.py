"""Masking units for dynamic masking, flat in step with a corpus' token stream (data/corpus.py token_stream):
words, ERNIE's knowledge units, Chinese (jieba) words, one byte per token cached beside the tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def word_start_stream(corpus_dir: Path, split: str, sep_id: int) -> np.ndarray:
    """The corpus' `word_starts` flattened in step with `token_stream(corpus_dir, split, sep_id)`.

    A separator counts as a word of its own. Cached next to the tokens, one byte per token.
    """
    from plmcli.data.corpus import column_stream

    return column_stream(corpus_dir, split, "word_starts", True, np.bool_, f"{split}.{sep_id}.word_starts.bin")


def knowledge_start_stream(corpus_dir: Path, split: str, sep_id: int, lexicon: str | None,
                           knowledge_units: str | None = None) -> np.ndarray:
    """Like `word_start_stream`, with ERNIE's units instead of words: every match of `lexicon` (or, with
    none, every phrase or entity jieba's tagger finds: `knowledge_units`) starts one unit and continues to
    its end (`masking.Lexicon.word_starts`, `knowledge.AutoUnits`). Cached per lexicon content / grammar."""
    from plmcli.data.knowledge import units_key
    from plmcli.data.masking import lexicon_key
    from plmcli.data.mlm_data import knowledge_lexicon

    def units(corpus_dir):
        lex, vocab = knowledge_lexicon(corpus_dir, lexicon, knowledge_units)
        return lambda ids, starts, ws: lex.word_starts(np.asarray(ids), ws, starts,
                                                       [vocab[i] for i in ids] if vocab is not None else None)

    key = lexicon_key(lexicon) if lexicon else units_key(knowledge_units)
    return _unit_stream(corpus_dir, split, sep_id, f"units-{key[:16]}", units)


def chinese_word_start_stream(corpus_dir: Path, split: str, sep_id: int) -> np.ndarray:
    """Like `word_start_stream`, with Chinese words (jieba, as make-mlm-data's chinese-wwm) as the words:
    Chinese-BERT-wwm's units for dynamic masking (RoBERTa-wwm)."""
    from plmcli.data.mlm_data import chinese_row_starts, text_vocab

    def units(corpus_dir):
        vocab = text_vocab(corpus_dir)
        return lambda ids, starts, ws: chinese_row_starts(ids, starts, ws, vocab)

    return _unit_stream(corpus_dir, split, sep_id, "jieba-words", units)


def _unit_stream(corpus_dir: Path, split: str, sep_id: int, name: str, make_row_fn) -> np.ndarray:
    """Masking units' starts, flat in step with `token_stream`: `make_row_fn(corpus_dir)` gives a function of
    one document's (ids, sentence_starts, word_starts) -> its unit starts. Computed once, cached next to
    the tokens (one byte per token, written to a temp file and renamed)."""
    from datasets import load_from_disk

    from plmcli.data.store import atomic_path

    corpus_dir = Path(corpus_dir)
    path = corpus_dir / f"{split}.{sep_id}.{name}.bin"
    if not path.is_file():
        row_starts = make_row_fn(corpus_dir)
        ds = load_from_disk(str(corpus_dir / "dataset" / split))
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            for batch in ds.iter(batch_size=200):
                for ids, starts, ws in zip(batch["input_ids"], batch["sentence_starts"], batch["word_starts"]):
                    units = row_starts(ids, starts, ws)
                    f.write(np.append(units, True).astype(np.bool_).tobytes())  # the separator: a unit of its own
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.bool_)
    return np.memmap(path, dtype=np.bool_, mode="r")
