import json
import os
import random

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from datasets import load_from_disk  # noqa: E402

from plmcli.config_sections import TokenizerConfig  # noqa: E402
from plmcli.data import mlm_data  # noqa: E402
from plmcli.data.corpus import tokenize_corpus  # noqa: E402
from plmcli.data.masking import chinese_word_starts  # noqa: E402
from plmcli.data.mlm_data import make_mlm_data  # noqa: E402
from plmcli.data.tokenizers import load_tokenizer  # noqa: E402
from plmcli.errors import PlmError  # noqa: E402

datasets.disable_progress_bars()

BERT_SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
MAX_LEN = 32


def tokenized(root, name, text, kind="word", specials=BERT_SPECIALS, vocab_size=30_000, **kw):
    src = root / f"{name}.txt"
    src.write_text(text, encoding="utf-8")
    cfg = TokenizerConfig(kind=kind, vocab_size=vocab_size, min_frequency=1, special_tokens=dict(specials))
    out = root / name
    tokenize_corpus([str(src)], out, cfg, **kw)
    return out


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Word-level corpora whose every token names its place: d<doc>s<sentence>w<word>."""
    root = tmp_path_factory.mktemp("mlm")
    rng = random.Random(0)
    docs = []
    for d in range(100):
        lines = [" ".join(f"d{d}s{s}w{w}" for w in range(rng.randint(2, 6))) for s in range(rng.randint(15, 30))]
        docs.append("\n".join(lines))
    one_doc = "\n".join(f"only s{s} " + " ".join(f"x{w}" for w in range(5)) for s in range(60))
    return {
        "main": tokenized(root, "main", "\n\n".join(docs) + "\n"),
        "one_doc": tokenized(root, "one_doc", one_doc + "\n"),
        "lines": tokenized(root, "lines", "".join(f"line {i} here\n" for i in range(50)), doc_per_line=True),
        "no_cls": tokenized(root, "no_cls", "\n\n".join(docs[:5]), specials={"eos": "<eos>"}),
    }


def load(out, split="train"):
    return load_from_disk(str(out / "dataset"))[split]


def restored(row):
    """The instance's tokens before masking."""
    ids = np.array(row["input_ids"])
    ids[row["masked_lm_positions"]] = row["masked_lm_labels"]
    return ids


class Places:
    """token id -> (document, index in the document, index in the corpus) for the d<d>s<s>w<w> corpus."""

    def __init__(self, corpus_dir):
        tok = load_tokenizer(corpus_dir / "tokenizer.json")
        self.sep = tok.token_to_id("[SEP]")
        self.cls = tok.token_to_id("[CLS]")
        keys = {}
        for t, i in tok.get_vocab().items():
            if t.startswith("d") and "s" in t:
                d, rest = t[1:].split("s")
                s, w = rest.split("w")
                keys[i] = (int(d), int(s), int(w))
        order = sorted(keys.values())
        rank = {k: n for n, k in enumerate(order)}
        first = {}
        for k in order:
            first.setdefault(k[0], rank[k])
        self.doc = {i: k[0] for i, k in keys.items()}
        self.glob = {i: rank[k] for i, k in keys.items()}
        self.local = {i: rank[k] - first[k[0]] for i, k in keys.items()}
        self.sentence_start = {i for i, k in keys.items() if k[2] == 0}

    def span(self, ids):
        """(doc, first index, last index) of a run of tokens that must be one contiguous piece of a document."""
        docs = {self.doc[int(i)] for i in ids}
        assert len(docs) == 1, "a segment mixes documents"
        local = [self.local[int(i)] for i in ids]
        assert local == list(range(local[0], local[0] + len(local))), "a segment is not contiguous"
        return docs.pop(), local[0], local[-1]


