"""One trainer at a time per run directory: a flock the kernel drops with its holder (kill -9 included), and
where the filesystem has no flock, an exclusive-create lock file whose dead holder's lock is taken over."""

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plm_process import plm, start, steady_files, wait_for_step
from plmcli.errors import PlmError
from plmcli.train.checkpoint import RunLock


@pytest.mark.e2e
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
        assert (tmp_path / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]
        with pytest.raises(PlmError, match=f"being trained by process {os.getpid()}"):
            RunLock(tmp_path)  # another open file description: refused like another process
    assert not (tmp_path / ".lock").exists()  # a finished run leaves no lock file
    with RunLock(tmp_path):  # the same process again, once released
        pass


REPO = Path(__file__).resolve().parents[2]
HELD = "wait for it to finish (or stop it), or choose another --out"


def _no_flock(*_):
    raise OSError(errno.ENOSYS, "Function not implemented")


@pytest.fixture
def no_flock(monkeypatch):
    """A filesystem without flock (Lustre mounted noflock, some NFS and FUSE mounts)."""
    monkeypatch.setattr(fcntl, "flock", _no_flock)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _refusal(run: Path) -> str:
    with pytest.raises(PlmError) as e:
        RunLock(run)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_no_flock_lock_refuses_a_second_and_is_reusable(tmp_path, no_flock):
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]
        assert _refusal(tmp_path) == f"run {tmp_path} is being trained by process {os.getpid()} — {HELD}"
    assert not (tmp_path / ".lock").exists()
    with RunLock(tmp_path):
        pass
    assert not (tmp_path / ".lock").exists()


def test_no_flock_takes_over_a_dead_holder_on_this_host(tmp_path, no_flock):
    (tmp_path / ".lock").write_text(f"{_dead_pid()} {socket.gethostname()}\n")
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text().split() == [str(os.getpid()), socket.gethostname()]
    assert os.listdir(tmp_path) == []  # the stale file set aside is gone too


def test_no_flock_refuses_a_holder_on_another_host(tmp_path, no_flock):
    (tmp_path / ".lock").write_text(f"{_dead_pid()} gpu-node-17\n")  # a pid dead here may live there
    pid = (tmp_path / ".lock").read_text().split()[0]
    assert _refusal(tmp_path) == (f"run {tmp_path} is being trained by process {pid} on host gpu-node-17 — {HELD}; "
                                  f"if that job is gone, delete {tmp_path / '.lock'}")
    (tmp_path / ".lock").unlink()  # as the message says
    with RunLock(tmp_path):
        pass


def test_no_flock_empty_lock_file_is_held_while_young_and_stale_when_old(tmp_path, no_flock):
    (tmp_path / ".lock").write_text("")  # its holder was killed between create and write, or is writing now
    assert _refusal(tmp_path) == f"run {tmp_path} is being trained by another process — {HELD}"
    old = time.time() - 120
    os.utime(tmp_path / ".lock", (old, old))
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())


def test_no_flock_release_leaves_a_lock_that_is_not_ours(tmp_path, no_flock):
    lock = RunLock(tmp_path)
    (tmp_path / ".lock").unlink()  # deleted by hand, and another trainer took the run
    (tmp_path / ".lock").write_text("1 gpu-node-17\n")
    lock.release()
    assert (tmp_path / ".lock").read_text() == "1 gpu-node-17\n"


def test_no_flock_a_slower_takeover_keeps_the_faster_ones_lock(tmp_path):
    """Two processes found the same stale file: the one that sets it aside second must not remove the
    fresh lock the first one made meanwhile (the same inode number included)."""
    from plmcli.train.checkpoint import _read_lock

    path = tmp_path / ".lock"
    path.write_text(f"{_dead_pid()} {socket.gethostname()}\n")
    stale = _read_lock(path)[1]
    path.unlink()
    path.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # the faster one's
    slower = RunLock.__new__(RunLock)
    slower.path = path
    slower._set_aside(stale)
    assert path.read_text().split()[0] == str(os.getpid())
    assert os.listdir(tmp_path) == [".lock"]


def test_lock_failure_is_one_plm_error(tmp_path, monkeypatch):
    def broken_flock(*_):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", broken_flock)
    message = _refusal(tmp_path)
    assert message.startswith(f"cannot lock run {tmp_path} ({tmp_path / '.lock'}): Input/output error — "), message

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert _refusal(tmp_path) == (f"cannot lock run {tmp_path} ({tmp_path / '.lock'}): Read-only file system — "
                                  "choose a location on a writable filesystem")


@pytest.mark.e2e
def test_no_flock_lock_of_a_killed_process_is_taken_over(tmp_path, no_flock):
    code = textwrap.dedent("""
        import errno, fcntl, sys, time
        def no_flock(*_):
            raise OSError(errno.ENOSYS, "Function not implemented")
        fcntl.flock = no_flock
        from plmcli.train.checkpoint import RunLock
        lock = RunLock(sys.argv[1])
        print("locked", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        assert _refusal(tmp_path) == f"run {tmp_path} is being trained by process {child.pid} — {HELD}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert (tmp_path / ".lock").read_text().split()[0] == str(child.pid)  # kill -9 left it behind
    with RunLock(tmp_path):
        assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
