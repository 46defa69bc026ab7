"""One trainer at a time per run directory: a flock the kernel drops with its holder (kill -9 included)."""

import json
import os
import signal

import pytest

from plm_process import plm, start, steady_files, wait_for_step
from plmcli.errors import PlmError
from plmcli.train.checkpoint import RunLock


def test_second_resume_refuses_while_one_trains(tmp_path):
    recipe, corpus = steady_files(tmp_path)
    run = tmp_path / "run"
    assert plm(tmp_path, "pretrain", "--recipe", recipe, "--data", corpus, "--out", run, "--stop-after", "10").returncode == 0
    first = start(tmp_path, "pretrain", "--resume", "--out", run, "--max-steps", "100000")
    try:
        assert wait_for_step(run, first, step=11)
        second = plm(tmp_path, "pretrain", "--resume", "--out", run)
        assert second.returncode == 2, second.stderr
        err = second.stderr.strip()
        assert err == (f"error: run {run} is being trained by process {first.pid} — wait for it to finish "
                       "(or stop it), or choose another --out"), err
        assert first.poll() is None  # the first one trains on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # No stale lock after kill -9: the run resumes, from the killed one's last checkpoint (one more step).
    last = max(int(c.name.split("-")[1]) for c in (run / "checkpoints").glob("step-*"))
    p = plm(tmp_path, "pretrain", "--resume", "--out", run, "--max-steps", str(last + 1))
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == last + 1


def test_lock_is_released_and_reusable(tmp_path):
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
        with pytest.raises(PlmError, match=f"being trained by process {os.getpid()}"):
            RunLock(tmp_path)  # another open file description: refused like another process
    assert not (tmp_path / ".lock").exists()  # a finished run leaves no lock file
    with RunLock(tmp_path):  # the same process again, once released
        pass