def check_masking(rows, specials_of, max_predictions=20, mask_count="reference"):
    """Google's num_to_predict = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob)))), len(tokens)
    counting [CLS]/[SEP]; with mask_count maskable, the same share of the maskable tokens alone."""
    for row in rows:
        n = len(row["input_ids"])
        special = specials_of(row)
        counted = n if mask_count == "reference" else n - len(special)
        want = min(max_predictions, max(1, int(round(counted * 0.15))))
        assert len(row["masked_lm_positions"]) == want
        assert not set(row["masked_lm_positions"]) & special
        assert row["masked_lm_positions"] == sorted(row["masked_lm_positions"])


def test_nsp_pairs(corpora, tmp_path):
    out = tmp_path / "nsp"
    meta = make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, short_seq_prob=0.0, dupe_factor=3, seed=1)
    assert meta["format"] == "plm-mlm" and meta["pairs"] == "nsp" and meta["dupe_factor"] == 3
    assert json.loads((out / "meta.json").read_text())["counts"] == meta["counts"]
    assert (out / "tokenizer.json").read_bytes() == (corpora["main"] / "tokenizer.json").read_bytes()
    p = Places(corpora["main"])
    rows = load(out).to_list()
    assert len(rows) == meta["counts"]["train"]["instances"]
    labels = np.array([r["next_sentence_label"] for r in rows])
    # 1 = random next (HF's convention). Google's rule also sends every one-sentence chunk (here often a
    # document's last sentence) to a random B, so positives run a few points above half.
    assert 0.47 < labels.mean() < 0.58
    assert meta["counts"]["train"]["random_next"] == labels.sum()
    for row in rows:
        ids = restored(row)
        assert len(ids) <= MAX_LEN and ids[0] == p.cls and ids[-1] == p.sep
        sep = int(np.flatnonzero(ids == p.sep)[0])
        assert row["token_type_ids"] == [0] * (sep + 1) + [1] * (len(ids) - sep - 1)
        assert row["attention_mask"] == [1] * len(ids)
        doc_a, a0, a1 = p.span(ids[1:sep])
        doc_b, b0, b1 = p.span(ids[sep + 1:-1])
        if row["next_sentence_label"] == 0:
            assert doc_a == doc_b and b0 > a1
            if len(ids) < MAX_LEN:  # nothing truncated: B starts right where A ends, both on sentence starts
                assert b0 == a1 + 1 and ids[1] in p.sentence_start and ids[sep + 1] in p.sentence_start
        else:
            assert doc_a != doc_b
    check_masking(rows, lambda r: {0, len(r["input_ids"]) - 1, r["token_type_ids"].index(1) - 1})
    assert meta["counts"]["validation"]["instances"] == len(load(out, "validation")) > 0


def test_sop_pairs_really_swapped(corpora, tmp_path):
    out = tmp_path / "sop"
    make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, pairs="sop", dupe_factor=2, seed=2)
    p = Places(corpora["main"])
    rows = load(out).to_list()
    labels = np.array([r["next_sentence_label"] for r in rows])
    assert abs(labels.mean() - 0.5) < 0.04
    for row in rows:
        ids = restored(row)
        sep = int(np.flatnonzero(ids == p.sep)[0])
        doc_a, a0, a1 = p.span(ids[1:sep])
        doc_b, b0, b1 = p.span(ids[sep + 1:-1])
        assert doc_a == doc_b
        assert (b0 > a1) if row["next_sentence_label"] == 0 else (b1 < a0)


