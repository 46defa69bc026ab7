"""ERNIE's entity units found by jieba's tagger are proper nouns: precision by occurrence against hand labels.

tests/data/fixtures/ernie_entity_labels.tsv labels each unit type (word, is_entity, note). Precision by occurrence
is the share of the units found, counted with repeats, whose type is labelled a proper noun, over the units whose
type is labelled at all; `coverage` is that labelled share of all units found. Every unit type the filter finds in
the evaluation samples (2,000 ChnSentiCorp train reviews, 2,000 THUCNews test titles) is labelled, so there the
precision is over all units; data/chinese-sample.txt is labelled in part. The old filter (every maximal run of
proper-noun tags) is entity_chunks with common=frozenset(), min_chars=1, rules=False. `pytest -s` prints the
figures BENCHMARKS.md records ("ERNIE entity units: precision").
"""

import random
from pathlib import Path

import pytest

from plmcli import api
from plmcli.data.entity_stoplist import COMMON_WORDS, SECOND_ROUND
from plmcli.data.knowledge import compound_of_common_words, entity_chunks, entity_word, reduplicated, tag, units

pytest.importorskip("jieba")

LABELS = Path(__file__).resolve().parent / "data" / "fixtures" / "ernie_entity_labels.tsv"
OLD = {"common": frozenset(), "min_chars": 1, "rules": False}
SAMPLE = 2000


def label_rows() -> list[list[str]]:
    rows = [line.split("\t") for line in LABELS.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]
    assert rows[0] == ["word", "is_entity", "note"]
    return rows[1:]


def labels() -> dict[str, int]:
    return {word: int(flag) for word, flag, _ in label_rows()}


def precision(texts: list[str], lab: dict[str, int], **filter_args) -> tuple[float, float, int]:
    """(precision by occurrence over labelled units, labelled share of units, units found) of the filter."""
    found = labelled = entities = 0
    for text in texts:
        tagged = tag(text)
        for i, j in entity_chunks(tagged, **filter_args):
            unit = "".join(w for w, _ in tagged[i:j])
            found += 1
            if unit in lab:
                labelled += 1
                entities += lab[unit]
    return entities / labelled, labelled / found, found


def dropped(texts: list[str], lab: dict[str, int]) -> tuple[int, int]:
    """(occurrences of units labelled proper nouns that the old filter finds and the new one does not, all the old
    filter's such occurrences), counted text by text."""
    lost = total = 0
    for text in texts:
        tagged = tag(text)
        found = {which: ["".join(w for w, _ in tagged[i:j]) for i, j in entity_chunks(tagged, **args)]
                 for which, args in (("old", OLD), ("new", {}))}
        old = [u for u in found["old"] if lab.get(u) == 1]
        total += len(old)
        lost += sum(max(0, old.count(u) - found["new"].count(u)) for u in set(old))
    return lost, total


def report(name: str, texts: list[str], lab: dict[str, int]) -> dict[str, tuple[float, float, int]]:
    out = {"old": precision(texts, lab, **OLD), "new": precision(texts, lab)}
    for which, (p, cov, n) in out.items():
        print(f"\n{name} ({len(texts):,} texts) {which}: precision {p:.3f} by occurrence, "
              f"{n:,} units, {cov:.1%} of them labelled")
    lost, total = dropped(texts, lab)
    print(f"{name}: entities dropped {lost:,} of {total:,}")
    return out


def read_column(path: Path, col: int, skip: int) -> list[str]:
    return [line.split("\t")[col] for line in path.read_text(encoding="utf-8").splitlines()[skip:]]


def test_common_words_are_no_entities():
    for word in ("陈旧", "毛巾", "谢谢", "安静", "东西", "四星"):
        assert tag(word)[0][1] in {"nr", "ns", "nz"}  # jieba's dictionary tags them proper nouns ...
        assert not entity_word(*tag(word)[0]) and word in COMMON_WORDS  # ... the filter knows better
    assert units("房间很安静，毛巾有点陈旧，谢谢前台小姐。", "entities") == []
    assert units("在京东买的华硕，比惠普好。", "entities") == ["京东", "华硕", "惠普"]
    assert units("北京的希尔顿酒店，张爱玲的书。", "entities") == ["北京", "希尔顿酒店", "张爱玲"]  # 希尔顿酒店/ns: one jieba word
    # one character alone is no unit (换/nz, 丹/ns of 于丹); in a run of two it is (张/nr 三/nrfg)
    assert units("于丹的书，换了一本。", "entities") == []
    assert entity_chunks([("张", "nr"), ("三", "nrfg"), ("去", "v"), ("换", "nz")]) == [(0, 2)]
    # a common word ends a run: 北京/ns 中考/ns is 北京 alone
    assert entity_chunks([("北京", "ns"), ("中考", "ns")]) == [(0, 1)]
    assert entity_chunks([("北京", "ns"), ("中考", "ns")], **OLD) == [(0, 2)]


