"""`python -m benchmarks gpu-check` (the GPU check) on a machine without CUDA: its skip, how it puts each
host sync in its optimizer step, what it reads from metrics.jsonl, the SIGTERM / resume check end to end, and
every part run on the CPU at toy size (--cpu) so their code paths run before a GPU session does."""

import json
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, where benchmarks/ lives

from benchmarks import common  # noqa: E402
from benchmarks.gpu import gpu_check, gpu_resume, gpu_syncs  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks.gpu.gpu_syncs import SYNC_TEXT, Mark, Sync, attribute, busy_steps  # noqa: E402

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]

# Tiny stand-ins for the recipes each part trains: a character GPT and a small-vocabulary BERT on the shipped
# sample corpus, so a run takes about a second here.
TINY_GPT = """\
extends: gpt-mini
model: {n_layer: 1, n_head: 2, d_model: 32, max_positions: 64, dropout: 0.1, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1, special_tokens: {eos: "<eos>", unk: "<unk>"}}
train: {seq_len: 32, global_batch_size: 8}
"""
TINY_BERT = """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64}
tokenizer: {vocab_size: 1000}
train: {seq_len: 32, global_batch_size: 8}
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """(gpt recipe, bert recipe), with runs and caches kept under tmp_path."""
    monkeypatch.setenv("PLM_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PLM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tiny-gpt.yaml").write_text(TINY_GPT)
    (tmp_path / "tiny-bert.yaml").write_text(TINY_BERT)
    return str(tmp_path / "tiny-gpt.yaml"), str(tmp_path / "tiny-bert.yaml")


@pytest.mark.parametrize("argv", [["gpu-check"], ["gpu-check", "--part", "resume", "checkpointing"]])
def test_gpu_check_skips_without_cuda(argv, monkeypatch, capsys, tmp_path):
    # Skip mode even on a GPU machine; and were it to publish, it would write here, not BENCHMARKS.md.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "write_section", lambda name, body, path=None: (tmp_path / "written").write_text(body))
    before = common.BENCHMARKS_MD.read_text() if common.BENCHMARKS_MD.is_file() else None
    t0 = time.perf_counter()
    rc = main(argv)
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert rc == 0
    assert out.strip() == "gpu-check: skipped: no CUDA device (torch.cuda.is_available() is False); BENCHMARKS.md left alone"
    assert not (tmp_path / "written").exists()
    assert (common.BENCHMARKS_MD.read_text() if common.BENCHMARKS_MD.is_file() else None) == before
    assert elapsed < 2.0, f"skip mode took {elapsed:.2f} s"


def _warning(text: str, filename: str = "/x/site-packages/torch/optim/adamw.py", lineno: int = 7):
    return warnings.WarningMessage(UserWarning(text), UserWarning, filename, lineno)


def test_attribute_puts_each_sync_in_its_step_and_phase():
    sync = f"{SYNC_TEXT} (Triggered internally at c10/cuda/CUDAFunctions.cpp:1)"
    loop_py = "/repo/plmcli/train/loop.py"
    events = [
        _warning(sync, loop_py, 200),  # building the model: before step 1
        Mark("step", 1), _warning(sync), Mark("out", 1), Mark("after", 1), Mark("out", 1),
        Mark("step", 2), _warning("a deprecation, not a sync"), Mark("out", 2), Mark("after", 2), Mark("out", 2),
        Mark("step", 3), _warning(sync, loop_py, 372), Mark("out", 3),
        Mark("after", 3), Sync("plmcli/train/health.py:60", "x.tolist()", "plmcli/train/loop.py:441"), Mark("out", 3),
        Mark("step", 4), _warning(sync, loop_py, 372), Mark("out", 4),
        Mark("after", 4), _warning(sync, loop_py, 441), _warning(sync, loop_py, 441), Mark("out", 4),
        _warning(sync, "/repo/plmcli/runs.py", 90),  # model.safetensors: after the last step
    ]
    got = attribute(events, busy={4})
    assert {k: got[k] for k in ("quiet_steps", "quiet", "quiet_max", "quiet_steps_with_syncs", "quiet_in_optimizer_step",
                                "quiet_in_after_step", "first", "busy", "setup", "outside")} == {
        "quiet_steps": 2, "quiet": 2, "quiet_max": 2, "quiet_steps_with_syncs": 1, "quiet_in_optimizer_step": 1,
        "quiet_in_after_step": 1, "first": 1, "busy": 3, "setup": 1, "outside": 1}
    assert got["sites"]["quiet"] == [("plmcli/train/loop.py:372", 1),
                                     ("plmcli/train/health.py:60 `x.tolist()` (from plmcli/train/loop.py:441)", 1)]
    assert got["sites"]["first"] == [("torch/optim/adamw.py:7", 1)]
    assert got["sites"]["busy"] == [("plmcli/train/loop.py:441", 2), ("plmcli/train/loop.py:372", 1)]
    assert attribute([Mark("step", 1), Mark("out", 1)], busy={1})["quiet_steps"] == 0


def test_busy_steps_are_the_logging_evaluation_checkpoint_and_last_ones():
    assert busy_steps(30, 30, 0, 0) == {30}
    assert busy_steps(12, 5, 0, 4) == {4, 5, 8, 10, 12}
    assert busy_steps(7, 10, 3, 0) == {3, 6, 7}  # a run cut short (time budget) logs at its last step


def test_the_recorder_marks_the_loops_steps_and_keeps_the_stack(monkeypatch):
    """Around stand-ins for _Training's two methods (the real ones wrapped the same way, by name): each step's
    Marks, a sync warning recorded with its site and the innermost plmcli frame (none here), other warnings
    passed on once, and the methods and filters put back afterwards."""
    from plmcli.train import loop
    from plmcli.train.checkpoint import LoopState

    def optimizer_step(self):
        if self.loop.step == 2:
            warnings.warn(SYNC_TEXT)
        warnings.warn("not a sync")
        self.loop.step += 1

    def after_step(self, stop_asked):
        if self.loop.step == 4:
            warnings.warn(SYNC_TEXT)

    monkeypatch.setattr(loop._Training, "optimizer_step", optimizer_step)
    monkeypatch.setattr(loop._Training, "after_step", after_step)
    training = object.__new__(loop._Training)
    training.loop = LoopState()
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        with gpu_syncs.SyncRecorder(debug=False) as rec:
            for _ in range(4):
                training.optimizer_step()
                training.after_step(None)
    assert loop._Training.optimizer_step is optimizer_step and loop._Training.after_step is after_step
    assert warnings.filters == filters
    assert [str(w.message) for w in outer] == ["not a sync"]  # shown once, not once a step
    marks = [m for m in rec.events if isinstance(m, Mark)]
    assert marks[:4] == [Mark("step", 1), Mark("out", 1), Mark("after", 1), Mark("out", 1)] and len(marks) == 16
    syncs = [e for e in rec.events if isinstance(e, Sync)]
    assert [s.site.rsplit("/", 1)[-1].split(":")[0] for s in syncs] == [Path(__file__).name] * 2
    assert all(s.plm is None and s.thread == "MainThread" and "warnings.warn(SYNC_TEXT)" in s.code for s in syncs)
    got = attribute(rec.events, busy={4})
    assert (got["quiet"], got["quiet_in_optimizer_step"], got["busy"]) == (1, 1, 1)


def test_the_recorder_around_a_real_run_finds_a_sync_in_the_loop(tiny, monkeypatch):
    """A real (tiny, CPU) pretrain with a stand-in sync inside every optimizer step: each quiet step holds one,
    traced to its line of plmcli/train/loop.py."""
    from plmcli import api
    from plmcli.train import loop

    real = loop.signal_number

    def signal_number(name):
        warnings.warn(SYNC_TEXT)
        return real(name)

    monkeypatch.setattr(loop, "signal_number", signal_number)
    n = 5
    with gpu_syncs.SyncRecorder(debug=False) as rec:
        api.pretrain(tiny[0], None, str(Path(tiny[0]).parent / "run"),
                     overrides=[f"train.max_steps={n}", f"train.log_every={n}", "train.eval_every=0", "train.save_every=0",
                                "train.eval_batches=1"])
    got = attribute(rec.events, busy_steps(n, n, 0, 0))
    assert (got["quiet_steps"], got["quiet"], got["quiet_max"], got["first"], got["busy"]) == (3, 3, 1, 1, 1)
    [(site, count)] = got["sites"]["quiet"]
    assert count == 3 and "(from plmcli/train/loop.py:" in site


def test_scale_summary_reads_the_fp16_columns():
    rows = [{"step": 10, "loss": 5.0, "tok_per_s": 1.0, "loss_scale": 65536.0, "nonfinite_steps": 0},
            {"step": 20, "loss": 4.0, "tok_per_s": 1.0, "loss_scale": 32768.0, "nonfinite_steps": 1},
            {"step": 20, "val_loss": 4.5},
            {"step": 30, "loss": 3.0, "tok_per_s": 1.0, "loss_scale": 65536.0, "nonfinite_steps": 1}]
    got = gpu_check.scale_summary(rows)
    assert {k: v for k, v in got.items() if k != "scales"} == {
        "rows": 3, "rows_with_scale": 3, "rows_with_nonfinite": 3, "scale_first": 65536.0, "scale_last": 65536.0,
        "scale_min": 32768.0, "scale_max": 65536.0, "nonfinite_steps": 1}
    assert gpu_check.scale_summary([{"step": 1, "loss": 1.0, "tok_per_s": 1.0}])["scale_first"] is None


def test_sigterm_after_a_checkpoint_exits_75_and_resumes_bitwise(tiny, tmp_path):
    """The resume part's whole procedure on the CPU (one thread, so the uninterrupted run's bytes are expected)."""
    env = common.child_env(1)
    t0 = time.perf_counter()
    res = gpu_resume.resume_check(tmp_path, tiny[0], 30, ["train.save_every=6", "train.eval_every=0",
                                                         "train.eval_batches=1", "train.num_workers=0"], env)
    elapsed = time.perf_counter() - t0
    assert res["ok"], (res, (tmp_path / "cut.log").read_text())
    assert res["exit"] == 75 and res["signal"] == "SIGTERM" and 6 <= res["stopped_step"] < 30 and res["checkpointed"]
    assert res["sha_equal"] and res["max_abs_diff"] == 0.0 and res["loss_resumed"] == res["loss_full"]
    print(f"resume check: {elapsed:.1f} s")


def test_every_part_runs_on_the_cpu_at_toy_size(tiny, monkeypatch, capsys):
    """--cpu: the parts that train in this process (the resume part is the test above), each ending in its JSON
    line and its section, nothing written to BENCHMARKS.md."""
    monkeypatch.setattr(common, "write_section", lambda *a, **k: pytest.fail("--cpu wrote BENCHMARKS.md"))
    rc = main(["gpu-check", "--cpu", "--threads", "1", "--part", "syncs", "fp16", "workers", "checkpointing",
               "--gpt", tiny[0], "--bert", tiny[1], "--large", tiny[0], "--sync-steps", "4", "--fp16-steps", "6",
               "--fp16-log-every", "3", "--workers-steps", "6", "--workers-batch", "8", "--ckpt-steps", "4",
               "--ckpt-batch", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    records = {r["part"]: r for r in (json.loads(x) for x in out.splitlines() if x.startswith('{"benchmark": "gpu-check"'))}
    assert list(records) == ["syncs", "fp16", "workers", "checkpointing"] and all(r["ok"] for r in records.values())
    assert [(r["recipe"], r["workers"], r["quiet_steps"], r["quiet"]) for r in records["syncs"]["runs"]] == [
        ("tiny-gpt", "auto", 2, 0), ("tiny-bert", "auto", 2, 0), ("tiny-gpt", "0", 2, 0), ("tiny-bert", "0", 2, 0)]
    assert records["fp16"]["runs"]["fp16"]["steps"] == 6 and records["workers"]["runs"]["0"]["tok_per_s"] > 0
    assert records["checkpointing"]["runs"]["on"]["tok_per_s"] > 0
    for title in ("host syncs per optimizer step", "fp16 loss scaling beside bf16", "input workers",
                  "activation checkpointing"):
        assert f"## GPU check: {title}" in out
    assert "(--no-write: BENCHMARKS.md left alone)" in out


def test_a_sigterm_mid_part_reports_the_runs_done_and_starts_no_other(tiny, monkeypatch, capsys):
    """gpu_device.sh's time cap is a SIGTERM. Inside a training loop the run stops (Interrupted); outside one the
    part's own handler stops it (CapReached). Either way the runs before it are reported, none is started after
    it, and the command fails."""
    import os
    import signal

    from plmcli import api
    from plmcli.errors import Interrupted

    calls = []

    def pretrain(recipe, data, out, overrides, **kw):
        calls.append(overrides)
        if len(calls) == 1:
            raise Interrupted("stopped after step 3 (SIGTERM); the checkpoint of step 3 is in x", "SIGTERM")
        pytest.fail("a run started after the SIGTERM")

    monkeypatch.setattr(api, "pretrain", pretrain)
    rc = main(["gpu-check", "--cpu", "--part", "fp16", "workers", "--gpt", tiny[0]])
    out = capsys.readouterr().out
    assert rc == 1 and len(calls) == 1
    [record] = [json.loads(x) for x in out.splitlines() if x.startswith('{"benchmark": "gpu-check"')]
    assert record["part"] == "fp16" and not record["ok"]
    assert record["runs"]["fp16"]["error"].startswith("Interrupted: stopped after step 3 (SIGTERM)")
    assert record["runs"]["bf16"]["error"] == "not run: SIGTERM (the time cap) came first"
    assert "## GPU check: fp16 loss scaling beside bf16" in out and "## GPU check: input workers" not in out

    def before_the_loop(*a, **kw):  # e.g. while the tokenizer trains: no loop has taken SIGTERM over yet
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("SIGTERM did not stop the part")

    monkeypatch.setattr(api, "pretrain", before_the_loop)
    previous = signal.getsignal(signal.SIGTERM)
    rc = main(["gpu-check", "--cpu", "--part", "workers", "--bert", tiny[1]])
    assert rc == 1 and signal.getsignal(signal.SIGTERM) is previous
    [record] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"benchmark": "gpu-check"')]
    assert record["runs"]["auto"]["error"] == "CapReached: SIGTERM" and record["runs"]["0"]["error"].startswith("not run")
