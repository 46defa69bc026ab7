"""`--out` where nothing can be written: one line before any work, for every command that writes one,
and nothing left behind. Tests run as root, where chmod does not stop writes: a parent that is a regular
file, and a directory whose mkdir fails as on a read-only filesystem or without permission."""

import errno
from pathlib import Path

import pytest

from helpers import dirs_under, run, tiny_gpt_run
from plmcli.data.outdir import check_writable
from plmcli.errors import PlmError

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny GPT run, a tokenized corpus and a transformers directory to feed the commands."""
    root = tmp_path_factory.mktemp("made")
    with dirs_under(root):
        tiny_gpt_run(root)
        assert run("tokenize", root / "c.txt", "--out", root / "tok", "--recipe", "bert-mini", "--val-fraction", "0.2").exit_code == 0
        assert run("export", root / "gpt", "--format", "hf", "--out", root / "hf").exit_code == 0
    return root


def commands(made, out):
    return {
        "pretrain": ["pretrain", "--recipe", made / "tiny.yaml", "--data", made / "c.txt", "--out", out],
        "finetune": ["finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", made / "gpt", "--out", out,
                     "--max-steps", 1, "--max-seq-len", 16],
        "tokenize": ["tokenize", made / "c.txt", "--out", out],
        "make-mlm-data": ["make-mlm-data", made / "tok", "--out", out, "--max-seq-len", 32],
        "export": ["export", made / "gpt", "--format", "hf", "--out", out],
        "import": ["import", made / "hf", "--out", out],
    }


def assert_one_line(res, line):
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == line and "Traceback" not in res.output


def test_a_parent_that_is_a_file(made, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    out = blocker / "sub" / "out"
    for name, args in commands(made, out).items():
        assert_one_line(run(*args), f"error: cannot write {out}: {blocker} is a file, not a directory — choose a writable --out")
    assert blocker.read_text() == "not a directory\n" and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("code, reason", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")])
def test_a_directory_that_takes_no_new_entry(made, tmp_path, monkeypatch, code, reason):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(locked)):
            raise (PermissionError if code == errno.EACCES else OSError)(code, reason, str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    for name, args in commands(made, locked / "out").items():
        assert_one_line(run(*args), f"error: cannot write {locked / 'out'}: {reason} — choose a writable --out")
    assert not any(locked.iterdir()) and not (tmp_path / "runs" / "latest").exists()


def test_the_check_leaves_nothing_and_passes_writable_places(tmp_path):
    check_writable(tmp_path / "new" / "deeper")  # missing directories are fine: the command makes them
    (tmp_path / "existing").mkdir()
    check_writable(tmp_path / "existing")
    (tmp_path / "lm.arpa").write_text("x")
    check_writable(tmp_path / "lm.arpa")  # an existing file: its directory is what must take writes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "lm.arpa"]
    assert not any((tmp_path / "existing").iterdir())
    with pytest.raises(PlmError, match="is a file, not a directory"):
        check_writable(tmp_path / "lm.arpa" / "x")


def test_stale_temp_dirs_of_the_same_out_are_removed_and_a_live_writer_s_kept(tmp_path):
    """An interrupted tokenize (kill -9) leaves a hidden .OUT.tmp-PID-* beside OUT that nothing removed: the next
    write of the same OUT removes those whose process is gone."""
    import os
    import subprocess
    import sys

    from plmcli.data.store import temp_beside

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dest = tmp_path / "tok"
    stale = tmp_path / f".tok.tmp-{int(gone.stdout)}-abc"
    live = tmp_path / f".tok.tmp-{os.getpid()}-def"
    other = tmp_path / f".tok2.tmp-{int(gone.stdout)}-ghi"  # another OUT's: not ours to judge
    for d in (stale, live, other):
        d.mkdir()
    tmp = temp_beside(dest)
    assert not stale.exists() and live.is_dir() and other.is_dir()
    assert tmp.name.startswith(f".tok.tmp-{os.getpid()}-")


@pytest.mark.e2e
def test_sigterm_stops_tokenize_as_ctrl_c_does(tmp_path):
    """A scheduler's SIGTERM mid-tokenize: the temp directory goes with it (it stayed behind before), one line,
    exit 143 (128 + SIGTERM, as a kill reports it)."""
    import random
    import signal
    import time

    from plm_process import start

    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    corpus = tmp_path / "big.txt"
    corpus.write_text("".join(" ".join(rng.choices(words, k=20)) + "\n" for _ in range(200_000)))
    out = tmp_path / "tok"
    proc = start(tmp_path, "tokenize", corpus, "--out", out)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".tok.tmp-*")):  # it is building
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM — nothing was written" and "Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".tok*")), list(tmp_path.iterdir())
