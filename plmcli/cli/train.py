"""`plm pretrain` and `plm finetune`: the commands that train."""

from __future__ import annotations

from dataclasses import fields
from typing import List, Optional

import typer

from plmcli.cli._common import Commands, Flag, config_flags, parse_duration, print_json, process, stderr
from plmcli.config import FinetuneConfig, Recipe
from plmcli.config_sections import FinetuneLoraConfig, FinetuneModelConfig, FinetuneTaskConfig
from plmcli.errors import PlmError

commands = Commands()

PRETRAIN_FLAGS = (Flag("train.max_steps"), Flag("train.max_tokens"), Flag("train.compile", ("--compile",)),
                  Flag("data.text_column"))
"""Recipe keys with a flag of their own (every key has --set section.key=value)."""

NAMES = {"task.name": ("--task", "-t"), "model.from_run": ("--from",), "train.global_batch_size": ("--batch-size",)}
"""plm finetune's flags named otherwise than their field."""

FINETUNE_TRAINING = ("train.epochs", "optim.lr", "train.global_batch_size", "train.seed", "grid.seeds", "train.max_steps",
                     "optim.warmup_ratio", "optim.weight_decay")
"""The train, optim and grid keys with a flag of plm finetune (every key has --set section.key=value)."""


def _finetune_flags() -> tuple:
    """Every field of the task, model and lora sections (--lora-r, ...), then FINETUNE_TRAINING's keys, as flags of
    plm finetune."""
    first = ("name", "data_dir", "max_seq_len")
    task = [*first, *(f.name for f in fields(FinetuneTaskConfig) if f.name not in first)]
    return (*(Flag(f"task.{n}", NAMES.get(f"task.{n}", ()), "Task") for n in task),
            *(Flag(f"model.{f.name}", NAMES.get(f"model.{f.name}", ()), "Model") for f in fields(FinetuneModelConfig)),
            *(Flag(f"lora.{f.name}", ("--lora-" + f.name.replace("_", "-"),), "LoRA") for f in fields(FinetuneLoraConfig)),
            *(Flag(k, NAMES.get(k, ()), "Training") for k in FINETUNE_TRAINING))


FINETUNE_FLAGS = _finetune_flags()


# ---------------------------------------------------------------- pretrain


