"""`plm finetune`: a pretrained encoder + a task head, trained with THE loop (plmcli.train.loop).

Recipe of Devlin et al. 2018 §4.1: AdamW (weight decay 0.01, none on biases and norms), linear
warmup over the first 10% of steps then linear decay to 0, gradient clipping at 1.0, dev evaluation
after every epoch and the best dev weights kept (selected on the task's main metric). The test split
is then predicted with those weights and written in the GLUE submission format.

The settings are a typed FinetuneConfig (plmcli.config: sections task, model, lora, train, optim), from a YAML
file (`--config`), `--set section.key=value` and the flags, each of which sets one key.

OUT/ holds what a run dir holds (config.json, tokenizer.json, model.safetensors, metrics.jsonl)
plus metrics.json (the result), finetune.yaml (the resolved config), data/ (the encoded splits) and
the submission files; with LoRA (lora.r > 0, plmcli.train.lora) also adapter.safetensors, the adapters
alone, merged into model.safetensors.
`--from OUT` finetunes further from such a directory (e.g. MNLI, then RTE).
"""

from __future__ import annotations

import json
import math
import shutil
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from plmcli.config import FinetuneConfig
from plmcli.config_sections import FinetuneGridConfig
from plmcli.data import store
from plmcli.data.outdir import discard
from plmcli.errors import Interrupted, PlmError, stop_signal
from plmcli.runs import (FINISHED_FINETUNE, FROM, RUN_CONFIG, TOKENIZER, WEIGHTS, check_new_run_dir, finetuned_model,
                         load_encoder, load_run_tokenizer, resolve_run, run_config, runs_root, task_objective)
from plmcli.train.lora import add_adapters, check_lora, save_merged


FINETUNE_CONFIG = "finetune.yaml"
"""OUT/finetune.yaml: the resolved config a finetune ran with; `plm finetune --config` takes it back."""

def run_finetune(cfg: FinetuneConfig, out: str | None = None, eval_only: bool = False, console=None) -> dict:
    """Finetune as `cfg` says into `out` (default runs/<run>-<task>-<time>); returns OUT/metrics.json.
    eval_only: cfg.model.from_run is a finetuned run of the task: score dev, predict test, train nothing."""
    from plmcli.data.store import content_fingerprint, has_meta, load_meta
    from plmcli.data.tasks.registry import get_task
    from plmcli.train.distributed import built_once, process_state

    if cfg.grid != FinetuneGridConfig():  # a caller below the api, which runs a grid by pipelines.finetune_grid
        raise PlmError("this finetune config has a grid section, and run_finetune runs one finetune",
                       "run it with plmcli.api.finetune (or plm finetune), or empty the grid section")
    t = get_task(cfg.task.name, cfg.task_options())
    _check_task_options(t, cfg.task)
    run, run_cfg, run_label, out_dir = _source_and_out(cfg.model.from_run, out, t, eval_only)
    if eval_only:
        _restore_finetuned(t, run_cfg, run_label)
    _check_backbone(run_cfg["family"], run_label, t)
    tok = load_run_tokenizer(run, run_cfg)
    # Before OUT exists (bad data leaves nothing behind), and before the objective: a task may learn
    # its labels from the data (own data, CoNLL tags), which sizes the head.
    splits = t.load(cfg.task.data_dir)
    if eval_only:
        model, obj = finetuned_model(run, run_cfg, tok)
    else:
        run_cfg = _with_dropout(run_cfg, cfg.model.dropout, run_label)
        model = load_encoder(run, run_cfg, pretrained=cfg.model.init == "pretrained", seed=cfg.train.seed)
        _check_features(model, cfg.model)
        check_lora(model, cfg.lora, cfg.model.freeze, run_cfg["family"], run_label)
        cfg = _resolved(cfg, run, _seq_len(cfg.task.max_seq_len, _positions(model)))
        special_ids = run_cfg.get("tokenizer", {}).get("special_token_ids", {})
        obj = task_objective(t, tok, special_ids, cfg.task.max_seq_len, type(model), cfg.model.classifier_dropout)

    state = process_state()  # on N processes (accelerate launch, torchrun) they all get here
    if not eval_only:  # fail before encoding anything
        _check_batch_split(cfg.train.global_batch_size, state.num_processes)
    state.wait_for_everyone()
    made_dir = not out_dir.exists()
    if state.is_main_process:
        if unfinished_finetune(out_dir):  # what a killed finetune left: it does not resume, so it starts again
            discard(out_dir, made=False)
        out_dir.mkdir(parents=True, exist_ok=True)
    label = "the --eval-only run" if eval_only else f"the {t.name} finetune"
    with _finished_or_discarded(out_dir, made_dir, state.is_main_process, label):
        data = out_dir / "data"

        def encoded() -> dict:
            if not has_meta(data):  # meta.json is written last: a directory with it is complete
                obj.encode_splits(splits, data)
            return load_meta(data)

        # Encoded once, by the main process (and by another node's, when OUT is not on a shared filesystem),
        # while the others wait outside the training collectives' timeout; then read by all.
        meta = built_once(state, encoded, content_fingerprint)
        if eval_only:
            return _eval_only(t, obj, model, data, meta, run, out_dir, cfg.train, state)
        return _train(t, obj, model, run_cfg, run, out_dir, data, meta, cfg, state, console)


