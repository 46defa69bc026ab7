"""ERNIE 1.0's knowledge units found automatically (plmcli.data.knowledge): entities from jieba's
part-of-speech tags, phrases from a regular grammar over them, masked whole on both data paths."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from datasets import load_from_disk

from helpers import assert_clean_error, run
from plmcli.config_sections import TokenizerConfig
from plmcli.data import knowledge
from plmcli.data.corpus import token_stream, tokenize_corpus
from plmcli.data.knowledge import AutoUnits, entity_chunks, phrase_chunks, tag, units, units_key
from plmcli.data.masking import chinese_word_starts, mask_batch
from plmcli.data.mlm_data import make_mlm_data, text_vocab
from plmcli.data.tokenizers import load_tokenizer, train_tokenizer
from plmcli.errors import PlmError

SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
ENTITIES = ["北京天安门", "湖南省湘潭县", "北京市海淀区"]  # ns ns: one entity each, two jieba words
PHRASES = ["三个苹果", "一台新电脑", "学习语言模型"]  # m n, m a n, v n n: phrases, no entity
WORDS = ["喜欢", "今天", "天气", "我们"]
SENTENCES = ["毛泽东出生于湖南省湘潭县韶山冲。", "北京大学是中国著名的高等学府，位于北京市海淀区。",
             "我爱北京天安门，上海很大。", "中国人民解放军在1949年进入了上海。", "苹果公司发布了三款新产品。",
             "我买了三个苹果和一台新电脑。", "中国人民喜欢学习语言模型。"]


def test_entities_are_runs_of_proper_noun_tags():
    # jieba's tags, as the hand lists below read them
    assert tag(SENTENCES[0])[:4] == [("毛泽东", "nr"), ("出", "v"), ("生于", "v"), ("湖南省", "ns")]
    assert tag(SENTENCES[3])[0] == ("中国人民解放军", "nt") and tag(SENTENCES[1])[0] == ("北京大学", "nt")
    assert [units(s, "entities") for s in SENTENCES] == [
        ["毛泽东", "湖南省湘潭县韶山冲"],  # nr | ns ns nr: one maximal run
        ["北京大学", "中国", "北京市海淀区"],  # nt | ns | ns ns
        ["北京天安门", "上海"],
        ["中国人民解放军", "上海"],  # 1949 is not Chinese: never part of a unit
        [], [], ["中国"]]
    tagged = [("张", "nr"), ("三", "nrfg"), ("去", "v"), ("ABC", "nz"), ("国家", "n"), ("华为", "nz")]
    assert entity_chunks(tagged) == [(0, 2), (5, 6)]


def test_phrases_follow_the_grammar():
    assert [units(s, "phrases") for s in SENTENCES] == [
        ["湖南省湘潭县韶山冲"],  # 生于/v + proper nouns: no VO (objects are common nouns), an NP of E E E
        ["北京市海淀区"],  # 是中国: the copula heads no VO; 位于/v + E: no VO
        ["北京天安门"],
        [],  # 年/m alone, 进入/v 了/ul: nothing of two words
        ["三款新产品"],  # M A N
        ["三个苹果", "一台新电脑"],  # M N, M A N
        ["中国人民", "学习语言模型"]]  # E N, V N N
    # By the classes alone: VO, then NP, then MQ, leftmost; single words are no phrase.
    tagged = [("打", "v"), ("球", "n"), ("三", "m"), ("个", "q"), ("是", "v"), ("学生", "n"), ("大", "a"), ("红", "a")]
    assert phrase_chunks(tagged) == [(0, 2), (2, 4)]
    assert phrase_chunks([("三", "m"), ("个", "q"), ("学", "n"), ("生", "n")]) == [(0, 4)]
    # 年 after Arabic digits is their unit (Q), not a numeral that starts an NP; a modal heads no VO
    assert phrase_chunks([("60", "eng"), ("年", "m"), ("铁树", "n"), ("形状", "n")]) == [(2, 4)]
    assert phrase_chunks([("能", "v"), ("吃", "v"), ("饭", "n")]) == [(1, 3)]


def wordpiece():
    return train_tokenizer(SENTENCES * 3, TokenizerConfig(kind="wordpiece", vocab_size=300, min_frequency=1,
                                                          special_tokens={"unk": "[UNK]"}))


def unit_strings(tok, kind, lines):
    """The masking units of a document (one line per sentence), tokens joined within a unit."""
    ids, ws, starts = [], [], []
    for enc in tok.encode_batch(lines, add_special_tokens=False):
        starts.append(len(ids))
        ids += enc.ids
        ws += [k == 0 or enc.word_ids[k] != enc.word_ids[k - 1] for k in range(len(enc.ids))]
    toks = [tok.id_to_token(i) for i in ids]
    out = AutoUnits(kind).word_starts(np.array(ids), ws, starts, toks)
    cut = np.flatnonzero(out).tolist() + [len(ids)]
    return ["".join(toks[a:b]) for a, b in zip(cut[:-1], cut[1:])]


def test_units_map_onto_tokens_and_other_text_keeps_jieba_words():
    tok = wordpiece()
    assert unit_strings(tok, "entities", [SENTENCES[0], SENTENCES[3]]) == [
        "毛泽东", "出", "生于", "湖南省湘潭县韶山冲", "。", "中国人民解放军", "在", "1949", "年", "进入", "了", "上海", "。"]
    assert unit_strings(tok, "phrases", [SENTENCES[5]]) == ["我", "买", "了", "三个苹果", "和", "一台新电脑", "。"]
    # the same sentence in the entity stage: jieba's words (三个 | 苹果), as chinese-wwm
    assert unit_strings(tok, "entities", [SENTENCES[5]]) == ["我", "买", "了", "三个", "苹果", "和", "一台", "新", "电脑", "。"]
    with pytest.raises(PlmError, match="tokens are text"):
        AutoUnits("entities").word_starts(np.array([1, 2]), [True, True], [0], None)
    with pytest.raises(PlmError, match="'people' is not one of phrases, entities"):
        AutoUnits("people")


def test_masking_a_row_masks_each_unit_whole():
    """Rows of the shipped Chinese sample: every unit (entity or jieba word) is masked wholly or not at all,
    one 80/10/10 draw per unit, within BERT's 15% budget."""
    from plmcli import api

    tok = load_sample_tokenizer()
    lines = [x for x in Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").splitlines() if x][:300]
    B, T = len(lines), 64
    ids, ws = np.zeros((B, T), dtype=np.int64), np.ones((B, T), dtype=bool)
    special = np.ones((B, T), dtype=bool)
    for r, enc in enumerate(tok.encode_batch(lines, add_special_tokens=False)):
        n = min(len(enc.ids), T - 1)
        base = [k == 0 or enc.word_ids[k] != enc.word_ids[k - 1] for k in range(len(enc.ids))]
        row_ws = AutoUnits("entities").word_starts(np.array(enc.ids), base, [0], enc.tokens)
        ids[r, :n], ws[r, :n], special[r, :n] = np.array(enc.ids[:n]) + 10, row_ws[:n], False
        ws[r, n] = True
    masked, target = mask_batch(ids, special, ws, np.random.default_rng(0), strategy="knowledge", mask_id=1,
                                vocab_size=20000, random_ids=np.arange(5000, 6000))
    kinds = np.where(masked == 1, 0, np.where(masked != ids, 1, 2))
    whole_multi = 0
    for r in range(B):
        cut = np.flatnonzero(ws[r] | special[r]).tolist() + [T]
        for a, b in zip(cut[:-1], cut[1:]):
            t = target[r, a:b]
            assert t.all() or not t.any(), "a unit was split"
            if t.all():
                assert len(set(kinds[r, a:b].tolist())) == 1
                whole_multi += b - a > 1
    assert whole_multi > 50
    n = (~special).sum(1)
    assert (target.sum(1) <= np.maximum(1, np.round(n * 0.15))).all()


def load_sample_tokenizer():
    from plmcli import api

    text = Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").splitlines()[:400]
    return train_tokenizer(text, TokenizerConfig(kind="wordpiece", vocab_size=3000, min_frequency=1,
                                                 special_tokens=dict(SPECIALS)))


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    """Chinese documents of entities, phrases and words, one per comma-separated chunk."""
    root = tmp_path_factory.mktemp("zh")
    rng = random.Random(0)
    pick = lambda: rng.choice(ENTITIES + PHRASES) if rng.random() < 0.5 else rng.choice(WORDS)  # noqa: E731
    docs = ["\n".join("，".join(pick() for _ in range(rng.randint(3, 9))) + "。" for _ in range(6)) for _ in range(50)]
    (root / "zh.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, special_tokens=dict(SPECIALS))
    tokenize_corpus([str(root / "zh.txt")], root / "tok", cfg)
    return root


def chunk_stats(rows, tok, whole_kind):
    """Over rows (restored ids, target): for the chunks of `whole_kind` (ENTITIES or PHRASES), how many were
    split, masked whole, seen; and for the other multi-word chunks how many were split."""
    punct = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    ids_of = {tuple(tok.encode(c, add_special_tokens=False).ids): c for c in ENTITIES + PHRASES}
    split = whole = seen = other_split = 0
    for ids, target in rows:
        bounds = [i for i, t in enumerate(ids) if int(t) in punct]
        for s, e in zip(bounds[:-1], bounds[1:]):
            chunk = ids_of.get(tuple(ids[s + 1: e].tolist()))
            if chunk is None:
                continue
            t = target[s + 1: e]
            partial = bool(t.any() and not t.all())
            if chunk in whole_kind:
                split, whole, seen = split + partial, whole + bool(t.all()), seen + 1
            else:
                other_split += partial
    return split, whole, seen, other_split


def static_rows(out):
    for row in load_from_disk(str(out / "dataset"))["train"].to_list():
        ids = np.array(row["input_ids"])
        ids[row["masked_lm_positions"]] = row["masked_lm_labels"]
        target = np.zeros(len(ids), dtype=bool)
        target[row["masked_lm_positions"]] = True
        yield ids, target


@pytest.mark.parametrize("kind, whole_kind", [("entities", ENTITIES), ("phrases", ENTITIES + PHRASES)])
def test_make_mlm_data_masks_found_units_whole(zh, tmp_path, kind, whole_kind):
    assert all(chinese_word_starts(list(c))[1:].any() for c in ENTITIES + PHRASES)  # jieba alone cuts each
    assert all(units(c, kind) == [c] for c in whole_kind)
    meta = make_mlm_data(zh / "tok", tmp_path / "m", max_seq_len=64, dupe_factor=4, max_predictions=0,
                         masking="knowledge", knowledge_units=kind)
    assert meta["knowledge_units"] == kind and meta["units_key"] == units_key(kind) and "lexicon" not in meta
    tok = load_tokenizer(tmp_path / "m" / "tokenizer.json")
    split, whole, seen, other_split = chunk_stats(static_rows(tmp_path / "m"), tok, whole_kind)
    assert split == 0 and seen > 300 and whole > 0.05 * seen
    if kind == "entities":
        assert other_split > 0  # phrases are not units here: their jieba words are masked apart


def test_units_are_keyed_by_kind_and_grammar(zh, tmp_path, monkeypatch):
    a = make_mlm_data(zh / "tok", tmp_path / "a", max_seq_len=64, dupe_factor=1, masking="knowledge", knowledge_units="phrases")
    b = make_mlm_data(zh / "tok", tmp_path / "b", max_seq_len=64, dupe_factor=1, masking="knowledge", knowledge_units="entities")
    assert a["key"] != b["key"] and a["units_key"] != b["units_key"]
    monkeypatch.setattr(knowledge, "PHRASE_GRAMMAR", r"VN+|[AN]*N")
    units_key.cache_clear()
    try:
        c = make_mlm_data(zh / "tok", tmp_path / "a", max_seq_len=64, dupe_factor=1, masking="knowledge",
                          knowledge_units="phrases")
        assert c["units_key"] != a["units_key"] and c["key"] != a["key"]  # a changed grammar builds afresh
    finally:
        units_key.cache_clear()


def test_dynamic_stream_masks_found_units_whole(zh):
    from plmcli.objectives.mlm import MaskedLM, MLMConfig
    from plmcli.objectives.mlm_units import knowledge_start_stream

    ids = json.loads((zh / "tok" / "meta.json").read_text())["tokenizer"]["special_token_ids"]
    starts = knowledge_start_stream(zh / "tok", "train", ids["sep"], None, "phrases")
    assert len(starts) == len(token_stream(zh / "tok", "train", ids["sep"]))
    assert (zh / "tok" / f"train.{ids['sep']}.units-{units_key('phrases')[:16]}.bin").is_file()
    doc = load_from_disk(str(zh / "tok" / "dataset"))["train"][0]
    vocab = text_vocab(zh / "tok")
    first = AutoUnits("phrases").word_starts(np.array(doc["input_ids"]), doc["word_starts"], doc["sentence_starts"],
                                             [vocab[i] for i in doc["input_ids"]])
    n = len(doc["input_ids"])
    assert (starts[:n] == first).all() and starts[n]

    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", masking="knowledge", knowledge_units="phrases",
                             max_predictions=0), None, ids, 64)
    stream = obj.stream(zh / "tok", "train", 8, 0, 0, 1, shuffle=False)
    rows = []  # a window may cut a chunk at its edges: no cut piece is a whole chunk, so chunk_stats skips it
    for k in range(stream.batches_per_epoch()):
        b = stream[k]
        x = b["input_ids"].flatten().index_put((b["mlm_positions"],), b["mlm_labels"]).view_as(b["input_ids"]).numpy()
        t = np.zeros(x.size, dtype=bool)
        t[b["mlm_positions"].numpy()] = True
        rows += list(zip(x, t.reshape(x.shape)))
    split, whole, seen, _ = chunk_stats(rows, load_tokenizer(zh / "tok" / "tokenizer.json"), ENTITIES + PHRASES)
    assert split == 0 and seen > 100 and whole > 0


