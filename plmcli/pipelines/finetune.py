"""`plm finetune`: a pretrained encoder + a task head, trained with THE loop (plmcli.train.loop).

Recipe of Devlin et al. 2018 §4.1: AdamW (weight decay 0.01, none on biases and norms), linear
warmup over the first 10% of steps then linear decay to 0, gradient clipping at 1.0, dev evaluation
after every epoch and the best dev weights kept (selected on the task's main metric). The test split
is then predicted with those weights and written in the GLUE submission format.

OUT/ holds what a run dir holds (config.json, tokenizer.json, model.safetensors, metrics.jsonl)
plus metrics.json (the result), data/ (the encoded splits) and the submission files.
`--from OUT` finetunes further from such a directory (e.g. MNLI, then RTE).
"""

from __future__ import annotations

import json
import math
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from plmcli.data.outdir import discard
from plmcli.errors import Interrupted, PlmError
from plmcli.runs import (FINISHED_FINETUNE, FROM, RUN_CONFIG, TOKENIZER, WEIGHTS, check_new_run_dir, finetuned_model,
                         load_encoder, load_run_tokenizer, resolve_run, run_config, runs_root, task_objective)

INITS = ("pretrained", "random")


def finetune(task: str, from_run: str | None = None, data_dir: str | None = None, epochs: int = 3,
             lr: float = 2e-5, batch_size: int = 32, seed: int = 42, out: str | None = None,
             max_seq_len: int | None = None, max_steps: int | None = None, init: str = "pretrained",
             warmup_ratio: float = 0.1, weight_decay: float = 0.01, classifier_dropout: float | None = None,
             dropout: float | None = None, options=None, eval_only: bool = False, console=None) -> dict:
    """Finetune run `from_run` (default runs/latest) on `task`; returns OUT/metrics.json.

    max_seq_len: tokens per example after the special tokens (default min(128, the model's positions)).
    max_steps: stop after this many optimizer steps instead of `epochs` full epochs (smoke tests).
    init: "pretrained" (the run's weights) or "random" (the same architecture freshly initialised,
    the baseline that shows what pretraining buys). dropout: the backbone's dropout and attention dropout
    while finetuning (default: the run's own; a run pretrained without dropout may want 0.1 here);
    classifier_dropout: before the task head (default: the backbone's dropout). options: a TaskOptions (files, columns, QA windows,
    CRF, auxiliary LM weight). eval_only: `from_run` is a finetuned run of this task; its dev split is
    scored and its test split predicted, nothing is trained.
    """
    from plmcli.data.store import load_meta
    from plmcli.data.tasks.registry import get_task
    from plmcli.train.distributed import process_state

    _check_settings(epochs, lr, batch_size, max_steps, init, warmup_ratio, weight_decay, classifier_dropout, dropout)
    t = get_task(task, options)
    run, cfg, run_label, out_dir = _source_and_out(from_run, out, t, eval_only)
    if eval_only:
        classifier_dropout = _restore_finetuned(t, cfg, run_label)
    _check_backbone(cfg["family"], run_label, t)
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    tok = load_run_tokenizer(run, cfg)
    # Before OUT exists (bad data leaves nothing behind), and before the objective: a task may learn
    # its labels from the data (own data, CoNLL tags), which sizes the head.
    splits = t.load(data_dir)
    if eval_only:
        model, obj = finetuned_model(run, cfg, tok)
        L = obj.seq_len
    else:
        cfg = _with_dropout(cfg, dropout, run_label)
        encoder = load_encoder(run, cfg, pretrained=init == "pretrained", seed=seed)
        L = _seq_len(max_seq_len, encoder.max_positions)
        obj = task_objective(t, tok, special_ids, L, type(encoder), classifier_dropout)

    state = process_state()  # on N processes (accelerate launch, torchrun) they all get here
    if not eval_only:  # fail before encoding anything
        _check_batch_split(batch_size, state.num_processes)
    state.wait_for_everyone()
    made_dir = not out_dir.exists()
    if state.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
    label = "the --eval-only run" if eval_only else f"the {t.name} finetune"
    with _finished_or_discarded(out_dir, made_dir, state.is_main_process, label):
        data = out_dir / "data"
        if state.is_main_process:
            obj.encode_splits(splits, data)
        state.wait_for_everyone()
        meta = load_meta(data)
        if eval_only:
            return _eval_only(t, obj, model, data, _counts(meta), meta, run, out_dir, batch_size, seed, state)
        settings = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed, "max_seq_len": L,
                    "max_steps": max_steps, "init": init, "warmup_ratio": warmup_ratio, "weight_decay": weight_decay,
                    "classifier_dropout": classifier_dropout, "dropout": dropout, "data_dir": data_dir}
        return _train(t, obj, encoder, cfg, run, out_dir, data, meta, settings, state, console)


