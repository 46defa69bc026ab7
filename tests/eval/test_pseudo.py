"""Pseudo-perplexity of masked LMs (Salazar et al. 2020) against a brute force: one copy, one forward."""

from plmcli.config import override_layers
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import save_model
from typer.testing import CliRunner

from families import families, tiny_model
from helpers import ToyEncoder, ToyEncoderConfig, tiny_corpus
from plmcli import api
from plmcli.cli import app
from plmcli.errors import PlmError
from plmcli.eval.pseudo import plan_batches, sentence_pll
from plmcli.models.base import Traits
from plmcli.models.registry import model_class

pytestmark = pytest.mark.usefixtures("one_thread")

V, P, PAD, CLS, SEP, MASK = 40, 12, 0, 2, 3, 4


def build(family: str, seed: int = 0):
    """A masked LM at its tiny size, read at V tokens and P positions (ELECTRA is scored by its generator)."""
    return tiny_model(family, [f"model.vocab_size={V}", f"model.max_positions={P}"], seed)


PSEUDO = [f for f in families() if model_class(f).traits.scoring == "pseudo"]
# Lengths 1..7 fit one window of P - 2 = 10 tokens; 10 just fits; 13 and 25 are windowed.
SENTENCES = [np.random.default_rng(i).integers(5, V, n) for i, n in enumerate((7, 1, 3, 10, 4, 13, 25))]


def brute_force(model, sentence, max_length, cls=CLS, sep=SEP):
    """PLL of one sentence: for each token, its own window of W = max_length - 2 tokens (centred on it,
    shifted inside the sentence at its edges), wrapped in [CLS] … [SEP], the token masked, one forward."""
    n, W = len(sentence), min(max_length - 2, len(sentence))
    total = 0.0
    for t in range(n):
        start = t - W // 2
        start = max(0, min(start, n - W))
        window = sentence[start : start + W].copy()
        assert start <= t < start + W
        window[t - start] = MASK
        x = torch.tensor([cls, *window, sep])[None]
        with torch.no_grad():
            logits = model(x).mlm_logits[0, 1 + t - start]  # (V,) every position, no batching
        total += torch.log_softmax(logits.double(), -1)[sentence[t]].item()
    return total


@pytest.mark.parametrize("family", PSEUDO)
def test_pll_equals_one_forward_per_masked_copy(family):
    model = build(family)
    expected = np.array([brute_force(model, s, P) for s in SENTENCES])
    # Budgets: one copy per pass (every sentence split), a few sentences per pass, everything in one.
    for budget in (1, 60, 10_000):
        got = sentence_pll(model, SENTENCES, MASK, P, CLS, SEP, PAD, budget)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    n = sum(len(s) for s in SENTENCES)
    assert math.exp(-got.sum() / n) == pytest.approx(math.exp(-expected.sum() / n), rel=1e-6)


def test_windows_shorter_than_the_model():
    model = build("bert", seed=1)
    for L in (3, 6, 9):  # W = 1 (no context at all), 4, 7 tokens
        got = sentence_pll(model, SENTENCES, MASK, L, CLS, SEP, PAD, 50)
        np.testing.assert_allclose(got, [brute_force(model, s, L) for s in SENTENCES], rtol=1e-6)
    # The window changes the score of a long sentence only.
    short = sentence_pll(model, SENTENCES, MASK, 6, CLS, SEP, PAD)
    full = sentence_pll(model, SENTENCES, MASK, P, CLS, SEP, PAD)
    assert short[1] == pytest.approx(full[1], rel=1e-6) and abs(short[-1] - full[-1]) > 1e-3


def test_batch_plan_keeps_sentences_whole():
    lengths = [7, 1, 3, 10, 0, 4]
    row = lambda n: min(n, 10) + 2  # noqa: E731
    plan = plan_batches(lengths, row, 60)
    # Whole sentences, shortest first, each batch within budget; the empty one never appears.
    assert plan == [[(1, 0, 1), (2, 0, 3), (5, 0, 4)], [(0, 0, 6)], [(0, 6, 7)], [(3, 0, 5)], [(3, 5, 10)]]
    for batch in plan:
        assert sum(b - a for _, a, b in batch) * max(row(lengths[i]) for i, _, _ in batch) <= 60
    assert plan_batches(lengths, row, 10_000) == [[(1, 0, 1), (2, 0, 3), (5, 0, 4), (0, 0, 7), (3, 0, 10)]]


