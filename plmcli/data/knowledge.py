"""ERNIE 1.0's knowledge units found in the text itself, for a corpus that comes without a lexicon.

ERNIE (Sun et al. 2019, §3.2) gets its phrase and entity units from "lexical analysis and chunking
tools" and named-entity recognition run over the corpus. Here the tagger is jieba's part-of-speech
tagger (`jieba.posseg`, HMM off: the same dictionary segmentation as chinese-wwm's words) and the
chunker a small regular grammar over its tags (PKU / ICTCLAS tag set):

entities  a maximal run of words tagged as proper nouns is one unit: persons (nr, and jieba's nrt for
          transliterated and nrfg for full names), places (ns), organisations (nt) and other proper
          nouns (nz). 北京/ns 天安门/ns is one unit, 毛泽东/nr another. jieba's dictionary tags many
          common words as proper nouns (陈旧/nr, 毛巾/nr, 东西/ns, 四星/nz), so a word of
          `entity_stoplist.COMMON_WORDS` is no part of a run (`entity_word`), nor is a reduplicated
          word (健健康康, 山山水水) or a filler entry of the dictionary made of common words
          (`compound_of_common_words`: 市场秩序/nr, 宣传语/nr); a run loses a leading function character
          (连/nr 华硕) and a trailing character after a longer word (曼城/ns 惜/nr), a run read as a
          predicate (很/d 安静, 陈旧 得) is none, and a run of a single character (换/nz, 美/ns, 丹/ns of
          于丹) is no unit (MIN_ENTITY_CHARS).
entities-thulac  the entities above, each confirmed by a second, statistical tagger: THULAC (Sun et al., Tsinghua;
          `pip install 'plm[zh-ner]'`) tags the sentence in context, and a unit whose characters it reads as
          common words only (THULAC_COMMON: common noun, verb, adjective, adverb — 毛巾/n, 红茶/n, 陈旧/a) is
          dropped; one it tags a name (np ns ni nz), an abbreviation or anything else stays. jieba's dictionary
          gives a word one tag wherever it stands, THULAC's model reads the context. About 17× slower than jieba's
          tagger (2,400 vs 40,000 characters/s on one core) and 1.3 GB per process: for corpora of tens of MB.
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

KINDS = ("phrases", "entities", "entities-thulac")
KnowledgeUnits = Literal[KINDS]
GRAMMAR_VERSION = 3
"""Bump when the classes or the grammar change meaning without their text changing (the key hashes both)."""
ENTITY_TAGS = frozenset({"nr", "nr1", "nr2", "nrj", "nrf", "nrfg", "nrt", "ns", "nsf", "nt", "nz"})
MIN_ENTITY_CHARS = 2
"""An entity unit spans at least this many characters: a lone character tagged nr/ns/nz is mostly a common
word (换, 连) or a fragment of a name the dictionary cuts (丹 of 于丹, 泰 of 格林豪泰)."""
CLASSES = {**{t: "E" for t in ENTITY_TAGS}, **{t: "N" for t in ("n", "ng", "nl", "vn", "an", "j")},
           "a": "A", "b": "A", "v": "V", "m": "M", "mq": "M", "q": "Q", "qt": "Q", "qv": "Q"}
FILLER_FREQ = 3
"""jieba's dictionary gives 63,000 of its 112,000 proper-noun entries the frequency 2 or 3: words added in bulk with
a tag that is often wrong (宣传语/nr, 市场秩序/nr, 洗手液/nz) among new names (郭德刚/nr, 张静初/nr). At or below it an
entry made of common words is taken to be one (`compound_of_common_words`)."""
FUNCTION_CHARS = frozenset("连和与及或在从向对把被给让跟将的了着过也都就还又才很太最更是不没这那我你他她它")
"""One-character words that lead a run as a preposition, conjunction or adverb, not as a name: jieba tags 连 and 和
as surnames, so 连/nr 华硕/nr ("even ASUS") would be one unit."""
DEGREE_WORDS = frozenset("很 太 非常 比较 特别 十分 更加 相当 极其 有点 最 更 这么 那么 越来越 太过".split())
PREDICATE_AFTER = frozenset({"得", "着"})
"""A run after a degree adverb or before a complement marker is an adjective or a verb (很/d 安静/nr, 陈旧/nr 得):
proper nouns take neither. Adverbs that also precede nouns (超, 够, 挺, 不, 有些) are left out."""
LIGHT_VERBS = frozenset({"是", "有", "能", "会", "要", "可以", "可能", "应该", "应当", "能够", "需要", "得"})
"""Verbs that head no verb-object phrase: the copula and the existential (ICTCLAS's vshi, vyou), modals."""
THULAC_COMMON = frozenset({"n", "v", "vm", "vd", "a", "d"})
"""THULAC's tags of common words (noun, verb, modal and directional verb, adjective, adverb): a unit all of whose
characters THULAC tags so is no entity (`thulac_checked`)."""
NER_FEATURE = "ERNIE's entity units confirmed by THULAC (knowledge_units entities-thulac)"
PHRASE_GRAMMAR = r"VN+|(?:M+Q?)?[ANE]*[NE]|M+Q"
_PHRASE = re.compile(PHRASE_GRAMMAR)


@functools.lru_cache(maxsize=None)
def _posseg():
    load_jieba()
    return needs("jieba.posseg", "zh", ZH_FEATURE)


def tag(text: str) -> list[tuple[str, str]]:
    """(word, part-of-speech tag) for each word of `text`: jieba's tagger, HMM off."""
    return [(p.word, p.flag) for p in _posseg().lcut(text, HMM=False)]


@functools.lru_cache(maxsize=None)
def _dictionary() -> tuple[dict, dict]:
    """jieba's dictionary: word -> frequency (0 for a prefix that is no word), word -> its one tag."""
    return load_jieba().dt.FREQ, _posseg().dt.word_tag_tab


def dictionary_tag(word: str) -> str | None:
    freq, tags = _dictionary()
    return tags.get(word) if freq.get(word, 0) > 0 else None


def reduplicated(word: str) -> bool:
    """AABB or ABAB (健健康康, 山山水水, 大片大片): a descriptive form no name takes. AA and ABB are left alone,
    as nicknames and given names use them (拉拉, 娜娜, 范冰冰)."""
    return len(word) == 4 and ((word[0] == word[1] and word[2] == word[3]) or word[:2] == word[2:])


@functools.lru_cache(maxsize=1 << 16)  # asked for every proper-noun word of a corpus; the dictionary is fixed
def compound_of_common_words(word: str) -> bool:
    """Whether a filler entry (FILLER_FREQ) of three or more characters splits in two dictionary words that make
    it a common phrase: both of two or more characters (市场/n 秩序/n), or the longer one no noun (宣传/vn 语,
    太/d 漂亮/a). A split with a proper-noun part (北京/ns 奥运, 韩/ns 政府) or a leading surname (张/nr 静初)
    reads as a name, and a noun with one more character (携程/n 网/n) is as often a name as not."""
    freq, _ = _dictionary()
    if len(word) < 3 or freq.get(word, 0) > FILLER_FREQ:
        return False
    for k in range(1, len(word)):
        parts = [(p, dictionary_tag(p)) for p in (word[:k], word[k:])]
        if any(t is None for _, t in parts) or any(t in ENTITY_TAGS and (len(p) > 1 or t != "nr") for p, t in parts):
            continue
        if len(parts[0][0]) == 1 and parts[0][1] == "nr":
            continue
        long = [t for p, t in parts if len(p) > 1]
        if len(long) == 2 or not long[0].startswith("n"):
            return True
    return False


def entity_word(word: str, pos: str, common: frozenset[str] = COMMON_WORDS, rules: bool = True) -> bool:
    """Whether a tagged word can be part of an entity: all Chinese, a proper-noun tag, not a common word (a stop
    word and, with `rules`, no reduplicated form nor a filler entry of common words)."""
    if pos not in ENTITY_TAGS or not is_chinese(word) or word in common:
        return False
    return not rules or not (reduplicated(word) or compound_of_common_words(word))


def trim_run(tagged: list[tuple[str, str]], i: int, j: int) -> tuple[int, int]:
    """The run [i, j) less a leading function character (连/nr 华硕) and a trailing character after a longer word
    (曼城/ns 惜/nr, 西城/ns 金/nr: a name is cut there far more often than it ends in one character); empty where
    the context makes it a predicate (DEGREE_WORDS, PREDICATE_AFTER)."""
    if j - i >= 2 and tagged[i][0] in FUNCTION_CHARS:
        i += 1
    if j - i >= 2 and len(tagged[j - 1][0]) == 1 and len(tagged[j - 2][0]) > 1:
        j -= 1
    if (i > 0 and tagged[i - 1][0] in DEGREE_WORDS) or (j < len(tagged) and tagged[j][0] in PREDICATE_AFTER):
        return i, i
    return i, j


def entity_chunks(tagged: list[tuple[str, str]], common: frozenset[str] = COMMON_WORDS,
                  min_chars: int = MIN_ENTITY_CHARS, rules: bool = True) -> list[tuple[int, int]]:
    """Word ranges [i, j) of the entities: maximal runs of `entity_word`s, trimmed by `trim_run` (with `rules`),
    spanning at least `min_chars` characters. common=frozenset(), min_chars=1, rules=False give every run of
    proper-noun tags (the filter before GRAMMAR_VERSION 2, which the precision test compares against)."""
    out, i = [], 0
    while i < len(tagged):
        j = i
        while j < len(tagged) and entity_word(*tagged[j], common, rules):
            j += 1
        a, b = trim_run(tagged, i, j) if rules and j > i else (i, j)
        if b > a and sum(len(w) for w, _ in tagged[a:b]) >= min_chars:
            out.append((a, b))
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


@functools.lru_cache(maxsize=None)
def _thulac():
    """THULAC's segmenter and tagger, loaded once per process (its model files: 2 s, 1.3 GB)."""
    import contextlib
    import io

    thulac = needs("thulac", "zh-ner", NER_FEATURE)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Model loaded succeed": stdout is a command's output
        return thulac.thulac()


def thulac_checked(tagged: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """entity_chunks less those THULAC reads as common words only (THULAC_COMMON), tagging the sentence in context."""
    chunks = entity_chunks(tagged)
    if not chunks:
        return chunks
    text = "".join(w for w, _ in tagged)
    tags, at = [None] * len(text), 0  # THULAC's tag of each character; None where it dropped one (spaces)
    for word, t in _thulac().cut(text):
        start = text.find(word, at)
        if start < 0:
            continue
        tags[start : start + len(word)] = [t] * len(word)
        at = start + len(word)
    offsets = np.cumsum([0] + [len(w) for w, _ in tagged]).tolist()
    return [(i, j) for i, j in chunks
            if not set(tags[offsets[i] : offsets[j]]) <= THULAC_COMMON]


def _thulac_key() -> list:
    from importlib.metadata import version

    needs("thulac", "zh-ner", NER_FEATURE)
    return ["thulac", version("thulac"), sorted(THULAC_COMMON)]


_CHUNKS = {"phrases": phrase_chunks, "entities": entity_chunks, "entities-thulac": thulac_checked}
_CHECKER_KEY = {"entities-thulac": _thulac_key}
"""What a kind's second tagger adds to units_key: its version and the tags it vetoes."""


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
    desc = [*_CHECKER_KEY.get(kind, list)(), jieba.__version__, "posseg HMM=False", kind, GRAMMAR_VERSION, sorted(ENTITY_TAGS), sorted(CLASSES.items()),
            sorted(LIGHT_VERBS), "Q after Arabic digits", PHRASE_GRAMMAR, sorted(COMMON_WORDS), MIN_ENTITY_CHARS,
            FILLER_FREQ, sorted(FUNCTION_CHARS), sorted(DEGREE_WORDS), sorted(PREDICATE_AFTER)]
    return hashlib.sha256(repr(desc).encode("utf-8")).hexdigest()


def check_kind(kind: str, name: str = "objective.knowledge_units") -> None:
    if kind not in KINDS:
        raise PlmError(f"{name} '{kind}' is not one of {', '.join(KINDS)}",
                       "phrases (ERNIE's phrase stage), entities (its entity stage), or entities-thulac (entities "
                       "confirmed by THULAC's tagger)")


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
