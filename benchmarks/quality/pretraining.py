"""Pretraining runs the benchmarks share: for a wall-clock budget, or for a compute budget (FLOPs)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path


def pretrain_for(recipe_name: str, corpus: Path, root: Path, budget: float, overrides=None) -> tuple[dict, float, float]:
    """Pretrain `recipe_name` on `corpus` for `budget` seconds into root/pretrain; (summary, wall s, tokens/s).

    A short calibration run measures this machine's tokens/s first, so the schedule's horizon (max_steps)
    ends when the budget does instead of being cut mid-decay by the time limit.
    """
    from plmcli import api
    from plmcli.config import load_recipe, override_layers

    recipe = load_recipe(recipe_name, overrides)
    tokens_per_step = recipe.train.global_batch_size * recipe.train.seq_len
    # logged every 5 steps whatever the recipe says, so that 30 steps give rates past the first (warm-up) one
    calibrate = [*(overrides or []), "train.log_every=5"]
    api.pretrain(recipe_name, [str(corpus)], str(root / "calibrate"), override_layers(calibrate, {"train.max_steps": 30}))
    rates = [r["tok_per_s"] for r in map(json.loads, (root / "calibrate" / "metrics.jsonl").read_text().splitlines())
             if "tok_per_s" in r][1:]
    rate = statistics.median(rates)
    steps = max(10, int(0.93 * budget * rate / tokens_per_step))  # evaluations and checkpoints take the rest
    t0 = time.perf_counter()
    pre = api.pretrain(recipe_name, [str(corpus)], str(root / "pretrain"),
                       override_layers(overrides, {"train.max_steps": steps}), time_budget=budget)
    return pre, time.perf_counter() - t0, rate


def steps_for(recipe, tflop: float) -> tuple[int, float]:
    """(optimizer steps, training FLOPs per token) that spend `tflop` on this recipe's model."""
    import torch

    from plmcli.models.registry import build_model

    cfg = replace(recipe.model)
    if getattr(cfg, "vocab_size", 1) == 0:
        cfg.vocab_size = recipe.tokenizer.vocab_size
    with torch.device("meta"):
        fpt = build_model(recipe.family, cfg).flops_per_token(recipe.train.seq_len)
    return max(10, round(tflop * 1e12 / (fpt * recipe.train.global_batch_size * recipe.train.seq_len))), fpt


def pretrain_compute(recipe_name: str, corpus: Path, out: Path, tflop: float, overrides=None) -> tuple[dict, float, float]:
    """Pretrain for `tflop` TFLOP of training compute into `out`; (summary, wall s, FLOPs per token).

    Unlike a wall-clock budget this does not depend on other load on the machine. The recipe's warmup
    and decay are stretched over the budget's steps; evaluation at the end only.
    """
    from plmcli import api
    from plmcli.config import load_recipe

    steps, fpt = steps_for(load_recipe(recipe_name, overrides), tflop)
    print(f"pretraining {recipe_name} for {steps} steps ({tflop:g} TFLOP at {fpt / 1e6:.1f} MFLOP/token) ...")
    t0 = time.perf_counter()
    pre = api.pretrain(recipe_name, [str(corpus)], str(out),
                       list(overrides or []) + [f"train.max_steps={steps}", f"train.eval_every={steps}", f"train.save_every={steps}"])
    return pre, time.perf_counter() - t0, fpt
