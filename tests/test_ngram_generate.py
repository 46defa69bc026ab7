"""`plm generate` from an n-gram run: greedy, beam and sampling decode the n-gram distribution itself."""

import json
import math
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from plmcli import api
from plmcli.cli import app
from plmcli.generate import generate

runner = CliRunner()


@pytest.fixture
def ngram_run(tmp_path):
    """Add-λ bigram (λ = 0.5) over "a b c d" ×3 and "b a": V = {<unk>, </s>, a, b, c, d}, |V| = 6."""
    train = tmp_path / "train.txt"
    train.write_text("a b c d\na b c d\na b c d\nb a\n", encoding="utf-8")
    api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                 overrides=["data.val_fraction=0", "model.k=0.5"])
    return str(tmp_path / "run")


def test_greedy_follows_the_most_likely_word_to_the_end_of_the_sentence(ngram_run):
    # P(b|a) = 3.5/7, P(c|b) = 3.5/7, P(d|c) = 3.5/6, P(</s>|d) = 3.5/6: each the argmax, then </s> stops.
    assert generate(ngram_run, ["a", "a b", "c", ""]) == ["b c d", "c d", "d", "a b c d"]
    # Out-of-vocabulary words read as <unk>: an unseen history backs off to uniform, whose argmax is id 0, <unk>.
    assert generate(ngram_run, ["zz"], max_new_tokens=2) == ["<unk> <unk>"]
    assert generate(ngram_run, ["a"], max_new_tokens=1) == ["b"]


def test_beam_search_finds_the_best_sentence(ngram_run):
    assert generate(ngram_run, ["a"], strategy="beam", num_beams=2) == ["b c d"]


def test_sampling_draws_from_the_model_probabilities(ngram_run):
    model, tok, cfg = api.load_run(ngram_run)
    n = 3000
    first = generate((model, tok, cfg), ["b"] * n, strategy="sample", max_new_tokens=1, seed=1, batch_size=n)
    # After b: c(b c) = 3, c(b </s>) = 0, c(b a) = 1, c(b) = 4; λ|V| = 3 → P = (c + 0.5) / 7; </s> yields "".
    want = {"c": 3.5 / 7, "a": 1.5 / 7, "": 0.5 / 7, "b": 0.5 / 7, "d": 0.5 / 7, "<unk>": 0.5 / 7}
    assert math.isclose(sum(want.values()), 1.0)
    freq = Counter(first)
    assert set(freq) <= set(want)
    for word, p in want.items():
        assert abs(freq[word] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (word, freq[word] / n, p)
    # Seeded: the same call gives the same text; another seed other text.
    again = generate(ngram_run, ["b"] * 20, strategy="sample", seed=1)
    assert again == generate(ngram_run, ["b"] * 20, strategy="sample", seed=1)
    assert again != generate(ngram_run, ["b"] * 20, strategy="sample", seed=2)
    # top-k 1 is greedy.
    assert generate(ngram_run, ["a"], strategy="sample", top_k=1, seed=5) == ["b c d"]


def test_the_session_scores_are_the_models_log_probabilities(ngram_run):
    model, tok, _ = api.load_run(ngram_run)
    session = model.generation_session([tok.encode("a b", add_special_tokens=False).ids])
    logits = session.logits().numpy()[0]
    assert np.allclose(np.exp(logits).sum(), 1.0)
    assert math.isclose(math.exp(logits[model.word_id("c")]), model.prob([model.word_id("b")], model.word_id("c")))


def test_generate_cli_from_an_ngram_run(ngram_run):
    res = runner.invoke(app, ["generate", ngram_run, "--prompt", "a", "--prompt", "c", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == [{"prompt": "a", "output": "b c d"}, {"prompt": "c", "output": "d"}]
