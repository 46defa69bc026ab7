"""What a cluster's scheduler does to a job: SIGTERM / SIGUSR1 stop it at an optimizer-step boundary with a
checkpoint of that step (exit 75), a requeued job runs one command (--auto-resume) and ends bitwise where
an uninterrupted run ends, checkpoints come by time too, and a process that dies is named by the others."""

import json
import os
import random
import signal
import time

import pytest
from safetensors.torch import load_file

from helpers import tiny_corpus, tiny_recipe
from plm_process import assert_interrupted, plm, sha256, start, start_ranks, steady_files, wait_for_step
from plmcli import api
from plmcli.errors import RESUMABLE_EXIT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def steady(tmp_path_factory):
    """The uninterrupted run, in its own process like the interrupted ones: 1 process, micro batch 4 ×
    accumulation 2, dropout on."""
    root = tmp_path_factory.mktemp("preempt")
    recipe, corpus = steady_files(root)
    p = plm(root, "pretrain", "--recipe", recipe, "--data", corpus, "--out", root / "full")
    assert p.returncode == 0, p.stderr
    return root, recipe, corpus, sha256(root / "full" / "model.safetensors")


def _requeued(run, procs, sig=signal.SIGTERM) -> int:
    """How many processes stopped with a checkpoint (exit 75, one line naming the signal); the others
    reached the run's end (exit 0)."""
    stopped = 0
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        if proc.returncode != 0:
            stopped += 1
            assert_interrupted(proc, err, run, code=RESUMABLE_EXIT)
            assert "stopped after step" in err and f"({sig.name})" in err, err
    return stopped


@pytest.mark.e2e
def test_sigterm_and_sigusr1_at_random_moments_resume_bitwise(steady):
    """The command a requeued job runs every time (--auto-resume), stopped by SIGTERM or SIGUSR1 at seeded
    random moments (with a DataLoader worker: the scheduler signals every process of the job), run again:
    the weights are the uninterrupted run's."""
    root, recipe, corpus, want = steady
    rng = random.Random(41)
    moments = [(rng.choice((5, 10, 15, 20)), rng.uniform(0.0, 0.05), sig, w)
               for sig, w in ((signal.SIGTERM, 0), (signal.SIGUSR1, 0), (signal.SIGTERM, 1))]
    command = ["pretrain", "--recipe", recipe, "--data", corpus, "--auto-resume"]
    stopped = 0
    for i, (step, delay, sig, workers) in enumerate(moments):
        run = root / f"sig{i}"
        args = [*command, "--out", run, "--set", f"train.num_workers={workers}"]
        proc = start(root, *args, start_new_session=True)
        if wait_for_step(run, proc, step=step):
            time.sleep(delay)
            os.killpg(proc.pid, sig) if workers else proc.send_signal(sig)
        stopped += _requeued(run, [proc], sig)
        if proc.returncode:
            assert not (run / "model.safetensors").exists()
        again = plm(root, *args)  # the same command: the run continues from its checkpoint
        assert again.returncode == 0, again.stderr
        assert sha256(run / "model.safetensors") == want, (i, step, delay, sig)
        done = plm(root, *args)  # and once more: a finished run is reported again, untouched
        assert done.returncode == 0 and sha256(run / "model.safetensors") == want, done.stderr
    assert stopped >= 2


@pytest.mark.e2e
def test_auto_resume_needs_the_run_directory(tmp_path):
    p = plm(tmp_path, "pretrain", "--recipe", "gpt-mini", "--auto-resume")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: --auto-resume needs --out RUN: the run directory that a requeued job starts, then continues — "
        "e.g. plm pretrain --recipe bert-base --out runs/bert-base --auto-resume"], p.stderr


@pytest.mark.distributed
def test_two_processes_stopped_by_a_scheduler_resume_to_the_one_process_weights(steady):
    """2 gloo processes (micro batch 4 each, no accumulation) get SIGTERM — both, or one of them, as a
    scheduler may — at a seeded moment; the same command on 2 processes finishes the run, and its weights
    are bitwise those of 1 process with accumulation 2 (dropout on: every draw keyed by the global
    micro-batch, not by the process)."""
    root, recipe, corpus, want = steady
    rng = random.Random(7)
    for i, (step, delay, both) in enumerate([(rng.choice((5, 10, 15)), rng.uniform(0.0, 0.05), b) for b in (True, False)]):
        run = root / f"ranks{i}"
        args = ["pretrain", "--recipe", recipe, "--data", corpus, "--out", run, "--auto-resume"]
        procs = start_ranks(root, 2, *args)
        if wait_for_step(run, procs[0], step=step):
            time.sleep(delay)
            for proc in procs if both else procs[1:]:
                proc.send_signal(signal.SIGTERM)
        _requeued(run, procs)
        assert all(c.name.startswith("step-") for c in (run / "checkpoints").iterdir())
        procs = start_ranks(root, 2, *args)
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
        assert sha256(run / "model.safetensors") == want, (i, step, delay, both)


@pytest.mark.distributed
def test_a_process_killed_makes_the_other_stop_with_one_line(steady):
    root, recipe, corpus, _ = steady
    run = root / "killed"
    procs = start_ranks(root, 2, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run,
                        "--max-steps", "100000")
    assert wait_for_step(run, procs[0], step=12)
    procs[1].kill()
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=120)
    took = time.monotonic() - killed
    procs[1].communicate()
    lines = err.strip().splitlines()
    assert procs[0].returncode == 2 and "Traceback" not in err, err
    assert lines[-1].startswith(f"error (process 0 of 2): process 1 (pid {procs[1].pid}) of this 2-process run died, "
                                "so process 0 stops too; the checkpoint of step 10 is in "), lines[-1]
    assert lines[-1].endswith("then run the same command again with --resume (or --auto-resume)"), lines[-1]
    assert took < 60, took  # gloo sees the closed connection at once; NCCL waits at most train.dist_timeout


def test_checkpoints_by_time(tmp_path):
    """train.save_every_minutes writes a checkpoint once that much training time passed since the last:
    a tiny interval checkpoints every step, a long one only at the end (save_every 0: no step interval)."""
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    for minutes, want in ((1e-9, [1, 2, 3, 4, 5, 6]), (60, [6])):
        run = tmp_path / f"every-{minutes}"
        api.pretrain(str(recipe), [str(corpus)], str(run), overrides=[
            "train.save_every=0", f"train.save_every_minutes={minutes}", "train.keep_checkpoints=10"])
        steps = sorted(int(c.name.split("-")[1]) for c in (run / "checkpoints").iterdir())
        assert steps == want, (minutes, steps)
        loop = json.loads((run / "checkpoints" / "step-6" / "loop_state.json").read_text())
        assert loop["saved_elapsed"] == loop["elapsed"]
    a = load_file(str(tmp_path / "every-1e-09" / "model.safetensors"))
    b = load_file(str(tmp_path / "every-60" / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)  # checkpointing changes nothing of the training
