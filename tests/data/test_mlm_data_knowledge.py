"""make-mlm-data with ERNIE's knowledge masking (--masking knowledge --lexicon) and SpanBERT's span settings."""

import json
import random

import numpy as np
import pytest
from datasets import load_from_disk
from typer.testing import CliRunner

from plmcli.cli import app
from plmcli.config_sections import TokenizerConfig
from plmcli.data.corpus import tokenize_corpus
from plmcli.data.masking import chinese_word_starts
from plmcli.data.mlm_data import make_mlm_data
from plmcli.data.tokenizers import load_tokenizer
from plmcli.errors import PlmError

SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
WORDS = ["中国", "人民", "我们", "喜欢", "学习", "语言", "模型", "今天", "天气"]  # jieba words
PHRASES = ["北京天安门", "深度学习模型", "上海外滩"]  # lexicon entries that jieba alone cuts into words


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    """Chinese documents of words and lexicon phrases, one per comma-separated chunk."""
    root = tmp_path_factory.mktemp("zh")
    rng = random.Random(0)
    pick = lambda: rng.choice(PHRASES) if rng.random() < 0.3 else rng.choice(WORDS)  # noqa: E731
    docs = ["\n".join("，".join(pick() for _ in range(rng.randint(3, 9))) + "。" for _ in range(6)) for _ in range(60)]
    (root / "zh.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, special_tokens=dict(SPECIALS))
    tokenize_corpus([str(root / "zh.txt")], root / "tok", cfg)
    (root / "phrases.txt").write_text("\n".join(PHRASES) + "\n", encoding="utf-8")
    return root


def chunks(row, punct):
    """(restored ids, target mask, [(start, end)] of the runs of characters between punctuation)."""
    ids = np.array(row["input_ids"])
    ids[row["masked_lm_positions"]] = row["masked_lm_labels"]
    target = np.zeros(len(ids), dtype=bool)
    target[row["masked_lm_positions"]] = True
    bounds = [i for i, t in enumerate(ids) if int(t) in punct]
    return ids, target, [(s + 1, e) for s, e in zip(bounds[:-1], bounds[1:]) if e - s > 1]


def stream_chunks(stream, punct):
    """chunks() of every row of every batch of a dynamic MLM stream."""
    import torch

    for k in range(stream.batches_per_epoch()):
        b = stream[k]
        x = b["input_ids"].flatten().index_put((b["mlm_positions"],), b["mlm_labels"]).view_as(b["input_ids"])
        t = torch.zeros(x.numel(), dtype=torch.bool).index_fill(0, b["mlm_positions"], True).view_as(x)
        for r in range(len(x)):
            row = {"input_ids": x[r].tolist(), "masked_lm_positions": torch.nonzero(t[r]).flatten().tolist()}
            row["masked_lm_labels"] = [row["input_ids"][p] for p in row["masked_lm_positions"]]
            yield chunks(row, punct)


def test_lexicon_phrases_and_jieba_words_are_masked_whole(zh, tmp_path):
    out = tmp_path / "ernie"
    meta = make_mlm_data(zh / "tok", out, max_seq_len=64, dupe_factor=3, max_predictions=0, masking="knowledge",
                         lexicon=str(zh / "phrases.txt"))
    assert meta["masking"] == "knowledge" and len(meta["lexicon_key"]) == 64 and "span_p" not in meta
    tok = load_tokenizer(out / "tokenizer.json")
    punct = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    phrase_ids = {tuple(tok.encode(p, add_special_tokens=False).ids) for p in PHRASES}
    seen = {"phrase": [0, 0], "word": [0, 0]}
    masked = total = 0
    for row in load_from_disk(str(out / "dataset"))["train"].to_list():
        ids, target, runs = chunks(row, punct)
        assert target.sum() <= max(1, round(len(ids) * 0.15))  # Google's budget ([CLS]/[SEP] counted), no cap
        masked, total = masked + target.sum(), total + len(ids)  # a share of the whole instance (Google's count)
        for s, e in runs:
            kind = "phrase" if tuple(ids[s:e].tolist()) in phrase_ids else "word"
            assert target[s:e].all() or not target[s:e].any(), "a unit was split"
            seen[kind][0] += 1
            seen[kind][1] += bool(target[s])
    # Phrases are units (jieba alone cuts them: 北京|天安门); words outside the lexicon are jieba words.
    assert all(chinese_word_starts(list(p))[1:].any() for p in PHRASES)
    assert seen["phrase"][1] > 0.05 * seen["phrase"][0] and seen["word"][1] > 0.05 * seen["word"][0]
    assert 0.12 < masked / total < 0.16


def test_lexicon_counts_by_content_and_settings_are_checked(zh, tmp_path):
    out = tmp_path / "a"
    a = make_mlm_data(zh / "tok", out, max_seq_len=64, dupe_factor=1, masking="knowledge", lexicon=str(zh / "phrases.txt"))
    copy = tmp_path / "copy.txt"
    copy.write_text((zh / "phrases.txt").read_text(encoding="utf-8"), encoding="utf-8")
    assert make_mlm_data(zh / "tok", out, max_seq_len=64, dupe_factor=1, masking="knowledge", lexicon=str(copy))["key"] == a["key"]
    copy.write_text("北京天安门\n", encoding="utf-8")
    b = make_mlm_data(zh / "tok", tmp_path / "b", max_seq_len=64, dupe_factor=1, masking="knowledge", lexicon=str(copy))
    assert b["key"] != a["key"] and b["lexicon_key"] != a["lexicon_key"]
    span = make_mlm_data(zh / "tok", tmp_path / "s", max_seq_len=64, dupe_factor=1, masking="span", span_p=0.5, span_max=3)
    assert (span["span_p"], span["span_max"]) == (0.5, 3) and "lexicon" not in span


@pytest.mark.parametrize("kwargs, pattern", [
    ({"masking": "knowledge"}, "needs --lexicon"),
    ({"lexicon": "x.txt"}, "--lexicon applies to --masking knowledge"),
    ({"masking": "knowledge", "lexicon": "no/such/file.txt"}, "does not exist"),
    ({"masking": "span", "span_max": 0}, "--span-max 0 must be"),
    ({"masking": "span", "span_p": 0.0}, r"--span-p 0.0 must be in \(0, 1\]"),
    ({"masking": "span", "span_p": 1.5}, "--span-p 1.5"),
])
def test_bad_settings(zh, tmp_path, kwargs, pattern):
    with pytest.raises(PlmError, match=pattern):
        make_mlm_data(zh / "tok", tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_cli_options(zh, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["make-mlm-data", str(zh / "tok"), "--out", str(tmp_path / "k"), "--max-seq-len", "64",
                              "--dupe-factor", "1", "--masking", "knowledge", "--lexicon", str(zh / "phrases.txt"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["lexicon"] == str((zh / "phrases.txt").resolve())
    res = runner.invoke(app, ["make-mlm-data", str(zh / "tok"), "--out", str(tmp_path / "s"), "--masking", "span",
                              "--span-max", "0"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --span-max 0 must be") and "Traceback" not in res.output
    (tmp_path / "empty.txt").write_text("\n# none\n", encoding="utf-8")
    res = runner.invoke(app, ["make-mlm-data", str(zh / "tok"), "--out", str(tmp_path / "e"), "--masking", "knowledge",
                              "--lexicon", str(tmp_path / "empty.txt")])
    assert res.exit_code == 2 and "has no usable lines" in res.stderr
    for probs, msg in (("0.5,x", "not a comma-separated list"), ("0.5,0.1", "summing to 1")):
        res = runner.invoke(app, ["make-mlm-data", str(zh / "tok"), "--out", str(tmp_path / "n"), "--masking", "ngram",
                                  "--ngram-probs", probs])
        assert res.exit_code == 2 and msg in res.stderr and "Traceback" not in res.output


def test_dynamic_knowledge_masking_reads_units_in_step_with_the_tokens(zh):
    from plmcli.data.corpus import token_stream
    from plmcli.data.mlm_data import knowledge_lexicon
    from plmcli.objectives.mlm import MaskedLM, MLMConfig
    from plmcli.objectives.mlm_units import knowledge_start_stream

    meta = json.loads((zh / "tok" / "meta.json").read_text())
    ids = meta["tokenizer"]["special_token_ids"]
    units = knowledge_start_stream(zh / "tok", "train", ids["sep"], str(zh / "phrases.txt"))
    tokens = token_stream(zh / "tok", "train", ids["sep"])
    assert len(units) == len(tokens)
    lex, vocab = knowledge_lexicon(zh / "tok", str(zh / "phrases.txt"))
    doc = load_from_disk(str(zh / "tok" / "dataset"))["train"][0]
    first = lex.word_starts(np.array(doc["input_ids"]), doc["word_starts"], doc["sentence_starts"],
                            [vocab[i] for i in doc["input_ids"]])
    n = len(doc["input_ids"])
    assert (units[:n] == first).all() and units[n] and tokens[n] == ids["sep"]

    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", masking="knowledge", lexicon=str(zh / "phrases.txt"),
                             max_predictions=0), None, ids, 64)
    tok = load_tokenizer(zh / "tok" / "tokenizer.json")
    punct = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    phrase_ids = {tuple(tok.encode(p, add_special_tokens=False).ids) for p in PHRASES}
    whole = 0
    for ids_r, target, runs in stream_chunks(obj.stream(zh / "tok", "train", 8, 0, 0, 1, shuffle=False), punct):
        for a, e in runs[1:-1]:  # a window may cut the first and last chunk
            if tuple(ids_r[a:e].tolist()) in phrase_ids:
                assert target[a:e].all() or not target[a:e].any()
                whole += bool(target[a])
    assert whole > 0


def test_dynamic_chinese_wwm_masks_jieba_words_whole(zh):
    """RoBERTa-wwm-style: dynamic masking whose whole words are jieba's Chinese words, as make-mlm-data's
    chinese-wwm (the cached unit stream equals its per-document word starts)."""
    from plmcli.data.corpus import token_stream
    from plmcli.data.mlm_data import chinese_row_starts, text_vocab
    from plmcli.objectives.mlm import MaskedLM, MLMConfig
    from plmcli.objectives.mlm_units import chinese_word_start_stream

    meta = json.loads((zh / "tok" / "meta.json").read_text())
    ids = meta["tokenizer"]["special_token_ids"]
    units = chinese_word_start_stream(zh / "tok", "train", ids["sep"])
    assert len(units) == len(token_stream(zh / "tok", "train", ids["sep"]))
    doc = load_from_disk(str(zh / "tok" / "dataset"))["train"][0]
    n = len(doc["input_ids"])
    first = chinese_row_starts(doc["input_ids"], doc["sentence_starts"], doc["word_starts"], text_vocab(zh / "tok"))
    assert (units[:n] == first).all() and units[n] and not first.all()  # jieba joined characters into words

    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", masking="chinese-wwm", max_predictions=0), None, ids, 64)
    tok = load_tokenizer(zh / "tok" / "tokenizer.json")
    punct = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    word_ids = {tuple(tok.encode(w, add_special_tokens=False).ids) for w in WORDS}
    whole = split = 0
    for ids_r, target, runs in stream_chunks(obj.stream(zh / "tok", "train", 8, 0, 0, 1, shuffle=False), punct):
        for a, e in runs[1:-1]:  # a window may cut the first and last chunk
            if tuple(ids_r[a:e].tolist()) in word_ids:
                whole += bool(target[a:e].all())
                split += bool(target[a:e].any() and not target[a:e].all())
    assert whole > 20 and split == 0


def test_static_span_settings_reach_the_masking(zh, tmp_path, monkeypatch):
    from plmcli.data import mlm_data

    real, seen = mlm_data.mask_batch, set()

    def spy(*args, **kw):
        seen.add((kw["strategy"], kw["span_p"], kw["span_max"]))
        return real(*args, **kw)

    monkeypatch.setattr(mlm_data, "mask_batch", spy)
    make_mlm_data(zh / "tok", tmp_path / "s", max_seq_len=64, dupe_factor=1, masking="span", span_p=0.5, span_max=3)
    assert seen == {("span", 0.5, 3)}
    seen.clear()
    monkeypatch.setattr(mlm_data, "mask_batch", lambda *a, **kw: seen.add(kw["ngram_probs"]) or real(*a, **kw))
    meta = make_mlm_data(zh / "tok", tmp_path / "n", max_seq_len=64, dupe_factor=1, masking="ngram",
                         ngram_probs=(0.5455, 0.2727, 0.1818))
    assert seen == {(0.5455, 0.2727, 0.1818)} and meta["ngram_probs"] == [0.5455, 0.2727, 0.1818]