@commands.command()
@config_flags(Recipe, PRETRAIN_FLAGS)
def pretrain(
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Shipped recipe name (plm recipes) or a .yaml path."),
    data: Optional[List[str]] = typer.Option(None, "--data", "-d", help="Raw text (files, dirs, .gz), JSON Lines / CSV / Parquet files, a save_to_disk dir, "
                                         "a Hub dataset NAME[:CONFIG[:SPLIT]], or a `plm tokenize` dir. Default: the shipped sample "
                                         "corpus. PATH:WEIGHT mixes the inputs by weight (objectives whose batches are "
                                         "independent samples: clm, bilm, mlm, rtd, ernie2, translation, denoising)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory (default runs/<recipe>-<time>)."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a recipe key: section.key=value (repeatable)."),
    time_budget: Optional[str] = typer.Option(None, help="Stop after this wall time, all phases together: seconds, or 90s / 10m / 2h."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run at --out (default runs/latest) from its last checkpoint."),
    auto_resume: bool = typer.Option(False, "--auto-resume", help="Continue the run at --out if it has one, else start it there: "
                                     "one command that a requeued (preempted) job runs every time."),
    stop_after: Optional[int] = typer.Option(None, help="Stop (with a checkpoint) after N steps without changing the schedule."),
    streaming: bool = typer.Option(False, "--streaming", help="Read, tokenize and pack the --data text files as training goes "
                                   "(corpora too big to tokenize first; objective clm, or mlm/rtd with dynamic token masking). "
                                   "The tokenizer is tokenizer.path, or trained on up to 256 MB "
                                   "from the starts of the files; validation = the last data.val_fraction of the text, at most 16 MB; "
                                   "--resume continues at the same byte of every file (same processes and micro batch)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
    flags: dict = None,
):
    """Train a model from a recipe.

    Example: plm pretrain --recipe gpt-mini --data corpus.txt --set train.max_steps=500

    Example: plm pretrain --recipe gpt2-small --data shards/ --streaming --set train.num_workers=4

    Example: plm pretrain --recipe bert-base --compile --set train.num_workers=4

    Example (a cluster job, requeued after a preemption): plm pretrain --recipe bert-base --out runs/bert --auto-resume

    Ctrl-C, SIGTERM and SIGUSR1 (a scheduler's preemption, time limit or warning, e.g. Slurm's
    --signal=USR1@120) stop at the next optimizer step with a checkpoint of that step and one line saying
    how to continue; the exit code is 130 after Ctrl-C and 75 after SIGTERM / SIGUSR1 (requeue the job).
    A second Ctrl-C stops at once. train.save_every_minutes adds checkpoints by time.
    """
    from plmcli import api
    from plmcli.config import override_layers

    if resume and auto_resume:
        raise PlmError("--resume and --auto-resume together", "pass one: --auto-resume also starts a run that does not exist yet")
    summary = api.pretrain(recipe, data, out, override_layers(overrides, flags), time_budget=parse_duration(time_budget),
                           resume="auto" if auto_resume else resume, stop_after=stop_after, console=stderr(),
                           streaming=streaming)
    if process()[0]:  # one result for N processes
        return
    if as_json:
        return print_json(summary)
    # A summary re-read from strict JSON holds null for a non-finite figure (an unsmoothed n-gram's inf ppl).
    loss, ppl = ("not finite" if summary.get(k) is None else f"{summary[k]:.{d}f}" for k, d in (("val_loss", 4), ("val_ppl", 2)))
    val = f", val loss {loss} (ppl {ppl})" if "val_loss" in summary else ""
    typer.echo(f"{summary['run_dir']}: {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['elapsed_s']:.1f}s{val}")


# ---------------------------------------------------------------- finetune

@commands.command()
@config_flags(FinetuneConfig, FINETUNE_FLAGS)
def finetune(
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A finetune config YAML: sections task, model, lora, train, "
                                         "optim, grid (a finished finetune's OUT/finetune.yaml is one)."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a config key: section.key=value (repeatable), "
                                                  "e.g. --set task.max_seq_len=256."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output directory (default runs/<run>-<task>-<time>)."),
    eval_only: bool = typer.Option(False, "--eval-only", help="--from is a finetuned run: score its dev set, predict test, train nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics.json (a grid: grid.json)."),
    flags: dict = None,
):
    """Finetune a run on a task; writes OUT/metrics.json, the best weights, test predictions and
    OUT/finetune.yaml (the resolved config: `--config OUT/finetune.yaml` runs it again).

    From encoder runs (BERT family, XLNet, ELMo features) every task; from causal runs (GPT) classification,
    pairs, similarity and multiple choice GPT-style (<s> x $ y <e>, plus --aux-lm-weight × the LM loss).

    Precedence, highest first: a flag (each sets the config key its help names) > --set section.key=value > the --config file > the defaults.

    Examples:
      plm pretrain --recipe bert-mini && plm finetune --task sst2 --data-dir glue-sample
      plm finetune --config sst2.yaml --set train.epochs=2 --set task.max_seq_len=64
      plm finetune --task cmrc2018 --train cmrc2018_train.json --dev cmrc2018_dev.json --max-seq-len 384
      plm finetune --task conll2003 --data-dir conll2003/ --crf
      plm finetune --task classification --train a.tsv --dev b.tsv --text-col sentence --label-col label
      plm finetune --task sst2 --from runs/my-finetuned --eval-only --data-dir glue/
      plm finetune --task rte --data-dir glue/ --lr 5e-5,3e-5,2e-5 --epochs 2,3,4 --batch-size 16,32 --seeds 5
    """
    from plmcli import api
    from plmcli.config import override_layers

    cfg = api.finetune_config(config, override_layers(overrides, flags))
    _echo_finetune(api.finetune(cfg, out, eval_only=eval_only, console=stderr()), as_json)


def _echo_finetune(res: dict, as_json: bool) -> None:
    if process()[0]:  # one result for N processes
        return
    if as_json:
        return print_json(res)
    if "runs" in res:  # a grid (its table is printed with the progress)
        return _echo_grid(res)
    best = f" (best at epoch {res['best_epoch']})" if res.get("best_epoch") is not None else ""
    typer.echo(f"{res['out_dir']}: {res['task']} dev " + ", ".join(f"{k} {v:.4f}" for k, v in res["dev"].items())
               + f"{best}; test predictions: {', '.join(res['test_predictions'].values()) or 'none'}")


def _echo_grid(res: dict) -> None:
    b = res["best"]
    typer.echo(f"{res['out_dir']}: {len(res['runs'])} {res['task']} finetunes; best lr {b['lr']:g}, {b['epochs']} epochs, "
               f"batch {b['batch_size']}, seed {b['seed']}: dev {res['main_metric']} {b['metric']:.4f} ({b['dir']}, kept "
               f"as the output); table: {res['out_dir']}/grid.md")
