"""ERNIE 1.0's knowledge units found in the text itself, for a corpus that comes without a lexicon.

ERNIE (Sun et al. 2019, §3.2) gets its phrase and entity units from "lexical analysis and chunking
tools" and named-entity recognition run over the corpus. Here the tagger is jieba's part-of-speech
tagger (`jieba.posseg`, HMM off: the same dictionary segmentation as chinese-wwm's words) and the
chunker a small regular grammar over its tags (PKU / ICTCLAS tag set):

entities  a maximal run of words tagged as proper nouns is one unit: persons (nr, and jieba's nrt for
          transliterated and nrfg for full names), places (ns), organisations (nt) and other proper
          nouns (nz). 北京/ns 天安门/ns is one unit, 毛泽东/nr another. jieba's dictionary tags many
          common words as proper nouns (陈旧/nr, 毛巾/nr, 东西/ns, 四星/nz), so a word of
          `entity_stoplist.COMMON_WORDS` is no part of a run (`entity_word`), and a run of a single
          character (换/nz, 美/ns, 丹/ns of 于丹) is no unit (MIN_ENTITY_CHARS).
phrases   each word is given a class — N (common noun: n, ng, nl, vn, an, j), E (proper noun: the entity
          tags), A (noun modifier: a, b), V (verb: v, but not the copula 是, the existential 有 — ICTCLAS's
          vshi, vyou, which jieba tags v — nor a modal such as 能), M (numeral: m, mq), Q (classifier: q,
          qt, qv, and a one-character m after Arabic digits, as 年 in 60/eng 年/m, which jieba tags m), O
          (anything else, and every word that is not all Chinese) — and the class string is cut
          leftmost-longest into
              VO  V N+                     a verb and its bare common-noun object   处理/v 技术/n
              NP  (M+ Q?)? (A|N|E)* (N|E)  a noun with its modifiers and count  中国/ns 人民/n, 三款/m 新/a 产品/n
              MQ  M+ Q                     a numeral and its classifier             三/m 个/q
          (tried in that order at each word); a chunk of two or more words is a unit.

Text outside the units keeps its jieba words, as with a lexicon (`masking.Lexicon.word_starts`), so the
entity stage masks entities and words, the phrase stage phrases and words. Units are character spans
of the tokens' text, mapped onto tokens by `masking.chinese_span_starts` (the mapping chinese-wwm uses).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Literal

import numpy as np

from plmcli.data.entity_stoplist import COMMON_WORDS
from plmcli.data.masking import ZH_FEATURE, chinese_span_starts, is_chinese, load_jieba
from plmcli.errors import PlmError, needs

KINDS = ("phrases", "entities")
KnowledgeUnits = Literal[KINDS]
GRAMMAR_VERSION = 2
"""Bump when the classes or the grammar change meaning without their text changing (the key hashes both)."""
ENTITY_TAGS = frozenset({"nr", "nr1", "nr2", "nrj", "nrf", "nrfg", "nrt", "ns", "nsf", "nt", "nz"})
MIN_ENTITY_CHARS = 2
"""An entity unit spans at least this many characters: a lone character tagged nr/ns/nz is mostly a common
word (换, 连) or a fragment of a name the dictionary cuts (丹 of 于丹, 泰 of 格林豪泰)."""
CLASSES = {**{t: "E" for t in ENTITY_TAGS}, **{t: "N" for t in ("n", "ng", "nl", "vn", "an", "j")},
           "a": "A", "b": "A", "v": "V", "m": "M", "mq": "M", "q": "Q", "qt": "Q", "qv": "Q"}
LIGHT_VERBS = frozenset({"是", "有", "能", "会", "要", "可以", "可能", "应该", "应当", "能够", "需要", "得"})
"""Verbs that head no verb-object phrase: the copula and the existential (ICTCLAS's vshi, vyou), modals."""
PHRASE_GRAMMAR = r"VN+|(?:M+Q?)?[ANE]*[NE]|M+Q"
_PHRASE = re.compile(PHRASE_GRAMMAR)


@functools.lru_cache(maxsize=None)
def _posseg():
    load_jieba()
    return needs("jieba.posseg", "zh", ZH_FEATURE)


def tag(text: str) -> list[tuple[str, str]]:
    """(word, part-of-speech tag) for each word of `text`: jieba's tagger, HMM off."""
    return [(p.word, p.flag) for p in _posseg().lcut(text, HMM=False)]


def entity_word(word: str, pos: str, common: frozenset[str] = COMMON_WORDS) -> bool:
    """Whether a tagged word can be part of an entity: all Chinese, a proper-noun tag, not a common word."""
    return pos in ENTITY_TAGS and is_chinese(word) and word not in common


def entity_chunks(tagged: list[tuple[str, str]], common: frozenset[str] = COMMON_WORDS,
                  min_chars: int = MIN_ENTITY_CHARS) -> list[tuple[int, int]]:
    """Word ranges [i, j) of the entities: maximal runs of `entity_word`s spanning at least `min_chars`
    characters. common=frozenset(), min_chars=1 give every run of proper-noun tags (the filter before
    GRAMMAR_VERSION 2, which the precision test compares against)."""
    out, i = [], 0
    while i < len(tagged):
        j = i
        while j < len(tagged) and entity_word(*tagged[j], common):
            j += 1
        if j > i and sum(len(w) for w, _ in tagged[i:j]) >= min_chars:
            out.append((i, j))
        i = max(j, i + 1)
    return out


def word_classes(tagged: list[tuple[str, str]]) -> str:
    """One class letter per word (N E A V M Q O, see above): what PHRASE_GRAMMAR reads."""
    out = []
    for k, (w, t) in enumerate(tagged):
        c = CLASSES.get(t, "O") if is_chinese(w) and w not in LIGHT_VERBS else "O"
        if c == "M" and len(w) == 1 and k and tagged[k - 1][0].isascii() and tagged[k - 1][0].isdigit():
            c = "Q"  # 60/eng 年/m: the unit of an Arabic number, which is no part of a unit itself
        out.append(c)
    return "".join(out)


def phrase_chunks(tagged: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """Word ranges [i, j) of the phrases: PHRASE_GRAMMAR's chunks of two or more words."""
    classes = word_classes(tagged)
    return [m.span() for m in _PHRASE.finditer(classes) if m.end() - m.start() > 1]


def units(text: str, kind: str) -> list[str]:
    """The knowledge units of one sentence as strings (the phrases or the entities), in order."""
    tagged = tag(text)
    return ["".join(w for w, _ in tagged[i:j]) for i, j in _CHUNKS[kind](tagged)]


_CHUNKS = {"phrases": phrase_chunks, "entities": entity_chunks}


def unit_spans(text: str, kind: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the masking units of one sentence: its knowledge units, and its
    multi-character Chinese words outside them."""
    tagged = tag(text)
    offsets = np.cumsum([0] + [len(w) for w, _ in tagged]).tolist()
    chunks = _CHUNKS[kind](tagged)
    spans = [(offsets[i], offsets[j]) for i, j in chunks]
    covered = {k for i, j in chunks for k in range(i, j)}
    spans += [(offsets[k], offsets[k + 1]) for k, (w, _) in enumerate(tagged)
              if k not in covered and len(w) > 1 and is_chinese(w)]
    return sorted(spans)


@functools.lru_cache(maxsize=None)
def units_key(kind: str) -> str:
    """What units found automatically depend on: the tagger and its version, the tag classes and the
    grammar. Cached data built with them is keyed by this, so a changed grammar builds afresh."""
    jieba = needs("jieba", "zh", ZH_FEATURE)

    check_kind(kind)
    desc = [jieba.__version__, "posseg HMM=False", kind, GRAMMAR_VERSION, sorted(ENTITY_TAGS), sorted(CLASSES.items()),
            sorted(LIGHT_VERBS), "Q after Arabic digits", PHRASE_GRAMMAR, sorted(COMMON_WORDS), MIN_ENTITY_CHARS]
    return hashlib.sha256(repr(desc).encode("utf-8")).hexdigest()


def check_kind(kind: str, name: str = "objective.knowledge_units") -> None:
    if kind not in KINDS:
        raise PlmError(f"{name} '{kind}' is not one of {', '.join(KINDS)}",
                       "phrases (ERNIE's phrase stage) or entities (its entity stage)")


class AutoUnits:
    """ERNIE's phrase or entity units found by the tagger, with `masking.Lexicon`'s `word_starts`: each
    unit is one masking unit, other Chinese text keeps its jieba words, non-Chinese text its words."""

    def __init__(self, kind: str):
        check_kind(kind)
        self.kind = kind

    def spans(self, text: str) -> list[tuple[int, int]]:
        return unit_spans(text, self.kind)

    def word_starts(self, ids, word_starts, sentence_starts, tokens: list[str] | None) -> np.ndarray:
        """The units of one document as word starts. ids, word_starts (n,): its tokens and their words;
        sentence_starts: offsets of its lines (units never cross one); tokens: the token strings."""
        if tokens is None:
            raise PlmError("knowledge units found by the tagger need a tokenizer whose tokens are text; "
                           "byte-level BPE tokens are bytes", "re-run `plm tokenize` with --tokenizer wordpiece "
                           "(or char), as ERNIE does, or give objective.lexicon")
        out = np.asarray(word_starts, dtype=bool).copy()
        bounds = list(sentence_starts) + [len(ids)]
        for s, e in zip(bounds[:-1], bounds[1:]):
            if e > s and any(is_chinese(t) for t in tokens[s:e]):
                out[s:e] &= chinese_span_starts(tokens[s:e], self.spans)
        return out
