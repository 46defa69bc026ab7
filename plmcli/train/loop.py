"""THE training loop: one for every objective, on accelerate.

The loop knows nothing about models or masking: it asks the objective for batches (random access by
micro-batch index, so the data position is one integer) and for `step(model, batch, state)`.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from plmcli.data.batching import CountFrom
from plmcli.errors import PlmError
from plmcli.train import checkpoint as ckpt
from plmcli.train.optim import build_optimizer
from plmcli.train.progress import MetricsLog, TrainProgress
from plmcli.train.schedule import build_scheduler

# Dense bf16 peak FLOP/s per device, for MFU. Matched on torch.cuda.get_device_name().
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def make_accelerator(mixed_precision: str, dist_timeout_s: int = 7200):
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import InitProcessGroupKwargs

    cuda = torch.cuda.is_available()
    if mixed_precision == "auto":
        mixed_precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "no"
    if mixed_precision == "fp16" and not cuda:
        raise PlmError("train.mixed_precision=fp16 needs a GPU", "use --set train.mixed_precision=bf16 (or no) on a CPU")
    # Several runs in one process (tests, notebooks) each get a fresh precision setting.
    AcceleratorState._reset_state()
    return Accelerator(
        mixed_precision=mixed_precision,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=dist_timeout_s))],
    )


def batch_sizes(global_batch: int, micro: int, world: int) -> tuple[int, int]:
    """(micro batch per device, accumulation steps) for a global batch on `world` processes."""
    if global_batch % world:
        raise PlmError(f"train.global_batch_size {global_batch} is not divisible by {world} processes",
                       "pick a global batch that is a multiple of the process count")
    micro = micro or global_batch // world
    if global_batch % (micro * world):
        raise PlmError(f"train.global_batch_size {global_batch} is not a multiple of micro batch {micro} × {world} processes",
                       "adjust train.micro_batch_size or train.global_batch_size")
    return micro, global_batch // (micro * world)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def _to(batch, device):
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def evaluate(accelerator, model, objective, stream, max_batches: int) -> dict:
    """Token-weighted mean of the objective's metrics over the validation stream.

    An objective with its own `evaluate(accelerator, model, stream, max_batches)` (task metrics that
    need all predictions, such as MCC or F1) is asked instead.
    """
    if hasattr(objective, "evaluate"):
        model.eval()
        try:
            return objective.evaluate(accelerator, model, stream, max_batches)
        finally:
            model.train()
    model.eval()
    sums: dict = {}
    count = torch.zeros((), device=accelerator.device)
    state = objective.init_state()
    n = stream.batches_per_epoch()
    n = min(n, max_batches) if max_batches else n
    with torch.no_grad():
        for k in range(n):
            batch = stream[k]
            if batch is None:
                continue
            with accelerator.autocast():
                out = objective.step(model, _to(batch, accelerator.device), state)
            state = out.state
            for name, v in out.metrics.items():
                sums[name] = sums.get(name, 0) + v.float()
            count += out.count
    model.train()
    keys = sorted(sums)
    if not keys:
        return {}
    vec = accelerator.reduce(torch.stack([sums[k] for k in keys] + [count]), reduction="sum")
    res = {f"val_{k}": (vec[i] / vec[-1]).item() for i, k in enumerate(keys)}
    key = f"val_{getattr(objective, 'ppl_metric', 'loss')}"
    if key in res:
        res["val_ppl"] = math.exp(min(res[key], 50.0))
    return res


def train(recipe, model, objective, corpus_dir, run_dir: Path, *, resume_from: Path | None = None,
          stop_after: int | None = None, console=None, select_metric: str | None = None) -> dict:
    """Train `model` with `objective` on `corpus_dir` as the recipe says; returns the summary.

    With `select_metric` (a key of the evaluation results, higher is better) model.safetensors holds
    the best evaluated weights instead of the last ones, and the summary reports that evaluation.
    """
    t, o = recipe.train, recipe.optim
    run_dir = Path(run_dir)
    accelerator = make_accelerator(t.mixed_precision)
    world, rank = accelerator.num_processes, accelerator.process_index
    micro, accum = batch_sizes(t.global_batch_size, t.micro_batch_size, world)

    optimizer = build_optimizer(model, o.name, o.lr, o.weight_decay, tuple(o.betas), o.eps, o.momentum)
    # A short run (--max-steps 3 for a smoke test) keeps the recipe's warmup as far as it goes.
    scheduler = build_scheduler(optimizer, o.schedule, min(o.warmup_steps, t.max_steps), t.max_steps, o.min_lr_ratio, o.power,
                                decay_factor=o.decay_factor, decay_every=o.decay_every, decay_start=o.decay_start)
    model, optimizer = accelerator.prepare(model, optimizer)
    # Not prepared: accelerate would step it once per process; our schedule counts optimizer steps.
    accelerator.register_for_checkpointing(scheduler)
    if t.compile:
        model = torch.compile(model)

    train_stream = objective.stream(corpus_dir, "train", micro, t.seed, rank, world, shuffle=True)
    val_stream = objective.stream(corpus_dir, "validation", micro, t.seed, rank, world, shuffle=False) \
        if _has_split(corpus_dir, "validation") else None

    loop = {"step": 0, "micro_batches": 0, "tokens": 0, "elapsed": 0.0}
    if resume_from is not None:
        loop = ckpt.load_checkpoint(accelerator, resume_from)
        if loop.get("world_size", world) != world or loop.get("global_batch_size", t.global_batch_size) != t.global_batch_size:
            raise PlmError(
                f"checkpoint was written by {loop.get('world_size')} processes with global batch {loop.get('global_batch_size')}",
                f"resume with the same world size and batch (now {world}, {t.global_batch_size})")

    main = accelerator.is_main_process
    log = MetricsLog(run_dir, enabled=main)
    unwrapped = accelerator.unwrap_model(model)
    fpt = unwrapped.flops_per_token(t.seq_len) if hasattr(unwrapped, "flops_per_token") else None
    peak = peak_flops(accelerator.device)

    loader = torch.utils.data.DataLoader(
        train_stream, batch_size=None, sampler=CountFrom(loop["micro_batches"]), num_workers=t.num_workers,
        pin_memory=accelerator.device.type == "cuda", persistent_workers=False,
        # Its own generator: creating the iterator would otherwise draw from the global RNG after a
        # resume restored it, shifting every later dropout mask.
        generator=torch.Generator().manual_seed(t.seed),
    )
    batches = iter(loader)
    state = objective.init_state()

    def stop_reason() -> str | None:
        if loop["step"] >= t.max_steps:
            return "max_steps"
        if t.max_tokens and loop["tokens"] >= t.max_tokens:
            return "max_tokens"
        if t.time_budget and loop["elapsed"] >= t.time_budget:
            return "time_budget"
        if stop_after and loop["step"] >= stop_after:
            return "stop_after"
        return None

    def snapshot():
        return ckpt.save_checkpoint(accelerator, run_dir, loop["step"], {**loop, "world_size": world,
                                    "global_batch_size": t.global_batch_size}, t.keep_checkpoints)

    progress = TrainProgress(console, t.max_steps, loop["step"], enabled=main)
    window = {"t0": time.perf_counter(), "tokens": 0, "sums": {}, "count": 0.0}
    last_eval, last_saved, reason = {}, -1, stop_reason()
    best = loop.get("best") or {}
    model.train()
    start = time.perf_counter() - loop["elapsed"]
    try:
        while reason is None:
            for i in range(accum):
                batch = _to(next(batches), accelerator.device)
                sync = i == accum - 1 or world == 1
                with nullcontext() if sync else accelerator.no_sync(model):
                    with accelerator.autocast():
                        out = objective.step(model, batch, state)
                    accelerator.backward(out.loss / accum)
                state = out.state
                loop["micro_batches"] += 1
                n_tok = objective.tokens_in(batch) * world
                loop["tokens"] += n_tok
                window["tokens"] += n_tok
                for name, v in out.metrics.items():
                    window["sums"][name] = window["sums"].get(name, 0) + v.float()
                window["count"] = window["count"] + out.count
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.grad_clip) if t.grad_clip > 0 else None
            optimizer.step()
            if not accelerator.optimizer_step_was_skipped:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loop["step"] += 1
            loop["elapsed"] = time.perf_counter() - start
            reason = stop_reason()

            if loop["step"] % t.log_every == 0 or reason:
                row = _log_row(accelerator, loop, window, scheduler, grad_norm, fpt, peak)
                log.write(row)
                progress.update(loop["step"], row, last_eval)
            if val_stream is not None and ((t.eval_every and loop["step"] % t.eval_every == 0) or reason):
                last_eval = evaluate(accelerator, model, objective, val_stream, t.eval_batches)
                log.write({"step": loop["step"], "tokens": loop["tokens"], **last_eval})
                progress.update(loop["step"], None, last_eval)
                if select_metric and (not best or last_eval[select_metric] > best[select_metric]):
                    best = {"step": loop["step"], **last_eval}
                    loop["best"] = best
                    if main:
                        save_weights(accelerator.unwrap_model(model), run_dir)
            if (t.save_every and loop["step"] % t.save_every == 0) or reason:
                snapshot()
                last_saved = loop["step"]
    except KeyboardInterrupt:
        if loop["step"] > 0 and last_saved != loop["step"]:
            snapshot()
        progress.close()
        raise
    finally:
        progress.close()
        log.close()

    summary = {"steps": loop["step"], "tokens": loop["tokens"], "elapsed_s": round(loop["elapsed"], 2),
               "stop_reason": reason, "train_loss": log.last.get("loss"), **last_eval}
    if select_metric and best:
        summary["best"] = best
    elif main:
        save_weights(accelerator.unwrap_model(model), run_dir)
    accelerator.wait_for_everyone()
    return summary


def _has_split(corpus_dir, split) -> bool:
    meta = json.loads((Path(corpus_dir) / "meta.json").read_text())
    counts = meta.get("counts", {}).get(split, {})
    return any(counts.get(k, 0) > 0 for k in ("documents", "instances", "examples"))


def _log_row(accelerator, loop, window, scheduler, grad_norm, fpt, peak) -> dict:
    keys = sorted(window["sums"])
    vec = accelerator.reduce(torch.stack([window["sums"][k] for k in keys] + [torch.as_tensor(window["count"]).float()
                                          .to(accelerator.device)]), reduction="sum")
    dt = max(time.perf_counter() - window["t0"], 1e-9)
    row = {"step": loop["step"], "tokens": loop["tokens"], "elapsed_s": round(loop["elapsed"], 3),
           "lr": scheduler.get_last_lr()[0], **{k: (vec[i] / vec[-1]).item() for i, k in enumerate(keys)},
           "tok_per_s": window["tokens"] / dt}
    if grad_norm is not None:
        row["grad_norm"] = float(grad_norm)
    if fpt and peak:
        row["mfu"] = fpt * row["tok_per_s"] / (peak * accelerator.num_processes)
    window.update(t0=time.perf_counter(), tokens=0, sums={}, count=0.0)
    return row


def save_weights(model, run_dir: Path) -> None:
    import os

    from safetensors.torch import save_model

    tmp = Path(run_dir) / ".model.safetensors.tmp"
    save_model(model, str(tmp))
    os.replace(tmp, Path(run_dir) / "model.safetensors")
