"""GPU check: what the one loop does on a GPU, in parts, cheapest and most important first.

  syncs          host syncs per optimizer step: gpt-mini and bert-mini in bf16 under
                 torch.cuda.set_sync_debug_mode("warn"), each warning put in the step it happened in
                 (benchmarks/gpu/gpu_syncs.py); train.num_workers=0 beside the default `auto`
  fp16           gpt-mini in fp16 (GradScaler) beside bf16: the loss_scale and nonfinite_steps columns of
                 metrics.jsonl, the final losses
  workers        bert-mini with dynamic masking: tokens/s with train.num_workers=0 and `auto`
  resume         gpt-mini stopped by SIGTERM after a checkpoint (exit 75), resumed with `plm pretrain --resume`,
                 its weights against an uninterrupted run's (benchmarks/gpu/gpu_resume.py)
  checkpointing  gpt2-small with train.activation_checkpointing on and off: peak memory and tokens/s

Each part writes its own BENCHMARKS.md section (`gpu-check-PART`, with the GPU's name, the date and the
command) and prints one JSON line of its figures; each run is capped by --time-budget, and one that fails is
reported as failed while the part goes on. benchmarks/gpu/gpu_device.sh runs each part as its own process under
a time cap. Data: the sample corpus shipped in plmcli/corpus/, tokenizers trained on it (nothing is
downloaded). Without CUDA every part prints one skip line and exits 0; --cpu runs the parts on the CPU
anyway (the tests: code paths at toy size with --set, no GPU figures, nothing written).
"""

from __future__ import annotations

import gc
import importlib
import json
import math
import os
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common

NAME = "gpu-check"
HELP = ("the GPU check: host syncs per step, fp16 loss scaling, input workers, SIGTERM + resume, "
        "activation checkpointing (skips without CUDA)")
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
# part -> the module that measures it (a `measure(ctx) -> Section`), in the order they run.
PARTS = {
    "syncs": "benchmarks.gpu.gpu_syncs",
    "fp16": "benchmarks.gpu.gpu_check",
    "workers": "benchmarks.gpu.gpu_check",
    "resume": "benchmarks.gpu.gpu_resume",
    "checkpointing": "benchmarks.gpu.gpu_check",
}
# bert-mini's data as gpu-mfu's BERT-base runs it: full windows masked afresh in the loader, no NSP pairs.
DYNAMIC_MLM = ["objective.dynamic=true", "objective.pairs=none"]


def add_arguments(p) -> None:
    p.add_argument("--part", nargs="+", choices=list(PARTS), default=list(PARTS), help="parts to run, in this order")
    p.add_argument("--gpt", default="gpt-mini", help="recipe of the syncs, fp16 and resume parts' causal runs")
    p.add_argument("--bert", default="bert-mini", help="recipe of the syncs and workers parts' masked-LM runs")
    p.add_argument("--large", default="gpt2-small", help="recipe of the checkpointing part (built at its full vocabulary)")
    p.add_argument("--sync-steps", type=int, default=30, help="syncs: optimizer steps per run (only the last logs)")
    p.add_argument("--fp16-steps", type=int, default=200, help="fp16: optimizer steps per run")
    p.add_argument("--fp16-log-every", type=int, default=10, help="fp16: steps per logged row")
    p.add_argument("--workers-steps", type=int, default=200, help="workers: optimizer steps per run")
    p.add_argument("--workers-batch", type=int, default=256, help="workers: global batch (sequences); 0 = the recipe's")
    p.add_argument("--resume-steps", type=int, default=600, help="resume: optimizer steps of the run")
    p.add_argument("--resume-save-every", type=int, default=100, help="resume: steps per checkpoint (SIGTERM after the first)")
    p.add_argument("--ckpt-steps", type=int, default=20, help="checkpointing: optimizer steps per run")
    p.add_argument("--ckpt-batch", type=int, default=32, help="checkpointing: global batch (one micro-batch)")
    p.add_argument("--time-budget", type=float, default=60.0, help="seconds of training each run may take at most")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe override for every run (repeatable), e.g. --set model.n_layer=1")
    p.add_argument("--cpu", action="store_true",
                   help="run without CUDA anyway, on the CPU in fp32 (the tests' code-path check; implies --no-write)")


def skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


@dataclass
class Ctx:
    """What every part gets: the options, the work dir, and the device the runs train on."""

    args: object
    root: Path
    cuda: bool
    gpu: dict
    info: dict

    stopped: bool = False
    """A SIGTERM came (gpu_device.sh's time cap): the part's runs left are not started."""

    def precision(self, p: str) -> str:
        # --cpu: auto, which is fp32 on a CPU (no fp16 training there, and bf16 emulated on most)
        return p if self.cuda else "auto"


class CapReached(Exception):
    """SIGTERM outside a training loop (inside one, the loop stops at a step and raises Interrupted)."""


def _cap_reached(signum, frame):
    raise CapReached("SIGTERM")


@dataclass
class Section:
    """A part's result: its BENCHMARKS.md section (title, prose, table), its JSON record, and whether it passed."""

    title: str
    text: str
    table: str
    record: dict
    ok: bool


def run(args) -> int:
    why = None if args.cpu else skip_reason()
    if why:
        print(f"{NAME}: skipped: {why}; BENCHMARKS.md left alone")
        return 0
    from plmcli.train.distributed import use_cpu

    if not args.cpu and use_cpu():  # accelerate would train on the CPU, and the sections would call it a GPU's
        raise SystemExit(f"{NAME}: CUDA is available but plm would train on the CPU (ACCELERATE_USE_CPU is "
                         f"{os.environ.get('ACCELERATE_USE_CPU', 'unset')!r}); unset it, or pass --cpu")
    if not args.cpu:
        return run_parts(args)
    args.no_write = True  # CPU figures never go into a GPU section
    saved = os.environ.get("ACCELERATE_USE_CPU")
    os.environ["ACCELERATE_USE_CPU"] = "1"  # on a GPU machine too (and the resume part's processes inherit it)
    try:
        return run_parts(args)
    finally:
        if saved is None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        else:
            os.environ["ACCELERATE_USE_CPU"] = saved


def run_parts(args) -> int:
    """Each part of args.part in turn, its JSON line printed and its section published as soon as it is done."""
    common.set_threads(args.threads)
    gpu = gpu_info(args.cpu)
    info = common.machine_info()
    print(f"{common.machine_line(info)}\n{gpu['line']}")
    ok = True
    # gpu_device.sh's time cap is a SIGTERM: the runs already done are still reported, the others are not started.
    previous = signal.signal(signal.SIGTERM, _cap_reached)
    try:
        with common.isolated_workdir("plm-gpu-check-", args.keep) as root:
            for part in args.part:
                ctx = Ctx(args, root / part, not args.cpu, gpu, info)
                ctx.root.mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                try:
                    sec = getattr(importlib.import_module(PARTS[part]), f"measure_{part}")(ctx)
                except CapReached:
                    print(f"{NAME}: {part} stopped by SIGTERM (the time cap) before it had anything to report")
                    return 1
                print(json.dumps({"benchmark": NAME, "part": part, "gpu": gpu["name"], "ok": sec.ok and not ctx.stopped,
                                  "seconds": round(time.perf_counter() - t0, 1), **sec.record}, default=str))
                body = common.section_body(f"GPU check: {sec.title}", args, f"{gpu['line']}\n\n{sec.text.strip()}",
                                           sec.table, info)
                common.publish(f"{NAME}-{part}", body, args)
                ok = ok and sec.ok and not ctx.stopped
                if ctx.stopped:
                    break
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if ok else 1


def gpu_info(cpu: bool) -> dict:
    import torch

    if cpu:
        return {"name": "none (--cpu)", "cuda": None, "memory_gib": None,
                "line": "GPU: none: --cpu ran the parts on the CPU in fp32 (a code-path check, not GPU figures)."}
    device = torch.device("cuda", 0)
    name, mem = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory / 2**30
    return {"name": name, "cuda": torch.version.cuda, "memory_gib": mem,
            "line": f"GPU: {name} ({mem:.0f} GiB), CUDA {torch.version.cuda}, torch {torch.__version__}."}


# ---------------------------------------------------------------- one in-process run


