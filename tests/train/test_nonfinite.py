"""A non-finite loss skips its optimizer step; train.max_nonfinite_steps of them in a row stop the run with
one line, the last good checkpoint kept and no model.safetensors written."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.cli import app
from plmcli.objectives.registry import objective_class
from plmcli.train.checkpoint import RunStopped


@pytest.fixture
def tiny(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def _poison(monkeypatch, steps: set[int], accum: int = 1):
    """The clm objective's loss is NaN in the training micro-batches of these optimizer steps."""
    cls = objective_class("clm")
    step, calls = cls.step, {"n": 0}

    def poisoned(self, model, batch, state):
        out = step(self, model, batch, state)
        if model.training:
            calls["n"] += 1
            if (calls["n"] - 1) // accum + 1 in steps:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(cls, "step", poisoned)
    return lambda: monkeypatch.setattr(cls, "step", step)


def test_lr_1e10_stops_with_one_line(tiny, tmp_path):
    recipe, corpus = tiny
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(run),
                                   "--set", "optim.lr=1e10", "--max-steps", "30"])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()[-1]  # after the progress lines
    assert err.startswith("error: training diverged") and "Traceback" not in res.output, res.output
    assert "optim.lr (now 1e+10" in err and "train.grad_clip" in err and "train.mixed_precision" in err, err
    assert "no model.safetensors was written" in err
    assert not (run / "model.safetensors").exists()
    for c in run.glob("checkpoints/step-*"):  # whatever was kept holds finite weights
        assert all(torch.isfinite(v).all() for v in torch.load(c / "pytorch_model.bin").values())


def test_stop_keeps_last_good_checkpoint_and_resume_works(tiny, tmp_path, monkeypatch):
    recipe, corpus = tiny
    over = ["train.max_nonfinite_steps=2", "train.micro_batch_size=2"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), overrides=over)
    unpoison = _poison(monkeypatch, {4, 5, 6}, accum=2)
    run = tmp_path / "run"
    with pytest.raises(RunStopped) as e:
        api.pretrain(str(recipe), [str(corpus)], str(run), overrides=over)
    assert e.value.message == ("training diverged: the loss or gradient was not finite at 2 optimizer steps in a row "
                               "(steps 4-5), loss nan at step 4 (skipped, no update); no model.safetensors was written")
    assert "optim.lr (now 0.003, e.g. --set optim.lr=0.0003)" in e.value.hint
    assert f"the checkpoint of step 3 is in {run / 'checkpoints' / 'step-3'}" in e.value.hint
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3"]
    unpoison()
    s = api.pretrain(out=str(run), resume=True, overrides=["train.max_nonfinite_steps=2"])
    assert s["steps"] == 6 and math.isfinite(s["val_loss"])
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(run / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_nonfinite_step_is_skipped(tiny, tmp_path, monkeypatch):
    recipe, corpus = tiny
    _poison(monkeypatch, {2})
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"))
    # Skipped, not applied: a NaN gradient step would have made every later loss NaN.
    assert s["steps"] == 6 and s["nonfinite_steps"] == 1 and math.isfinite(s["val_loss"]) and math.isfinite(s["train_loss"])
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 3, 4, 5, 6]  # the skipped step's loss is not averaged in
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    w = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in w.values())
