"""The library surface: what each CLI command calls. Everything here raises PlmError on bad input."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, replace
from importlib import resources
from pathlib import Path

from plmcli.errors import PlmError

from plmcli.runs import RUN_CONFIG  # noqa: F401  (where callers have long imported it from)


def _quiet_datasets_off_terminal() -> None:
    """datasets' progress bars help on a terminal and only clutter logs elsewhere."""
    import sys

    if not sys.stderr.isatty():
        import datasets

        datasets.disable_progress_bars()


def default_corpus(name: str = "shakespeare-sample.txt") -> str:
    """A small corpus shipped inside the package, so the first `plm pretrain` needs no data."""
    return str(resources.files("plmcli") / "corpus" / name)


SAMPLE_DATA_DIRS = ("glue-sample",)
"""Task samples shipped in plmcli/corpus/ (data/ in the repository), named by `--data-dir NAME` anywhere."""


def sample_data_dir(data_dir: str | None) -> str | None:
    """`data_dir`, or the shipped sample it names when no such directory exists here (`--data-dir glue-sample`
    works after `pip install`, outside the repository)."""
    if data_dir and not Path(data_dir).exists() and Path(data_dir).name in SAMPLE_DATA_DIRS:
        return default_corpus(Path(data_dir).name)
    return data_dir


# ---------------------------------------------------------------- recipes


def list_recipes() -> list[dict]:
    """Every shipped recipe: name, family, objective, params, description.

    Read from the YAML files and the shipped parameter table (plmcli/recipe_params.py), so listing
    imports no torch and builds no model; tests/test_recipes.py validates every shipped recipe."""
    from plmcli.config import raw_recipe, shipped_recipes
    from plmcli.recipe_params import read_table, recipe_params

    table = read_table()
    rows = []
    for name in shipped_recipes():
        raw = raw_recipe(name)
        rows.append({"name": name, "family": (raw.get("model") or {}).get("family"),
                     "objective": (raw.get("objective") or {}).get("name"),
                     "params": recipe_params(name, raw, table), "description": str(raw.get("description") or "")})
    return rows


def count_params(recipe) -> int:
    """Parameter count of the recipe's model (built on the meta device: no memory, no time)."""
    import torch

    from plmcli.models.registry import build_model

    cfg = replace(recipe.model)
    if getattr(cfg, "vocab_size", 1) == 0:
        cfg.vocab_size = recipe.tokenizer.vocab_size
    with torch.device("meta"):
        model = build_model(recipe.family, cfg)
    return sum(p.numel() for p in model.parameters())


def show_recipe(name: str, overrides: list[str] | None = None) -> str:
    from plmcli.config import load_recipe

    return load_recipe(name, overrides).to_yaml()


def accelerate_configs() -> dict:
    """name -> path of each `accelerate launch --config_file` file shipped with plm (ddp, fsdp, deepspeed-zero2/3)."""
    from plmcli.train.distributed import accelerate_configs as shipped

    return shipped()


# ---------------------------------------------------------------- tokenize


def tokenize(inputs: list[str], out: str, tokenizer: str | None = None, vocab_size: int | None = None,
             min_frequency: int | None = None, lowercase: bool | None = None, special_tokens: dict | None = None,
             recipe: str | None = None, doc_per_line: bool = False, val_fraction: float = 0.05, num_proc: int = 1,
             force: bool = False, split_sentences: bool = False, text_column: str = "text") -> dict:
    """Train (or load) a tokenizer and encode the corpus into an Arrow dataset at `out`; `text_column`:
    the column read from JSON Lines / CSV / Parquet files, saved datasets and Hub datasets."""
    from plmcli.config import load_recipe
    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.corpus import tokenize_corpus
    from plmcli.data.outdir import check_writable
    from plmcli.data.tokenizers import default_special_tokens

    check_writable(out)
    _quiet_datasets_off_terminal()
    base = load_recipe(recipe).tokenizer if recipe else TokenizerConfig()
    if tokenizer and tokenizer.endswith(".json"):
        base = replace(base, path=tokenizer)
    elif tokenizer:
        base = replace(base, kind=tokenizer, path=None)
    if not recipe and not base.path:  # a recipe's own special tokens win; else those the kind's models need
        base = replace(base, special_tokens=default_special_tokens(base.kind))
    changes = {k: v for k, v in dict(vocab_size=vocab_size, min_frequency=min_frequency, lowercase=lowercase,
                                     special_tokens=special_tokens).items() if v is not None}
    cfg = replace(base, **changes)
    if not 0 <= val_fraction < 1:
        raise PlmError(f"--val-fraction {val_fraction} must be in [0, 1)", "e.g. --val-fraction 0.05")
    return tokenize_corpus(inputs, out, cfg, doc_per_line=doc_per_line, val_fraction=val_fraction,
                           num_proc=num_proc, force=force, split_sentences=split_sentences, column=text_column)


