"""ngram_per_word's start probability as a recipe key (objective.ngram_start_prob) and a make-mlm-data flag
(--ngram-start-prob), and make-mlm-data's --mask-count: each declared once (data/masking_options.py), checked,
and handed through to the masking code."""

import json
import sys
import types

import numpy as np
import pytest

from helpers import assert_clean_error, run
from plmcli.config_schema import build_section
from plmcli.config_sections import TokenizerConfig
from plmcli.data import masking, mlm_data
from plmcli.data.corpus import tokenize_corpus
from plmcli.errors import PlmError
from plmcli.objectives.mlm import MaskedLM, MLMConfig

SPECIALS = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("seed")
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat while dogs ran far away from home and back again".split()
    docs = ["\n".join(" ".join(rng.choice(words, rng.integers(4, 12))) for _ in range(6)) for _ in range(20)]
    (root / "c.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=dict(SPECIALS))
    return tokenize_corpus([str(root / "c.txt")], root / "tok", cfg), root / "tok"


def spy_on(monkeypatch, module, seen: list):
    """Record the ngram_start_prob and counted that `module`'s mask_batch is handed."""
    real = masking.mask_batch

    def spy(*args, **kw):
        seen.append((kw.get("ngram_start_prob"), kw.get("counted")))
        return real(*args, **kw)

    monkeypatch.setattr(module, "mask_batch", spy)


def test_the_flag_reaches_the_masking_and_the_cache_key(corpus, tmp_path, monkeypatch):
    _, tok = corpus
    seen = []
    spy_on(monkeypatch, mlm_data, seen)
    res = run("make-mlm-data", tok, "--out", tmp_path / "a", "--masking", "ngram_per_word", "--ngram-start-prob", "0.3",
              "--max-seq-len", 32, "--dupe-factor", 1, "--json")
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)
    assert meta["ngram_start_prob"] == 0.3 and meta["mask_count"] == "reference"
    assert seen and {p for p, _ in seen} == {0.3} and all(c is not None for _, c in seen)  # Google's count: lengths
    seen.clear()
    derived = mlm_data.make_mlm_data(tok, tmp_path / "b", masking="ngram_per_word", max_seq_len=32, dupe_factor=1,
                                     mask_count="maskable")
    assert "ngram_start_prob" not in derived and derived["key"] != meta["key"]
    assert {p for p, _ in seen} == {None} and {c for _, c in seen} == {None}  # derived p; the maskable count
    for value in ("0", "1", "1.5"):
        assert_clean_error(run("make-mlm-data", tok, "--out", tmp_path / "x", "--masking", "ngram_per_word",
                               "--ngram-start-prob", value), "--ngram-start-prob")
    assert_clean_error(run("make-mlm-data", tok, "--out", tmp_path / "x", "--mask-count", "all"), "--mask-count")
    assert not (tmp_path / "x").exists()
    help_text = run("make-mlm-data", "--help").stdout
    assert "0.081" in help_text and "maskable" in help_text  # the fields' docstrings


def test_the_recipe_key_is_checked_and_reaches_both_data_paths(corpus, tmp_path, monkeypatch):
    meta, tok = corpus
    ids = meta["tokenizer"]["special_token_ids"]
    for bad in (0, 1, -0.5):
        with pytest.raises(PlmError, match=r"objective.ngram_start_prob .* must be in \(0, 1\)"):
            build_section(MLMConfig, {"masking": "ngram_per_word", "ngram_start_prob": bad}, "objective")
    cfg = build_section(MLMConfig, {"masking": "ngram_per_word", "ngram_start_prob": 0.3, "mask_count": "maskable"},
                        "objective")
    assert MLMConfig().ngram_start_prob is None and MLMConfig().mask_count == "reference"
    # static: make-mlm-data is asked for it (and it keys the cached data)
    calls = []
    fake = types.ModuleType("plmcli.data.mlm_data")
    fake.make_mlm_data = lambda corpus_dir, out_dir, **kw: calls.append(kw) or out_dir.mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "plmcli.data.mlm_data", fake)
    out = MaskedLM(cfg, None, ids, 32).prepare(tok, tmp_path / "cache")
    assert calls[-1]["ngram_start_prob"] == 0.3 and calls[-1]["mask_count"] == "maskable"
    assert MaskedLM(MLMConfig(masking="ngram_per_word"), None, ids, 32).prepare(tok, tmp_path / "cache") != out
    assert "ngram_start_prob" not in calls[-1] and calls[-1]["mask_count"] == "reference"
    # dynamic: every batch is masked with it
    seen = []
    spy_on(monkeypatch, masking, seen)
    dyn = build_section(MLMConfig, {"masking": "ngram_per_word", "ngram_start_prob": 0.3, "dynamic": True,
                                    "pairs": "none"}, "objective")
    stream = MaskedLM(dyn, None, ids, 32).stream(tok, "train", 4, 0, 0, 1, shuffle=False)
    stream[0]
    assert seen and {p for p, _ in seen} == {0.3}
    assert all(c.tolist() == [32] for _, c in seen)  # Google's count: the whole window, [CLS]/[SEP] included


def test_the_start_probability_changes_the_walk():
    """A low p starts few spans per pass: the walk needs more passes, and its spans start later in the row."""
    special = np.zeros((200, 60), dtype=bool)
    special[:, 0] = special[:, -1] = True
    late = [masking.select_units(special, None, np.random.default_rng(0), strategy="ngram_per_word", max_predictions=0,
                                 ngram_start_prob=p).start.mean() for p in (0.02, 0.5)]
    assert late[0] > late[1] + 5
