"""GPU check: bert-mini and gpt-mini pretrain in bf16 on one GPU through `plmcli.api.pretrain`.

One prepared script for a session that has a GPU (a few minutes on an H100/H200, each run capped by
--time-budget): it shows that the GPU path works end to end (bf16 autocast, the one loop, checkpoints)
and what it delivers, tokens/s and MFU as the loop logs them (MFU needs the device in
plmcli.train.peaks.PEAKS). The data is the sample corpus shipped in plmcli/corpus/ and the
tokenizers are trained on it, so nothing is downloaded. Without CUDA it prints one skip line and exits 0.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from benchmarks import common

NAME = "gpu-check"
HELP = "bert-mini and gpt-mini: 200 bf16 pretraining steps on one GPU, tokens/s and MFU (skips without CUDA)"


def add_arguments(p) -> None:
    p.add_argument("--recipes", nargs="+", default=["bert-mini", "gpt-mini"], help="recipes to pretrain")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[0, 256],
                   help="global batches (sequences) to run each recipe at, one micro-batch each; 0 = the recipe's own")
    p.add_argument("--log-every", type=int, default=20, help="steps per logged throughput window")
    p.add_argument("--time-budget", type=float, default=60.0, help="seconds of training each run may take at most")
    p.add_argument("--compile", action="store_true", help="torch.compile the models (train.compile=true)")
    p.add_argument("--keep", type=Path, help="write the runs under this dir and keep them (default: a temporary dir)")


def skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def run(args) -> int:
    why = skip_reason()
    if why:
        print(f"{NAME}: skipped: {why}; BENCHMARKS.md left alone")
        return 0
    import torch

    from plmcli.config import load_recipe
    from plmcli.train.peaks import peak_flops

    common.set_threads(args.threads)
    info = common.machine_info()
    device = torch.device("cuda", 0)
    gpu, peak = torch.cuda.get_device_name(device), peak_flops(device)
    print(f"{common.machine_line(info)}\nGPU: {gpu}, CUDA {torch.version.cuda}, bf16 peak "
          + (f"{peak / 1e12:,.0f} TFLOP/s" if peak else "unknown (no MFU)"))
    results = []
    with common.isolated_workdir("plm-gpu-check-", args.keep) as root:
        for name in args.recipes:
            recipe = load_recipe(name)
            for gb in args.batch_sizes:
                res = one_run(name, gb or recipe.train.global_batch_size, recipe.train.seq_len, root, args)
                res["recipe_batch"] = gb == 0
                results.append(res)
                print(f"{name} batch {res['batch']}: {res['tok_per_s']:,.0f} tok/s, MFU {_pct(res['mfu'])}, "
                      f"loss {res['loss_first']:.3f} -> {res['loss_last']:.3f}, {res['steps']} steps "
                      f"({res['stop_reason']}), peak memory {res['peak_gib']:.2f} GiB, {'ok' if res['ok'] else 'FAILED'}")
    common.publish(NAME, render(args, info, gpu, peak, results, torch.version.cuda), args)
    return 0 if all(r["ok"] for r in results) else 1


def one_run(name: str, batch: int, seq_len: int, root: Path, args) -> dict:
    """Pretrain `name` at global batch `batch` in bf16; its logged throughput, MFU, losses and memory."""
    import torch

    from plmcli import api

    out = root / f"{name}-b{batch}"
    over = ["train.mixed_precision=bf16", f"train.global_batch_size={batch}", "train.micro_batch_size=0",
            f"train.log_every={args.log_every}", "train.eval_every=0", "train.eval_batches=20", "train.save_every=0",
            f"train.compile={'true' if args.compile else 'false'}"]
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = api.pretrain(name, None, str(out), overrides=over, max_steps=args.steps, time_budget=args.time_budget)
    wall = time.perf_counter() - t0
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "tok_per_s" in r]
    # The first window holds CUDA start-up (context, cuBLAS handles, compilation): not steady state.
    steady = rows[1:] or rows
    losses = [r["loss"] for r in rows]
    mfus = [r["mfu"] for r in steady if "mfu" in r]
    return {
        "recipe": name, "batch": batch, "seq_len": seq_len, "steps": summary["steps"],
        "stop_reason": summary["stop_reason"], "tok_per_s": statistics.median(r["tok_per_s"] for r in steady),
        "mfu": statistics.median(mfus) if mfus else None, "loss_first": losses[0], "loss_last": losses[-1],
        "val_loss": summary.get("val_loss"), "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "loop_s": summary["elapsed_s"], "wall_s": wall,
        # bf16 ran and learned: every logged loss finite, and the last below the first.
        "ok": all(math.isfinite(x) for x in losses) and losses[-1] < losses[0],
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def render(args, info: dict, gpu: str, peak: float | None, results: list[dict], cuda: str | None) -> str:
    peak_text = (f"{peak / 1e12:,.0f} TFLOP/s dense bf16 (plmcli.train.peaks.PEAKS)" if peak
                 else "unknown: this GPU is not in plmcli.train.peaks.PEAKS, so no MFU")
    text = f"""
GPU: {gpu}, CUDA {cuda}; peak for MFU: {peak_text}.

Each recipe pretrains for {args.steps} steps (or {args.time_budget:g} s of training, whichever comes first) on
the sample corpus shipped in `plmcli/corpus/` with its tokenizer trained there, through `plmcli.api.pretrain`
with `train.mixed_precision=bf16` on one GPU, the whole global batch in one micro-batch. A batch marked
"(recipe)" is the recipe's own, tiny for a GPU; a larger one shows what the same model does with more work per step.

- **tokens/s** and **MFU** are the medians over the loop's {args.log_every}-step logging windows, leaving
  out the first (CUDA start-up). MFU = flops_per_token(seq_len) × tokens/s / peak, with the model's own
  6N + 12·L·T·C estimate (BERT counts its MLM head at the 15% masked positions only).
- **loss** is the training loss of the first and the last logging window; **ok** means every logged
  loss was finite and the last below the first. **Peak memory** is torch.cuda.max_memory_allocated.
- **wall** runs from the `api.pretrain` call to its return, tokenization and masked-data creation included;
  **loop** is the training loop's own time.
"""
    headers = ["recipe", "batch × tokens", "steps", "tokens/s", "MFU", "loss first → last", "peak memory",
               "loop", "wall", "ok"]
    rows = [[f"`{r['recipe']}`", f"{r['batch']} × {r['seq_len']}" + (" (recipe)" if r.get("recipe_batch") else ""), r["steps"], f"{r['tok_per_s']:,.0f}",
             _pct(r["mfu"]), f"{r['loss_first']:.3f} → {r['loss_last']:.3f}", f"{r['peak_gib']:.2f} GiB",
             f"{r['loop_s']:.1f} s", f"{r['wall_s']:.1f} s", "yes" if r["ok"] else "**no**"] for r in results]
    return common.section_body("GPU check: bert-mini and gpt-mini in bf16 on one GPU", args, text,
                               common.markdown_table(headers, rows), info)
