"""What a user watches during training: the run's header and time estimate, the bar per step
and micro-batch, plain lines off a terminal, and files that follow the umask."""

import json
import os
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.cli import app
from plmcli.config import load_recipe
from plmcli.train.progress import STEADY, WARMUP, WARMUP_COMPILED, StageProgress, TrainProgress, device_flops, duration

pytestmark = pytest.mark.usefixtures("one_thread")


class Clock:
    """A clock the test moves by hand: no timing in these tests, only arithmetic on given times."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Params(torch.nn.Module):
    """A model of `n` parameters that takes no memory (meta device): only its count is read."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(n, device="meta"))


def bert_base_like(max_steps=900_000):
    """Training settings alone, as finetune passes them (no recipe name, no family)."""
    return SimpleNamespace(train=SimpleNamespace(global_batch_size=256, seq_len=128, max_steps=max_steps))


def console(terminal: bool) -> Console:
    return Console(file=StringIO(), force_terminal=terminal, width=300)


def lines(c: Console) -> list[str]:
    return c.file.getvalue().splitlines()


def test_duration_reads_like_a_person_would():
    assert [duration(s) for s in (0.004, 0.25, 3.5, 42, 192, 5 * 3600 + 20 * 60, 4.5 * 86400, 5.9 * 365.25 * 86400)] == \
        ["4.0ms", "250ms", "3.5s", "42s", "3m12s", "5h20m", "4.5 days", "5.9 years"]


def test_estimate_and_hint_for_a_recipe_far_too_big(tmp_path):
    # bert-base on a device doing 1e12 FLOP/s: 6.5e8 FLOPs/token × 32,768 tokens = 21.3 s a step (221.9 days for 900k).
    c = console(False)
    p = TrainProgress(c, 900_000, 0, accum=4)
    p.begin(tmp_path / "run", load_recipe("bert-base"), Params(110_000_000), 6.5e8, torch.device("cpu"), flops=1e12)
    head, estimate, hint = lines(c)
    assert head == f"training {tmp_path / 'run'}: 900,000 optimizer steps (256 × 128 tokens, 4 micro-batches each)"
    assert estimate.startswith("estimate: at least 21s per optimizer step, 221.9 days for the run "
                               "(6.5e+08 FLOPs per token × 32,768 tokens per step at the 1e+12 FLOP/s")
    assert f"refined from {STEADY} steady micro-batches after {WARMUP} warm-up ones" in estimate
    # The probe's estimate is a lower bound, and its hint says so: the smallest shipped bert recipe, at most
    # the steps that fit in a day (86,400 s / 21.3 s), a GPU.
    assert hint.startswith("hint: bert-base is far too big for this CPU (at least 221.9 days, by the matmul probe): try ")
    assert "--recipe bert-mini, 5.5M parameters against 110.0M" in hint
    assert "at most --max-steps 4,056 fit in a day" in hint and hint.endswith(" or a GPU")
    p.close()


def test_a_finetune_far_too_big_gets_fewer_steps_or_a_gpu(tmp_path):
    c = console(False)
    TrainProgress(c, 900_000, 0).begin(tmp_path, bert_base_like(), Params(110_000_000), 6.5e8, torch.device("cpu"), flops=1e12)
    assert lines(c)[2] == ("hint: this run is far too big for this CPU (at least 221.9 days, by the matmul probe): "
                           "try fewer steps (at most --max-steps 4,056 fit in a day) or a GPU")


def test_fallback_six_times_params_and_a_small_run_gets_no_hint(tmp_path):
    c = console(False)
    p = TrainProgress(c, 400, 0)
    recipe = SimpleNamespace(train=SimpleNamespace(global_batch_size=32, seq_len=128))
    p.begin(tmp_path, recipe, Params(1_000_000), None, torch.device("cpu"), world=2, flops=1e11)
    # 6 × 1e6 FLOPs/token × 4,096 tokens over 2 processes × 1e11 FLOP/s = 123 ms a step, 49 s for 400.
    assert lines(c)[1].startswith("estimate: at least 123ms per optimizer step, 49s for the run (6e+06 FLOPs per token "
                                  "× 4,096 tokens per step at the 1e+11 FLOP/s × 2 processes")
    assert len(lines(c)) == 2


