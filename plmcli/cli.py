"""The `plm` command line: each command parses its options and calls plmcli.api — nothing else.

Heavy libraries (torch, datasets) are imported inside api calls so `plm --help` starts fast.
"""

from __future__ import annotations

import json
import os
from typing import List, Optional

import typer
from typer.core import TyperGroup

from plmcli.errors import PlmError

_state = {"debug": False}


def _stderr():
    from rich.console import Console

    return Console(stderr=True)


def _floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlmError(f"{name} '{text}' is not a comma-separated list of numbers", f"e.g. {name} 0.4,0.3,0.2,0.1") from None


def _process() -> tuple[int, int]:
    """(rank, world size) under a multi-process launcher (accelerate launch, torchrun); (0, 1) without one."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _places() -> dict:
    """Directories plm picks for the user (see errors.os_error): a failure inside one names its setting."""
    from plmcli.data.corpus import default_cache_dir  # only once something failed: keeps startup light

    places = {}
    try:
        places[str(default_cache_dir(check=False))] = ("PLM_CACHE", "export PLM_CACHE=<a writable directory> to move the cache")
    except Exception:  # noqa: BLE001 — a hint must never hide the error it explains
        pass
    places[os.environ.get("PLM_RUNS", "runs")] = ("PLM_RUNS", "pass --out <a writable directory>, or export PLM_RUNS=<one>")
    return places


def _report(e: BaseException, command: str) -> tuple[str, int]:
    """The one line for an exception that escaped `command`, and the exit code (see `plm --help`)."""
    from plmcli.data.outdir import find_plm_error
    from plmcli.errors import Interrupted, os_error

    if isinstance(e, Interrupted):
        return f"interrupted — {e.message}", 130
    if isinstance(e, KeyboardInterrupt):
        return "interrupted — nothing was written", 130
    plm = find_plm_error(e)  # datasets wraps ours raised in its generators and workers
    if plm is not None:
        return f"error: {plm}", 2
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return f"error: {os_error(cause, _places())}", 2
    return (f"error: internal error in `{command}`: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            f" — this is a bug in plm; `plm --debug {command.removeprefix('plm ')} …` shows the traceback to report"), 1


_PASS = (typer.Exit, typer.Abort, typer.TyperException)  # Typer's own exits and usage errors


class _ReportingGroup(TyperGroup):
    """Catches, once for every command under it, any exception that escapes: one line on stderr and an
    exit code (see `plm --help`); with --debug the traceback instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _PASS:
            raise
        except (Exception, KeyboardInterrupt) as e:
            if _state["debug"]:
                raise
            names, c = [ctx.invoked_subcommand], ctx
            while c.parent is not None:  # the path below the program, whatever name it was started under
                names.insert(0, c.info_name)
                c = c.parent
            command = " ".join(["plm", *filter(None, names)])
            line, code = _report(e, command)
            rank, world = _process()  # each process says it once: the line may come from only one of them
            if world > 1:
                head, _, rest = line.partition(" ")
                line = f"{head.rstrip(':')} (process {rank} of {world}){':' * head.endswith(':')} {rest}"
            typer.echo(line, err=True)
            raise typer.Exit(code) from None


def guarded(fn):
    """Marks a command whose errors the app reports (_ReportingGroup does it for every command)."""
    return fn


class _Program(typer.Typer):
    """The `plm` process (console script, python -m plmcli): once a command has ended, its exit code is
    decided and a late Ctrl-C has nothing left to stop. Ignored from then on, it can no longer kill the
    interpreter's teardown (which would exit by SIGINT, -2, with no message) or print tracebacks from
    exit handlers. In-process callers (CliRunner) do not pass here, so their Ctrl-C is left alone."""

    def __call__(self, *args, **kwargs):
        import signal
        import threading

        try:
            return super().__call__(*args, **kwargs)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)


app = _Program(
    name="plm",
    help="Pretrain, finetune and evaluate classic language models from one recipe per model.\n\n"
    "Start with: plm pretrain --recipe gpt-mini   then   plm eval-ppl some.txt\n\n"
    "Exit codes: 0 done; 2 bad input or a file plm cannot read or write (one line: error: what — how to fix); "
    "130 interrupted (the line says what was left and how to continue); 1 an internal error, a bug in plm "
    "(plm --debug COMMAND … shows its traceback).",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=_ReportingGroup,
)
recipes_app = typer.Typer(help="List the shipped recipes or show one fully resolved.", invoke_without_command=True,
                          cls=_ReportingGroup)
