"""Sentence splitting for one-document-per-line corpora (data.split_sentences / plm tokenize --split-sentences)."""

import json

import numpy as np
import pytest

from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.corpus import load_corpus, prepare_corpus, tokenize_corpus
from plmcli.data.text import split_sentences


@pytest.mark.parametrize("line, expected", [
    ("Hello world. This is Mr. Smith from the U.S. Army! Is it? Yes.\n",
     ["Hello world.", " This is Mr. Smith from the U.S. Army!", " Is it?", " Yes.\n"]),
    ("酒店在海边。装修一般，但还算整洁！服务呢？很好……下次再来。\n",
     ["酒店在海边。", "装修一般，但还算整洁！", "服务呢？", "很好……", "下次再来。\n"]),
    ("他说：“真好。”然后走了。\n", ["他说：“真好。”", "然后走了。\n"]),  # closing quotes stay with their sentence
    ('He said "Stop." Then he left.\n', ['He said "Stop."', " Then he left.\n"]),
    ("J. K. Rowling wrote it, approx. three times. e.g. this one.\n",
     ["J. K. Rowling wrote it, approx. three times. e.g. this one.\n"]),  # initials, a lowercase continuation
    ("3.14 is pi. Version 2.0 shipped.\n", ["3.14 is pi.", " Version 2.0 shipped.\n"]),  # no space: no cut
    ("no sentence end at all\n", ["no sentence end at all\n"]),
    ("Ends here!   \n", ["Ends here!   \n"]),  # nothing after the last terminator
    ("", []),
])
def test_split_rules(line, expected):
    assert split_sentences(line) == expected


def test_pieces_always_concatenate_back():
    rng = np.random.default_rng(0)
    alphabet = list("ab cD.!?。！？”\"') \n…Mr")
    for _ in range(2000):
        line = "".join(rng.choice(alphabet, rng.integers(0, 30)))
        pieces = split_sentences(line)
        assert "".join(pieces) == line and all(pieces)


CHAR = TokenizerConfig(kind="char", vocab_size=500, min_frequency=1, special_tokens={"eos": "<eos>"})


def test_tokenize_with_split_sentences_marks_each_sentence(tmp_path):
    f = tmp_path / "reviews.txt"
    f.write_text("Good. Bad!\n好。坏！\n", encoding="utf-8")
    plain = tokenize_corpus([str(f)], tmp_path / "plain", CHAR, doc_per_line=True, val_fraction=0.0)
    split = tokenize_corpus([str(f)], tmp_path / "split", CHAR, doc_per_line=True, val_fraction=0.0,
                            split_sentences=True)
    assert plain["key"] != split["key"] and split["split_sentences"] is True and plain["split_sentences"] is False
    assert plain["counts"]["train"]["sentences"] == 2 and split["counts"]["train"]["sentences"] == 4
    dd, tok, _ = load_corpus(tmp_path / "split")
    first = dd["train"][0]
    assert first["sentence_starts"] == [0, len("Good.")]
    assert first["input_ids"] == dd["train"][0]["input_ids"]  # the same tokens, only more sentence starts
    assert [tok.id_to_token(i) for i in first["input_ids"]] == list("Good. Bad!\n")
    assert dd["train"][1]["sentence_starts"] == [0, 2]
    # pretrain's data.split_sentences reaches the same corpus through the cache
    cached = prepare_corpus([str(f)], CHAR, DataConfig(doc_per_line=True, val_fraction=0.0, split_sentences=True),
                            cache_root=tmp_path / "cache")
    assert json.loads((cached / "meta.json").read_text())["key"] == split["key"]