def pretrain_run(ctx: Ctx, recipe: str, name: str, overrides: list[str], steps: int) -> dict:
    """`api.pretrain` in this process: metrics rows, summary, wall time, peak GPU memory; a failure as one
    line in `error` (its traceback in the log), so the part's other runs still go."""
    import torch

    from plmcli import api
    from plmcli.config import override_layers
    from plmcli.errors import Interrupted

    out = ctx.root / name
    over = [*overrides, *ctx.args.overrides]
    res = {"name": name, "recipe": recipe, "out": out, "error": None, "rows": [], "summary": {}, "peak_gib": None}
    if ctx.stopped:
        res["error"] = "not run: SIGTERM (the time cap) came first"
        return res
    if ctx.cuda:
        gc.collect()  # what an earlier run (one that ran out of memory) left behind
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        res["summary"] = api.pretrain(recipe, None, str(out), override_layers(over, {"train.max_steps": steps}),
                                      time_budget=ctx.args.time_budget)
    except Exception as e:  # noqa: BLE001 (one failed run is a row of the table, not the end of the part)
        ctx.stopped = isinstance(e, (Interrupted, CapReached))
        if not ctx.stopped:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        res["error"] = f"{type(e).__name__}: {first}"[:300]
    res["wall_s"] = time.perf_counter() - t0
    if ctx.cuda:
        res["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        res["rows"] = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return res


def train_rows(rows: list[dict]) -> list[dict]:
    """The logged training rows (evaluation rows carry no tok_per_s)."""
    return [r for r in rows if "tok_per_s" in r]


def tokens_per_s(res: dict, warmup: int) -> float | None:
    """Tokens/s after `warmup` steps, from the loop's cumulative tokens and clock (gpu-mfu's `throughput`)."""
    from benchmarks.gpu.gpu_mfu import throughput

    try:
        return throughput(res["rows"], warmup)["tok_per_s"]
    except (ValueError, ZeroDivisionError):
        return None


def _num(x, fmt: str = "{:,.0f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _status(res: dict) -> str:
    return f"**failed**: {res['error']}" if res["error"] else "ok"


# ---------------------------------------------------------------- fp16


def scale_summary(rows: list[dict]) -> dict:
    """The fp16 columns of a run's logged training rows: loss scale first / last / min / max, the final
    nonfinite_steps, and how many rows carry each column (under fp16 the loop writes both in every row)."""
    logged = train_rows(rows)
    scales = [r["loss_scale"] for r in logged if "loss_scale" in r]
    counts = [r["nonfinite_steps"] for r in logged if "nonfinite_steps" in r]
    return {"rows": len(logged), "rows_with_scale": len(scales), "rows_with_nonfinite": len(counts),
            "scale_first": scales[0] if scales else None, "scale_last": scales[-1] if scales else None,
            "scale_min": min(scales) if scales else None, "scale_max": max(scales) if scales else None,
            "nonfinite_steps": counts[-1] if counts else None,
            "scales": [(r["step"], r["loss_scale"]) for r in logged if "loss_scale" in r]}


def measure_fp16(ctx: Ctx) -> Section:
    a = ctx.args
    results = {}
    for prec in ("fp16", "bf16"):
        over = [f"train.mixed_precision={ctx.precision(prec)}", f"train.log_every={a.fp16_log_every}",
                "train.eval_every=0", "train.save_every=0"]
        res = pretrain_run(ctx, a.gpt, f"{prec}", over, a.fp16_steps)
        logged = train_rows(res["rows"])
        res.update(scale_summary(res["rows"]), loss_last=logged[-1]["loss"] if logged else None,
                   val_loss=res["summary"].get("val_loss"), steps=res["summary"].get("steps"),
                   tok_per_s=tokens_per_s(res, a.fp16_log_every),
                   finite=bool(logged) and all(math.isfinite(r["loss"]) for r in logged))
        results[prec] = res
        print(f"{prec}: {res['steps']} steps, loss {_num(res['loss_last'], '{:.4f}')}, val {_num(res['val_loss'], '{:.4f}')}, "
              f"loss scale {res['scale_first']} -> {res['scale_last']} (min {res['scale_min']}), nonfinite steps "
              f"{res['nonfinite_steps']}, {_num(res['tok_per_s'])} tok/s; {_status(res)}")
        print(f"{prec}: loss scale by logged step: {res['scales']}")
    fp16, bf16 = results["fp16"], results["bf16"]
    columns = fp16["rows"] > 0 and fp16["rows_with_scale"] == fp16["rows_with_nonfinite"] == fp16["rows"]
    ok = not fp16["error"] and not bf16["error"] and fp16["finite"] and bf16["finite"] and (columns or not ctx.cuda)
    diff = (fp16["loss_last"] - bf16["loss_last"]) if fp16["loss_last"] is not None and bf16["loss_last"] is not None else None
    text = f"""
`{a.gpt}` pretrains {a.fp16_steps} steps twice through `plmcli.api.pretrain`, with
`--set train.mixed_precision=fp16` (fp16 autocast, fp32 master weights, accelerate's GradScaler: dynamic
loss scaling, an overflowing step skipped on the device) and with bf16, logging every {a.fp16_log_every} steps.
Under fp16 every logged row of metrics.jsonl carries `loss_scale` and `nonfinite_steps` (the steps the
scaler skipped so far): {'**yes**' if columns else '**no**'} ({fp16['rows_with_scale']} and
{fp16['rows_with_nonfinite']} of {fp16['rows']} rows). Final training loss fp16 − bf16:
{_num(diff, '{:+.4f}')}. **tokens/s** after the first logged window, from the loop's cumulative clock.
"""
    headers = ["precision", "steps", "loss (last logged)", "val loss", "loss scale first → last (min–max)",
               "nonfinite steps", "tokens/s", "status"]
    rows = [[p, r["steps"], _num(r["loss_last"], "{:.4f}"), _num(r["val_loss"], "{:.4f}"),
             (f"{r['scale_first']:g} → {r['scale_last']:g} ({r['scale_min']:g}–{r['scale_max']:g})"
              if r["scale_first"] is not None else "none"),
             _num(r["nonfinite_steps"], "{}"), _num(r["tok_per_s"]), _status(r)] for p, r in results.items()]
    keep = ("steps", "loss_last", "val_loss", "scale_first", "scale_last", "scale_min", "scale_max", "nonfinite_steps",
            "rows", "rows_with_scale", "rows_with_nonfinite", "tok_per_s", "error")
    record = {"columns_in_every_row": columns, "loss_diff": diff,
              "runs": {p: {k: r.get(k) for k in keep} for p, r in results.items()}}
    return Section("fp16 loss scaling beside bf16", text, common.markdown_table(headers, rows), record, ok)


# ---------------------------------------------------------------- input workers


def measure_workers(ctx: Ctx) -> Section:
    from plmcli.data.batching import loader_workers

    a = ctx.args
    warmup = max(1, a.workers_steps // 10)
    batch = [f"train.global_batch_size={a.workers_batch}"] if a.workers_batch else []
    auto = loader_workers("auto", accelerated=ctx.cuda)
    results = {}
    for workers in ("auto", "0"):
        over = [f"train.mixed_precision={ctx.precision('bf16')}", *DYNAMIC_MLM, *batch, "train.micro_batch_size=0",
                f"train.log_every={warmup}", "train.eval_every=0", "train.eval_batches=2", "train.save_every=0",
                f"train.num_workers={workers}"]
        res = pretrain_run(ctx, a.bert, f"workers-{workers}", over, a.workers_steps)
        res.update(tok_per_s=tokens_per_s(res, warmup), steps=res["summary"].get("steps"))
        results[workers] = res
        print(f"num_workers={workers}: {_num(res['tok_per_s'])} tok/s over steps {warmup}–{res['steps']}; {_status(res)}")
    fast, slow = results["auto"]["tok_per_s"], results["0"]["tok_per_s"]
    ratio = fast / slow if fast and slow else None
    ok = all(not r["error"] and r["tok_per_s"] for r in results.values())
    text = f"""
`{a.bert}` with dynamic masking (`{' '.join(DYNAMIC_MLM)}`: full windows masked afresh as each batch is
built), global batch {a.workers_batch or "the recipe's"} in one micro-batch, bf16, {a.workers_steps} steps, with
`--set train.num_workers=0` (batches built in the training process, between steps) and the default `auto`
(here {auto} worker processes: min(8, cores // processes − 1) beside a GPU; {os.cpu_count()} cores).
**tokens/s** over the steps after the first {warmup}, from the loop's cumulative clock. auto / 0: {_num(ratio, '{:.2f}×')}.
"""
    headers = ["train.num_workers", "processes", "steps", "tokens/s", "status"]
    rows = [[w, auto if w == "auto" else 0, r["steps"], _num(r["tok_per_s"]), _status(r)] for w, r in results.items()]
    record = {"auto_workers": auto, "ratio_auto_over_0": ratio,
              "runs": {w: {k: r.get(k) for k in ("steps", "tok_per_s", "error")} for w, r in results.items()}}
    return Section("input workers (train.num_workers) on masked-LM pretraining", text, common.markdown_table(headers, rows),
                   record, ok)


# ---------------------------------------------------------------- activation checkpointing


def measure_checkpointing(ctx: Ctx) -> Section:
    from benchmarks.gpu.gpu_mfu import phaseless_recipe
    from plmcli.config import load_recipe

    a = ctx.args
    recipe = phaseless_recipe(a.large, ctx.root)  # a recipe's later phase (BERT's seq 512) would follow otherwise
    vocab = load_recipe(str(recipe)).tokenizer.vocab_size
    warmup = max(1, a.ckpt_steps // 4)
    results = {}
    for on in (False, True):
        # The recipe's full vocabulary: the sample's tokenizer has fewer tokens, the output layer costs the same.
        over = [f"train.mixed_precision={ctx.precision('bf16')}", f"train.global_batch_size={a.ckpt_batch}",
                "train.micro_batch_size=0", f"model.vocab_size={vocab}", f"train.log_every={warmup}", "train.eval_every=0",
                "train.eval_batches=2", "train.save_every=0", f"train.activation_checkpointing={'true' if on else 'false'}"]
        res = pretrain_run(ctx, str(recipe), f"ckpt-{'on' if on else 'off'}", over, a.ckpt_steps)
        res.update(tok_per_s=tokens_per_s(res, warmup), steps=res["summary"].get("steps"))
        results[on] = res
        print(f"activation_checkpointing={on}: peak {_num(res['peak_gib'], '{:.2f}')} GiB, {_num(res['tok_per_s'])} tok/s; "
              f"{_status(res)}")
    off, on = results[False], results[True]
    mem = on["peak_gib"] / off["peak_gib"] if on["peak_gib"] and off["peak_gib"] else None
    speed = on["tok_per_s"] / off["tok_per_s"] if on["tok_per_s"] and off["tok_per_s"] else None
    seq = load_recipe(str(recipe)).train.seq_len
    text = f"""
`{a.large}` (built at its vocabulary of {vocab:,}) pretrains {a.ckpt_steps} steps of {a.ckpt_batch} × {seq} tokens in one
micro-batch, bf16, with `--set train.activation_checkpointing=false` and `true` (each block keeps only its input and
recomputes its activations in backward), through `plmcli.api.pretrain` in this process.
**peak memory** is torch.cuda.max_memory_allocated over the whole call (reset before it; weights, AdamW state,
activations, the final evaluation); **tokens/s** after the first {warmup} steps. On / off: memory
{_num(mem, '{:.2f}×')}, tokens/s {_num(speed, '{:.2f}×')}.
"""
    headers = ["activation checkpointing", "batch × tokens", "steps", "peak memory", "tokens/s", "status"]
    rows = [["on" if k else "off", f"{a.ckpt_batch} × {seq}", r["steps"], _num(r["peak_gib"], "{:.2f} GiB"),
             _num(r["tok_per_s"]), _status(r)] for k, r in results.items()]
    ok = not (off["error"] or on["error"]) and (not ctx.cuda or (mem is not None and mem < 1))
    record = {"memory_on_over_off": mem, "speed_on_over_off": speed,
              "runs": {("on" if k else "off"): {x: r.get(x) for x in ("steps", "peak_gib", "tok_per_s", "error")}
                       for k, r in results.items()}}
    return Section("activation checkpointing, peak memory and speed", text, common.markdown_table(headers, rows), record, ok)