app.add_typer(recipes_app, name="recipes")


def _print_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, ensure_ascii=False))


def parse_duration(text: str | None) -> float | None:
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise PlmError(f"--time-budget '{text}' is not a duration", "write seconds or e.g. 90s, 10m, 1.5h") from None


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors.")):
    _state["debug"] = debug


# ---------------------------------------------------------------- recipes


@recipes_app.callback()
@guarded
def recipes(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")):
    """List every shipped recipe: name, family, objective, parameters, and the first sentence of its
    description, one line each; `plm recipes show NAME` prints a recipe whole, --json lists them all.

    Example: plm recipes
    """
    if ctx.invoked_subcommand is not None:
        return
    from plmcli import api

    rows = api.list_recipes()
    if as_json:
        return _print_json(rows)
    import re

    from rich import box
    from rich.console import Console
    from rich.table import Table

    cells = [(r["name"], r["family"] or "", r["objective"] or "", f"{r['params'] / 1e6:,.1f}M",
              # the first sentence of the first line ("et al. 2019" does not end one): `recipes show` has the rest
              re.split(r"(?<=[.!?])\s+(?=[A-Z])", r["description"].strip().split("\n", 1)[0], maxsplit=1)[0])
             for r in rows]
    console = Console()
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    heads = ("recipe", "family", "objective", "params")
    widths = [max(len(head), *(len(c[i]) for c in cells)) for i, head in enumerate(heads)]
    for head, width in zip(heads, widths):  # never cut: a name is what the user types next
        table.add_column(head, no_wrap=True, min_width=width, justify="right" if head == "params" else "left")
    # the description gets the width that is left: each column is padded by 2, and 1 separates two columns
    left = max(console.width - sum(widths) - 3 * len(heads) - 2, 8)
    table.add_column("description", no_wrap=True, overflow="ellipsis", max_width=left)
    for c in cells:
        table.add_row(*c)
    console.print(table)


@recipes_app.command("list")
def recipes_list(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")):
    """Same as `plm recipes`."""
    recipes(typer.Context(typer.main.get_command(recipes_app)), as_json)


@recipes_app.command("show")
@guarded
def recipes_show(
    name: str = typer.Argument(..., help="A shipped recipe name or a path to a .yaml recipe."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a key: section.key=value (repeatable)."),
):
    """Print the fully resolved recipe as YAML.

    Example: plm recipes show gpt2-small --set train.max_steps=100
    """
    from plmcli import api

    typer.echo(api.show_recipe(name, overrides), nl=False)


@recipes_app.command("accelerate")
@guarded
def recipes_accelerate(name: Optional[str] = typer.Argument(None, help="ddp | fsdp | deepspeed-zero2 | deepspeed-zero3")):
    """Where the shipped `accelerate launch` configs are (all of them, or NAME's path alone).

    Example: accelerate launch --config_file $(plm recipes accelerate ddp) --num_processes 8 -m plmcli pretrain --recipe bert-base
    """
    from plmcli import api

    configs = api.accelerate_configs()
    if name is not None and name not in configs:
        raise PlmError(f"no shipped accelerate config '{name}'", f"one of: {', '.join(configs)}")
    typer.echo(configs[name] if name else "\n".join(f"{key:16} {path}" for key, path in configs.items()))


# ---------------------------------------------------------------- tokenize


@app.command()
@guarded
def tokenize(
    inputs: List[str] = typer.Argument(..., help="Text files, directories of them, .gz files, - for stdin; JSON Lines / "
                                       "JSON / CSV / Parquet files, a save_to_disk directory, or a Hub dataset NAME[:CONFIG[:SPLIT]] "
                                       "(each row a document; a DatasetDict's train split, and its validation split as validation)."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (tokenizer.json, dataset/, meta.json)."),
    tokenizer: Optional[str] = typer.Option(None, help="wordpiece | bpe | bytelevel-bpe | unigram | char | word, or a tokenizer.json to load (default: the recipe's, else bytelevel-bpe)."),
    vocab_size: Optional[int] = typer.Option(None, help="Vocabulary size to train (default 8192, or the recipe's)."),
    min_frequency: Optional[int] = typer.Option(None, help="Minimum count of a piece to enter the vocabulary."),
    lowercase: Optional[bool] = typer.Option(None, "--lowercase/--no-lowercase", help="Lower-case the text first."),
    special_tokens: Optional[str] = typer.Option(None, help="Roles to tokens, e.g. 'cls=[CLS],sep=[SEP],mask=[MASK],pad=[PAD],unk=[UNK]' "
                                          "(default: the recipe's, else the kind's usual ones: wordpiece BERT's, unigram ALBERT's "
                                          "<pad> <unk> [CLS] [SEP] [MASK], others GPT-2's <|endoftext|>)."),
    recipe: Optional[str] = typer.Option(None, help="Take the tokenizer settings (kind, size, special tokens) from this recipe."),
    doc_per_line: bool = typer.Option(False, help="Each line is a document (default: blank lines separate documents)."),
    split_sentences: bool = typer.Option(False, help="Cut lines into sentences at 。！？ and . ! ? (text that is not one "
                                         "sentence per line: NSP/SOP pairs are built from sentences)."),
    val_fraction: float = typer.Option(0.05, help="Share of documents (from the end) kept for validation."),
    num_proc: int = typer.Option(1, help="Worker processes for encoding."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="The text column of JSON Lines / CSV / Parquet files, "
                                              "saved datasets and Hub datasets (default: text)."),
    force: bool = typer.Option(False, help="Rebuild even when the cache matches."),
    as_json: bool = typer.Option(False, "--json", help="Print meta.json."),
):
    """Train (or load) a tokenizer and encode a corpus into an Arrow dataset.

    Example: plm tokenize wiki/ books.txt.gz --out data/tok --tokenizer wordpiece --vocab-size 30522 --recipe bert-base

    Example: plm tokenize wikitext:wikitext-103-raw-v1 --out data/wt103 --tokenizer bytelevel-bpe

    Example: plm tokenize docs.jsonl --text-column body --out data/docs
    """
    from plmcli import api

    specials = None
    if special_tokens:
        try:
            specials = dict(item.split("=", 1) for item in special_tokens.split(","))
        except ValueError:
            raise PlmError(f"--special-tokens '{special_tokens}' is not role=token,…", "e.g. --special-tokens 'eos=<|endoftext|>'") from None
    meta = api.tokenize(inputs, out, tokenizer, vocab_size, min_frequency, lowercase, specials, recipe,
                        doc_per_line, val_fraction, num_proc, force, split_sentences=split_sentences,
                        text_column=text_column or "text")
    if as_json:
        return _print_json(meta)
    c = meta["counts"]
    typer.echo(f"{out}: {c['train']['documents']:,} train / {c['validation']['documents']:,} validation documents, "
               f"{c['train']['tokens'] + c['validation']['tokens']:,} tokens, vocab {meta['tokenizer']['vocab_size']:,}")


# ---------------------------------------------------------------- make-mlm-data


@app.command("make-mlm-data")
@guarded
def make_mlm_data(
    corpus: str = typer.Argument(..., help="A `plm tokenize` output directory."),
    out: str = typer.Option(..., "--out", "-o", help="Output directory (dataset/, meta.json, tokenizer.json)."),
    max_seq_len: int = typer.Option(128, help="Tokens per instance, [CLS] and [SEP]s included."),
    short_seq_prob: float = typer.Option(0.1, help="Share of instances with a shorter random target length."),
    dupe_factor: int = typer.Option(5, help="Copies of the corpus, each masked differently."),
    mask_prob: float = typer.Option(0.15, help="Share of tokens to predict."),
    max_predictions: int = typer.Option(20, help="At most this many predictions per instance."),
    pairs: str = typer.Option("nsp", help="nsp (next sentence) | sop (sentence order) | none (RoBERTa full-sentence packing)."),
    cross_documents: bool = typer.Option(True, help="--pairs none: pack across documents (RoBERTa's FULL-SENTENCES); "
                                         "--no-cross-documents keeps each instance inside one document (DOC-SENTENCES)."),
    masking: str = typer.Option("token", help="token | wwm (whole word) | ngram (1-4 words, 40/30/20/10) | chinese-wwm (jieba words) | span (SpanBERT) | knowledge (ERNIE: whole --lexicon matches)."),
    span_p: float = typer.Option(0.2, help="--masking span: span length in words ~ Geometric(p), p in (0, 1]."),
    span_max: int = typer.Option(10, help="--masking span: longest span, in words (≥ 1)."),
    lexicon: Optional[str] = typer.Option(None, help="--masking knowledge: phrases or entities, one per line; each match is masked whole."),
    ngram_probs: str = typer.Option("0.4,0.3,0.2,0.1", help="--masking ngram: P(1 word), P(2 words), ... comma-separated "
                                    "(ALBERT: 0.5455,0.2727,0.1818)."),
    seed: int = typer.Option(12345, help="Random seed: the output is deterministic for a seed."),
    num_proc: int = typer.Option(1, help="Worker processes."),
    force: bool = typer.Option(False, help="Rebuild even when the cache matches."),
    as_json: bool = typer.Option(False, "--json", help="Print meta.json."),
):
    """Create static masked-LM instances with BERT's create_pretraining_data semantics.

    80% of the chosen tokens become [MASK], 10% a random token, 10% stay; [CLS]/[SEP] are never masked.

    Example: plm make-mlm-data tok/ --out mlm128 --max-seq-len 128 --max-predictions 20 --masking wwm --pairs nsp

    ERNIE's entity masking: plm make-mlm-data tok/ --out ent --masking knowledge --lexicon entities.txt
    """
    from plmcli import api

    meta = api.make_mlm_data(corpus, out, max_seq_len, short_seq_prob, dupe_factor, mask_prob, max_predictions,
                             pairs, masking, seed, num_proc, force, span_p=span_p, span_max=span_max, lexicon=lexicon,
                             ngram_probs=_floats(ngram_probs, "--ngram-probs"), cross_documents=cross_documents)
    if as_json:
        return _print_json(meta)
    c = meta.get("counts", {})
    typer.echo(f"{out}: " + ", ".join(f"{k} {v.get('instances', v) if isinstance(v, dict) else v:,}" for k, v in c.items()))


# ---------------------------------------------------------------- pretrain


@app.command()
@guarded
def pretrain(
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Shipped recipe name (plm recipes) or a .yaml path."),
    data: Optional[List[str]] = typer.Option(None, "--data", "-d", help="Raw text (files, dirs, .gz), JSON Lines / CSV / Parquet files, a save_to_disk dir, a Hub dataset "
                                         "NAME[:CONFIG[:SPLIT]], or a `plm tokenize` dir. Default: the shipped sample corpus."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Run directory (default runs/<recipe>-<time>)."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", help="Override a recipe key: section.key=value (repeatable)."),
    max_steps: Optional[int] = typer.Option(None, help="Optimizer steps (also the schedule's horizon)."),
    max_tokens: Optional[int] = typer.Option(None, help="Stop after this many training tokens."),
    time_budget: Optional[str] = typer.Option(None, help="Stop after this wall time: seconds, or 90s / 10m / 2h."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run at --out (default runs/latest) from its last checkpoint."),
    stop_after: Optional[int] = typer.Option(None, help="Stop (with a checkpoint) after N steps without changing the schedule."),
    streaming: bool = typer.Option(False, "--streaming", help="Read, tokenize and pack the --data text files as training goes "
                                   "(corpora too big to tokenize first; objective clm, or mlm/rtd with dynamic token masking). The tokenizer is tokenizer.path, or trained on up to 256 MB "
                                   "from the starts of the files; validation = the last data.val_fraction of the text, at most 16 MB; "
                                   "--resume continues at the same byte of every file (same processes, train.num_workers, batch)."),
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
    """
    from plmcli import api

    overrides = [*(overrides or []), "train.compile=true"] if compile_model else overrides
    summary = api.pretrain(recipe, data, out, overrides, max_steps, max_tokens, parse_duration(time_budget),
                           resume, stop_after, console=_stderr(), streaming=streaming, text_column=text_column)
    if _process()[0]:  # one result for N processes
        return
    if as_json:
        return _print_json(summary)
    val = f", val loss {summary['val_loss']:.4f} (ppl {summary['val_ppl']:.2f})" if "val_loss" in summary else ""
    typer.echo(f"{summary['run_dir']}: {summary['steps']} steps, {summary['tokens']:,} tokens in {summary['elapsed_s']:.1f}s{val}")


# ---------------------------------------------------------------- finetune


@app.command()
@guarded
def finetune(
    task: str = typer.Option(..., "--task", "-t", help="GLUE: cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli; "
                             "span QA: squad | cmrc2018; NER: conll2003; multiple choice: swag; own data: "
                             "classification | regression | pair-classification."),
    from_run: Optional[str] = typer.Option(None, "--from", help="Encoder run directory (default: runs/latest)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="The task's data folder (GLUE: holding SST-2/, CoLA/, … or one task's folder; "
                                           "SQuAD, CoNLL, SWAG, own data: their files; glue-sample: the SST-2 sample shipped with plm); "
                                           "none = --train/--dev/--test, else the Hub."),
    epochs: int = typer.Option(3, help="Epochs; dev is evaluated after each and the best weights are kept."),
    lr: float = typer.Option(2e-5, help="Peak learning rate (10% warmup, linear decay)."),
    batch_size: int = typer.Option(32, help="Examples per optimizer step."),
    seed: int = typer.Option(42, help="Seeds the head init, data order and dropout."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Output directory (default runs/<run>-<task>-<time>)."),
    max_seq_len: Optional[int] = typer.Option(None, help="Tokens per example (default min(128, model positions))."),
    max_steps: Optional[int] = typer.Option(None, help="Stop after N steps instead of full epochs."),
    init: str = typer.Option("pretrained", help="pretrained | random (same architecture, fresh weights: the baseline)."),
    warmup_ratio: float = typer.Option(0.1, help="Share of the steps spent warming the learning rate up."),
    weight_decay: float = typer.Option(0.01, help="AdamW weight decay (not on biases and norms)."),
    dropout: Optional[float] = typer.Option(None, help="Backbone dropout and attention dropout while finetuning "
                                            "(default: the run's own)."),
    classifier_dropout: Optional[float] = typer.Option(None, help="Dropout before the task head (default: the backbone's)."),
    train: Optional[str] = typer.Option(None, "--train", help="Training file of the task's format (own data TSV/CSV/JSONL, SQuAD JSON, CoNLL, SWAG CSV)."),
    dev: Optional[str] = typer.Option(None, "--dev", help="Dev file: evaluated every epoch, its main metric keeps the best weights."),
    test: Optional[str] = typer.Option(None, "--test", help="Test file: predictions are written for it."),
    text_col: Optional[str] = typer.Option(None, help="Own data: the text column (header name or JSONL key)."),
    text_pair_col: Optional[str] = typer.Option(None, help="Own data: the second text of a pair."),
    label_col: Optional[str] = typer.Option(None, help="Own data: the label column."),
    doc_stride: int = typer.Option(128, help="Span QA: tokens between consecutive windows over a long passage."),
    max_query_len: int = typer.Option(64, help="Span QA: question tokens kept."),
    max_answer_len: int = typer.Option(30, help="Span QA: longest answer, in tokens."),
    n_best: int = typer.Option(20, help="Span QA: start and end candidates combined per window."),
    crf: bool = typer.Option(False, "--crf", help="NER: a linear-chain CRF over the tag scores (Viterbi decoding)."),
    aux_lm_weight: float = typer.Option(0.5, help="Causal runs (GPT-style transfer): weight of the auxiliary LM loss."),
    eval_only: bool = typer.Option(False, "--eval-only", help="--from is a finetuned run: score its dev set, predict test, train nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print metrics.json."),
):
    """Finetune a run on a task; writes OUT/metrics.json, the best weights and test predictions.

    From encoder runs (BERT family, XLNet, ELMo features) every task; from causal runs (GPT) classification,
    pairs, similarity and multiple choice GPT-style (<s> x $ y <e>, plus --aux-lm-weight × the LM loss).

    Examples:
      plm pretrain --recipe bert-mini && plm finetune --task sst2 --data-dir glue-sample
      plm finetune --task cmrc2018 --train cmrc2018_train.json --dev cmrc2018_dev.json --max-seq-len 384
      plm finetune --task conll2003 --data-dir conll2003/ --crf
      plm finetune --task classification --train a.tsv --dev b.tsv --text-col sentence --label-col label
      plm finetune --task sst2 --from runs/my-finetuned --eval-only --data-dir glue/
    """
    from plmcli import api

    options = dict(train=train, dev=dev, test=test, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col,
                   doc_stride=doc_stride, max_query_len=max_query_len, max_answer_len=max_answer_len, n_best=n_best, crf=crf,
                   aux_lm_weight=aux_lm_weight)
    res = api.finetune(task, from_run, data_dir, epochs, lr, batch_size, seed, out, max_seq_len, max_steps, init,
                       console=_stderr(), eval_only=eval_only, warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                       dropout=dropout, classifier_dropout=classifier_dropout, **options)
    if _process()[0]:  # one result for N processes
        return
    if as_json:
        return _print_json(res)
    best = f" (best at epoch {res['best_epoch']})" if res.get("best_epoch") is not None else ""
    typer.echo(f"{res['out_dir']}: {res['task']} dev " + ", ".join(f"{k} {v:.4f}" for k, v in res["dev"].items())
               + f"{best}; test predictions: {', '.join(res['test_predictions'].values()) or 'none'}")


# ---------------------------------------------------------------- eval-ppl


@app.command("eval-ppl")
@guarded
def eval_ppl(
    files: List[str] = typer.Argument(..., help="Text files to score (each one continuous text), or JSON Lines / CSV / "
                                      "Parquet files, a save_to_disk directory (its test split, else validation) or a Hub "
                                      "dataset NAME[:CONFIG[:SPLIT]]: rows read as text separated by blank lines."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Run directory (default runs/latest)."),
    max_length: Optional[int] = typer.Option(None, help="Tokens the model reads per window (default: the run's training "
                                             "seq_len, capped by the model's positions)."),
    stride: Optional[int] = typer.Option(None, help="New tokens scored per window (default max_length/2; = max_length: no overlap)."),
    batch_size: int = typer.Option(8, help="Windows per forward pass (masked LMs: --max-tokens-per-batch)."),
    mem_len: Optional[int] = typer.Option(None, help="Models with memory (Transformer-XL, XLNet): states kept per layer "
                                          "(default: the recipe's eval_mem_len, else mem_len)."),
    tgt_len: Optional[int] = typer.Option(None, help="Models with memory: tokens per segment (default: the recipe's "
                                          "eval_tgt_len, else the training seq_len)."),
    max_tokens_per_batch: Optional[int] = typer.Option(None, help="Masked LMs: input tokens per forward pass "
                                                       "(masked copies × their length; default 8192)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: ppl, nll, tokens, bpb, bytes, words, word_ppl, stride, "
                                 "max_length, window_from (masked LMs: also pseudo: true)."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="The text column of JSON Lines / CSV / Parquet files, "
                                              "saved datasets and Hub datasets (default: text)."),
):
    """Perplexity of a causal LM on text, every token scored exactly once (masked LMs: pseudo-perplexity).

    Windows of --max-length tokens move by --stride; each window scores only its new tokens, so every
    token gets between max_length-stride and max_length tokens of context. The default window is the
    length the run trained on (config.json's seq_len; gpt-mini: 128 of its 256 positions), since positions
    it never trained make perplexity worse, not better; the output says which window and why. The first
    token is scored given the tokenizer's BOS/EOS when it has one (else it is context only; it says which).

    Also reports bits per byte (comparable across tokenizers) and word-level perplexity. Bytes are those
    of the text as scored: UTF-8, every line ending in one LF (a CRLF file counts as its LF copy, as
    Python's text mode reads it; a BOM is dropped, a missing final newline added). n-gram runs score
    each line as a sentence (N-1 <s> before it, </s> scored), ignore the windows and report the OOV rate.

    Transformer-XL reads the text in segments of --tgt-len tokens, each attending to --mem-len cached
    states per layer (no windows): plm eval-ppl wiki.test.tokens --tgt-len 128 --mem-len 1600

    Masked LMs (BERT, RoBERTa, ALBERT, SpanBERT, NEZHA, ERNIE; ELECTRA's generator) report pseudo-perplexity
    (Salazar et al. 2020): each line is a sentence, each of its tokens is masked in turn and scored given
    the rest ([CLS]/[SEP] not scored); a line longer than --max-length is scored in windows centred on
    each token: plm eval-ppl valid.txt --model runs/bert-mini --json

    Example: plm eval-ppl wiki.test.raw --model runs/latest --max-length 1024 --stride 512 --json
    """
    from plmcli import api

    res = api.eval_ppl(files, model, max_length, stride, batch_size, mem_len=mem_len, tgt_len=tgt_len,
                       max_tokens_per_batch=max_tokens_per_batch, text_column=text_column)
    if as_json:
        return _print_json({k: v for k, v in res.items() if k != "files"} | {"files": res["files"]})
    if res.get("pseudo"):
        return typer.echo(f"pseudo-perplexity (Salazar et al. 2020) {res['ppl']:.3f}  nll {res['nll']:.4f}  "
                          f"tokens {res['tokens']:,} in {res['sentences']:,} sentences  bpb {res['bpb']:.4f}  "
                          f"word ppl {res['word_ppl']:.3f} ({res['words']:,} words)  window ≤ {res['max_length']}, centred "
                          f"({res['window_from']})")
    context = (f"segment {res['tgt_len']} memory {res['mem_len']}" if "mem_len" in res
               else f"window {res['max_length']}/{res['stride']}"
               + (f" ({res['window_from']})" if "window_from" in res else ""))
    typer.echo(f"ppl {res['ppl']:.3f}  nll {res['nll']:.4f}  tokens {res['tokens']:,}  bpb {res['bpb']:.4f}  "
               f"word ppl {res['word_ppl']:.3f} ({res['words']:,} words)  {context}  "
               f"first token {res['first_token']}" + (f"  oov {res['oov_rate']:.2%}" if "oov_rate" in res else "")
               + (f"  ({res['factorisation']} factorisation)" if "factorisation" in res else ""))


# ---------------------------------------------------------------- generate


@app.command()
@guarded
def generate(
    run: Optional[str] = typer.Argument(None, help="Run directory (default runs/latest)."),
    prompts: Optional[List[str]] = typer.Option(None, "--prompt", "-p", help="Prompt text (repeatable); for an encoder-decoder run, the source."),
    input_file: Optional[str] = typer.Option(None, "--input", "-i", help="A file of prompts, one per line (blank lines skipped; '-' = stdin)."),
    max_new_tokens: int = typer.Option(50, help="Generate at most this many tokens (stops earlier at eos)."),
    strategy: str = typer.Option("greedy", help="greedy | beam | sample."),
    num_beams: int = typer.Option(4, help="Beams for --strategy beam."),
    top_k: int = typer.Option(0, help="sample: only the k most likely tokens (0 = no limit)."),
    top_p: float = typer.Option(1.0, help="sample: only the smallest set of tokens with probability ≥ p (1 = no limit)."),
    temperature: float = typer.Option(1.0, help="sample: divide the logits by this first (< 1 sharper, > 1 flatter)."),
    seed: int = typer.Option(0, help="sample: seed of the sampler (the same seed gives the same text)."),
    length_penalty: float = typer.Option(1.0, help="beam: hypotheses ranked by log-probability / length^this."),
    batch_size: int = typer.Option(16, help="Prompts decoded together."),
    as_json: bool = typer.Option(False, "--json", help="Print [{prompt, output}, ...] as JSON."),
):
    """Generate text from a run: a causal LM continues each prompt; an encoder-decoder (seq2seq,
    transformer) translates it (or, trained with denoising, restores it).

    Greedy, beam search (length-normalized, stops once num_beams hypotheses end), or sampling with
    temperature, top-k and top-p (nucleus). Prints each output (only the generated text) on its own
    line; use --json to keep prompts and multi-line outputs apart.

    Example: plm generate runs/latest --prompt "First Citizen:" --strategy sample --top-p 0.9 --max-new-tokens 100
    """
    from plmcli import api

    rows = api.generate(run, prompts, input_file, max_new_tokens, strategy, num_beams, top_k, top_p, temperature,
                        seed, length_penalty, batch_size)
    if as_json:
        return _print_json(rows)
    for row in rows:
        typer.echo(row["output"])


# Commands that look inside runs or move them between tools, in their own file (see its docstring).
from plmcli import cli_insight  # noqa: E402  (needs guarded & co. defined above)

cli_insight.register(app)


if __name__ == "__main__":
    app()