def _source_and_out(from_run: str | None, out: str | None, t, eval_only: bool):
    """(the run finetuned from, its config, its label for messages, the output directory, checked to be new)."""
    import time

    run = resolve_run(from_run, FROM).resolve()
    cfg = run_config(run)
    run_label = from_run or f"runs/latest ({run.name})"
    what = "eval" if eval_only else t.name
    out_dir = Path(out) if out else runs_root() / f"{run.name}-{what}-{time.strftime('%Y%m%d-%H%M%S')}"
    # every process checks, before any work
    check_new_run_dir(out_dir, "output directory", "choose another --out, or delete it")
    return run, cfg, run_label, out_dir


def _restore_finetuned(t, cfg: dict, run_label: str):
    """--eval-only: the run must be finetuned on this task; its task state comes back, and its classifier dropout."""
    prev = cfg.get("finetune")
    if not prev or prev.get("task") != t.name:
        raise PlmError(f"--eval-only needs a run finetuned on {t.name}, and {run_label} is "
                       + (f"finetuned on {prev.get('task')}" if prev else "not finetuned"),
                       f"pass --from a directory written by `plm finetune --task {t.name}`")
    t.restore(prev.get("task_state", {}))
    return prev.get("classifier_dropout")


def _seq_len(max_seq_len: int | None, positions: int) -> int:
    L = max_seq_len if max_seq_len is not None else min(128, positions)
    if not 8 <= L <= positions:
        raise PlmError(f"--max-seq-len {L} is outside 8..{positions} (the model's positions)",
                       f"use --max-seq-len ≤ {positions}")
    return L


