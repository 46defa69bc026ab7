import json
import os

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.errors import PlmError
from plmcli.train.loop import batch_sizes


@pytest.fixture
def setup(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def test_pretrain_writes_run_dir(setup, tmp_path):
    recipe, corpus = setup
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"))
    run = tmp_path / "run"
    assert s["steps"] == 6 and s["tokens"] == 6 * 4 * 16 and s["stop_reason"] == "max_steps"
    for name in ("recipe.yaml", "tokenizer.json", "config.json", "model.safetensors", "metrics.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3", "step-6"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if "val_loss" in r] == [3, 6]
    assert all(r["loss"] > 0 and r["tok_per_s"] > 0 and r["lr"] > 0 for r in rows if "loss" in r)
    assert os.path.realpath(tmp_path / "runs" / "latest") == os.path.realpath(run)
    assert not list(run.glob(".*tmp*")) and not list((run / "checkpoints").glob(".*"))


def test_loss_goes_down(setup, tmp_path):
    recipe, corpus = setup
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"), overrides=["train.max_steps=40", "train.eval_every=0"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0] - 0.5
    assert s["val_loss"] < losses[0]


def test_resume_is_bitwise_identical(setup, tmp_path):
    recipe, corpus = setup
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"))
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "half"), stop_after=3)
    first = load_file(str(tmp_path / "half" / "model.safetensors"))
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert any(not torch.equal(first[k], b[k]) for k in a)  # the resumed half really trained
    for k in a:
        assert torch.equal(a[k], b[k]), k
    full = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    half = [json.loads(x) for x in (tmp_path / "half" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in full if "loss" in r] == [r["loss"] for r in half if "loss" in r]


def test_a_compiled_cpu_run_of_one_batch_shape_resumes_bitwise_on_two_threads(setup, tmp_path):
    """Inductor's CPU kernels add an embedding's gradient rows with atomics from several threads; a compiled run
    on a CPU steps in torch's deterministic mode (restored after), so where every batch has one shape (the resumed
    process compiles the same graph) it resumes bitwise as an eager run does."""
    recipe, corpus = setup
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    over = ["train.compile=true", "train.max_steps=4", "train.eval_every=0", "train.save_every=2"]
    try:
        api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), overrides=over)
        api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "half"), overrides=over, stop_after=2)
        api.pretrain(out=str(tmp_path / "half"), resume=True)
    finally:
        torch.set_num_threads(threads)
    assert not torch.are_deterministic_algorithms_enabled()  # the process's setting is back
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "half" / "model.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_accumulation_matches_one_big_batch(setup, tmp_path):
    recipe, corpus = setup
    over = ["model.dropout=0.0", "train.max_steps=3", "train.eval_every=0"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "a"), overrides=over)
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "b"), overrides=over + ["train.micro_batch_size=2"])
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in "ab")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-5, rtol=1e-4)


def test_stops_on_token_and_time_budget(setup, tmp_path):
    recipe, corpus = setup
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "t"), overrides={"train.max_tokens": 2 * 64})
    assert s["steps"] == 2 and s["stop_reason"] == "max_tokens"
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "u"), time_budget=0.5, overrides={"train.max_steps": 10_000})
    assert s["stop_reason"] == "time_budget" and s["steps"] < 10_000
    assert (tmp_path / "u" / "checkpoints" / f"step-{s['steps']}").is_dir()


def test_resume_without_checkpoint(setup, tmp_path):
    with pytest.raises(PlmError, match="not a run directory"):
        api.pretrain(out=str(tmp_path / "nothing"), resume=True)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "recipe.yaml").write_text((tmp_path / "tiny.yaml").read_text())
    with pytest.raises(PlmError, match="no checkpoint to resume"):
        api.pretrain(out=str(tmp_path / "r"), resume=True)


def test_batch_sizes():
    assert batch_sizes(32, 0, 1) == (32, 1)
    assert batch_sizes(32, 8, 2) == (8, 2)
    with pytest.raises(PlmError):
        batch_sizes(32, 6, 1)
    with pytest.raises(PlmError):
        batch_sizes(3, 0, 2)
