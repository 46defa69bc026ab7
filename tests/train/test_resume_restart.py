"""--resume of a run stopped before its first checkpoint starts it again; a finished run keeps its summary;
--max-steps below 1 is refused."""

import json
import signal
import time

import pytest
from typer.testing import CliRunner

from helpers import tiny_corpus, tiny_recipe
from plm_process import plm, sha256, start, steady_files, wait_for_step
from plmcli import api
from plmcli.cli import app


@pytest.mark.e2e
def test_killed_before_first_checkpoint_restarts_from_step_0(tmp_path):
    recipe, corpus = steady_files(tmp_path)
    assert plm(tmp_path, "pretrain", "--recipe", recipe, "--data", corpus, "--out", tmp_path / "full").returncode == 0
    run = tmp_path / "dead"
    proc = start(tmp_path, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run)
    assert wait_for_step(run, proc, step=5)  # logged steps, no checkpoint yet (save_every 10)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").glob("step-*"))
    # A plain restart refuses, and says what works.
    p = plm(tmp_path, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run)
    assert p.returncode == 2 and "already exists and is not empty" in p.stderr and "--resume" in p.stderr
    p = plm(tmp_path, "pretrain", "--resume", "--out", run)
    assert p.returncode == 0, p.stderr
    assert sha256(run / "model.safetensors") == sha256(tmp_path / "full" / "model.safetensors")
    full = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [json.loads(x)["step"] for x in full]  # the dead run's rows are gone


def test_killed_during_first_checkpoint_write_restarts(tmp_path):
    """A checkpoint temp directory left by a kill -9 mid-write is not a checkpoint: --resume starts over."""
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    full = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"))
    run = tmp_path / "dead"
    api.pretrain(str(recipe), [str(corpus)], str(run), stop_after=3)
    # What a kill during the first save leaves: the run's files and a half-written temp checkpoint.
    (run / "checkpoints" / "step-3").rename(run / "checkpoints" / ".step-3.tmp")
    (run / "checkpoints" / ".step-3.tmp" / "loop_state.json").unlink()
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()
    s = api.pretrain(out=str(run), resume=True)
    assert s["steps"] == 6 and s["val_loss"] == full["val_loss"] and s["train_loss"] == full["train_loss"]
    assert sha256(run / "model.safetensors") == sha256(tmp_path / "full" / "model.safetensors")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3", "step-6"]


def test_resume_of_finished_run_keeps_its_summary(tmp_path):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    api.pretrain(str(recipe), [str(corpus)], str(run))
    before = json.loads((run / "summary.json").read_text())
    assert {"val_loss", "val_ppl", "train_loss"} <= set(before)
    time.sleep(0.01)
    again = api.pretrain(out=str(run), resume=True)
    after = json.loads((run / "summary.json").read_text())
    assert after == before and again["val_loss"] == before["val_loss"]


def test_resume_of_finished_phased_run_keeps_its_summary(tmp_path):
    recipe = tmp_path / "phased.yaml"
    recipe.write_text((tiny_recipe(tmp_path / "tiny.yaml")).read_text().replace("extends: gpt-mini", "extends: gpt-mini\n"
                      "phases: [{name: a, max_steps: 3}, {name: b, max_steps: 3, set: {train.seq_len: 8}}]"))
    run = tmp_path / "run"
    api.pretrain(str(recipe), [str(tiny_corpus(tmp_path / "corpus.txt"))], str(run))
    before = json.loads((run / "summary.json").read_text())
    api.pretrain(out=str(run), resume=True)
    assert json.loads((run / "summary.json").read_text()) == before and "val_loss" in before


runner = CliRunner()


@pytest.mark.parametrize("args, needle", [
    (["--max-steps", "0"], "--max-steps 0 is out of range: must be ≥ 1"),
    (["--max-steps", "-5"], "--max-steps -5 is out of range: must be ≥ 1"),
    (["--stop-after", "-1"], "--stop-after -1 must be > 0"),  # was: 0 steps, exit 0, an untrained run
    (["--stop-after", "0"], "--stop-after 0 must be > 0"),
    (["--max-tokens", "0"], "--max-tokens 0 is out of range: must be ≥ 1"),  # was: trained all steps
    (["--set", "train.max_steps=0"], "train.max_steps"),
    (["--set", "train.max_nonfinite_steps=0"], "train.max_nonfinite_steps 0 must be ≥ 1"),
])
def test_bad_step_counts_are_refused(tmp_path, args, needle):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    res = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(tmp_path / "r"), *args])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert "warmup" not in err and "total_steps" not in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "cache").exists()  # refused before any tokenizing


def test_resume_with_another_recipe_is_refused_and_the_same_one_continues(tmp_path):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    api.pretrain(str(recipe), [str(corpus)], str(run), stop_after=2)
    res = runner.invoke(app, ["pretrain", "--resume", "--out", str(run), "--recipe", "bert-mini"])
    assert res.exit_code == 2 and "trained from recipe tiny; --recipe bert-mini would be ignored" in res.stderr, res.output
    s = api.pretrain(str(recipe), out=str(run), resume=True)  # the same recipe, as --auto-resume repeats it
    assert s["steps"] == 6


def test_resume_cuts_metrics_back_to_the_checkpoint(tmp_path):
    """A run killed after its last checkpoint logged steps that the resume redoes: their rows go (and a row cut off
    by the kill), so metrics.jsonl's steps never go back (plm plot would zigzag)."""
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    api.pretrain(str(recipe), [str(corpus)], str(run), stop_after=3)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:  # what the killed run logged after step 3
        f.write('{"step": 4, "loss": 9.0}\n{"step": 5, "loss": 9.0}\n{"step": 6, "lo')
    api.pretrain(out=str(run), resume=True)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6] and 9.0 not in [r["loss"] for r in rows if "loss" in r]
