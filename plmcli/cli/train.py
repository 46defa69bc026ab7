"""`plm pretrain` and `plm finetune`: the commands that train."""

from __future__ import annotations

from typing import List, Optional

import typer

from plmcli.cli._common import Commands, parse_duration, print_json, process, stderr
from plmcli.errors import PlmError

commands = Commands()


# ---------------------------------------------------------------- pretrain


@commands.command()
def pretrain(
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Shipped recipe name (plm recipes) or a .yaml path."),
    data: Optional[List[str]] = typer.Option(None, "--data", "-d", help="Raw text (files, dirs, .gz), JSON Lines / CSV / Parquet files, a save_to_disk dir, "
                                         "a Hub dataset NAME[:CONFIG[:SPLIT]], or a `plm tokenize` dir. Default: the shipped sample "
                                         "corpus."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory (default runs/<recipe>-<time>)."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a recipe key: section.key=value (repeatable)."),
    max_steps: Optional[int] = typer.Option(None, help="Optimizer steps (also the schedule's horizon)."),
    max_tokens: Optional[int] = typer.Option(None, help="Stop after this many training tokens."),
    time_budget: Optional[str] = typer.Option(None, help="Stop after this wall time: seconds, or 90s / 10m / 2h."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run at --out (default runs/latest) from its last checkpoint."),
    auto_resume: bool = typer.Option(False, "--auto-resume", help="Continue the run at --out if it has one, else start it there: "
                                     "one command that a requeued (preempted) job runs every time."),
    stop_after: Optional[int] = typer.Option(None, help="Stop (with a checkpoint) after N steps without changing the schedule."),
    streaming: bool = typer.Option(False, "--streaming", help="Read, tokenize and pack the --data text files as training goes "
                                   "(corpora too big to tokenize first; objective clm, or mlm/rtd with dynamic token masking). "
                                   "The tokenizer is tokenizer.path, or trained on up to 256 MB "
                                   "from the starts of the files; validation = the last data.val_fraction of the text, at most 16 MB; "
                                   "--resume continues at the same byte of every file (same processes and micro batch)."),
    compile_model: bool = typer.Option(False, "--compile", help="torch.compile the model (= --set train.compile=true): on a GPU, "
                                       "faster steps after a first step that compiles for a minute or so."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="The text column of JSON Lines / CSV / Parquet files, "
                                              "saved datasets and Hub datasets (= --set data.text_column=…; default: text)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
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

    if resume and auto_resume:
        raise PlmError("--resume and --auto-resume together", "pass one: --auto-resume also starts a run that does not exist yet")
    overrides = [*(overrides or []), "train.compile=true"] if compile_model else overrides
    summary = api.pretrain(recipe, data, out, overrides, max_steps, max_tokens, parse_duration(time_budget),
                           "auto" if auto_resume else resume, stop_after, console=stderr(), streaming=streaming,
                           text_column=text_column)
    if process()[0]:  # one result for N processes
        return
    if as_json:
        return print_json(summary)
    # A summary re-read from strict JSON holds null for a non-finite figure (an unsmoothed n-gram's inf ppl).
    loss, ppl = ("not finite" if summary.get(k) is None else f"{summary[k]:.{d}f}" for k, d in (("val_loss", 4), ("val_ppl", 2)))
    val = f", val loss {loss} (ppl {ppl})" if "val_loss" in summary else ""
    typer.echo(f"{summary['run_dir']}: {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['elapsed_s']:.1f}s{val}")


# ---------------------------------------------------------------- finetune

FREEZE = typer.Option(None, "--freeze", help="Feature-based: the backbone stays as pretrained (eval mode, no backward through "
                      "it); only the task head (and a scalar mix) train (= model.freeze).")
FEATURES = typer.Option(None, "--features", help="What the head reads: last | scalar_mix (a learned γ·Σ softmax(s)_j h_j over "
                        "every layer, embeddings included) | concat_last_four (BERT §5.3) (= model.features; default last).")
ELMO_AT_OUTPUT = typer.Option(None, "--elmo-at-output", help="ELMo runs: ELMo vectors also at the task BiLSTM's output, "
                              "with a scalar mix of their own (Peters et al. §3.3) (= model.elmo_at_output).")


@commands.command()
def finetune(
    task: Optional[str] = typer.Option(None, "--task", "-t", help="GLUE: cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli; "
                                       "span QA: squad | cmrc2018; NER: conll2003; multiple choice: swag | race; own data: "
                                       "classification | regression | pair-classification (= task.name; required unless "
                                       "the --config file names it)."),
    from_run: Optional[str] = typer.Option(None, "--from", help="Encoder run directory (= model.from_run; default: runs/latest)."),
    config: Optional[str] = typer.Option(None, "--config", "-c", help="A finetune config YAML: sections task, model, train, optim "
                                         "(a finished finetune's OUT/finetune.yaml is one)."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a config key: section.key=value (repeatable), "
                                                  "e.g. --set task.max_seq_len=256."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="The task's data folder (GLUE: holding SST-2/, CoLA/, … or one task's folder; "
                                           "SQuAD, CoNLL, SWAG, own data: their files; glue-sample: the SST-2 sample shipped with plm); "
                                           "none = --train/--dev/--test, else the Hub (= task.data_dir)."),
    epochs: Optional[str] = typer.Option(None, metavar="N[,N…]", help="Epochs; dev after each, the best weights kept (= train.epochs; "
                                         "default 3, more for a small model on few rows). A list (2,3,4): a grid (= grid.epochs)."),
    lr: Optional[str] = typer.Option(None, metavar="LR[,LR…]", help="Peak learning rate, 10% warmup, linear decay (= optim.lr; default by "
                                     "the backbone's size: 2e-5 BERT-base, 3e-4 bert-mini). A list (5e-5,3e-5): a grid (= grid.lr)."),
    batch_size: Optional[str] = typer.Option(None, metavar="N[,N…]", help="Examples per optimizer step (= train.batch_size; default 32). "
                                             "A list (16,32) finetunes each: a grid (= grid.batch_size)."),
    seed: Optional[int] = typer.Option(None, help="Seeds the head init, data order and dropout (= train.seed; default 42)."),
    seeds: Optional[int] = typer.Option(None, help="Finetunes per setting (seeds --seed, --seed + 1, …); the best dev run kept (= grid.seeds)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output directory (default runs/<run>-<task>-<time>)."),
    max_seq_len: Optional[int] = typer.Option(None, help="Tokens per example (= task.max_seq_len; default min(128, model positions))."),
    max_steps: Optional[int] = typer.Option(None, help="Stop after N steps instead of full epochs (= train.max_steps)."),
    init: Optional[str] = typer.Option(None, help="pretrained | random: fresh weights, the baseline (= model.init; default pretrained)."),
    warmup_ratio: Optional[float] = typer.Option(None, help="Share of the steps spent warming the learning rate up, "
                                                 "0 = none (= optim.warmup_ratio; default 0.1)."),
    weight_decay: Optional[float] = typer.Option(None, help="AdamW weight decay, not on biases and norms "
                                                 "(= optim.weight_decay; default 0.01)."),
    dropout: Optional[float] = typer.Option(None, help="Backbone dropout and attention dropout while finetuning "
                                            "(= model.dropout; default: the run's own)."),
    classifier_dropout: Optional[float] = typer.Option(None, help="Dropout before the task head (= model.classifier_dropout)."),
    freeze: Optional[bool] = FREEZE, features: Optional[str] = FEATURES, elmo_at_output: Optional[bool] = ELMO_AT_OUTPUT,
    train: Optional[str] = typer.Option(None, "--train", help="Training file of the task's format (own data TSV/CSV/JSONL, "
                                        "SQuAD JSON, CoNLL, SWAG CSV) (= task.train)."),
    dev: Optional[str] = typer.Option(None, "--dev", help="Dev file: evaluated every epoch, its main metric keeps the best "
                                      "weights (= task.dev)."),
    test: Optional[str] = typer.Option(None, "--test", help="Test file: predictions are written for it (= task.test)."),
    text_col: Optional[str] = typer.Option(None, help="Own data: the text column, header name or JSONL key (= task.text_col)."),
    text_pair_col: Optional[str] = typer.Option(None, help="Own data: the second text of a pair (= task.text_pair_col)."),
    label_col: Optional[str] = typer.Option(None, help="Own data: the label column (= task.label_col)."),
    doc_stride: Optional[int] = typer.Option(None, help="Span QA: tokens between consecutive windows over a long passage "
                                             "(= task.doc_stride; default 128)."),
    max_query_len: Optional[int] = typer.Option(None, help="Span QA: question tokens kept (= task.max_query_len; default 64)."),
    max_answer_len: Optional[int] = typer.Option(None, help="Span QA: longest answer, in tokens (= task.max_answer_len; default 30)."),
    n_best: Optional[int] = typer.Option(None, help="Span QA: start and end candidates combined per window (= task.n_best; default 20)."),
    crf: Optional[bool] = typer.Option(None, "--crf", help="NER: a linear-chain CRF over the tag scores, Viterbi decoding (= task.crf)."),
    aux_lm_weight: Optional[float] = typer.Option(None, help="Causal runs (GPT-style transfer): weight of the auxiliary LM loss, "
                                                  "0 = the task loss alone (= task.aux_lm_weight; default 0.5)."),
    eval_only: bool = typer.Option(False, "--eval-only", help="--from is a finetuned run: score its dev set, predict test, train nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics.json (a grid: grid.json)."),
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

    options = dict(train=train, dev=dev, test=test, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col,
                   doc_stride=doc_stride, max_query_len=max_query_len, max_answer_len=max_answer_len, n_best=n_best, crf=crf,
                   aux_lm_weight=aux_lm_weight)
    res = api.finetune(task, from_run, data_dir, _grid_list(epochs, "--epochs", int), _grid_list(lr, "--lr", float),
                       _grid_list(batch_size, "--batch-size", int), seed, out, max_seq_len, max_steps, init,
                       console=stderr(), eval_only=eval_only, warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                       dropout=dropout, classifier_dropout=classifier_dropout, config=config, overrides=overrides,
                       seeds=seeds, freeze=freeze, features=features, elmo_at_output=elmo_at_output, **options)
    _echo_finetune(res, as_json)


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


def _grid_list(text: str | None, flag: str, kind: type):
    """A flag's value: one number, or a comma list of them (a grid axis); None when not given."""
    if text is None:
        return None
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        what, example = ("whole numbers", "2,3,4") if kind is int else ("numbers", "5e-5,3e-5,2e-5")
        raise PlmError(f"{flag} '{text}' is not a number or a comma-separated list of {what}",
                       f"e.g. {flag} {example}") from None
    return values[0] if len(values) == 1 else values
