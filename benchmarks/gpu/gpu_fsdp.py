"""FSDP on GPUs: plm's fsdp.yaml through `accelerate launch`, as a user launches it, where CI cannot (its CPU
test, tests/train/test_fsdp.py, runs the CPU processes' path, on which plm itself attaches FSDP).

A tiny two-phase GPT recipe is stopped at step 2 of its first phase (a torch.distributed.checkpoint checkpoint),
resumed to the end (on 1 process when it started on 2: resharded on load), its second phase continuing the sharded
model in the same process. Checked: the checkpoint's shard files, model.safetensors loading into a plain model, and
every logged loss against one unsharded process (fp32, micro batch 1 on both sides, so the same micro-batches and
dropout draws). Then the same launch in bf16 (FSDP's mixed-precision policy) only has to finish. One GPU is enough:
one process shards trivially, yet saves, loads and gathers through the same code.

    python -m benchmarks.gpu.gpu_fsdp            # a minute or two on an H100; without CUDA one skip line, exit 0
    python -m benchmarks.gpu.gpu_fsdp --cpu      # the same on 2 CPU processes (gloo), to check this script anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import free_port, tiny_corpus

REPO = Path(__file__).resolve().parents[2]  # benchmarks/gpu/gpu_fsdp.py -> the repo root
RECIPE = """\
extends: gpt-mini
model: {n_layer: 2, n_head: 2, d_model: 32, max_positions: 32, dropout: 0.1, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1, special_tokens: {eos: "<eos>", unk: "<unk>"}}
data: {val_fraction: 0.2}
train: {seq_len: 16, global_batch_size: 4, micro_batch_size: 1, max_steps: 6, eval_every: 3, eval_batches: 2,
        save_every: 3, log_every: 1, mixed_precision: "no"}
optim: {lr: 3.0e-3, warmup_steps: 2, schedule: cosine}
phases:
  - {name: short, max_steps: 4, set: {train.seq_len: 8, optim.lr: 5.0e-3}}
  - {name: long, max_steps: 3, set: {train.seq_len: 16, train.global_batch_size: 2}}
"""
REL = 1e-4  # GPU kernels may sum in another order under FSDP's all-gather / reduce-scatter (on CPUs: 2.4e-7)


def launch(root: Path, processes: int | None, *args) -> None:
    """`accelerate launch --config_file <fsdp.yaml> --num_processes N -m plmcli pretrain ARGS`; None: plain `plm pretrain`."""
    from plmcli.api import accelerate_configs

    head = ["-m", "accelerate.commands.launch", "--config_file", str(accelerate_configs()["fsdp"]), "--num_processes",
            str(processes), "--main_process_port", str(free_port())] if processes else []
    env = {**os.environ, "PLM_RUNS": str(root / "runs"), "PLM_CACHE": str(root / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, *head, "-m", "plmcli", "pretrain", *map(str, args)]
    print("gpu_fsdp:", " ".join(cmd[1:]), flush=True)
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if res.returncode:
        sys.exit(f"gpu_fsdp: FAILED (exit {res.returncode}):\n{res.stderr[-4000:]}")


def rows(run: Path, phase: str) -> dict:
    lines = (run / "phases" / phase / "metrics.jsonl").read_text().splitlines()
    return {(r["step"], "loss" in r): r for r in map(json.loads, lines)}


def check(ok: bool, what: str) -> None:
    print(f"gpu_fsdp: {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        sys.exit(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run on 2 CPU processes when there is no GPU")
    args = ap.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    if not gpus and not args.cpu:
        print("gpu_fsdp: skipped: no CUDA device (--cpu runs it on 2 CPU processes)")
        return
    first, then = (2, 1) if (gpus or 2) >= 2 else (1, 1)
    with tempfile.TemporaryDirectory(prefix="gpu_fsdp.") as tmp:
        root = Path(tmp)
        (root / "phased.yaml").write_text(RECIPE, encoding="utf-8")
        base = ["--recipe", root / "phased.yaml", "--data", tiny_corpus(root / "c.txt")]
        launch(root, None, *base, "--out", root / "ref")
        launch(root, first, *base, "--out", root / "fsdp", "--stop-after", 2)
        ck = root / "fsdp" / "phases" / "short" / "checkpoints" / "step-2"
        shards = sorted(p.name for p in (ck / "pytorch_model_fsdp_0").glob("__*.distcp"))
        check(shards == [f"__{r}_0.distcp" for r in range(first)] and (ck / "optimizer_0" / ".metadata").is_file(),
              f"step 2 saved as torch.distributed.checkpoint shards {shards}")
        launch(root, then, "--resume", "--out", root / "fsdp")
        worst = 0.0
        for phase in ("short", "long"):
            ref, got = rows(root / "ref", phase), rows(root / "fsdp", phase)
            for key, r in ref.items():
                for k in ("loss", "val_loss", "grad_norm"):
                    if k in r:
                        worst = max(worst, abs(got[key][k] - r[k]) / max(abs(r[k]), 1e-6))
        check(worst <= REL, f"resumed on {then} process(es), both phases: losses and gradient norms as one unsharded "
                            f"process's (largest relative difference {worst:.1e}, allowed {REL:g})")
        from safetensors.torch import load_model

        from plmcli.config import load_recipe
        from plmcli.models.registry import build_model

        r = load_recipe(str(root / "fsdp" / "recipe.yaml"))
        model = build_model(r.family, r.model)
        load_model(model, str(root / "fsdp" / "model.safetensors"))
        check(True, "model.safetensors loads into a plain model (strict)")
        launch(root, first, *base, "--set", "train.mixed_precision=bf16", "--out", root / "bf16")
        summary = json.loads((root / "bf16" / "summary.json").read_text())
        check(summary["steps"] == 3, f"bf16 under FSDP's mixed-precision policy: both phases, val loss {summary.get('val_loss')}")
    print(f"gpu_fsdp: passed on {'%d GPU(s)' % gpus if gpus else '2 CPU processes'}, accelerate "
          f"{__import__('accelerate').__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