BERT_TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=24",
             "tokenizer.vocab_size=120", "tokenizer.min_frequency=1", "objective.dynamic=true", "objective.pairs=none",
             "data.val_fraction=0.2", "train.seq_len=24", "train.global_batch_size=4", "train.eval_every=0",
             "train.save_every=0", "train.log_every=1"]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pseudo")
    corpus = tiny_corpus(root / "c.txt")
    api.pretrain("bert-mini", [str(corpus)], str(root / "run"), overrides=override_layers(BERT_TINY, {"train.max_steps": 3}))
    text = root / "eval.txt"
    words = corpus.read_text().split()
    # Lines of different lengths, a blank one (skipped), and one of 40 words: longer than the 22 a window holds.
    text.write_text("the cat sat on a mat\n\ndogs ran far away\n" + " ".join(words[:40]) + "\nhome\n", encoding="utf-8")
    return root / "run", text


def test_eval_ppl_of_a_bert_run(bert_run):
    run, text = bert_run
    model, tok, cfg = api.load_run(str(run))
    lines = [line for line in text.read_text().split("\n") if line.strip()]
    ids = [np.array(tok.encode(line, add_special_tokens=False).ids) for line in lines]
    assert len(ids[2]) == 40
    for L in (None, 10):
        res = api.eval_ppl([str(text)], str(run), max_length=L)
        pll = sum(brute_force(model, s, L or 24) for s in ids)
        n = sum(len(s) for s in ids)  # text tokens only: no [CLS] / [SEP]
        assert res["pseudo"] is True and res["tokens"] == n == 51 and res["sentences"] == 4
        assert res["ppl"] == pytest.approx(math.exp(-pll / n), rel=1e-6)
        assert res["nll"] == pytest.approx(-pll / n, rel=1e-6)
        n_bytes = len(text.read_bytes())
        assert res["bpb"] == pytest.approx(-pll / (math.log(2) * n_bytes), rel=1e-6)
        assert res["words"] == 51 and res["word_ppl"] == pytest.approx(math.exp(-pll / 51), rel=1e-6)
        assert (res["stride"], res["max_length"]) == (1, L or 24)
    # The budget changes the batching, not the result.
    small = api.eval_ppl([str(text)], str(run), max_tokens_per_batch=7)
    assert small["ppl"] == pytest.approx(api.eval_ppl([str(text)], str(run))["ppl"], rel=1e-6)


def test_cli_json_and_text(bert_run):
    run, text = bert_run
    runner = CliRunner()
    res = runner.invoke(app, ["eval-ppl", str(text), "--model", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"ppl", "nll", "tokens", "bpb", "words", "word_ppl", "stride", "max_length"} <= set(out)
    assert out["pseudo"] is True and out["tokens"] == 51 and out["files"][0]["tokens"] == 51
    res = runner.invoke(app, ["eval-ppl", str(text), "--model", str(run), "--max-tokens-per-batch", "100"])
    assert res.exit_code == 0 and "pseudo-perplexity (Salazar et al. 2020)" in res.stdout
    assert f"{out['ppl']:.3f}" in res.stdout


@pytest.mark.parametrize("args, needle", [(["--stride", "4"], "does not apply to pseudo-perplexity"),
                                          (["--max-length", "2"], "outside 3..24"),
                                          (["--max-length", "25"], "outside 3..24"),
                                          (["--max-tokens-per-batch", "0"], "must be ≥ 1")])
def test_bad_options(bert_run, args, needle):
    run, text = bert_run
    res = CliRunner().invoke(app, ["eval-ppl", str(text), "--model", str(run), *args])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and needle in res.stderr, res.output


class ToyCausal(ToyEncoder):
    traits = Traits(causal=True, scoring="window")


@pytest.mark.parametrize("family, kwargs, needle", [("toyenc", {}, "is not a causal LM, so it has no left-to-right "
                                                     "perplexity, nor a masked LM for pseudo-perplexity"),
                                                    ("toycausal", {"max_tokens_per_batch": 100}, "applies to masked LMs")])
def test_runs_that_are_not_masked_lms(tmp_path, monkeypatch, family, kwargs, needle):
    from plmcli.models import registry

    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    monkeypatch.setitem(registry.FAMILIES, "toycausal", "test_pseudo:ToyCausal")
    run = tmp_path / "enc"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"family": family, "model": {"vocab_size": 5}, "tokenizer": {}}))
    save_model(ToyEncoder(ToyEncoderConfig(vocab_size=5)), str(run / "model.safetensors"))
    (tmp_path / "t.txt").write_text("hello\n")
    with pytest.raises(PlmError) as e:
        api.eval_ppl([str(tmp_path / "t.txt")], str(run), **kwargs)
    assert needle in str(e.value)