def test_resumed_and_finished_runs_say_what_is_left(tmp_path):
    c = console(False)
    TrainProgress(c, 60, 30).begin(tmp_path, bert_base_like(), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    assert lines(c)[0] == f"training {tmp_path}: 30 more optimizer steps, 31 to 60 (256 × 128 tokens)"
    c = console(False)
    TrainProgress(c, 60, 60).begin(tmp_path, bert_base_like(), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    assert lines(c) == [f"training {tmp_path}: all 60 optimizer steps are done"]


def test_bar_moves_every_step_and_shows_micro_batches():
    clock = Clock()
    c = console(True)
    p = TrainProgress(c, 10, 0, accum=4, clock=clock)
    task = lambda: p.progress.tasks[0]  # noqa: E731
    p.begin("R", bert_base_like(10), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    assert task().fields["eta"] == "-" or task().fields["eta"].startswith("~")
    clock.now += 200.0
    p.micro_batch()  # warm-up: 200 s, and no estimate from it
    assert task().fields["micro"] == "micro-batch 1/4" and task().completed == 0
    assert "estimate: ~" not in c.file.getvalue()
    for _ in range(3):  # the second warm-up one, then steady ones of 2 s: 8 s an optimizer step of 4, 80 s for 10
        clock.now += 2.0
        p.micro_batch()
    assert task().fields["micro"] == "micro-batch 4/4"
    p.step(1)
    clock.now += 2.0
    p.micro_batch()  # the third steady one
    assert ("estimate: ~8.0s per optimizer step, ~1m20s for the run (2.0s a micro-batch, the mean of 3 steady "
            "micro-batches after 2 warm-up ones)") in c.file.getvalue()
    assert task().completed == 1 and task().fields["micro"] == "micro-batch 1/4"
    assert task().fields["eta"] == "~1m12s"  # 9 steps × 8 s, from the steady estimate
    p.update(1, {"loss": 3.25, "lr": 1e-4, "tok_per_s": 1000.0}, {})
    clock.now += 8.0
    for _ in range(3):
        p.micro_batch()
    p.step(2)  # measured from here: 10 s a step (the first one's end to this one's), 8 steps left; no new loss
    assert task().completed == 2 and task().fields["eta"] == "1m20s"  # logged, the last one stays
    assert task().fields["info"].startswith("loss 3.2500")
    assert c.file.getvalue().count("estimate: ~") == 1
    p.close()


def test_log_file_gets_only_the_sparse_lines():
    clock = Clock()
    c = console(False)
    p = TrainProgress(c, 3, 0, accum=2, clock=clock)
    p.begin("R", bert_base_like(3), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    for step in (1, 2, 3):
        p.micro_batch()
        p.micro_batch()
        p.step(step)
    p.update(3, {"loss": 2.5, "lr": 1e-4, "tok_per_s": 10.0}, {})
    out = lines(c)
    assert len(out) == 4 and out[0].startswith("training R: 3 optimizer steps") and out[1].startswith("estimate: at least")
    assert out[2].startswith("estimate: ~") and out[3] == "step 3  loss 2.5000  lr 1.00e-04  10 tok/s"
    assert "\x1b" not in c.file.getvalue()


def test_the_device_probe_leaves_the_random_streams_alone():
    device_flops.cache_clear()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert device_flops("cpu") > 1e6
    assert torch.equal(torch.get_rng_state(), before)


def test_pretrain_log_starts_with_run_dir_steps_and_estimate(tmp_path):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(run),
                                   "--set", "train.global_batch_size=8", "--set", "train.micro_batch_size=4"])
    assert res.exit_code == 0, res.output
    err = res.stderr.splitlines()
    assert err[0] == f"training {run}: 6 optimizer steps (8 × 16 tokens, 2 micro-batches each)"
    assert err[1].startswith("estimate: at least ") and "FLOPs per token × 128 tokens per step" in err[1]
    # 12 micro-batches: the steady estimate follows the 5th, within step 3
    assert err[2].startswith("step 1  loss ") and err[3].startswith("step 2  loss ")
    assert err[4].startswith("estimate: ~") and f"the mean of {STEADY} steady micro-batches" in err[4]
    assert sum(line.startswith("estimate:") for line in err) == 2 and not any(line.startswith("hint:") for line in err)
    # logging stays sparse: one metrics row per logged step
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_run_files_follow_the_umask(tmp_path, umask):
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    old = os.umask(umask)
    try:
        api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"), overrides=["train.max_steps=3"],
                     console=console(False))
    finally:
        os.umask(old)
    files = [f for f in Path(tmp_path / "run").rglob("*") if f.is_file()]
    modes = {str(f.relative_to(tmp_path / "run")): f.stat().st_mode & 0o777 for f in files}
    assert "model.safetensors" in modes and any(k.startswith("checkpoints/step-3/") for k in modes)
    assert modes == {k: 0o666 & ~umask for k in modes}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_estimate_names_it_and_its_steady_window_is_timed():
    c = console(False)
    p = TrainProgress(c, 10, 0, accum=2)
    device = torch.device("cuda")
    p.begin("R", bert_base_like(10), Params(10), 1e9, device, precision="bf16")
    assert torch.cuda.get_device_name(device) in lines(c)[1] and device_flops("cuda", None, "bf16") > 1e12
    for step in (1, 2, 3):
        p.micro_batch()
        p.micro_batch()
        p.step(step)
    assert lines(c)[2].startswith("estimate: ~") and len(lines(c)) == 3


def steady_run(c, clock, total=1000, accum=4, first=100.0, each=1.0, compiled=False, micro_batches=None,
               recipe=None, params=10):
    """A run whose first micro-batch takes `first` seconds and every later one `each`; `micro_batches` of them
    (by default just enough for the steady estimate)."""
    p = TrainProgress(c, total, 0, accum=accum, clock=clock, compiled=compiled)
    p.begin("R", recipe or bert_base_like(total), Params(params), 1.0, torch.device("cpu"), flops=1e12)
    n = micro_batches if micro_batches is not None else (WARMUP_COMPILED if compiled else WARMUP) + STEADY
    for i in range(n):
        clock.now += first if i == 0 else each
        p.micro_batch()
        if (i + 1) % accum == 0:
            p.step((i + 1) // accum)
    return p


def test_a_slow_first_micro_batch_neither_inflates_the_estimate_nor_hints(tmp_path):
    # gpt-mini on a 2-core CPU: warm-up (compilation, allocator) 100 × a steady micro-batch. Timed from the
    # first micro-batch, 1,000 steps × 4 × 100 s would be 4.6 days and a hint; the steady figures say 1h07m.
    clock, c = Clock(), console(False)
    p = steady_run(c, clock, recipe=load_recipe("gpt-mini"), params=11_000_000)
    out = lines(c)
    assert len(out) == 3 and not any(line.startswith("hint:") for line in out)
    assert out[2] == ("estimate: ~4.0s per optimizer step, ~1h06m for the run (1.0s a micro-batch, "
                      f"the mean of {STEADY} steady micro-batches after {WARMUP} warm-up ones)")
    assert p.per_step == 4.0
    p.close()


def test_the_refined_estimate_is_the_steady_mean_times_accum_times_the_steps_left(tmp_path):
    # A resumed run, 700 of 1,000 steps left, accum 8, steady micro-batches of 0.75 s: 6 s a step, 4,200 s.
    clock, c = Clock(), console(False)
    p = TrainProgress(c, 1000, 300, accum=8, clock=clock)
    p.begin("R", bert_base_like(1000), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    for i in range(WARMUP + STEADY):
        clock.now += 60.0 if i < WARMUP else 0.75
        p.micro_batch()
    assert p.per_step == pytest.approx(0.75 * 8)
    assert lines(c)[2].startswith(f"estimate: ~6.0s per optimizer step, ~{duration(0.75 * 8 * 700)} for the run ")
    assert p.eta() == "~" + duration(6.0 * 700)  # no step done yet: the steady estimate
    p.close()


def test_a_compiled_run_skips_one_more_warm_up_micro_batch():
    clock, c = Clock(), console(False)
    p = TrainProgress(c, 100, 0, accum=1, clock=clock, compiled=True)
    p.begin("R", bert_base_like(100), Params(10), 1.0, torch.device("cpu"), flops=1e12)
    assert f"after {WARMUP_COMPILED} warm-up ones" in lines(c)[1]
    for i, took in enumerate([50.0, 20.0, 10.0, 2.0, 2.0, 2.0]):  # compile, recompile on a new shape, settle
        clock.now += took
        p.micro_batch()
        p.step(i + 1)
    assert lines(c)[2].startswith("estimate: ~2.0s per optimizer step, ~3m20s for the run ")


def test_the_hint_follows_steady_figures_far_too_big(tmp_path):
    # 100,000 steps × 4 micro-batches × 1 s = 4.6 days at the steady pace: past FAR_S, so the hint, timed.
    clock, c = Clock(), console(False)
    steady_run(c, clock, total=100_000, first=1.0, recipe=load_recipe("bert-base"), params=110_000_000)
    hint = lines(c)[3]
    assert hint.startswith("hint: bert-base is far too big for this CPU (about 4.6 days, timed over "
                           f"{STEADY} steady micro-batches): try a smaller bert recipe (--recipe bert-mini")
    assert "fewer steps (--max-steps 21,600 takes about a day)" in hint and hint.endswith(" or a GPU")
    assert len(lines(c)) == 4


def test_a_run_shorter_than_the_window_prints_no_refined_estimate():
    clock, c = Clock(), console(False)
    p = steady_run(c, clock, total=3, accum=2, micro_batches=WARMUP + STEADY - 1)  # 2 of 3 steps, then the end
    assert len(lines(c)) == 2 and lines(c)[1].startswith("estimate: at least")
    assert p.per_step == pytest.approx(1.0 * 256 * 128 / 1e12)  # still the probe's: 1 FLOP a token × 32,768 tokens


def test_on_cuda_the_steady_window_is_timed_by_events_never_waited_for(monkeypatch):
    """The window's two ends are CUDA events queued behind the work; the estimate prints once the second has
    completed (polled with query()), and the host never synchronizes with the device."""
    clock, c = Clock(), console(False)
    done = {"after": 10**9}

    class Event:  # a CUDA event on the fake clock, complete `after` micro-batches once recorded
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at, self.polls = clock.now, 0

        def query(self):
            self.polls += 1
            return self.polls > done["after"]

        def elapsed_time(self, end):
            return (end.at - self.at) * 1000

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: pytest.fail("the host waited for the GPU"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    p = TrainProgress(c, 1000, 0, accum=4, clock=clock)
    p.begin("R", bert_base_like(1000), Params(10), 1.0, torch.device("cuda", 0), flops=1e12)
    done["after"] = 2  # the end event completes two micro-batches after it was queued
    for i in range(40):
        clock.now += 1.0
        p.micro_batch()
        if (i + 1) % 4 == 0:
            p.step((i + 1) // 4)
    assert lines(c)[2].startswith("estimate: ~4.0s per optimizer step")


# ---------------------------------------------------------------- a command's stages (probe, generate)


def test_a_stage_bar_waits_for_its_delay_and_shows_every_stage():
    out, clock = StringIO(), Clock()
    with StageProgress(Console(file=out, force_terminal=True, width=100), delay=1.0, clock=clock) as bar:
        bar.start("first stage", 10)
        bar.advance(3)
        assert not bar.shown and out.getvalue() == ""  # work done within the delay flashes nothing
        clock.now += 1.5
        bar.advance(1)
        assert bar.shown
        bar.start("second stage", 4)
    assert "first stage" in out.getvalue() and "second stage" in out.getvalue() and "0/4" in out.getvalue()


def test_off_a_terminal_a_stage_is_silent_or_logs_sparse_lines():
    clock = Clock()
    quiet = Console(file=StringIO(), force_terminal=False)
    with StageProgress(quiet, clock=clock) as bar:
        bar.start("vectors", 100)
        bar.advance(50)
    assert quiet.file.getvalue() == ""
    log = Console(file=StringIO(), force_terminal=False, width=200)
    with StageProgress(log, log_every=30, clock=clock) as bar:
        bar.start("vectors", 100)
        for _ in range(10):  # 10 s apart: a line every third
            clock.now += 10
            bar.advance(10)
    assert log.file.getvalue().splitlines() == ["vectors: 0/100", "vectors: 30/100 (30s)", "vectors: 60/100 (1m00s)",
                                                "vectors: 90/100 (1m30s)"]
