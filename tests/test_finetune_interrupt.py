"""An interrupted or killed finetune leaves nothing that passes for a finished run: Ctrl-C removes what it
wrote (finetune does not resume) and says so; after a kill -9 the run reader refuses the unfinished OUT."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import dirs_under, run, tiny_gpt_run
from plmcli.errors import PlmError

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"
ROOT = Path(__file__).resolve().parents[1]


def interrupted_message(res) -> str:
    """The message of the Interrupted the command raised: the CLI prints `interrupted — <message>`, exit 130."""
    assert res.exit_code == 130, res.output
    last = res.stderr.strip().splitlines()[-1]  # after the progress lines, the one line of the stop
    assert last.startswith("interrupted — ") and "Traceback" not in res.output, res.stderr
    return last[len("interrupted — "):]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt")
    with dirs_under(root):
        return tiny_gpt_run(root)


def finetune_args(gpt, out, *more):
    return ["finetune", "--task", "sst2", "--data-dir", SAMPLE, "--from", gpt, "--out", out, "--max-seq-len", 16, *more]


def _interrupt_after_training(monkeypatch):
    """Ctrl-C as the last step ends: the best weights and a checkpoint are on disk."""
    import plmcli.train.loop as loop

    real = loop.train

    def train(*args, **kwargs):
        real(*args, **kwargs)
        assert (Path(args[4]) / "model.safetensors").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", train)


def test_ctrl_c_removes_the_out_it_made_and_says_so(gpt, tmp_path, monkeypatch):
    _interrupt_after_training(monkeypatch)
    out = tmp_path / "ft"
    msg = interrupted_message(run(*finetune_args(gpt, out, "--max-steps", 3)))
    assert msg == f"the sst2 finetune stopped after step 3; finetune does not resume, so {out} was removed — run the same command again"
    assert "pretrain --resume" not in msg and not out.exists()
    monkeypatch.undo()
    res = run(*finetune_args(gpt, out, "--max-steps", 3))  # the same command again works
    assert res.exit_code == 0, res.output
    assert (out / "metrics.json").is_file() and not (out / "checkpoints").exists()


def test_ctrl_c_empties_an_out_the_user_made(gpt, tmp_path, monkeypatch):
    _interrupt_after_training(monkeypatch)
    out = tmp_path / "mine"
    out.mkdir()
    msg = interrupted_message(run(*finetune_args(gpt, out, "--max-steps", 2)))
    assert f"so {out} was emptied" in msg and out.is_dir() and not any(out.iterdir())


def test_ctrl_c_before_the_first_step(gpt, tmp_path, monkeypatch):
    import plmcli.objectives.classify as classify

    def encode_splits(self, splits, data):
        Path(data).mkdir(parents=True)
        (Path(data) / "half.arrow").write_bytes(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(classify.Classify, "encode_splits", encode_splits, raising=True)
    out = tmp_path / "ft"
    msg = interrupted_message(run(*finetune_args(gpt, out)))
    assert "stopped before its first optimizer step" in msg and not out.exists()


def test_a_failure_mid_finetune_leaves_nothing(gpt, tmp_path, monkeypatch):
    import plmcli.pipelines.finetune as ft

    def broken(*args, **kwargs):
        raise PlmError("the test file is broken", "fix it")

    monkeypatch.setattr(ft, "_predict_tests", broken)
    out = tmp_path / "ft"
    res = run(*finetune_args(gpt, out, "--max-steps", 2))
    assert res.exit_code == 2 and "the test file is broken" in res.stderr and not out.exists()


def _start(gpt, out, tmp_path):
    env = {**os.environ, "PLM_RUNS": str(tmp_path / "runs"), "PLM_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Own data of 16 rows: an epoch (and so the first best weights) is one step; the epochs never end.
    rows = "sentence\tlabel\n" + "".join(f"the cat {'sat' if i % 2 else 'ran'} far\t{i % 2}\n" for i in range(16))
    (tmp_path / "train.tsv").write_text(rows)
    (tmp_path / "dev.tsv").write_text(rows)
    args = ["finetune", "--task", "classification", "--train", tmp_path / "train.tsv", "--dev", tmp_path / "dev.tsv",
            "--text-col", "sentence", "--label-col", "label", "--from", gpt, "--out", out, "--max-seq-len", 16,
            "--batch-size", 16, "--epochs", 100000]
    args = [str(a) for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "plmcli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "model.safetensors").is_file():  # the first epoch's best weights: what used to look finished
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the finetune wrote no weights in 120 s"
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 75)])
@pytest.mark.e2e
def test_a_stop_signal_in_a_real_process(gpt, tmp_path, sig, code):
    """Ctrl-C, or a scheduler's SIGTERM (exit 75: run the same command again): OUT removed, one line."""
    out = tmp_path / "ft"
    proc = _start(gpt, out, tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "interrupted — the classification finetune stopped after step" in err and "Traceback" not in err, err
    assert f"so {out} was removed — run the same command again" in err
    assert not out.exists()


@pytest.mark.e2e
def test_kill_9_leaves_an_out_every_reader_refuses(gpt, tmp_path):
    out = tmp_path / "ft"
    proc = _start(gpt, out, tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "metrics.json").exists()
    text = tmp_path / "t.txt"
    text.write_text("the cat\n")
    for args in (finetune_args(out, tmp_path / "again", "--max-steps", 1), finetune_args(out, tmp_path / "e", "--eval-only"),
                 ["eval-ppl", text, "--model", out], ["generate", out, "--prompt", "the"],
                 ["export", out, "--format", "hf", "--out", tmp_path / "hf"]):
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert res.stderr.strip() == f"error: {out} is an unfinished finetune (no metrics.json: it was interrupted or " \
                                     "killed) — run the finetune again", res.stderr
    assert not (tmp_path / "again").exists() and not (tmp_path / "hf").exists()
    # the same command starts it again in OUT (it refused with "already exists ... delete it" before)
    res = run(*finetune_args(gpt, out, "--max-steps", 2))
    assert res.exit_code == 0, res.output
    assert (out / "metrics.json").is_file() and "unfinished" not in run("eval-ppl", text, "--model", out).output