def _resolved(cfg: FinetuneConfig, run: Path, max_seq_len: int) -> FinetuneConfig:
    """`cfg` as it runs: the run and the sequence length it resolved to, and the data paths made absolute,
    so OUT/finetune.yaml repeats this finetune from any directory."""
    def absolute(p):
        return str(Path(p).resolve()) if p else p

    task = replace(cfg.task, max_seq_len=max_seq_len, data_dir=absolute(cfg.task.data_dir),
                   **{k: absolute(getattr(cfg.task, k)) for k in ("train", "dev", "test")})
    return replace(cfg, task=task, model=replace(cfg.model, from_run=str(run)))


def _source_and_out(from_run: str | None, out: str | None, t, eval_only: bool):
    """(the run finetuned from, its config, its label for messages, the output directory, checked to be new)."""
    import time

    run = resolve_run(from_run, FROM).resolve()
    cfg = run_config(run)
    run_label = from_run or f"runs/latest ({run.name})"
    what = "eval" if eval_only else t.name
    out_dir = Path(out) if out else runs_root() / f"{run.name}-{what}-{time.strftime('%Y%m%d-%H%M%S')}"
    # every process checks, before any work; a finetune killed in OUT (kill -9: no metrics.json) starts again there,
    # as the message of a reader that refuses it says
    if not unfinished_finetune(out_dir):
        check_new_run_dir(out_dir, "output directory", "choose another --out, or delete it")
    return run, cfg, run_label, out_dir


