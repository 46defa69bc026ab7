"""gpu-check's resume part: a scheduler's SIGTERM mid-run, the exit a requeue needs, and the resumed weights.

`plm pretrain` runs as its own process, as on a cluster. Once its first periodic checkpoint is on disk it
gets SIGTERM; it must stop at the next optimizer-step boundary with a checkpoint of that step and exit 75
(errors.RESUMABLE_EXIT, "requeue me"). `plm pretrain --out RUN --resume` then finishes it, and its
model.safetensors is set against an uninterrupted run of the same recipe and steps. On a CPU with one thread
the two are bitwise equal (tests/train/test_preemption.py); on a GPU only deterministic kernels promise
that (CUBLAS_WORKSPACE_CONFIG is set; plm has no switch for torch.use_deterministic_algorithms, and flash
attention's backward accumulates in a varying order), so the largest difference is reported beside the hash.
"""

from __future__ import annotations

import hashlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.gpu.gpu_check import Ctx, Section, _num

STOPPED = re.compile(r"stopped\s+after\s+step\s+(\d+)\s+\((\w+)\)")
# The uninterrupted run, the interrupted one's rest and its resume each get at most this long.
WAIT_S = 300


def plm_command(*args) -> list[str]:
    return [sys.executable, "-m", "plmcli", *map(str, args)]


def sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def first_checkpoint(run: Path, proc: subprocess.Popen, deadline: float) -> int | None:
    """The step of the first checkpoint that appears in `run` (renamed into place whole, so complete),
    or None if the process ended or the deadline passed first."""
    ckpts = run / "checkpoints"
    while time.monotonic() < deadline:
        if ckpts.is_dir():
            steps = [int(p.name[5:]) for p in ckpts.iterdir() if p.name.startswith("step-") and p.name[5:].isdigit()]
            if steps:
                return max(steps)
        if proc.poll() is not None:
            return None
        time.sleep(0.01)
    return None


def compare_weights(a: Path, b: Path) -> dict:
    """Same file bytes? Else the largest |difference| of any tensor, and which."""
    from safetensors.torch import load_file

    if not (a.is_file() and b.is_file()):
        return {"sha_equal": False, "max_abs_diff": None, "worst": None, "missing": [str(p) for p in (a, b) if not p.is_file()]}
    wa, wb = load_file(str(a)), load_file(str(b))
    diffs = {k: float((wa[k].float() - wb[k].float()).abs().max()) for k in wa if k in wb and wa[k].shape == wb[k].shape}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {"sha_equal": sha256(a) == sha256(b), "max_abs_diff": diffs.get(worst), "worst": worst,
            "same_tensors": sorted(wa) == sorted(wb) and len(diffs) == len(wa)}


def last_loss(run: Path) -> float | None:
    import json

    path = run / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    losses = [r["loss"] for r in rows if "tok_per_s" in r]
    return losses[-1] if losses else None


def resume_check(root: Path, recipe: str, steps: int, sets: list[str], env: dict) -> dict:
    """SIGTERM `plm pretrain` after its first checkpoint, resume it, and run it uninterrupted: what happened.
    Each process writes its output to ROOT/<name>.log (a pipe left unread would fill and stop it)."""
    base = ["pretrain", "--recipe", recipe, "--max-steps", steps, *[x for s in sets for x in ("--set", s)]]
    cut, full = root / "cut", root / "full"
    res: dict = {"steps": steps, "signalled_after": None, "exit": None, "stopped_step": None, "signal": None,
                 "checkpointed": False, "weights_before_resume": None, "stop_s": None}
    procs: list[subprocess.Popen] = []

    def start(name: str, *args) -> subprocess.Popen:
        with open(root / f"{name}.log", "w") as log:
            procs.append(subprocess.Popen(plm_command(*args), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=common.REPO_ROOT))
        return procs[-1]

    try:
        # Side by side: the caches are built into temp paths and renamed, so two builds of one cache are safe.
        p = start("cut", *base, "--out", cut)
        q = start("full", *base, "--out", full)
        res["signalled_after"] = first_checkpoint(cut, p, time.monotonic() + WAIT_S)
        if res["signalled_after"] is not None:
            p.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        p.wait(WAIT_S)
        res["exit"] = p.returncode
        res["stop_s"] = time.monotonic() - signalled if res["signalled_after"] is not None else None
        said = STOPPED.search((root / "cut.log").read_text())
        if said:
            res["stopped_step"], res["signal"] = int(said.group(1)), said.group(2)
            res["checkpointed"] = (cut / "checkpoints" / f"step-{res['stopped_step']}").is_dir()
        res["weights_before_resume"] = (cut / "model.safetensors").exists()
        t0 = time.monotonic()
        r = start("resume", "pretrain", "--out", cut, "--resume")
        r.wait(WAIT_S)
        res["resume_exit"], res["resume_s"] = r.returncode, time.monotonic() - t0
        q.wait(WAIT_S)
        res["full_exit"] = q.returncode
    except subprocess.TimeoutExpired as e:
        res["error"] = f"`{' '.join(map(str, e.cmd[2:]))}` ran past {WAIT_S} s"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    res.update(compare_weights(cut / "model.safetensors", full / "model.safetensors"),
               loss_resumed=last_loss(cut), loss_full=last_loss(full))
    res["ok"] = (not res.get("error") and res["exit"] == 75 and res["signal"] == "SIGTERM" and res["checkpointed"]
                 and not res["weights_before_resume"] and res.get("resume_exit") == 0 and res.get("full_exit") == 0
                 and res["stopped_step"] is not None and res["stopped_step"] < steps)
    return res