# ---------------------------------------------------------------- make-mlm-data


def make_mlm_data(corpus_dir: str, out: str, max_seq_len: int = 128, short_seq_prob: float = 0.1, dupe_factor: int = 5,
                  mask_prob: float = 0.15, max_predictions: int = 20, pairs: str = "nsp", masking: str = "token",
                  seed: int = 12345, num_proc: int = 1, force: bool = False, span_p: float = 0.2, span_max: int = 10,
                  lexicon: str | None = None, ngram_probs=(0.4, 0.3, 0.2, 0.1), cross_documents: bool = True) -> dict:
    """Static masked-LM instances from a `plm tokenize` directory (BERT create_pretraining_data semantics).

    ngram_probs shapes masking "ngram" (P(n words), n = 1, 2, ...); span_p / span_max shape masking "span" (SpanBERT); `lexicon` gives the units of masking "knowledge" (ERNIE).
    """
    from plmcli.data.mlm_data import make_mlm_data as build
    from plmcli.data.outdir import check_writable

    check_writable(out)
    _quiet_datasets_off_terminal()
    return build(corpus_dir, out, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                 mask_prob=mask_prob, max_predictions=max_predictions, pairs=pairs, masking=masking, seed=seed,
                 num_proc=num_proc, force=force, span_p=span_p, span_max=span_max, lexicon=lexicon,
                 ngram_probs=ngram_probs, cross_documents=cross_documents)


# ---------------------------------------------------------------- pretrain


def pretrain(recipe: str | None = None, data: list[str] | None = None, out: str | None = None,
             overrides: list[str] | None = None, max_steps: int | None = None, max_tokens: int | None = None,
             time_budget: float | None = None, resume: bool = False, stop_after: int | None = None,
             console=None, streaming: bool = False, text_column: str | None = None) -> dict:
    """Train a model from a recipe; returns the run summary (also written to RUN/summary.json).

    A recipe with `phases` trains them in order (RUN/phases/<name>/ each), every phase continuing the
    previous one's weights with a fresh optimizer and schedule. `streaming`: read, tokenize and pack the
    text files as training goes (plmcli/data/streaming.py) instead of tokenizing them first.
    `resume` continues RUN from its last checkpoint; a run stopped before its first one starts again
    from step 0 (its recipe, tokenizer and config are there). One process at a time trains into a run.
    `text_column` (= data.text_column): the text column of `datasets` inputs (data/tables.py).
    """
    from contextlib import ExitStack

    from plmcli.config import load_recipe
    from plmcli.train import checkpoint as ckpt

    _quiet_datasets_off_terminal()
    if max_steps is not None and max_steps < 1:
        raise PlmError(f"--max-steps {max_steps} must be ≥ 1", "e.g. --max-steps 100, or leave it out for the recipe's train.max_steps")
    restart = False
    if resume:
        run_dir = Path(out) if out else ckpt.runs_root() / "latest"
        if not (run_dir / "recipe.yaml").is_file():
            raise PlmError(f"--resume: {run_dir} is not a run directory", "pass --out RUN, the directory of the run to continue")
        run_dir = run_dir.resolve()
        if not (run_dir / RUN_CONFIG).is_file():  # stopped between its first two files: nothing to restart from
            raise PlmError(f"no checkpoint to resume in {run_dir}, nor its {RUN_CONFIG} to start it again",
                           f"delete {run_dir} and start the run again without --resume")
        restart = not _has_progress(run_dir)
        r = load_recipe(str(run_dir / "recipe.yaml"), overrides)
        prev = json.loads((run_dir / RUN_CONFIG).read_text())
        if streaming and not prev.get("streaming"):
            raise PlmError(f"--resume --streaming: {run_dir} was trained from a tokenized corpus", "resume without --streaming")
        streaming = prev.get("streaming", False)  # a streamed run resumes streaming its text files
        if not data:  # the same corpus as the interrupted run: its tokenized dir if still there, else its inputs
            data = [prev["corpus"]] if (Path(prev["corpus"]) / "meta.json").is_file() and not streaming else prev["inputs"]
    else:
        if not recipe:
            raise PlmError("no recipe given", "pass --recipe NAME (see `plm recipes`) or --recipe path/to/recipe.yaml")
        r = load_recipe(recipe, overrides)
        run_dir = Path(out) if out else ckpt.runs_root() / f"{r.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        _check_new_run_dir(run_dir)  # before any tokenizing; again when it is made
    if text_column is not None:
        r.data.text_column = text_column
    names = [ph["name"] for ph in r.phases] or [None]
    stages = [r.phase(i) for i in range(len(r.phases))] or [r]
    for st in stages:
        st.train.max_steps = max_steps if max_steps is not None else st.train.max_steps
        st.train.max_tokens = max_tokens if max_tokens is not None else st.train.max_tokens
    with ExitStack() as held:  # the run's lock, released however this ends
        return _pretrain_run(r, names, stages, data, run_dir, resume, restart, streaming, time_budget, stop_after,
                             console, held)