def unfinished_finetune(out_dir: Path) -> bool:
    """Whether `out_dir` holds a finetune that never finished (its config.json, no metrics.json)."""
    try:
        cfg = json.loads((out_dir / RUN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "finetune" in cfg and not (out_dir / FINISHED_FINETUNE).exists()


def _restore_finetuned(t, cfg: dict, run_label: str) -> None:
    """--eval-only: the run must be finetuned on this task; its task state comes back."""
    prev = cfg.get("finetune")
    if not prev or prev.get("task") != t.name:
        raise PlmError(f"--eval-only needs a run finetuned on {t.name}, and {run_label} is "
                       + (f"finetuned on {prev.get('task')}" if prev else "not finetuned"),
                       f"pass --from a directory written by `plm finetune --task {t.name}`")
    t.restore(prev.get("task_state", {}))


def _seq_len(max_seq_len: int | None, positions: int) -> int:
    L = max_seq_len if max_seq_len is not None else min(128, positions)
    if not 8 <= L <= positions:
        raise PlmError(f"--max-seq-len {L} is outside 8..{positions} (the model's positions)",
                       f"use --max-seq-len ≤ {positions}")
    return L


def _positions(model) -> int:
    """The longest input the backbone reads: its position limit, unbounded for one without (an RNN)."""
    from plmcli.models.base import HasPositionLimit

    return model.max_positions if isinstance(model, HasPositionLimit) else 2**31 - 1


def _check_batch_split(batch_size: int, processes: int) -> None:
    if batch_size % processes:
        fit = -(-batch_size // processes) * processes
        raise PlmError(f"--batch-size {batch_size} cannot be split evenly over {processes} processes",
                       f"pick a multiple of the process count, e.g. --batch-size {fit}")


def _counts(meta: dict) -> dict:
    return {k: v["documents"] for k, v in meta["counts"].items()}


SIZE_DEFAULTS = (
    (50_000_000, 2e-5, 0),  # BERT-base (85M weights outside the embeddings) and up: Devlin et al. §4.1, 3 epochs
    (10_000_000, 1e-4, 600),  # BERT-small / medium (13M / 25M): the top of Turc et al. 2019's grid
    (1, 3e-4, 600),  # BERT-mini (3.3M) and smaller: BENCHMARKS.md, "Finetuning on small data (issue 20 §1)"
    (0, 3e-3, 600),  # nothing but embedding tables (word2vec's vectors under a CNN): BENCHMARKS.md "low-resource"
)
"""(fewest weights outside the embeddings, lr, fewest optimizer steps), largest first: what a finetune runs with
when it sets no lr or epochs. Epochs: 3, or as many as make the fewest steps on a small training set.

Why a small encoder gets more: it starts (from random init, or early in pretraining) with nearly one [CLS]
state for every input — attention near uniform, the [CLS] token's own embedding dominating its row — and it
takes a few hundred updates before the classifier's input depends on the sentence; at BERT-base's 2e-5 and 3
epochs of 2,000 rows (189 steps) it ends on the majority class. Failed few-sample runs are optimisation
failures that more iterations cure (Mosbach et al. 2021); the small models take the higher lr Turc et al.
found best for them. A backbone of embedding tables alone (word2vec: each vector updated only
in the rows its word occurs in) learns like a model over word counts, at a rate ten times higher: at 3e-4 the
plain average under a linear layer is still near ln 2 after 600 steps on 1,000 SST-2 rows."""

DEFAULT_EPOCHS = 3
"""Devlin et al.'s epochs, every model's when its training set gives it enough steps."""


def backbone_size(model) -> int:
    """Weights outside the embedding tables, whose size follows the vocabulary rather than the network's
    capacity (a tied output layer is one of them, counted once)."""
    tables = {id(p) for p in model.embedding_tables()}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


def size_row(n: int) -> tuple[int, float, int]:
    """The SIZE_DEFAULTS row of a backbone with `n` weights outside its embedding tables (backbone_size)."""
    return next(row for row in SIZE_DEFAULTS if n >= row[0])


def size_defaults(cfg: FinetuneConfig, backbone, steps_per_epoch: int) -> tuple[FinetuneConfig, str | None]:
    """`cfg` with the lr and epochs it leaves unset (None) chosen from the backbone's size and the steps an epoch
    takes (SIZE_DEFAULTS), and a line saying what was chosen and why (None when the config set both). A value
    the user set (flag, --set, config file) always stays."""
    t, o = cfg.train, cfg.optim
    if t.epochs is not None and o.lr is not None:
        return cfg, None
    n = backbone_size(backbone)
    _, lr, min_steps = size_row(n)
    # --max-steps sets the step count itself (epochs then only label the history)
    epochs = DEFAULT_EPOCHS if t.max_steps else max(DEFAULT_EPOCHS, math.ceil(min_steps / steps_per_epoch))
    chosen = [f"lr {lr:g}"] * (o.lr is None)
    if t.epochs is None:
        more = f" (at least {min_steps} steps at {steps_per_epoch} an epoch)" if epochs > DEFAULT_EPOCHS else ""
        chosen.append(f"{epochs} epochs{more}")
    base = SIZE_DEFAULTS[0]
    note = (f"finetune defaults for a {n / 1e6:.2f}M-weight backbone (embeddings aside): {', '.join(chosen)}; "
            f"BERT-base size (≥ {base[0] / 1e6:g}M): lr {base[1]:g}, {DEFAULT_EPOCHS} epochs; "
            "--lr / --epochs override")
    cfg = replace(cfg, train=replace(t, epochs=t.epochs if t.epochs is not None else epochs),
                  optim=replace(o, lr=o.lr if o.lr is not None else lr))
    return cfg, note


def loop_config(cfg: FinetuneConfig, steps_per_epoch: int) -> FinetuneConfig:
    """`cfg` as THE loop reads it (train and optim): the steps counted, the evaluation and logging intervals that
    the config leaves to the epoch (0) set, the examples task.max_seq_len long."""
    t = cfg.train
    total = t.max_steps or t.epochs * steps_per_epoch
    return replace(cfg, train=replace(t, seq_len=cfg.task.max_seq_len, max_steps=total,
                                      eval_every=t.eval_every or steps_per_epoch,
                                      log_every=t.log_every or max(1, min(50, steps_per_epoch // 4))))


def _train(t, obj, encoder, run_cfg: dict, run: Path, out_dir: Path, data: Path, meta: dict, cfg: FinetuneConfig,
           state, console) -> dict:
    """Build the task model on `encoder`, train it with THE loop keeping the best dev weights, predict the
    test split with them, and write OUT/metrics.json."""
    import torch
    from safetensors.torch import load_model

    from plmcli.train.loop import train

    counts = _counts(meta)
    steps_per_epoch = math.ceil(counts["train"] / cfg.train.global_batch_size)
    cfg, chosen = size_defaults(cfg, encoder, steps_per_epoch)
    if chosen and state.is_main_process:
        from rich.console import Console

        (console or Console(stderr=True)).print(chosen, highlight=False, soft_wrap=True)
    torch.manual_seed(cfg.train.seed)
    model = obj.build_model(encoder)
    with_features(model, obj, cfg.model)
    adapted = add_adapters(encoder, cfg.lora, run_cfg["family"]) if cfg.lora.r else None  # the backbone frozen
    looped = loop_config(cfg, steps_per_epoch)
    total, warmup = looped.train.max_steps, looped.optim.warmup(looped.train.max_steps)
    if state.is_main_process:
        _write_run_files(t, run_cfg, run, out_dir, cfg)

    summary = train(looped, model, obj, data, out_dir, console=console, select_metric=obj.select_metric)
    best = summary.get("best") or {}

    written = {}
    if state.is_main_process:
        load_model(model, str(out_dir / WEIGHTS))  # the best dev weights, for the test predictions
        if adapted:  # OUT/adapter.safetensors, then the adapters merged: model.safetensors is a plain model
            save_merged(model, encoder, adapted, cfg.lora, out_dir)
        written = _predict_tests(t, obj, model, data, counts, out_dir, cfg.train.global_batch_size, cfg.train.seed)
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)  # optimizer state: finetune does not resume
    result = {
        "task": t.name, "from_run": str(run), "init": cfg.model.init, "out_dir": str(out_dir),
        "main_metric": t.main_metric, "dev": _strip(best), "best_step": best.get("step"),
        "best_epoch": round(best["step"] / steps_per_epoch, 2) if best else None,
        "history": _history(out_dir / "metrics.jsonl", steps_per_epoch) if state.is_main_process else [],
        "train_loss": summary.get("train_loss"), "steps": summary["steps"], "elapsed_s": summary["elapsed_s"],
        "examples": counts, "truncated": {k: v.get("truncated", 0) for k, v in meta["counts"].items()},
        "test_predictions": written, **({"skipped_rows": dict(t.skipped)} if t.skipped else {}),
        "settings": _settings(t, cfg, steps_per_epoch, total, warmup), **({"size_defaults": chosen} if chosen else {}),
    }
    if state.is_main_process:

        store.write_json(out_dir / FINISHED_FINETUNE, result)
    state.wait_for_everyone()
    return result


def _write_run_files(t, run_cfg: dict, run: Path, out_dir: Path, cfg: FinetuneConfig) -> None:
    """OUT's config.json (the backbone's config and what a reader needs to rebuild the task model), its
    tokenizer, and finetune.yaml (the config this finetune resolved to)."""

    m = cfg.model
    finetune_info = {"task": t.name, "objective": t.objective, "num_labels": t.num_labels,
                     "label_names": list(t.label_names), "from_run": str(run), "init": m.init,
                     "max_seq_len": cfg.task.max_seq_len, "classifier_dropout": m.classifier_dropout,
                     "dropout": m.dropout, "task_state": t.state(), "options": asdict(t.options),
                     "freeze": m.freeze, "features": m.features, "elmo_at_output": m.elmo_at_output}
    store.write_json(out_dir / RUN_CONFIG, {**{k: v for k, v in run_cfg.items() if k != "finetune"},
                                           "objective": t.objective, "finetune": finetune_info})
    shutil.copyfile(run / TOKENIZER, out_dir / TOKENIZER)
    store.write_text(out_dir / FINETUNE_CONFIG, cfg.to_yaml())


def _settings(t, cfg: FinetuneConfig, steps_per_epoch: int, total: int, warmup: int) -> dict:
    """metrics.json's `settings`: what the finetune ran with."""
    tr, m = cfg.train, cfg.model
    return {"epochs": tr.epochs, "lr": cfg.optim.lr, "batch_size": tr.global_batch_size, "seed": tr.seed,
            "max_seq_len": cfg.task.max_seq_len, "max_steps": tr.max_steps, "steps_per_epoch": steps_per_epoch,
            "total_steps": total, "warmup_steps": warmup, "weight_decay": cfg.optim.weight_decay,
            "classifier_dropout": m.classifier_dropout, "dropout": m.dropout, "freeze": m.freeze, "features": m.features,
            "elmo_at_output": m.elmo_at_output, "data_dir": cfg.task.data_dir if cfg.task.data_dir else _data_source(t),
            **({"lora": asdict(cfg.lora)} if cfg.lora.r else {})}


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
                          f"{'removed' if made else 'emptied'} — run the same command again", stop_signal(e)) from e
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
    """OUT's submission files of the test splits. `t` read the test data (CoNLL's writer needs its words): under
    --eval-only it is not the objective's task, which is the one the finetuned run recorded."""
    return obj.write_test_predictions(model, data, counts, out_dir, batch_size, seed, task=t)


def _eval_only(t, obj, model, data, meta, run, out_dir, train, state) -> dict:
    """Score the dev split(s) and predict the test split with a finetuned model; OUT/metrics.json."""
    from accelerate import Accelerator

    from plmcli.train.distributed import use_cpu

    counts, batch_size, seed = _counts(meta), train.global_batch_size, train.seed
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
        store.write_json(out_dir / "metrics.json", result)
    return result


def _check_backbone(family: str, run_label: str, task) -> None:
    """The task's objective says which model classes it can finetune (`backbone_problem`): one line that says
    why not and which runs to finetune instead (the README's finetune table)."""
    from plmcli.models.registry import model_class
    from plmcli.objectives.registry import objective_class

    from plmcli.config import raw_recipe, shipped_recipes

    objective = objective_class(task.objective)
    problem = objective.backbone_problem(model_class(family))
    if problem:
        what = f"{task.suite} finetuning" if task.suite else f"finetuning on {task.name}"
        clause, _, need = problem.partition("; it needs ")
        # the small shipped recipes whose family this task can finetune (not a fixed list: CoNLL takes no GPT)
        fits = sorted((n for n in shipped_recipes() if n.endswith("-mini")
                       and not objective.backbone_problem(model_class(raw_recipe(n)["model"]["family"]))),
                      key=lambda n: (n != "bert-mini", n))  # BERT first: the one most tasks take
        raise PlmError(f"run {run_label} {clause} ({family}); {what} needs {need or 'another kind of run'}",
                       f"pretrain one with `plm pretrain --recipe {fits[0]}`" +
                       (f" (or {', '.join(fits[1:6])})" if len(fits) > 1 else "") if fits else
                       "no shipped recipe can: see the README's finetune table")


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


def _check_features(encoder, m) -> None:
    """--features / --elmo-at-output the backbone cannot serve: one line before OUT exists."""
    from plmcli.objectives.heads import features_problem

    problem = features_problem(encoder, m.features, m.elmo_at_output)
    if problem:
        raise PlmError(*problem)


def with_features(model, obj, m) -> None:
    """The task model reads and trains what the model section says (features, freeze, elmo_at_output). GPT's
    auxiliary LM loss is off then: a frozen backbone's LM would train nothing, and mixed states are not the
    last layer its LM head reads."""
    from plmcli.objectives.heads import configure_features

    configure_features(model, m.features, m.freeze, m.elmo_at_output)
    if m.freeze or m.features != "last":
        obj.aux_lm_weight = 0.0


# Task options only one kind of task reads (objective -> options): set for another task they would be ignored.
TASK_OPTIONS = {"tagging": ("crf",), "qa": ("doc_stride", "max_query_len", "max_answer_len", "n_best")}


def _check_task_options(task, section) -> None:
    """Refuse an option the task would silently ignore (--crf on sst2)."""
    from plmcli.config_sections import TaskOptions

    defaults = TaskOptions()
    for objective, names in TASK_OPTIONS.items():
        for name in names:
            if task.objective != objective and getattr(section, name) != getattr(defaults, name):
                flag = "--" + name.replace("_", "-")
                raise PlmError(f"{flag} (task.{name}) applies to {objective} tasks, and {task.name} is not one",
                               f"drop {flag}, or finetune a task it applies to")


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
