"""Ctrl-C stops at an optimizer-step boundary with a checkpoint of that complete step: resumed, the run is
bitwise the uninterrupted one."""

import json
import os
import random
import signal
import time

import pytest
from safetensors.torch import load_file

from helpers import tiny_corpus, tiny_recipe
from plm_process import ACCUM, assert_interrupted, plm, sha256, start, steady_files, wait_for_step
from plmcli import api
from plmcli.errors import Interrupted
from plmcli.objectives.registry import objective_class

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, in its own process like the interrupted ones."""
    root = tmp_path_factory.mktemp("steady")
    recipe, corpus = steady_files(root)
    p = plm(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", root / "full")
    assert p.returncode == 0, p.stderr
    return root, recipe, corpus, sha256(root / "full" / "model.safetensors")


def _check_checkpoints(run):
    """Every checkpoint holds whole steps (its data position is step × accumulation) and no temp is left."""
    for c in (run / "checkpoints").iterdir() if (run / "checkpoints").is_dir() else []:
        assert not c.name.startswith("."), c
        loop = json.loads((c / "loop_state.json").read_text())
        assert loop["step"] == int(c.name.split("-")[1]) and loop["micro_batches"] == loop["step"] * ACCUM, loop


def test_sigint_at_random_moments_resumes_bitwise(reference):
    root, recipe, corpus, want = reference
    rng = random.Random(17)
    # (a logged step, a delay after it, DataLoader workers): anchored to a step at most halfway through
    # the 40, so the moment falls inside the run however fast the machine is; the delay lands it anywhere
    # in the next steps (mid-step, mid-evaluation, mid-checkpoint). With a worker, Ctrl-C reaches the
    # whole process group, as a terminal sends it.
    moments = [(rng.choice((5, 10, 15, 20)), rng.uniform(0.0, 0.05), w) for w in (0, 0, 1)]
    interrupted = 0
    for i, (step, delay, workers) in enumerate(moments):
        run = root / f"int{i}"
        proc = start(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run,
                     "--set", f"train.num_workers={workers}", start_new_session=True)
        if wait_for_step(run, proc, step=step):
            time.sleep(delay)
            if workers:
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            interrupted += 1
            assert_interrupted(proc, err, run)
            assert "stopped after step" in err
            _check_checkpoints(run)
            assert not (run / "model.safetensors").exists()
            p = plm(root, "pretrain", "--resume", "--out", run)
            assert p.returncode == 0, p.stderr
        _check_checkpoints(run)
        assert sha256(run / "model.safetensors") == want, (i, step, delay, workers)
    assert interrupted >= 2  # the moments fall inside the run, not after it


def test_second_sigint_stops_at_once(reference):
    root, recipe, corpus, want = reference
    run = root / "twice"
    proc = start(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run)
    assert wait_for_step(run, proc, step=5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "stopped" in err
    assert not list(run.rglob(".*.tmp")), list(run.rglob(".*.tmp"))
    _check_checkpoints(run)
    p = plm(root, "pretrain", "--resume", "--out", run)
    assert p.returncode == 0, p.stderr
    assert sha256(run / "model.safetensors") == want


@pytest.fixture
def tiny(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def test_sigint_inside_a_step_waits_for_its_end(tiny, tmp_path, monkeypatch):
    """A Ctrl-C between two micro-batches of step 4 stops after step 4, with step 4 checkpointed whole;
    the SIGINT handler is put back afterwards."""
    recipe, corpus = tiny
    over = ["train.micro_batch_size=2", "train.save_every=0"]
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"), overrides=over)
    cls = objective_class("clm")
    step, calls = cls.step, {"n": 0}

    def step_and_interrupt(self, model, batch, state):
        if model.training:
            calls["n"] += 1
            if calls["n"] == 7:  # the first micro-batch of step 4 (2 per step)
                os.kill(os.getpid(), signal.SIGINT)
        return step(self, model, batch, state)

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(cls, "step", step_and_interrupt)
    with pytest.raises(Interrupted) as e:
        api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "cut"), overrides=over)
    assert signal.getsignal(signal.SIGINT) is before
    cut = tmp_path / "cut"
    assert e.value.message == (f"stopped after step 4 (SIGINT); the checkpoint of step 4 is in {cut / 'checkpoints' / 'step-4'}; "
                               f"continue with `plm pretrain --resume --out {cut}`")
    assert calls["n"] == 8
    loop = json.loads((cut / "checkpoints" / "step-4" / "loop_state.json").read_text())
    assert loop["step"] == 4 and loop["micro_batches"] == 8
    monkeypatch.setattr(cls, "step", step)
    api.pretrain(out=str(cut), resume=True)
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)


def test_sigint_after_the_last_step_ends_cleanly(reference):
    """A Ctrl-C that comes once the run has written its weights (final writes, the DataLoader's shutdown,
    the interpreter's exit) has nothing left to stop: exit 0, no traceback, the run whole."""
    root, recipe, corpus, want = reference
    for i, delay in enumerate((0.0, 0.05, 0.3)):
        run = root / f"late{i}"
        proc = start(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run,
                     "--set", "train.num_workers=1", start_new_session=True)
        deadline = time.monotonic() + 240
        while not (run / "model.safetensors").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:  # already gone: nothing to interrupt
            pass
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and "Traceback" not in err and "Exception" not in err, (delay, proc.returncode, err)
        assert sha256(run / "model.safetensors") == want
