import gzip
import json

import pytest

from helpers import reverse_pairs, tiny_corpus
from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.corpus import tokenize_corpus
from plmcli.data.parallel import load_split, prepare_parallel, tokenize_parallel
from plmcli.errors import PlmError

TOK = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1,
                      special_tokens={"pad": "<pad>", "bos": "<s>", "eos": "</s>", "mask": "<mask>"})


def test_build_counts_splits_and_shared_vocab(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a b c\tx y\n\nd e\tz z z\textra column ignored\nf\tw\n" * 5, encoding="utf-8")
    meta = tokenize_parallel([f], tmp_path / "out", TOK, val_fraction=0.2)
    assert meta["format"] == "plm-parallel"
    assert meta["counts"]["train"] == {"examples": 12, "src_tokens": 24, "tgt_tokens": 24, "tgt_bytes": 36}
    assert meta["counts"]["validation"]["examples"] == 3
    ids = meta["tokenizer"]["special_token_ids"]
    assert set(ids) == {"pad", "bos", "eos", "mask", "unk"} and meta["tokenizer"]["vocab_size"] == 5 + 10
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    train = load_split(tmp_path / "out", "train")
    row = train[0]
    assert tok.decode(row["src_ids"][0].as_py()) == "a b c" and tok.decode(row["tgt_ids"][0].as_py()) == "x y"
    last = load_split(tmp_path / "out", "validation")[2]  # the tail of the file is the validation split
    assert tok.decode(last["src_ids"][0].as_py()) == "f" and tok.decode(last["tgt_ids"][0].as_py()) == "w"
    # one vocabulary for both sides: a target word is a source token too
    assert tok.token_to_id("x") is not None and tok.token_to_id("a") is not None


def test_cached_by_key_and_gz_input(tmp_path):
    f = reverse_pairs(tmp_path / "p.txt", n=50)
    gz = tmp_path / "p.txt.gz"
    gz.write_bytes(gzip.compress(f.read_bytes()))
    data = DataConfig(val_fraction=0.1)
    a = prepare_parallel([str(f)], TOK, data, cache_root=tmp_path / "c")
    stamp = (a / "meta.json").stat().st_mtime_ns
    assert prepare_parallel([str(f)], TOK, data, cache_root=tmp_path / "c") == a
    assert (a / "meta.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert a.parent.name == "parallel"
    b = prepare_parallel([str(gz)], TOK, data, cache_root=tmp_path / "c")
    assert b != a and json.loads((b / "meta.json").read_text())["counts"]["train"]["examples"] == 45
    assert prepare_parallel([str(a)], TOK, data) == a  # a built directory is used as is


def test_line_without_tab_names_file_and_line(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_text("a b\tb a\n\nc d e\n", encoding="utf-8")
    with pytest.raises(PlmError) as e:
        tokenize_parallel([f], tmp_path / "out", TOK)
    msg = str(e.value)
    assert "bad.txt" in msg and "line 3" in msg and "tab" in msg
    assert not (tmp_path / "out").exists()  # nothing half-built left behind


def test_empty_side_and_missing_roles(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a\tb\n \tc\n", encoding="utf-8")
    with pytest.raises(PlmError, match="line 2 has an empty source"):
        tokenize_parallel([f], tmp_path / "o1", TOK)
    f.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(PlmError, match="pad"):
        tokenize_parallel([f], tmp_path / "o2", TokenizerConfig(kind="word", min_frequency=1))


def test_tokenized_documents_are_not_parallel_text(tmp_path):
    docs = tiny_corpus(tmp_path / "docs.txt")
    tokenize_corpus([docs], tmp_path / "tok", TokenizerConfig(kind="char", min_frequency=1))
    with pytest.raises(PlmError, match="not parallel text"):
        prepare_parallel([str(tmp_path / "tok")], TOK, DataConfig())