def test_rules_drop_common_forms():
    # reduplicated forms and filler entries of the dictionary made of common words are no entity words ...
    assert reduplicated("健健康康") and reduplicated("大片大片") and not reduplicated("杜拉拉")
    for word in ("市场秩序", "宣传语", "太漂亮"):
        assert tag(word)[0][1] in {"nr", "nz"} and compound_of_common_words(word)
        assert not entity_word(*tag(word)[0]) and entity_word(*tag(word)[0], rules=False)
    # ... but a split with a place, a leading surname or a noun plus one character reads as a name
    for word in ("北京奥运", "张静初", "携程网", "张爱玲"):
        assert not compound_of_common_words(word)
    # runs lose a leading function character and a trailing character after a longer word
    assert entity_chunks([("连", "nr"), ("华硕", "nr")]) == [(1, 2)]
    assert entity_chunks([("曼城", "ns"), ("惜", "nr"), ("败", "v")]) == [(0, 1)]
    assert entity_chunks([("张", "nr"), ("三", "nrfg")]) == [(0, 2)]
    # a run read as a predicate is none
    assert entity_chunks([("很", "d"), ("华贵", "nr")]) == [] and entity_chunks([("华贵", "nr"), ("得", "ud")]) == []
    assert entity_chunks([("很", "d"), ("华贵", "nr")], **OLD) == [(1, 2)]


def test_labels_are_clean():
    lab = labels()
    assert len(lab) > 4000 and set(lab.values()) == {0, 1} and len(lab) == len(label_rows())
    assert not COMMON_WORDS & {w for w, e in lab.items() if e}, "a stop word labelled a proper noun"
    first_seen_in_eval = {w for w, _, note in label_rows() if note.split("; ")[-1] in ("eval", "eval-tail")}
    assert not SECOND_ROUND & first_seen_in_eval, "the evaluation samples chose a stop word"


def test_precision_on_the_shipped_sample():
    text = Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").splitlines()
    got = report("chinese-sample.txt", [t for t in text if t], labels())
    p, cov, _ = got["new"]
    assert p >= 0.8 and cov >= 0.7
    assert got["old"][0] < 0.6


def evaluation_samples(shared_data: Path) -> tuple[list[str], list[str]]:
    """The two evaluation samples (2,000 ChnSentiCorp train reviews, 2,000 THUCNews test titles, seed 0), or a skip."""
    zh = shared_data / "chinese"
    if not (zh / "ChnSentiCorp" / "train.tsv").is_file() or not (zh / "THUCNews-titles" / "test.txt").is_file():
        pytest.skip("ChnSentiCorp or THUCNews titles not in ../shared/data")
    return (random.Random(0).sample(read_column(zh / "ChnSentiCorp" / "train.tsv", 1, 1), SAMPLE),
            random.Random(0).sample(read_column(zh / "THUCNews-titles" / "test.txt", 0, 0), SAMPLE))


def test_precision_on_reviews_and_news(shared_data):
    lab, reviews, titles = labels(), *evaluation_samples(shared_data)
    # every unit type found in these samples is labelled: precision over all units, not a labelled subset
    for name, texts, floor, old_at_most in (("ChnSentiCorp train", reviews, 0.77, 0.4),
                                            ("THUCNews test titles", titles, 0.84, 0.65)):
        got = report(name, texts, lab)
        p, cov, _ = got["new"]
        assert p >= floor and cov >= 0.99, name
        assert got["old"][0] <= old_at_most, name


def kind_precision(texts: list[str], lab: dict[str, int], kind: str) -> tuple[float, float, int]:
    """(precision by occurrence over labelled units, labelled share, entity occurrences kept) of a units kind."""
    found = [u for t in texts for u in units(t, kind)]
    labelled = [lab[u] for u in found if u in lab]
    return sum(labelled) / len(labelled), len(labelled) / len(found), sum(labelled)


def test_thulac_confirms_entities_in_context(shared_data):
    """entities-thulac: jieba's entity units less those THULAC's tagger reads as common words in the sentence."""
    pytest.importorskip("thulac")
    assert units("携程订的希尔顿酒店，红茶不错", "entities") == ["希尔顿酒店", "红茶"]  # 红茶/nz in jieba's dictionary
    assert units("携程订的希尔顿酒店，红茶不错", "entities-thulac") == ["希尔顿酒店"]  # THULAC: 红茶/n
    assert units("北京的希尔顿酒店，张爱玲的书。", "entities-thulac") == ["北京", "希尔顿酒店", "张爱玲"]
    lab, reviews, titles = labels(), *evaluation_samples(shared_data)
    for name, texts, floor in (("ChnSentiCorp train", reviews, 0.88), ("THUCNews test titles", titles, 0.89)):
        p, cov, kept = kind_precision(texts, lab, "entities-thulac")
        base = kind_precision(texts, lab, "entities")
        print(f"\n{name} entities-thulac: precision {p:.3f} by occurrence ({base[0]:.3f} without THULAC), "
              f"{kept:,} of {base[2]:,} entity occurrences kept, {cov:.1%} labelled")
        assert p >= floor and cov >= 0.99 and kept >= 0.9 * base[2], name