def test_none_packs_across_documents_with_separator(corpora, tmp_path):
    out = tmp_path / "none"
    meta = make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, pairs="none", dupe_factor=2, seed=3)
    p = Places(corpora["main"])
    rows = load(out).to_list()
    crossed = words_out = 0
    for row in rows:
        ids = restored(row)
        assert row["next_sentence_label"] == -1 and set(row["token_type_ids"]) == {0}
        assert ids[0] == p.cls and ids[-1] == p.sep and len(ids) <= MAX_LEN
        body = ids[1:-1]
        assert body[0] != p.sep and body[-1] != p.sep and body[0] in p.sentence_start
        words = body[body != p.sep]
        g = [p.glob[int(i)] for i in words]
        assert g == list(range(g[0], g[0] + len(g)))  # contiguous in the corpus
        docs = [p.doc[int(i)] for i in words]
        changes = sum(a != b for a, b in zip(docs, docs[1:]))
        assert changes == int((body == p.sep).sum())  # one separator at each document boundary
        crossed += changes > 0
        words_out += len(words)
    assert crossed > len(rows) // 10
    assert meta["packing"] == "full_sentences"
    from plmcli.data.mlm_data import FORMAT, VERSION
    from plmcli.data.store import cache_key, read_meta

    cmeta = read_meta(corpora["main"])  # the key as before packing had a name: outputs built then are reused
    before = dict(max_seq_len=MAX_LEN, short_seq_prob=0.1, dupe_factor=2, mask_prob=0.15, max_predictions=20, pairs="none",
                  masking="token", seed=3, mask_count="reference", cross_documents=True)
    assert meta["key"] == cache_key(cmeta.get("key"), cmeta["tokenizer"].get("hash"), before, FORMAT, VERSION)
    train = load_from_disk(str(corpora["main"] / "dataset"))["train"]
    assert words_out == 2 * sum(map(len, train["input_ids"]))  # every token once per dupe
    assert meta["counts"]["train"]["instances"] == len(rows)
    check_masking(rows, lambda r: {i for i, t in enumerate(restored(r)) if t in (p.cls, p.sep)})


def test_doc_sentences_never_cross_a_document(corpora, tmp_path):
    out = tmp_path / "doc"
    meta = make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, pairs="none", packing="doc_sentences", dupe_factor=1)
    assert meta["packing"] == "doc_sentences" and "cross_documents" not in meta
    p = Places(corpora["main"])
    rows = load(out).to_list()
    words_out, short = 0, 0
    for row in rows:
        ids = restored(row)
        body = ids[1:-1]
        assert ids[0] == p.cls and ids[-1] == p.sep and not (body == p.sep).any()
        g = [p.glob[int(i)] for i in body]
        assert g == list(range(g[0], g[0] + len(g))) and len({p.doc[int(i)] for i in body}) == 1
        assert body[0] in p.sentence_start
        words_out += len(body)
        short += len(ids) < MAX_LEN - 6  # most documents end in a short block: it stops at the document end
    train = load_from_disk(str(corpora["main"] / "dataset"))["train"]
    assert words_out == sum(map(len, train["input_ids"]))
    assert short >= 50
    check_masking(rows, lambda r: {0, len(r["input_ids"]) - 1})
    with pytest.raises(PlmError, match="DOC-SENTENCES"):
        make_mlm_data(corpora["main"], tmp_path / "x", pairs="nsp", packing="doc_sentences")
    with pytest.raises(PlmError, match="--packing 'window' is not one of"):
        make_mlm_data(corpora["main"], tmp_path / "x", pairs="none", packing="window")


def test_deterministic_and_independent_of_num_proc(corpora, tmp_path, monkeypatch):
    monkeypatch.setattr(mlm_data, "SHARD_TOKENS", 800)  # several shards
    kw = dict(max_seq_len=MAX_LEN, dupe_factor=2, seed=7)
    make_mlm_data(corpora["main"], tmp_path / "a", **kw)
    make_mlm_data(corpora["main"], tmp_path / "b", **kw, num_proc=2)
    make_mlm_data(corpora["main"], tmp_path / "c", **{**kw, "seed": 8})
    a, b, c = (load_from_disk(str(tmp_path / n / "dataset")) for n in "abc")
    for split in ("train", "validation"):
        assert a[split].to_dict() == b[split].to_dict()
    assert a["train"].to_dict() != c["train"].to_dict()


