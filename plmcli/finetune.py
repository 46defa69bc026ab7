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
import time
from pathlib import Path
from types import SimpleNamespace

from plmcli.errors import PlmError

INITS = ("pretrained", "random")


def finetune(task: str, from_run: str | None = None, data_dir: str | None = None, epochs: int = 3,
             lr: float = 2e-5, batch_size: int = 32, seed: int = 42, out: str | None = None,
             max_seq_len: int | None = None, max_steps: int | None = None, init: str = "pretrained",
             warmup_ratio: float = 0.1, weight_decay: float = 0.01, classifier_dropout: float | None = None,
             console=None) -> dict:
    """Finetune the encoder of run `from_run` (default runs/latest) on `task`; returns OUT/metrics.json.

    max_seq_len: tokens per example after [CLS]/[SEP] (default min(128, the model's positions)).
    max_steps: stop after this many optimizer steps instead of `epochs` full epochs (smoke tests).
    init: "pretrained" (the run's weights) or "random" (the same architecture freshly initialised,
    the baseline that shows what pretraining buys).
    """
    import torch
    from accelerate import PartialState
    from safetensors.torch import load_model

    from plmcli.api import RUN_CONFIG, resolve_run
    from plmcli.config import OptimConfig, TrainConfig
    from plmcli.data.tasks.registry import get_task
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.objectives.registry import objective_class
    from plmcli.train import checkpoint as ckpt
    from plmcli.train.loop import train

    _check_settings(epochs, lr, batch_size, max_steps, init, warmup_ratio, weight_decay, classifier_dropout)
    t = get_task(task)
    run = resolve_run(from_run).resolve()
    cfg = json.loads((run / RUN_CONFIG).read_text())
    run_label = from_run or f"runs/latest ({run.name})"
    _check_encoder(cfg["family"], run_label, t)
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    missing = [r for r in ("cls", "sep") if r not in special_ids]
    if missing:
        raise PlmError(f"the tokenizer of run {run_label} has no {' / '.join(missing)} token, which [CLS] a [SEP] b [SEP] needs",
                       "finetune from a run pretrained with a bert recipe")
    tok = load_tokenizer(run / "tokenizer.json")
    encoder = load_encoder(run, cfg, pretrained=init == "pretrained", seed=seed)
    positions = encoder.max_positions
    L = max_seq_len if max_seq_len is not None else min(128, positions)
    if not 8 <= L <= positions:
        raise PlmError(f"--max-seq-len {L} is outside 8..{positions} (the model's positions)",
                       f"use --max-seq-len ≤ {positions}")
    splits = t.load(data_dir)  # before OUT exists: bad data leaves nothing behind

    out_dir = Path(out) if out else ckpt.runs_root() / f"{run.name}-{t.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out_dir.exists() and any(out_dir.iterdir()):  # every process checks, before any writes
        raise PlmError(f"output directory {out_dir} already exists and is not empty", "choose another --out, or delete it")
    state = PartialState()
    state.wait_for_everyone()
    if state.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
    obj_cls = objective_class(t.objective)
    obj = obj_cls(obj_cls.Config(task=t.name, num_labels=t.num_labels, classifier_dropout=classifier_dropout),
                  tok, special_ids, L, task=t, layout=getattr(type(encoder), "pair_layout", "cls_first"))
    data = out_dir / "data"
    if state.is_main_process:
        obj.encode_splits(splits, data)
    state.wait_for_everyone()
    meta = json.loads((data / "meta.json").read_text())
    counts = {k: v["documents"] for k, v in meta["counts"].items()}

    torch.manual_seed(seed)
    model = obj.build_model(encoder)
    steps_per_epoch = math.ceil(counts["train"] / batch_size)
    total = max_steps or epochs * steps_per_epoch
    warmup = int(warmup_ratio * total)
    recipe = SimpleNamespace(
        train=TrainConfig(seq_len=L, global_batch_size=batch_size, max_steps=total, eval_every=steps_per_epoch,
                          eval_batches=0, save_every=0, keep_checkpoints=1, log_every=max(1, min(50, steps_per_epoch // 4)),
                          seed=seed),
        optim=OptimConfig(name="adamw", lr=lr, weight_decay=weight_decay, schedule="linear", warmup_steps=warmup),
    )
    finetune_info = {"task": t.name, "objective": t.objective, "num_labels": t.num_labels,
                     "label_names": list(t.label_names), "from_run": str(run), "init": init, "max_seq_len": L,
                     "classifier_dropout": classifier_dropout}
    if state.is_main_process:
        ckpt.write_json(out_dir / RUN_CONFIG, {**{k: v for k, v in cfg.items() if k != "finetune"},
                                               "objective": t.objective, "finetune": finetune_info})
        shutil.copyfile(run / "tokenizer.json", out_dir / "tokenizer.json")

    select = f"val_{t.main_metric}"
    summary = train(recipe, model, obj, data, out_dir, console=console, select_metric=select)
    best = summary.get("best") or {}

    written = {}
    if state.is_main_process:
        load_model(model, str(out_dir / "model.safetensors"))  # the best dev weights, for the test predictions
        for split, filename in t.test_splits.items():
            if counts.get(split):
                ids, preds = obj.predict(model, obj.stream(data, split, batch_size, seed, 0, 1, shuffle=False))
                t.write_predictions(out_dir / filename, ids, preds)
                written[split] = filename
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # optimizer state: finetune has no --resume
    result = {
        "task": t.name, "from_run": str(run), "init": init, "out_dir": str(out_dir),
        "main_metric": t.main_metric, "dev": _strip(best), "best_step": best.get("step"),
        "best_epoch": round(best["step"] / steps_per_epoch, 2) if best else None,
        "history": _history(out_dir / "metrics.jsonl", steps_per_epoch) if state.is_main_process else [],
        "train_loss": summary.get("train_loss"), "steps": summary["steps"], "elapsed_s": summary["elapsed_s"],
        "examples": counts, "truncated": {k: v["truncated"] for k, v in meta["counts"].items()},
        "test_predictions": written, **({"skipped_rows": dict(t.skipped)} if getattr(t, "skipped", None) else {}),
        "settings": {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed, "max_seq_len": L,
                     "max_steps": max_steps, "steps_per_epoch": steps_per_epoch, "total_steps": total,
                     "warmup_steps": warmup, "weight_decay": weight_decay, "classifier_dropout": classifier_dropout,
                     "data_dir": str(Path(data_dir).resolve()) if data_dir else "the Hub"},
    }
    if state.is_main_process:
        ckpt.write_json(out_dir / "metrics.json", result)
    state.wait_for_everyone()
    return result


def load_encoder(run: Path, cfg: dict, pretrained: bool = True, seed: int = 0):
    """The run's encoder, with its weights (`pretrained`) or freshly initialised under `seed`.

    A finetuned run holds classifier weights (encoder.* + head.*): its encoder part is taken.
    """
    import torch
    from safetensors.torch import load_model

    from plmcli.config import build_section
    from plmcli.models.registry import build_model, model_config_class
    from plmcli.objectives.classify import SequenceClassifier

    model_cfg = build_section(model_config_class(cfg["family"]), cfg["model"], "model")
    torch.manual_seed(seed)
    encoder = build_model(cfg["family"], model_cfg)
    if pretrained:
        ft = cfg.get("finetune")
        target = SequenceClassifier(encoder, ft["num_labels"]) if ft else encoder
        try:
            load_model(target, str(run / "model.safetensors"))
        except (RuntimeError, KeyError) as e:
            raise PlmError(f"the weights in {run / 'model.safetensors'} do not fit its config.json ({str(e).splitlines()[0]})",
                           "pass a run directory written by `plm pretrain` or `plm finetune`") from e
    return encoder


def load_finetuned(run_dir: str):
    """(SequenceClassifier in eval mode, tokenizer, config) of a `plm finetune` output directory."""
    from safetensors.torch import load_model

    from plmcli.api import RUN_CONFIG, resolve_run
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.objectives.classify import SequenceClassifier

    path = resolve_run(run_dir)
    cfg = json.loads((path / RUN_CONFIG).read_text())
    ft = cfg.get("finetune")
    if not ft:
        raise PlmError(f"{path} is not a finetuned run (its config.json has no 'finetune' section)",
                       "pass a directory written by `plm finetune`")
    model = SequenceClassifier(load_encoder(path, {**cfg, "finetune": None}, pretrained=False), ft["num_labels"],
                               ft.get("classifier_dropout"))
    load_model(model, str(path / "model.safetensors"))
    model.eval()
    return model, load_tokenizer(path / "tokenizer.json"), cfg


def _check_encoder(family: str, run_label: str, task) -> None:
    from plmcli.models.registry import model_class

    cls = model_class(family)
    if getattr(cls, "encoder", False):
        return
    what = f"{task.suite} finetuning" if getattr(task, "suite", "") else f"finetuning on {task.name}"
    hint = "pretrain one with `plm pretrain --recipe bert-mini` (or elmo-mini for ELMo features)"
    if getattr(cls, "causal", False):
        raise PlmError(f"run {run_label} is a causal LM ({family}); {what} needs an encoder run", hint)
    raise PlmError(f"run {run_label} ({family}) has no encoder to finetune; {what} needs an encoder run", hint)


def _check_settings(epochs, lr, batch_size, max_steps, init, warmup_ratio, weight_decay, classifier_dropout) -> None:
    if init not in INITS:
        raise PlmError(f"--init '{init}' is not one of {', '.join(INITS)}", "use --init pretrained (default) or random")
    for name, value, ok, fix in (
        ("--epochs", epochs, isinstance(epochs, int) and epochs >= 1, "e.g. --epochs 3"),
        ("--lr", lr, lr > 0, "e.g. --lr 2e-5"),
        ("--batch-size", batch_size, isinstance(batch_size, int) and batch_size >= 1, "e.g. --batch-size 32"),
        ("--max-steps", max_steps, max_steps is None or max_steps >= 1, "e.g. --max-steps 100, or leave it out"),
        ("warmup_ratio", warmup_ratio, 0 <= warmup_ratio < 1, "e.g. 0.1"),
        ("weight_decay", weight_decay, weight_decay >= 0, "e.g. 0.01"),
        ("classifier_dropout", classifier_dropout, classifier_dropout is None or 0 <= classifier_dropout < 1, "e.g. 0.1"),
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
