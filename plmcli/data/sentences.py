"""Sentence splitting for corpora that are not one sentence per line (`data.split_sentences`,
`plm tokenize --split-sentences`): one review, news item or Wikipedia article per line.

BERT's create_pretraining_data reads one sentence per line; NSP/SOP pairs and short_seq_prob work on
those sentences. This is a punctuation rule, as light as the rest of the pipeline: a Chinese/Japanese
sentence ends after 。！？ or … (and any closing quotes or brackets after them); a Latin-script one after
. ! or ? (and closing quotes) when whitespace and then no lowercase letter follow, and the word before a
period is not a common abbreviation or a single capital (an initial). For text where that is not good
enough, split it with a real sentence splitter beforehand and write one sentence per line.
"""

from __future__ import annotations

import re

# Terminators, then closing quotes / brackets that belong to the ending sentence.
_CJK_END = re.compile(r"[。！？…]+[”’」』）》〉)\"']*")
_LATIN_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[^\s])")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig no vol inc ltd co corp dept gen col lt sgt rev hon jan feb "
    "mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m".split())


def split_sentences(line: str) -> list[str]:
    """`line` cut into sentences; the pieces concatenate back to `line` (whitespace between two sentences
    starts the next one, so a byte-level tokenizer encodes its first word as it would in running text)."""
    if not line:
        return []
    cuts = {m.end() for m in _CJK_END.finditer(line)}
    for m in _LATIN_END.finditer(line):
        rest = line[m.end():].lstrip()
        if rest[:1].islower():
            continue  # "approx. three", "e.g. this": no new sentence
        if line[m.start()] == "." and _abbreviation(line[: m.start()]):
            continue
        cuts.add(m.end())
    body = len(line.rstrip())
    cuts = sorted(c for c in cuts if 0 < c < body)  # a terminator at the very end starts no sentence
    return [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)])]


def _abbreviation(before: str) -> bool:
    m = _WORD_BEFORE.search(before)
    if not m:
        return False
    word = m.group(1)
    return word.lower().rstrip(".") in ABBREVIATIONS or (len(word) == 1 and word.isupper())