def _pretrain_run(r, names, stages, data, run_dir: Path, resume: bool, restart: bool, streaming: bool, time_budget,
                  stop_after, console, held) -> dict:
    """pretrain() once its recipe and run directory are known: prepare the data, lock and fill the run
    directory, train every phase, write the summary."""
    import shlex

    import torch

    from plmcli.data.corpus import default_cache_dir
    from plmcli.data.store import load_meta
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.errors import Interrupted
    from plmcli.models.registry import build_model, model_class
    from plmcli.objectives.registry import objective_class
    from plmcli.train import checkpoint as ckpt
    from plmcli.train.distributed import process_state
    from plmcli.train.loop import batch_sizes

    continue_with = f"plm pretrain --resume --out {shlex.quote(str(run_dir))}"
    state = process_state(r.train.dist_timeout)  # on N processes (accelerate launch, torchrun) they all get here
    if resume and state.is_main_process:  # before any work: a second trainer of this run refuses at once
        held.enter_context(ckpt.RunLock(run_dir))
    shipped = default_corpus(r.data.default_data or objective_class(r.objective_name).default_data)
    inputs = list(data) if data else ([r.data.path] if r.data.path else [shipped])
    fits = hasattr(model_class(r.family), "fit")
    for st in stages if not fits else []:  # a batch that does not split over the processes fails before tokenizing
        batch_sizes(st.train.global_batch_size, st.train.micro_batch_size, state.num_processes)
    with state.main_process_first():  # one process tokenizes; the others then read its cache
        if streaming:  # only a tokenizer and the validation tail are prepared; training text is read as it goes
            from plmcli.data.streaming import StreamingObjective, prepare_stream_corpus

            corpus_dir = prepare_stream_corpus(inputs, r.tokenizer, r.data, objective_class(r.objective_name),
                                               objective_cfg=r.objective)
        else:
            corpus_dir = objective_class(r.objective_name).prepare_corpus(inputs, r.tokenizer, r.data)
    meta = load_meta(corpus_dir)
    tok = load_tokenizer(corpus_dir / "tokenizer.json")
    special_ids = meta["tokenizer"]["special_token_ids"]
    objectives = [_objective(st, tok, special_ids) for st in stages]
    if streaming:
        objectives = [StreamingObjective(obj, st.train.num_workers) for obj, st in zip(objectives, stages)]
    objectives[0].configure_model(r.model, tok.get_vocab_size())
    _check_sizes(r, stages, tok.get_vocab_size())
    torch.manual_seed(r.train.seed)
    model = build_model(r.family, r.model)
    objectives[0].check_model(model)
    # Every phase's training data (make-mlm-data instances, cached) before the run directory exists, so a
    # corpus that cannot make them leaves no run behind (nor runs/latest pointing at one).
    data_dirs = []
    for obj in objectives:
        with state.main_process_first():
            data_dirs.append(obj.prepare(corpus_dir, default_cache_dir(), num_proc=r.data.num_proc))

    previous_latest, made_dir = _latest_target(), not run_dir.exists()
    if state.is_main_process:
        if restart:  # stopped before its first checkpoint: what it left goes, and it starts as a fresh run would
            _clear_progress(run_dir)
            ckpt.write_text(run_dir / "recipe.yaml", r.to_yaml())
        if not resume:
            _check_new_run_dir(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            held.enter_context(ckpt.RunLock(run_dir))
            ckpt.write_text(run_dir / "recipe.yaml", r.to_yaml())
            shutil.copyfile(corpus_dir / "tokenizer.json", run_dir / "tokenizer.json")
            ckpt.write_json(run_dir / RUN_CONFIG, {
                "family": r.family, "model": asdict(r.model), "objective": r.objective_name,
                "tokenizer": meta["tokenizer"], "seq_len": r.train.seq_len, "corpus": str(Path(corpus_dir).resolve()),
                "inputs": [str(Path(i).resolve()) if Path(i).exists() else str(i) for i in inputs],  # Hub names as given
                "streaming": streaming,
            })
        ckpt.point_latest(run_dir)
    state.wait_for_everyone()

    try:
        summary, last_phase = _train_stages(model, r, names, stages, objectives, data_dirs, run_dir, state, fits, resume,
                                            time_budget, stop_after, console, continue_with)
    except ckpt.RunStopped:  # it trained, and stopped resumable (non-finite loss, a write that failed): the run stays
        raise
    except PlmError:
        if state.is_main_process and not resume and not _trained(run_dir):
            _discard_run(run_dir, previous_latest, made_dir)  # bad data found by the loop: nothing half-made stays
        raise
    except KeyboardInterrupt:  # before a phase's loop took charge of Ctrl-C (it raises Interrupted itself)
        raise Interrupted(f"stopped before the next checkpoint of {run_dir}; `{continue_with}` continues from the "
                          "last one (or from step 0 if there is none)") from None
    summary["run_dir"] = str(run_dir)
    if state.is_main_process:
        if names[0] is not None:  # the run's weights are its last phase's
            tmp = run_dir / ".model.safetensors.tmp"
            with ckpt.writing("model.safetensors", tmp, continue_with):
                shutil.copyfile(last_phase / "model.safetensors", tmp)
                tmp.replace(run_dir / "model.safetensors")
        ckpt.write_json(run_dir / "summary.json", summary, continue_with)
    return summary


def _train_stages(model, r, names, stages, objectives, data_dirs, run_dir, state, fits, resume, time_budget,
                  stop_after, console, continue_with=None) -> tuple[dict, Path]:
    """Train (or fit) each phase in turn into run_dir (phases/<name>/ each); (the last phase's summary, its dir)."""
    from plmcli.train import checkpoint as ckpt

    summary: dict = {}
    started = time.monotonic()
    for name, st, obj, data_dir in zip(names, stages, objectives, data_dirs):
        sub = run_dir if name is None else run_dir / "phases" / name
        if name is not None and (sub / "summary.json").is_file():  # finished before an interruption
            _load_weights(model, sub)
            summary = json.loads((sub / "summary.json").read_text())  # a finished run resumed reports it again
            continue
        sub.mkdir(parents=True, exist_ok=True)
        resume_from = ckpt.list_checkpoints(sub)[-1:] if resume else []
        if time_budget is not None:
            st.train.time_budget = max(time_budget - (time.monotonic() - started), 1e-3)
        if fits:  # no gradient (n-gram counts): the main process fits the model and writes RUN/model.*
            from accelerate.utils import broadcast_object_list

            summary = [model.fit(data_dir, st, sub, console=console) if state.is_main_process else None]
            summary = broadcast_object_list(summary)[0] if state.num_processes > 1 else summary[0]
        else:
            summary = loop_train(st, model, obj, data_dir, sub, resume_from=resume_from[0] if resume_from else None,
                                 stop_after=stop_after, console=console, continue_with=continue_with)
        if summary["stop_reason"] not in ("max_steps", "max_tokens"):
            break  # stopped early: the next --resume continues this phase
        if name is not None and state.is_main_process:
            ckpt.write_json(sub / "summary.json", summary, continue_with)
    return summary, sub


def _latest_target() -> str | None:
    import os

    from plmcli.train import checkpoint as ckpt

    latest = ckpt.runs_root() / "latest"
    return os.readlink(latest) if latest.is_symlink() else None


def _trained(run_dir: Path) -> bool:
    """Whether a run directory holds anything of training: a logged step, a checkpoint or weights."""
    metrics = list(run_dir.glob("metrics.jsonl")) + list(run_dir.glob("phases/*/metrics.jsonl"))
    return any(m.stat().st_size for m in metrics) or any(run_dir.glob("**/checkpoints/step-*")) \
        or any(run_dir.glob("**/model.safetensors"))


def _has_progress(run_dir: Path) -> bool:
    """Whether a run has something to resume from: a complete checkpoint or a finished phase (else, or
    for a fitted run without checkpoints, --resume starts it again from step 0)."""
    from plmcli.train import checkpoint as ckpt

    subs = [run_dir, *(p for p in run_dir.glob("phases/*") if p.is_dir())]
    return any(ckpt.list_checkpoints(sub) for sub in subs) or any(run_dir.glob("phases/*/summary.json"))


def _clear_progress(run_dir: Path) -> None:
    """What a run wrote while training (logs, partial checkpoints, weights), keeping the files it was made with."""
    keep = {"recipe.yaml", "tokenizer.json", RUN_CONFIG, ".lock"}
    for child in run_dir.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _discard_run(run_dir: Path, previous_latest: str | None, made_dir: bool) -> None:
    """Remove what this call wrote into run_dir (the directory too if it made it), and point runs/latest
    back where it pointed before."""
    import os

    from plmcli.data.outdir import discard
    from plmcli.train import checkpoint as ckpt

    discard(run_dir, made_dir)
    latest = ckpt.runs_root() / "latest"
    if latest.is_symlink() and not latest.exists():  # it points at the removed run
        latest.unlink()
        if previous_latest is not None:
            os.symlink(previous_latest, latest, target_is_directory=True)


def loop_train(*args, **kwargs):
    from plmcli.train.loop import train

    return train(*args, **kwargs)


def _check_new_run_dir(run_dir: Path) -> None:
    from plmcli.data.outdir import check_writable

    if run_dir.exists() and any(run_dir.iterdir()):
        raise PlmError(f"run directory {run_dir} already exists and is not empty",
                       "choose another --out, delete it, or add --resume to continue it (a run stopped before its "
                       "first checkpoint starts again from step 0)")
    check_writable(run_dir)


def _objective(recipe, tok, special_ids):
    from plmcli.objectives.registry import objective_class

    return objective_class(recipe.objective_name)(recipe.objective, tok, special_ids, recipe.train.seq_len)


def _check_sizes(r, stages, vocab: int) -> None:
    """The tokenizer must fit the model's vocabulary and every phase's sequences its positions."""
    model_vocab = getattr(r.model, "vocab_size", vocab)
    if model_vocab < vocab:
        raise PlmError(f"the tokenizer has {vocab} tokens but model.vocab_size is {model_vocab}",
                       f"--set model.vocab_size={vocab} (or 0 to follow the tokenizer), or use a smaller tokenizer")
    max_pos = getattr(r.model, "max_positions", None)
    for st in stages:
        if max_pos and st.train.seq_len > max_pos:
            raise PlmError(f"train.seq_len {st.train.seq_len} exceeds the model's max_positions {max_pos}",
                           f"--set train.seq_len={max_pos} (longer texts are chunked into sequences of seq_len)")


def _load_weights(model, run_dir: Path) -> None:
    from safetensors.torch import load_model

    load_model(model, str(Path(run_dir) / "model.safetensors"))


# ---------------------------------------------------------------- finetune


def finetune(task: str, from_run: str | None = None, data_dir: str | None = None, epochs: int = 3, lr: float = 2e-5,
             batch_size: int = 32, seed: int = 42, out: str | None = None, max_seq_len: int | None = None,
             max_steps: int | None = None, init: str = "pretrained", console=None, eval_only: bool = False,
             warmup_ratio: float = 0.1, weight_decay: float = 0.01, dropout: float | None = None,
             classifier_dropout: float | None = None, **options) -> dict:
    """Finetune a pretrained run on a task; returns OUT/metrics.json (see plmcli.finetune).

    `options`: the task settings of plmcli.data.tasks.TaskOptions (train, dev, test, text_col, crf, ...).
    """
    from dataclasses import fields

    from plmcli.data.tasks import TaskOptions
    from plmcli.finetune import finetune as run_finetune

    known = {f.name for f in fields(TaskOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise PlmError(f"unknown finetune option(s) {', '.join(unknown)}", f"known: {', '.join(sorted(known))}")
    _quiet_datasets_off_terminal()
    return run_finetune(task, from_run=from_run, data_dir=sample_data_dir(data_dir), epochs=epochs, lr=lr, batch_size=batch_size,
                        seed=seed, out=out, max_seq_len=max_seq_len, max_steps=max_steps, init=init, console=console,
                        warmup_ratio=warmup_ratio, weight_decay=weight_decay, dropout=dropout,
                        classifier_dropout=classifier_dropout, options=TaskOptions(**options), eval_only=eval_only)


# ---------------------------------------------------------------- export


def export(run: str | None, format: str, out: str, force: bool = False) -> dict:
    """Write a run in another tool's format: arpa (n-gram runs) or hf (a transformers directory);
    returns {"format", "out", ...} (hf adds architecture, parameters and what was left out, see plmcli.export)."""
    from plmcli.export import export_report

    return export_report(run, format, out, force)


def import_hf(hf_dir: str, out: str, force: bool = False) -> dict:
    """A local transformers model directory as a plm run directory at `out` (see plmcli.interop.hf);
    returns {"out", "family", "model_type", "fresh": modules initialised because the checkpoint lacks them, ...}."""
    from plmcli.data.outdir import check_writable
    from plmcli.interop.hf import import_hf as import_dir

    check_writable(out)
    return import_dir(hf_dir, out, force)


# ---------------------------------------------------------------- runs


def resolve_run(run: str | None, usage: str = "--model RUN") -> Path:
    """A finished run's directory (None: runs/latest); `usage` is how the calling command takes a run,
    for the hints (see plmcli.runs)."""
    from plmcli.runs import resolve_run as resolve

    return resolve(run, usage)


def load_run(run: str | None, usage: str = "--model RUN", doing: str = "use it"):
    """(model in eval mode, tokenizer, run config) of a finished language-model run (see plmcli.runs)."""
    from plmcli.runs import load_run as load

    return load(run, usage, doing)


# ---------------------------------------------------------------- eval-ppl


def eval_ppl(files: list[str], model: str | None = None, max_length: int | None = None, stride: int | None = None,
             batch_size: int = 8, console=None, mem_len: int | None = None, tgt_len: int | None = None,
             max_tokens_per_batch: int | None = None, text_column: str | None = None) -> dict:
    """Perplexity of `files` under a run (see plmcli.eval.perplexity for the conventions).

    Causal LMs are scored with sliding windows; a family with its own `eval_ppl` (stateful RNNs, n-grams,
    bidirectional or conditional LMs) scores the text itself and returns the same keys. `mem_len` and
    `tgt_len` (memory and segment length) apply to families with memory (`has_memory`: Transformer-XL, XLNet).
    Masked LMs get pseudo-perplexity (plmcli.eval.pseudo; `pseudo: True`), batched by `max_tokens_per_batch`.
    `files` may be `datasets` inputs (data/tables.py), read by `text_column`.
    """
    import torch

    from plmcli.eval.perplexity import check_lengths, encode_file, report, sequence_nll, window_length
    from plmcli.eval.pseudo import pseudo_ppl, scores_masked_tokens
    from plmcli.models.registry import model_class
    from plmcli.runs import refuse_task_model, run_config

    from plmcli.data.tables import with_text_column

    files = with_text_column(files, text_column)
    check_lengths(max_length=(max_length, 1), stride=(stride, 1), tgt_len=(tgt_len, 1), mem_len=(mem_len, 0),
                  batch_size=(batch_size, 1))
    path = resolve_run(model, "--model RUN")
    run_cfg = run_config(path)
    refuse_task_model(path, run_cfg, model, "--model RUN", "score text")
    family = run_cfg["family"]
    cls = model_class(family)
    masked = not hasattr(cls, "eval_ppl") and scores_masked_tokens(cls)
    if not (getattr(cls, "causal", False) or hasattr(cls, "eval_ppl") or masked):
        raise PlmError(f"run {model or 'runs/latest'} ({family}) is not a causal LM, so it has no left-to-right perplexity, "
                       "nor a masked LM for pseudo-perplexity", "evaluate a causal (gpt) or masked-LM (bert) run instead")
    if max_tokens_per_batch is not None and not masked:
        raise PlmError(f"--max-tokens-per-batch applies to masked LMs (pseudo-perplexity), and run {model or 'runs/latest'} "
                       f"is {family}", "leave it out; --batch-size sets the windows per forward pass")
    memory = {k: v for k, v in (("mem_len", mem_len), ("tgt_len", tgt_len)) if v is not None}
    if memory and not getattr(cls, "has_memory", False):
        raise PlmError(f"--mem-len / --tgt-len apply to models with memory (transformer_xl, xlnet), and run "
                       f"{model or 'runs/latest'} is {family}", "leave them out; use --max-length / --stride for windows")
    net, tok, cfg = load_run(model, "--model RUN", "score text")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if hasattr(net, "eval_ppl"):
        return net.eval_ppl(files, tok, cfg, max_length=max_length, stride=stride, batch_size=batch_size, device=device,
                            **memory)
    if masked:
        return pseudo_ppl(net, files, tok, cfg, max_length, stride, max_tokens_per_batch, device)
    positions = net.max_positions
    L, window_from = window_length(max_length, positions, cfg.get("seq_len"))
    if not 1 <= L <= positions:
        raise PlmError(f"--max-length {L} is outside 1..{positions} (the model's positions)", f"use --max-length ≤ {positions}")
    S = max(1, L // 2) if stride is None else stride
    if not 1 <= S <= L:
        raise PlmError(f"--stride {S} must be between 1 and --max-length {L}", f"e.g. --stride {max(1, L // 2)}")
    ids = cfg["tokenizer"].get("special_token_ids", {})
    prefix = ids.get("bos", ids.get("eos"))
    prefix_name = next((r for r in ("bos", "eos") if r in ids), None)

    net.to(device)
    total_nll, total_tok, total_bytes, total_words, per_file = 0.0, 0, 0, 0, []
    for f in files:
        seq, n_bytes, n_words = encode_file(f, tok, prefix)
        nll, n = sequence_nll(net, seq, L, S, batch_size, device)
        per_file.append({"file": f, **report(nll, n, n_bytes, n_words, S, L)})
        total_nll, total_tok, total_bytes, total_words = total_nll + nll, total_tok + n, total_bytes + n_bytes, total_words + n_words
    res = report(total_nll, total_tok, total_bytes, total_words, S, L)
    res["window_from"] = window_from
    res["first_token"] = f"conditioned on {prefix_name}" if prefix_name else "not scored (tokenizer has no bos/eos)"
    res["files"] = per_file
    return res


# ---------------------------------------------------------------- generate


def generate(model: str | None = None, prompts: list[str] | None = None, input_file: str | None = None,
             max_new_tokens: int = 50, strategy: str = "greedy", num_beams: int = 4, top_k: int = 0,
             top_p: float = 1.0, temperature: float = 1.0, seed: int = 0, length_penalty: float = 1.0,
             batch_size: int = 16) -> list[dict]:
    """Generate from a run for each prompt (--prompt texts, then the non-blank lines of --input);
    returns [{"prompt", "output"}] where output is the generated text only (see plmcli.generate)."""
    from plmcli.data.text import iter_text_lines
    from plmcli.generate import generate as run_generate

    texts = list(prompts or [])
    if input_file:
        texts += [line.rstrip("\n") for line in iter_text_lines([input_file]) if line.strip()]
    if not texts:
        raise PlmError("no prompts given", "pass --prompt TEXT (repeatable) or --input FILE (one prompt per line)")
    if batch_size < 1:
        raise PlmError(f"--batch-size {batch_size} must be ≥ 1", "e.g. --batch-size 16")
    outputs = run_generate(model, texts, max_new_tokens=max_new_tokens, strategy=strategy, num_beams=num_beams,
                           top_k=top_k, top_p=top_p, temperature=temperature, seed=seed,
                           length_penalty=length_penalty, batch_size=batch_size)
    return [{"prompt": p, "output": o} for p, o in zip(texts, outputs)]