def test_settings_are_checked():
    from plmcli.objectives.mlm import MaskedLM, MLMConfig

    for cfg, msg in ((MLMConfig(masking="knowledge"), "needs objective.lexicon .* or objective.knowledge_units"),
                     (MLMConfig(masking="knowledge", lexicon="chinese-sample-entities.txt", knowledge_units="entities"),
                      "not both"),
                     (MLMConfig(masking="wwm", knowledge_units="phrases"), "objective.knowledge_units applies to masking knowledge")):
        with pytest.raises(PlmError, match=msg):
            MaskedLM(cfg, None, {}, 64)
    from plmcli.config import load_recipe

    with pytest.raises(PlmError, match="objective.knowledge_units 'people' is not one of phrases, entities"):
        load_recipe("ernie-chinese-mini", ["objective.knowledge_units=people"])
    phases = load_recipe("ernie-chinese-mini").phases
    assert [(p["set"]["objective.masking"], p["set"].get("objective.knowledge_units")) for p in phases] == [
        ("token", None), ("knowledge", "phrases"), ("knowledge", "entities")]


def test_cli(zh, tmp_path):
    res = run("make-mlm-data", zh / "tok", "--out", tmp_path / "k", "--max-seq-len", "64", "--dupe-factor", "1",
              "--masking", "knowledge", "--knowledge-units", "entities", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["knowledge_units"] == "entities"
    for extra, needle in (([], "needs --lexicon FILE"), (["--knowledge-units", "people"], "--knowledge-units 'people'"),
                          (["--knowledge-units", "entities", "--lexicon", "chinese-sample-entities.txt"], "not both")):
        res = run("make-mlm-data", zh / "tok", "--out", tmp_path / "x", "--masking", "knowledge", *extra)
        assert_clean_error(res, needle)
        assert not (tmp_path / "x").exists()


def test_ernie_pretrains_on_chinese_text_without_a_lexicon(tmp_path):
    """`plm pretrain --recipe ernie-chinese-mini --data their.txt`: no lexicon anywhere; the phrase and
    entity phases build their data from the units the tagger finds."""
    from plmcli import api

    sample = Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").split("\n\n")[:30]
    (tmp_path / "their.txt").write_text("\n\n".join(sample) + "\n", encoding="utf-8")
    sets = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=32",
            "tokenizer.vocab_size=3000", "tokenizer.min_frequency=1", "data.val_fraction=0.1", "train.seq_len=32",
            "train.global_batch_size=4", "train.eval_every=0", "train.eval_batches=2", "train.save_every=0",
            "objective.dupe_factor=1"]
    res = run("pretrain", "--recipe", "ernie-chinese-mini", "--data", tmp_path / "their.txt", "--out", tmp_path / "run",
              "--max-steps", "2", *[a for s in sets for a in ("--set", s)])
    assert res.exit_code == 0, res.output
    for phase in ("basic", "phrase", "entity"):
        assert json.loads((tmp_path / "run" / "phases" / phase / "summary.json").read_text())["steps"] == 2
    metas = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "mlm").glob("*/meta.json")]
    assert sorted((m["masking"], m.get("knowledge_units"), m.get("units_key")) for m in metas) == sorted([
        ("token", None, None), ("knowledge", "phrases", units_key("phrases")), ("knowledge", "entities", units_key("entities"))])


THUCNEWS = Path("/work/shared/data/chinese/THUCNews-titles/dev.txt")


@pytest.mark.skipif(not THUCNEWS.is_file(), reason="THUCNews titles not in /work/shared/data")
def test_real_news_titles_get_units(tmp_path):
    titles = [line.split("\t")[0] for line in THUCNEWS.read_text(encoding="utf-8").splitlines()[:1000]]
    tok = load_sample_tokenizer()
    covered = {}
    for kind in ("entities", "phrases"):
        inside = total = count = 0
        for enc in tok.encode_batch(titles, add_special_tokens=False):
            base = [k == 0 or enc.word_ids[k] != enc.word_ids[k - 1] for k in range(len(enc.ids))]
            ws = AutoUnits(kind).word_starts(np.array(enc.ids), base, [0], enc.tokens)
            found = units("".join(t.removeprefix("##") for t in enc.tokens), kind)
            count += len(found)
            inside += sum(len(u) for u in found)
            total += len(enc.ids)
            assert ws.sum() <= len(ws)
        covered[kind] = (count, inside / total)
    assert covered["entities"][0] > 300 and covered["phrases"][0] > 500
    assert 0.05 < covered["entities"][1] < covered["phrases"][1] < 0.8