def test_output_columns_and_cache(corpora, tmp_path):
    out = tmp_path / "cols"
    meta = make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, dupe_factor=1, masking="ngram")
    ds = load(out)
    assert {k: (type(v).__name__, getattr(getattr(v, "feature", v), "dtype", None)) for k, v in ds.features.items()} == {
        "input_ids": ("List", "int32"), "token_type_ids": ("List", "int8"), "attention_mask": ("List", "int8"),
        "masked_lm_positions": ("List", "int32"), "masked_lm_labels": ("List", "int32"),
        "next_sentence_label": ("Value", "int8"),
    }
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, dupe_factor=1, masking="ngram") == meta
    assert (out / "meta.json").stat().st_mtime_ns == stamp  # reused
    make_mlm_data(corpora["main"], out, max_seq_len=MAX_LEN, dupe_factor=1, masking="ngram", force=True)
    assert (out / "meta.json").stat().st_mtime_ns != stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_sop_on_a_single_document(corpora, tmp_path):
    meta = make_mlm_data(corpora["one_doc"], tmp_path / "o", max_seq_len=MAX_LEN, pairs="sop", dupe_factor=1)
    assert meta["counts"]["train"]["instances"] > 5


def test_whole_word_masking_never_splits_words(tmp_path):
    rng = random.Random(1)
    vocab = ["unbelievable", "tokenization", "transformers", "pretraining", "masking", "the", "a", "of", "bert"]
    docs = ["\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 12))) for _ in range(8)) for _ in range(60)]
    corpus = tokenized(tmp_path, "wp", "\n\n".join(docs) + "\n", kind="wordpiece", vocab_size=60)
    tok = load_tokenizer(corpus / "tokenizer.json")
    assert any(t.startswith("##") for t in tok.get_vocab())  # words really are split into pieces
    out = tmp_path / "wwm"
    make_mlm_data(corpus, out, max_seq_len=64, masking="wwm", dupe_factor=2, max_predictions=0)
    total = masked = 0
    for row in load(out).to_list():
        ids = restored(row)
        target = np.zeros(len(ids), dtype=bool)
        target[row["masked_lm_positions"]] = True
        piece = [tok.id_to_token(int(i)) for i in ids]
        # A "##" piece goes with the piece before it (unless truncation left it first after [CLS]/[SEP]).
        cont = np.array([p.startswith("##") and q not in ("[CLS]", "[SEP]") for q, p in zip(["[CLS]"] + piece, piece)])
        assert (target[1:][cont[1:]] == target[:-1][cont[1:]]).all()
        total += len(ids)  # the budget is a share of the whole instance, [CLS]/[SEP] included (Google's count)
        masked += target.sum()
    assert 0.12 < masked / total < 0.16


def test_chinese_whole_word_masking(tmp_path):
    words = ["北京", "天安门", "中国", "人民", "我们", "喜欢", "学习", "语言", "模型", "今天", "天气"]
    assert all(chinese_word_starts(list(w)).tolist() == [True] + [False] * (len(w) - 1) for w in words)
    rng = random.Random(2)
    docs = ["\n".join("，".join(rng.choice(words) for _ in range(rng.randint(3, 10))) + "。" for _ in range(6))
            for _ in range(60)]
    corpus = tokenized(tmp_path, "zh", "\n\n".join(docs) + "\n", kind="wordpiece", vocab_size=200)
    tok = load_tokenizer(corpus / "tokenizer.json")
    out = tmp_path / "zh-wwm"
    make_mlm_data(corpus, out, max_seq_len=64, masking="chinese-wwm", dupe_factor=2, max_predictions=0)
    punct = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    runs = masked_runs = 0
    for row in load(out).to_list():
        ids = restored(row)
        target = np.zeros(len(ids), dtype=bool)
        target[row["masked_lm_positions"]] = True
        bounds = [i for i, t in enumerate(ids) if int(t) in punct]
        for s, e in zip(bounds[:-1], bounds[1:]):  # each run of characters between punctuation is one word
            if e - s > 1:
                runs += 1
                assert len(set(target[s + 1:e].tolist())) == 1, "a Chinese word was split"
                masked_runs += target[s + 1]
    assert masked_runs > runs * 0.05


@pytest.mark.parametrize("kwargs, pattern", [
    ({"max_seq_len": 4}, "too short"),
    ({"masking": "bogus"}, "unknown --masking"),
    ({"pairs": "nope"}, "unknown --pairs"),
    ({"mask_prob": 0.0}, "--mask-prob"),
    ({"mask_prob": 1.0}, "--mask-prob"),
    ({"dupe_factor": 0}, "--dupe-factor"),
    ({"masking": "ngram", "ngram_probs": (0.6, 0.6)}, "--ngram-probs"),
])
def test_bad_settings(corpora, tmp_path, kwargs, pattern):
    with pytest.raises(PlmError, match=pattern):
        make_mlm_data(corpora["main"], tmp_path / "x", **kwargs)


def test_bad_corpora(corpora, tmp_path):
    with pytest.raises(PlmError, match="plm tokenize") as e:
        make_mlm_data(tmp_path, tmp_path / "x")
    assert "plm tokenize" in e.value.hint
    with pytest.raises(PlmError, match="at least 2 documents") as e:
        make_mlm_data(corpora["one_doc"], tmp_path / "x", pairs="nsp")
    assert "--pairs sop" in e.value.hint
    with pytest.raises(PlmError, match="at least 2 sentences"):
        make_mlm_data(corpora["lines"], tmp_path / "x", pairs="sop")
    make_mlm_data(corpora["lines"], tmp_path / "lines-none", pairs="none", dupe_factor=1)  # packing needs no pairs
    with pytest.raises(PlmError, match="cls/sep/mask") as e:
        make_mlm_data(corpora["no_cls"], tmp_path / "x")
    assert "--special-tokens" in e.value.hint
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file.txt").write_text("mine")
    with pytest.raises(PlmError, match="not a `plm make-mlm-data` output"):
        make_mlm_data(corpora["main"], tmp_path / "taken")
    assert not (tmp_path / "x").exists()


def test_mask_count_reference_by_default_maskable_on_request(corpora, tmp_path):
    """Google's count ([CLS]/[SEP] in the length) by default; --mask-count maskable keeps plm's older count, and
    each count has its own cache key (data built with the other count is never reused)."""
    kw = dict(max_seq_len=MAX_LEN, dupe_factor=1, short_seq_prob=0.0, seed=4)
    ref = make_mlm_data(corpora["main"], tmp_path / "ref", **kw)
    own = make_mlm_data(corpora["main"], tmp_path / "own", mask_count="maskable", **kw)
    assert ref["mask_count"] == "reference" and own["mask_count"] == "maskable" and ref["key"] != own["key"]
    specials = lambda r: {0, len(r["input_ids"]) - 1, r["token_type_ids"].index(1) - 1}  # noqa: E731
    check_masking(load(tmp_path / "ref").to_list(), specials)
    check_masking(load(tmp_path / "own").to_list(), specials, mask_count="maskable")
    assert ref["counts"]["train"]["predictions"] > own["counts"]["train"]["predictions"]  # 32 tokens: 5 targets, not 4


@pytest.mark.parametrize("kwargs, pattern", [
    ({"mask_count": "all"}, "--mask-count 'all' is not one of reference, maskable"),
    ({"masking": "ngram_per_word", "ngram_start_prob": 0.0}, "--ngram-start-prob 0.0 is out of range"),
    ({"masking": "ngram_per_word", "ngram_start_prob": 1.0}, "--ngram-start-prob 1.0 is out of range"),
    ({"ngram_start_prob": 0.2}, "--ngram-start-prob applies to --masking ngram_per_word, not token"),
])
def test_bad_masking_options(corpora, tmp_path, kwargs, pattern):
    with pytest.raises(PlmError, match=pattern):
        make_mlm_data(corpora["main"], tmp_path / "x", **kwargs)