def measure_resume(ctx: Ctx) -> Section:
    a = ctx.args
    sets = [f"train.mixed_precision={ctx.precision('bf16')}", f"train.save_every={a.resume_save_every}",
            "train.eval_every=0", "train.eval_batches=2", *a.overrides]
    env = common.child_env(a.threads, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
    res = resume_check(ctx.root, a.gpt, a.resume_steps, sets, env)
    for name in ("cut", "resume", "full"):
        tail = (ctx.root / f"{name}.log").read_text(errors="replace").strip().splitlines()[-4:]
        print(f"--- {name}.log (last lines)\n" + "\n".join(tail))
    if res.get("missing"):
        same = "not compared: no " + ", ".join(str(Path(m).relative_to(ctx.root)) for m in res["missing"])
    elif res["sha_equal"]:
        same = "bitwise equal"
    else:
        same = f"differ: max |Δ| {_num(res['max_abs_diff'], '{:.3g}')} in `{res['worst']}`"
    print(f"SIGTERM after the checkpoint of step {res['signalled_after']}: exit {res['exit']} after {_num(res['stop_s'], '{:.1f}')} s, "
          f"stopped after step {res['stopped_step']} (checkpoint there: {res['checkpointed']}); resume exit "
          f"{res.get('resume_exit')}; uninterrupted exit {res.get('full_exit')}; weights {same}; "
          f"{'ok' if res['ok'] else 'FAILED'}")
    text = f"""
`plm pretrain --recipe {a.gpt} --max-steps {a.resume_steps}` (bf16, a checkpoint every {a.resume_save_every} steps)
runs as its own process and gets SIGTERM as soon as its first checkpoint is on disk; it must stop at the next
optimizer step with a checkpoint of that step and exit 75 (requeue). `plm pretrain --out RUN --resume` finishes
it, and its `model.safetensors` is compared with an uninterrupted run of the same command (both with
`CUBLAS_WORKSPACE_CONFIG=:4096:8`; plm has no switch for torch's deterministic algorithms, so on a GPU equal
bytes are not promised and the largest difference is given). Final logged training loss: resumed
{_num(res['loss_resumed'], '{:.5f}')}, uninterrupted {_num(res['loss_full'], '{:.5f}')}.
"""
    rows = [["SIGTERM sent after the checkpoint of step", res["signalled_after"]],
            ["exit code (75 expected)", res["exit"]],
            ["stopped after step, by", f"{res['stopped_step']}, {res['signal']}"],
            ["checkpoint of that step written", "yes" if res["checkpointed"] else "**no**"],
            ["SIGTERM to exit (the checkpoint written)", _num(res["stop_s"], "{:.1f} s")],
            ["`--resume` exit code", res.get("resume_exit")],
            ["uninterrupted run exit code", res.get("full_exit")],
            ["model.safetensors vs uninterrupted", same]] + ([["error", res["error"]]] if res.get("error") else [])
    record = {k: v for k, v in res.items() if k != "ok"}
    return Section("SIGTERM mid-run, exit 75, resume", text, common.markdown_table(["check", "result"], rows),
                   record, res["ok"])