def _check_batch_split(batch_size: int, processes: int) -> None:
    if batch_size % processes:
        fit = -(-batch_size // processes) * processes
        raise PlmError(f"--batch-size {batch_size} cannot be split evenly over {processes} processes",
                       f"pick a multiple of the process count, e.g. --batch-size {fit}")


def _counts(meta: dict) -> dict:
    return {k: v["documents"] for k, v in meta["counts"].items()}


def _loop_recipe(s: dict, steps_per_epoch: int, total: int, warmup: int):
    """THE loop's recipe for a finetune: the train and optim sections it reads, as Devlin et al. set them."""
    from types import SimpleNamespace

    from plmcli.config import OptimConfig, TrainConfig

    return SimpleNamespace(
        train=TrainConfig(seq_len=s["max_seq_len"], global_batch_size=s["batch_size"], max_steps=total,
                          eval_every=steps_per_epoch, eval_batches=0, save_every=0, keep_checkpoints=1,
                          log_every=max(1, min(50, steps_per_epoch // 4)), seed=s["seed"]),
        optim=OptimConfig(name="adamw", lr=s["lr"], weight_decay=s["weight_decay"], schedule="linear",
                          warmup_steps=warmup),
    )


def _train(t, obj, encoder, cfg: dict, run: Path, out_dir: Path, data: Path, meta: dict, s: dict, state, console) -> dict:
    """Build the task model on `encoder`, train it with THE loop keeping the best dev weights, predict the
    test split with them, and write OUT/metrics.json."""
    import torch
    from safetensors.torch import load_model

    from plmcli.train import checkpoint as ckpt
    from plmcli.train.loop import train

    counts = _counts(meta)
    torch.manual_seed(s["seed"])
    model = obj.build_model(encoder)
    steps_per_epoch = math.ceil(counts["train"] / s["batch_size"])
    total = s["max_steps"] or s["epochs"] * steps_per_epoch
    warmup = int(s["warmup_ratio"] * total)
    recipe = _loop_recipe(s, steps_per_epoch, total, warmup)
    finetune_info = {"task": t.name, "objective": t.objective, "num_labels": t.num_labels,
                     "label_names": list(t.label_names), "from_run": str(run), "init": s["init"],
                     "max_seq_len": s["max_seq_len"], "classifier_dropout": s["classifier_dropout"],
                     "dropout": s["dropout"], "task_state": t.state(), "options": asdict(t.options)}
    if state.is_main_process:
        ckpt.write_json(out_dir / RUN_CONFIG, {**{k: v for k, v in cfg.items() if k != "finetune"},
                                               "objective": t.objective, "finetune": finetune_info})
        shutil.copyfile(run / TOKENIZER, out_dir / TOKENIZER)

    select = f"val_{t.main_metric}"
    summary = train(recipe, model, obj, data, out_dir, console=console, select_metric=select)
    best = summary.get("best") or {}

    written = {}
    if state.is_main_process:
        load_model(model, str(out_dir / WEIGHTS))  # the best dev weights, for the test predictions
        written = _predict_tests(t, obj, model, data, counts, out_dir, s["batch_size"], s["seed"])
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # optimizer state: finetune does not resume
    result = {
        "task": t.name, "from_run": str(run), "init": s["init"], "out_dir": str(out_dir),
        "main_metric": t.main_metric, "dev": _strip(best), "best_step": best.get("step"),
        "best_epoch": round(best["step"] / steps_per_epoch, 2) if best else None,
        "history": _history(out_dir / "metrics.jsonl", steps_per_epoch) if state.is_main_process else [],
        "train_loss": summary.get("train_loss"), "steps": summary["steps"], "elapsed_s": summary["elapsed_s"],
        "examples": counts, "truncated": {k: v.get("truncated", 0) for k, v in meta["counts"].items()},
        "test_predictions": written, **({"skipped_rows": dict(t.skipped)} if t.skipped else {}),
        "settings": {"epochs": s["epochs"], "lr": s["lr"], "batch_size": s["batch_size"], "seed": s["seed"],
                     "max_seq_len": s["max_seq_len"], "max_steps": s["max_steps"], "steps_per_epoch": steps_per_epoch,
                     "total_steps": total, "warmup_steps": warmup, "weight_decay": s["weight_decay"],
                     "classifier_dropout": s["classifier_dropout"], "dropout": s["dropout"],
                     "data_dir": str(Path(s["data_dir"]).resolve()) if s["data_dir"] else _data_source(t)},
    }
    if state.is_main_process:
        ckpt.write_json(out_dir / FINISHED_FINETUNE, result)
    state.wait_for_everyone()
    return result


@contextmanager
def _finished_or_discarded(out_dir: Path, made: bool, main: bool, what: str):
    """OUT ends complete (metrics.json, written last) or not at all. Finetune does not resume, so the best
    weights of an interrupted or failed finetune would only pass for a finished run: they are removed with
    the rest. (A kill -9 cannot be caught: the run reader refuses a finetune without metrics.json.)"""
    try:
        yield
    except (KeyboardInterrupt, Interrupted) as e:
        step = _last_step(out_dir / "metrics.jsonl")
        if main:
            discard(out_dir, made)
        done = f"after step {step}" if step else "before its first optimizer step"
        raise Interrupted(f"{what} stopped {done}; finetune does not resume, so {out_dir} was "
                          f"{'removed' if made else 'emptied'} — run the same command again") from e
    except BaseException:
        if main:
            discard(out_dir, made)
        raise


def _last_step(metrics_file: Path) -> int | None:
    try:
        lines = metrics_file.read_text(encoding="utf-8").splitlines()
        return json.loads(lines[-1]).get("step") if lines else None
    except (OSError, ValueError):
        return None


def _data_source(task) -> str:
    o = task.options
    files = [f for f in (o.train, o.dev, o.test) if f]
    return ", ".join(str(Path(f).resolve()) for f in files) if files else "the Hub"


def _predict_tests(t, obj, model, data, counts, out_dir, batch_size, seed) -> dict:
    written = {}
    for split, filename in t.test_splits.items():
        if counts.get(split):
            ids, preds = obj.predict(model, obj.stream(data, split, batch_size, seed, 0, 1, shuffle=False))
            t.write_predictions(out_dir / filename, ids, preds)
            written[split] = filename
    return written


def _eval_only(t, obj, model, data, counts, meta, run, out_dir, batch_size, seed, state) -> dict:
    """Score the dev split(s) and predict the test split with a finetuned model; OUT/metrics.json."""
    from accelerate import Accelerator

    from plmcli.train import checkpoint as ckpt
    from plmcli.train.distributed import use_cpu

    acc = Accelerator(cpu=use_cpu())
    model.to(acc.device).eval()
    # each process scores its share of the dev split; evaluate gathers them
    stream = obj.stream(data, "validation", batch_size, seed, state.process_index, state.num_processes, shuffle=False)
    dev = obj.evaluate(acc, model, stream, 0)
    written = _predict_tests(t, obj, model, data, counts, out_dir, batch_size, seed) if state.is_main_process else {}
    result = {"task": t.name, "from_run": str(run), "eval_only": True, "out_dir": str(out_dir),
              "main_metric": t.main_metric, "dev": _strip(dev), "examples": counts,
              "truncated": {k: v.get("truncated", 0) for k, v in meta["counts"].items()}, "test_predictions": written}
    if state.is_main_process:
        ckpt.write_json(out_dir / "metrics.json", result)
    return result


def _check_backbone(family: str, run_label: str, task) -> None:
    """The task's objective says which model classes it can finetune (`backbone_problem`)."""
    from plmcli.models.registry import model_class
    from plmcli.objectives.registry import objective_class

    problem = objective_class(task.objective).backbone_problem(model_class(family))
    if problem:
        what = f"{task.suite} finetuning" if task.suite else f"finetuning on {task.name}"
        clause, _, need = problem.partition("; it needs ")
        raise PlmError(f"run {run_label} {clause} ({family}); {what} needs {need or 'another kind of run'}",
                       "pretrain one with `plm pretrain --recipe bert-mini` (or elmo-mini for ELMo features)")


def _with_dropout(cfg: dict, dropout: float | None, run_label: str) -> dict:
    """The run config with its backbone's dropout and attention dropout (where it has one) set to `dropout`;
    the finetuned run's config.json then records what it was trained with."""
    if dropout is None:
        return cfg
    keys = [k for k in ("dropout", "attn_dropout") if k in cfg["model"]]
    if not keys:
        raise PlmError(f"--dropout: the {cfg['family']} model of {run_label} has no dropout setting",
                       "leave --dropout out")
    return {**cfg, "model": {**cfg["model"], **dict.fromkeys(keys, dropout)}}


def _check_settings(epochs, lr, batch_size, max_steps, init, warmup_ratio, weight_decay, classifier_dropout,
                    dropout=None) -> None:
    if init not in INITS:
        raise PlmError(f"--init '{init}' is not one of {', '.join(INITS)}", "use --init pretrained (default) or random")
    for name, value, ok, fix in (
        ("--epochs", epochs, isinstance(epochs, int) and epochs >= 1, "e.g. --epochs 3"),
        ("--lr", lr, lr > 0, "e.g. --lr 2e-5"),
        ("--batch-size", batch_size, isinstance(batch_size, int) and batch_size >= 1, "e.g. --batch-size 32"),
        ("--max-steps", max_steps, max_steps is None or max_steps >= 1, "e.g. --max-steps 100, or leave it out"),
        ("--warmup-ratio", warmup_ratio, 0 <= warmup_ratio < 1, "e.g. --warmup-ratio 0.1"),
        ("--weight-decay", weight_decay, weight_decay >= 0, "e.g. --weight-decay 0.01"),
        ("--classifier-dropout", classifier_dropout, classifier_dropout is None or 0 <= classifier_dropout < 1,
         "e.g. --classifier-dropout 0.1"),
        ("--dropout", dropout, dropout is None or 0 <= dropout < 1, "e.g. --dropout 0.1"),
    ):
        if not ok:
            raise PlmError(f"{name} {value} is out of range", fix)


def _strip(evaluation: dict) -> dict:
    return {k[4:]: v for k, v in evaluation.items() if k.startswith("val_")}


def _history(metrics_file: Path, steps_per_epoch: int) -> list[dict]:
    """One row per dev evaluation (every epoch, and at the end) from the loop's metrics.jsonl."""
    rows = []
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            row = json.loads(line)
            if any(k.startswith("val_") for k in row):
                rows.append({"epoch": round(row["step"] / steps_per_epoch, 2), "step": row["step"], **_strip(row)})
    return rows
