import json
import os
import re
import subprocess
import sys

import pytest

from plmcli.config_sections import TokenizerConfig
from plmcli.data.tokenizers import (
    KINDS,
    load_tokenizer,
    special_token_ids,
    tokenizer_hash,
    tokenizer_kind,
    train_tokenizer,
)
from plmcli.errors import PlmError

TEXT = [
    "The quick brown fox jumps over the lazy dog.\n",
    "A lazy dog sleeps, the quick fox runs!\n",
    "Foxes and dogs: friends?\n",
] * 10
SAMPLE = "The lazy fox runs, the dog sleeps.\nA quick dog!"
SPECIALS = {"pad": "[PAD]", "mask": "[MASK]", "eos": "<|endoftext|>"}


def train(kind, **kw):
    kw.setdefault("vocab_size", 300)
    kw.setdefault("min_frequency", 1)
    kw.setdefault("special_tokens", dict(SPECIALS))
    return train_tokenizer(iter(TEXT), TokenizerConfig(kind=kind, **kw))


# What decode(encode(SAMPLE)) gives: exact where the kind keeps all text, else its normal form.
ROUND_TRIP = {
    "wordpiece": "The lazy fox runs, the dog sleeps. A quick dog!",
    "bpe": "The lazy fox runs , the dog sleeps . A quick dog !",
    "bytelevel-bpe": SAMPLE,
    "unigram": SAMPLE,
    "char": SAMPLE,
    "word": "The lazy fox the dog A quick",  # "runs," "sleeps." "dog!" are unseen words -> unk, dropped
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips(kind):
    tok = train(kind)
    assert tok.decode(tok.encode(SAMPLE).ids) == ROUND_TRIP[kind]
    assert tokenizer_kind(tok) == kind


@pytest.mark.parametrize("kind", KINDS)
def test_lowercase(kind):
    tok = train(kind, lowercase=True)
    assert tok.encode("The Quick FOX").ids == tok.encode("the quick fox").ids
    assert tok.decode(tok.encode("The Quick FOX").ids) == "the quick fox"


def test_wordpiece_lowercase_strips_accents():
    tok = train("wordpiece", lowercase=True)
    assert tok.encode("Fóxes FOXY").tokens == ["foxes", "fox", "##y"]


def test_char_keeps_newlines_and_every_char_is_a_token():
    tok = train("char")
    enc = tok.encode("a\nb c\n")
    assert enc.tokens == ["a", "\n", "b", " ", "c", "\n"]
    assert "\n" in tok.get_vocab()


def test_char_vocab_by_frequency_and_min_frequency():
    texts = ["aaaa\n", "bbb\n", "cc\n", "d\n"]
    tok = train_tokenizer(iter(texts), TokenizerConfig(kind="char", vocab_size=100, min_frequency=2, special_tokens={}))
    # counts: \n=4 a=4 b=3 c=2 d=1 -> d dropped by min_frequency; <unk> added
    assert set(tok.get_vocab()) == {"<unk>", "\n", "a", "b", "c"}
    assert tok.token_to_id("<unk>") == 0
    capped = train_tokenizer(iter(texts), TokenizerConfig(kind="char", vocab_size=4, min_frequency=1, special_tokens={}))
    assert set(capped.get_vocab()) == {"<unk>", "\n", "a", "b"}  # the 3 most frequent + unk
    assert capped.decode(capped.encode("abd\n").ids) == "ab\n"  # d is unk, dropped when decoding


def test_word_kind():
    tok = train("word")
    assert tok.encode("the quick  fox\nruns!").tokens == ["the", "quick", "fox", "runs!"]
    assert tok.decode(tok.encode("the quick  fox\nruns!").ids) == "the quick fox runs!"


ZH = ["我爱北京天安门，天安门上太阳升。", "这个酒店的服务很好，房间也很干净。", "服务很差，不推荐 hotel OK", "北京的酒店很干净"] * 3


def test_word_kind_cuts_chinese_into_jieba_words_and_saves_that_cut(tmp_path):
    cfg = TokenizerConfig(kind="word", segment="jieba", vocab_size=1000, min_frequency=2,
                          special_tokens={"unk": "[UNK]", "bos": "[BOS]", "eos": "[EOS]"})
    tok = train_tokenizer(iter(ZH), cfg)
    assert tok.encode("我爱北京的酒店，服务很好").tokens == ["我", "爱", "北京", "的", "酒店", "，", "服务", "很", "好"]
    # an ideograph never seen is [UNK] alone; the rest of its run is still cut; whitespace words stay whole
    enc = tok.encode("hotel OK 龘天安门")
    assert enc.ids[:3] == [tok.token_to_id("hotel"), tok.token_to_id("OK"), tok.token_to_id("[UNK]")]
    assert enc.tokens[-1] == "天安门" and tok.token_to_id("[BOS]") == 1
    tok.save(str(tmp_path / "t.json"))
    back = load_tokenizer(tmp_path / "t.json")
    assert back.encode("北京的酒店很干净").tokens == ["北京", "的", "酒店", "很", "干净"] and tokenizer_kind(back) == "word"
    # the default word tokenizer keeps one word per ideograph
    assert train_tokenizer(iter(ZH), TokenizerConfig(kind="word", min_frequency=1)).encode("北京").tokens == ["北", "京"]
    with pytest.raises(PlmError, match="segment=jieba applies to the word tokenizer"):
        train_tokenizer(iter(ZH), TokenizerConfig(kind="wordpiece", segment="jieba"))


def test_jieba_word_vocabulary_is_the_same_in_every_process(tmp_path):
    # Ideographs of equal count once took their order from a set, which follows the process' string hash seed:
    # the same corpus gave other ids (so other word vectors) in every run.
    script = (
        "import sys\n"
        "from plmcli.config_sections import TokenizerConfig\n"
        "from plmcli.data.tokenizers import train_tokenizer\n"
        "text = ['酒店很好，服务很好', '龙 虎 鸟 鱼 猫 狗 马 牛 羊 鸡']\n"
        "cfg = TokenizerConfig(kind='word', segment='jieba', min_frequency=1, special_tokens={'unk': '[UNK]'})\n"
        "sys.stdout.write(train_tokenizer(iter(text), cfg).to_str())\n"
    )
    out = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")]
    assert out[0] == out[1] == out[2]
    vocab = [t for t, _ in json.loads(out[0])["model"]["vocab"]]
    assert "".join(vocab[1:13]) == "很好龙虎鸟鱼猫狗马牛羊鸡"  # ideographs by count, ties in order of first appearance


@pytest.mark.parametrize("kind", KINDS)
def test_special_tokens_lowest_ids_and_never_split(kind):
    tok = train(kind)
    unk = "[UNK]" if kind == "wordpiece" else "<unk>"
    order = ["[PAD]"] + ([] if kind == "bytelevel-bpe" else [unk]) + ["[MASK]", "<|endoftext|>"]
    assert [tok.id_to_token(i) for i in range(len(order))] == order
    ids = special_token_ids(tok, SPECIALS)
    assert ids == {"pad": 0, "mask": len(order) - 2, "eos": len(order) - 1}
    enc = tok.encode("dog[MASK]fox<|endoftext|>")
    assert ids["mask"] in enc.ids and ids["eos"] in enc.ids
    assert "[MASK]" in enc.tokens and "<|endoftext|>" in enc.tokens
    # objectives add specials themselves: no post-processor may insert any
    assert tok.encode("dog fox").ids == tok.encode("dog fox", add_special_tokens=False).ids


def test_same_string_for_several_roles_is_one_token():
    tok = train("char", special_tokens={"cls": "<s>", "bos": "<s>", "sep": "</s>", "eos": "</s>"})
    assert [tok.id_to_token(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    assert special_token_ids(tok, {"bos": "<s>", "cls": "<s>"}) == {"bos": 1, "cls": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_special_token_that_also_occurs_in_the_text(kind):
    # "?" is a character and "dogs" a word of TEXT; the WordLevel and Unigram trainers need renumbering here
    tok = train(kind, special_tokens={"unk": "?", "mask": "dogs"})
    ids = sorted(tok.get_vocab().values())
    assert ids == list(range(tok.get_vocab_size()))
    assert special_token_ids(tok, {"unk": "?", "mask": "dogs"}) == {"unk": 0, "mask": 1}
    assert tok.encode("dogs?").ids == [1, 0]


def test_bytelevel_never_produces_unk():
    tok = train("bytelevel-bpe")
    text = "日本語 ☃ \t tabs\r\n and 🙂 unseen"
    enc = tok.encode(text)
    assert tok.get_vocab_size() >= 256
    assert tok.decode(enc.ids) == text
    assert not any(t in ("<unk>", "[UNK]") for t in enc.tokens)


def test_bytelevel_honours_vocab_size():
    text = [f"word{i} another{i % 7} thing number {i * 37}\n" for i in range(300)]
    tok = train_tokenizer(iter(text), TokenizerConfig(kind="bytelevel-bpe", vocab_size=300, min_frequency=2))
    assert tok.get_vocab_size() == 300  # 256 bytes + <|endoftext|> + 43 merges


def test_unknown_kind_and_role():
    with pytest.raises(PlmError, match="wordpiece, bpe, bytelevel-bpe, unigram, char, word"):
        train_tokenizer(iter(TEXT), TokenizerConfig(kind="sentencepiece"))
    with pytest.raises(PlmError, match="unknown special-token role.*'start'") as e:
        train("char", special_tokens={"start": "<s>"})
    assert "bos" in e.value.hint


def test_save_load_and_hash(tmp_path):
    tok = train("wordpiece")
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(path)
    assert loaded.encode(SAMPLE).ids == tok.encode(SAMPLE).ids
    h = tokenizer_hash(tok)
    assert re.fullmatch(r"[0-9a-f]{16}", h)
    assert tokenizer_hash(loaded) == h
    assert tokenizer_hash(train("char")) != h


def test_load_errors(tmp_path):
    with pytest.raises(PlmError, match="not found") as e:
        load_tokenizer(tmp_path / "missing.json")
    assert e.value.hint
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlmError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)
    bad.write_text(json.dumps({"version": "1.0"}))
    with pytest.raises(PlmError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_special_token_ids_missing_role():
    tok = train("char")
    with pytest.raises(PlmError, match="'<s>' \\(role 'bos'\\)"):
        special_token_ids(tok, {"pad": "[PAD]", "bos": "<s>"})
