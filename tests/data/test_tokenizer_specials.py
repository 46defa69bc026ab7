"""`plm tokenize --tokenizer KIND` gives each kind the special tokens its usual models need."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import tiny_corpus  # noqa: E402
from test_cli import run  # noqa: E402


def tokenize(tmp_path, *args):
    tmp_path.mkdir(exist_ok=True)
    corpus = tiny_corpus(tmp_path / "c.txt", n_docs=40)
    res = run("tokenize", corpus, "--out", tmp_path / "tok", "--vocab-size", "200", "--min-frequency", "1", "--json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["tokenizer"]


@pytest.mark.parametrize("kind, ids", [
    ("wordpiece", {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}),
    ("unigram", {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}),
    ("bytelevel-bpe", {"eos": "<|endoftext|>"}),
])
def test_kind_defaults(tmp_path, kind, ids):
    tok = tokenize(tmp_path, "--tokenizer", kind)
    assert tok["special_tokens"] == ids
    assert tok["special_token_ids"] == {role: i for i, role in enumerate(ids)}  # lowest ids, in ROLES order


def test_recipe_and_flag_win(tmp_path):
    tok = tokenize(tmp_path, "--recipe", "roberta-base")
    assert tok["kind"] == "bytelevel-bpe" and tok["special_tokens"] == {
        "pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>", "bos": "<s>", "eos": "</s>"}
    tok = tokenize(tmp_path / "x", "--tokenizer", "wordpiece", "--special-tokens", "unk=<u>,eos=<e>")
    assert tok["special_tokens"] == {"unk": "<u>", "eos": "<e>"}


def test_wordpiece_then_make_mlm_data(tmp_path):
    tokenize(tmp_path, "--tokenizer", "wordpiece")
    res = run("make-mlm-data", tmp_path / "tok", "--out", tmp_path / "mlm", "--max-seq-len", "32", "--dupe-factor", "1")
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "mlm" / "meta.json").read_text())
    assert meta["counts"]["train"]["documents"] > 30
    assert meta["tokenizer"]["special_token_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
