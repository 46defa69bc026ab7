"""`plm pretrain`: a recipe, a corpus and a run directory put together, then THE loop (plmcli.train.loop)
over each phase. The run directory's files and checks are plmcli.runs'."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from plmcli.config_schema import Range, check_option
from plmcli.data import store
from plmcli.data.store import content_fingerprint, has_meta, load_meta
from plmcli.errors import PlmError, WriteFailed
from plmcli.pipelines.common import default_corpus, quiet_datasets_off_terminal
from plmcli.runs import (RECIPE, RUN_CONFIG, TOKENIZER, WEIGHTS, check_new_run_dir, clear_progress, discard_run,
                         has_progress, latest_target, list_checkpoints, load_phase_weights, point_latest, runs_root, trained)


def pretrain(recipe=None, data: list[str] | None = None, out: str | None = None, overrides=None, *,
             time_budget: float | None = None, resume: bool | str = False, stop_after: int | None = None,
             streaming: bool = False, console=None) -> dict:
    """plmcli.api.pretrain (see there)."""
    from contextlib import ExitStack

    from plmcli.config import Recipe, load_recipe, raw_recipe

    quiet_datasets_off_terminal()
    # 0 is a value, not "unset": every bound is checked as given (None alone means no limit).
    for flag, value, example in (("--stop-after", stop_after, "10"), ("--time-budget", time_budget, "2h")):
        check_option(flag, value, Range(0, lo_open=True), f"e.g. {flag} {example}, or leave it out")
    if isinstance(recipe, Recipe) and overrides:
        raise PlmError("overrides over a Recipe object", "load it with plmcli.config.load_recipe(name, overrides)")
    if resume == "auto":
        resume = auto_resume(out)
    restart = False
    if resume:
        r, run_dir, restart, streaming, data = _resumed(out, overrides, streaming, data)
        # --auto-resume repeats the first command, --recipe included: the same recipe is fine, another one is not
        name = recipe.name if isinstance(recipe, Recipe) else raw_recipe(recipe).get("name") if recipe else r.name
        if name != r.name:
            raise PlmError(f"--resume continues {run_dir}, trained from recipe {r.name}; --recipe {name} would be "
                           "ignored", "drop --recipe to continue it, or start a new run in another --out")
    else:
        if not recipe:
            raise PlmError("no recipe given", "pass --recipe NAME (see `plm recipes`) or --recipe path/to/recipe.yaml")
        r = recipe if isinstance(recipe, Recipe) else load_recipe(recipe, overrides)
        run_dir = Path(out) if out else runs_root() / f"{r.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        check_new_run_dir(run_dir)  # before any tokenizing; again when it is made
    names = [ph["name"] for ph in r.phases] or [None]
    stages = [r.phase(i) for i in range(len(r.phases))] or [r]
    with ExitStack() as held:  # the run's lock, released however this ends
        return pretrain_run(r, names, stages, data, run_dir, resume, restart, streaming, time_budget, stop_after,
                            console, held)


def auto_resume(out: str | None) -> bool:
    """--auto-resume: whether --out holds a run to continue (else a new run starts there), so a requeued job
    runs one command every time. Every process decides alike: the main one writes the run directory only
    after the preparation's barriers, which each reaches after deciding."""
    if not out:
        raise PlmError("--auto-resume needs --out RUN: the run directory that a requeued job starts, then continues",
                       "e.g. plm pretrain --recipe bert-base --out runs/bert-base --auto-resume")
    return (Path(out) / RECIPE).is_file()


def _resumed(out: str | None, overrides, streaming: bool, data):
    """(recipe, run dir, restart from step 0?, streaming, data) of the run --resume continues."""
    from plmcli.config import load_recipe

    run_dir = Path(out) if out else runs_root() / "latest"
    if not (run_dir / RECIPE).is_file():
        raise PlmError(f"--resume: {run_dir} is not a run directory", "pass --out RUN, the directory of the run to continue")
    run_dir = run_dir.resolve()
    if not (run_dir / RUN_CONFIG).is_file():  # stopped between its first two files: nothing to restart from
        raise PlmError(f"no checkpoint to resume in {run_dir}, nor its {RUN_CONFIG} to start it again",
                       f"delete {run_dir} and start the run again without --resume")
    restart = not has_progress(run_dir)
    r = load_recipe(str(run_dir / RECIPE), overrides)
    prev = json.loads((run_dir / RUN_CONFIG).read_text())
    if streaming and not prev.get("streaming"):
        raise PlmError(f"--resume --streaming: {run_dir} was trained from a tokenized corpus", "resume without --streaming")
    streaming = prev.get("streaming", False)  # a streamed run resumes streaming its text files
    if not data:  # the same corpus as the interrupted run: its tokenized dir if still there, else its inputs
        data = [prev["corpus"]] if has_meta(prev["corpus"]) and not streaming else prev["inputs"]
    return r, run_dir, restart, streaming, data


@dataclass
class Prepared:
    """What a run trains on and with, made before its run directory exists."""

    inputs: list
    corpus_dir: Path
    meta: dict
    fits: bool
    objectives: list
    data_dirs: list
    model: object


def pretrain_run(r, names, stages, data, run_dir: Path, resume: bool, restart: bool, streaming: bool, time_budget,
                 stop_after, console, held) -> dict:
    """pretrain() once its recipe and run directory are known: prepare the data, lock and fill the run
    directory, train every phase, write the summary."""
    import shlex

    from plmcli.errors import Interrupted, stop_signal
    from plmcli.train import checkpoint as ckpt
    from plmcli.train.distributed import process_state

    continue_with = f"plm pretrain --resume --out {shlex.quote(str(run_dir))}"
    state = process_state(r.train.dist_timeout)  # on N processes (accelerate launch, torchrun) they all get here
    if resume and state.is_main_process:  # before any work: a second trainer of this run refuses at once
        held.enter_context(ckpt.RunLock(run_dir))
    prep = prepare(r, stages, data, streaming, state)
    if state.is_main_process:
        _note_missing_validation(r, prep.data_dirs, console)
    previous_latest, made_dir = latest_target(), not run_dir.exists()
    if state.is_main_process:
        _fill_run_dir(r, run_dir, prep, resume, restart, streaming, held)
    state.wait_for_everyone()

    try:
        summary, last_phase = train_stages(prep.model, r, names, stages, prep.objectives, prep.data_dirs, run_dir, state,
                                           prep.fits, resume, time_budget, stop_after, console, continue_with)
    except (ckpt.RunStopped, WriteFailed):  # it trained, and stopped resumable (non-finite loss, a full disk): the run stays
        raise
    except PlmError:
        if state.is_main_process and not resume and not trained(run_dir):
            discard_run(run_dir, previous_latest, made_dir)  # bad data found by the loop: nothing half-made stays
        raise
    except KeyboardInterrupt as e:  # before a phase's loop took charge of the stop signals (it raises Interrupted)
        raise Interrupted(f"stopped before the next checkpoint of {run_dir}; `{continue_with}` continues from the "
                          "last one (or from step 0 if there is none)", stop_signal(e)) from None
    summary["run_dir"] = str(run_dir)
    if state.is_main_process:
        _write_final(run_dir, names, last_phase, summary, continue_with)
    return summary


def prepare(r, stages, data, streaming: bool, state) -> Prepared:
    """The corpus (tokenized once, or set up for streaming), each phase's objective and training data, and
    the model, checked against one another."""
    import torch

    from plmcli.data import mixing
    from plmcli.data.corpus import default_cache_dir
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.models.base import Fits
    from plmcli.models.checkpointing import apply_activation_checkpointing
    from plmcli.models.registry import build_model, model_class
    from plmcli.objectives.registry import objective_class
    from plmcli.train.distributed import built_once, main_builds_first
    from plmcli.train.loop import batch_sizes

    shipped = default_corpus(r.data.default_data or objective_class(r.objective_name).default_data)
    inputs, sources = data_inputs(r, stages, data, shipped)
    fits = issubclass(model_class(r.family), Fits)
    for st in stages if not fits else []:  # a batch that does not split over the processes fails before tokenizing
        batch_sizes(st.train.global_batch_size, st.train.micro_batch_size, state.num_processes)
    if streaming:  # only a tokenizer and the validation tail are prepared; training text is read as it goes
        from plmcli.data.streaming import StreamingObjective, prepare_stream_corpus

        def build():
            return prepare_stream_corpus([s.path for s in sources] if sources else inputs, r.tokenizer, r.data,
                                         objective_class(r.objective_name), objective_cfg=r.objective,
                                         weights=mixing.shares(sources) if sources else None)
    elif sources:  # each source its own corpus (one tokenizer), and a directory that mixes them
        def build():
            return mixing.prepare_mixed_corpus(sources, r.tokenizer, r.data, objective_class(r.objective_name).prepare_corpus)
    elif len(inputs) == 1 and mixing.is_mix(inputs[0]):  # a mix's directory as is (a resumed run's corpus)
        def build():
            return Path(inputs[0])
    else:
        def build():
            return objective_class(r.objective_name).prepare_corpus(inputs, r.tokenizer, r.data)
    # One process tokenizes (one per node when a node does not see its cache); the others then read it,
    # and a node whose corpus came out different stops the job.
    corpus_dir = built_once(state, build, lambda d: content_fingerprint(load_meta(d)))
    meta = load_meta(corpus_dir)
    tok = load_tokenizer(corpus_dir / TOKENIZER)
    special_ids = meta["tokenizer"]["special_token_ids"]
    objectives = [objective(st, tok, special_ids) for st in stages]
    if streaming:
        objectives = [StreamingObjective(obj, st.train.num_workers) for obj, st in zip(objectives, stages)]
    objectives[0].configure_model(r.model, tok.get_vocab_size())
    check_sizes(r, stages, tok.get_vocab_size())
    torch.manual_seed(r.train.seed)
    model = build_model(r.family, r.model)
    objectives[0].check_model(model)
    # the loop sets it per phase; a family without blocks (n-grams and word2vec never reach the loop) refuses here
    apply_activation_checkpointing(model, any(st.train.activation_checkpointing for st in stages))
    # Every phase's training data (make-mlm-data instances, cached) before the run directory exists, so a
    # corpus that cannot make them leaves no run behind (nor runs/latest pointing at one).
    data_dirs = []
    for obj in objectives:
        with main_builds_first(state):  # a mix: each source's data, and a mix of them (data/mixing.py)
            data_dirs.append(mixing.prepared(corpus_dir, lambda d: obj.prepare(d, default_cache_dir(), num_proc=r.data.num_proc),
                                             default_cache_dir()))
    return Prepared(inputs, corpus_dir, meta, fits, objectives, data_dirs, model)


def _note_missing_validation(r, data_dirs, console) -> None:
    """One line on stderr when data.val_fraction asks for validation and the data (or a source of a mix) has none:
    else the run would end with no validation loss, and nothing said why."""
    from rich.console import Console

    from plmcli.data.mixing import lacking

    if not r.data.val_fraction:
        return
    missing = list(dict.fromkeys(name for d in data_dirs for name in lacking(d, "validation")))
    if not missing:
        return
    what = ("the corpus has no validation split, so the run reports no validation loss" if missing == ["the corpus"]
            else f"no validation split in the mix's {'sources' if len(missing) > 1 else 'source'} {', '.join(missing)}, "
                 f"so no val_loss/{'NAME' if len(missing) > 1 else missing[0]} for {'them' if len(missing) > 1 else 'it'}")
    (console or Console(stderr=True)).print(
        f"note: {what}: data.val_fraction holds out whole documents, which end at blank lines (text without any is one "
        "document), and a held-out document may be too short for one sample — --set data.doc_per_line=true holds "
        "out lines instead", highlight=False, soft_wrap=True)


def data_inputs(r, stages, data, shipped) -> tuple[list, list | None]:
    """(the inputs a run records, the sources of a mix or None): --data (a weight after a colon mixes), else the
    recipe's data.mix, data.path or the shipped sample. A mix trains the objectives whose batches are independent
    samples (data/mixing.py: BlendsSources); the others are refused in one line."""
    from plmcli.data import mixing
    from plmcli.objectives.registry import objective_class

    sources = mixing.parse_inputs(data) if data else mixing.from_config(r.data.mix) if r.data.mix else None
    if not sources:
        return (list(data) if data else ([r.data.path] if r.data.path else [shipped])), None
    for st in stages:
        mixing.check_mixable(objective_class(st.objective_name), st.objective_name, st.objective)
    return [mixing.spec(s) for s in sources], sources


def _fill_run_dir(r, run_dir: Path, prep: Prepared, resume: bool, restart: bool, streaming: bool, held) -> None:
    """The main process makes (or restarts) the run directory, locks it and points runs/latest at it."""
    from plmcli.train import checkpoint as ckpt

    if restart:  # stopped before its first checkpoint: what it left goes, and it starts as a fresh run would
        clear_progress(run_dir)
        store.write_text(run_dir / RECIPE, r.to_yaml())
    if not resume:
        check_new_run_dir(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        held.enter_context(ckpt.RunLock(run_dir))
        store.write_text(run_dir / RECIPE, r.to_yaml())
        shutil.copyfile(prep.corpus_dir / TOKENIZER, run_dir / TOKENIZER)
        store.write_json(run_dir / RUN_CONFIG, {
            "family": r.family, "model": asdict(r.model), "objective": r.objective_name,
            "tokenizer": prep.meta["tokenizer"], "seq_len": r.train.seq_len,
            "corpus": str(Path(prep.corpus_dir).resolve()),
            "inputs": [str(Path(i).resolve()) if Path(i).exists() else str(i) for i in prep.inputs],  # Hub names as given
            "streaming": streaming,
        })
    point_latest(run_dir)


def _write_final(run_dir: Path, names, last_phase: Path, summary: dict, continue_with: str) -> None:
    """The run's weights (its last phase's, when it has phases) and RUN/summary.json."""
    if names[0] is not None:  # the run's weights are its last phase's
        with store.atomic_path(run_dir / WEIGHTS, continue_with=continue_with) as tmp:
            shutil.copyfile(last_phase / WEIGHTS, tmp)
    store.write_json(run_dir / "summary.json", summary, continue_with)


def train_stages(model, r, names, stages, objectives, data_dirs, run_dir, state, fits, resume, time_budget,
                 stop_after, console, continue_with=None) -> tuple[dict, Path]:
    """Train (or fit) each phase in turn into run_dir (phases/<name>/ each); (the last phase's summary, its dir)."""

    summary: dict = {}
    started = time.monotonic()
    for name, st, obj, data_dir in zip(names, stages, objectives, data_dirs):
        sub = run_dir if name is None else run_dir / "phases" / name
        if name is not None and (sub / "summary.json").is_file():  # finished before an interruption
            load_phase_weights(model, sub)
            summary = json.loads((sub / "summary.json").read_text())  # a finished run resumed reports it again
            continue
        sub.mkdir(parents=True, exist_ok=True)
        resume_from = list_checkpoints(sub)[-1:] if resume else []
        if time_budget is not None:
            st.train.time_budget = max(time_budget - (time.monotonic() - started), 1e-3)
        if fits:  # no gradient (n-gram counts): the main process fits the model and writes RUN/model.*
            from plmcli.train.distributed import on_main

            summary = on_main(state, lambda: model.fit(data_dir, st, sub, console=console))
        else:
            summary = loop_train(st, model, obj, data_dir, sub, resume_from=resume_from[0] if resume_from else None,
                                 stop_after=stop_after, console=console, continue_with=continue_with)
        if summary["stop_reason"] not in ("max_steps", "max_tokens"):
            break  # stopped early: the next --resume continues this phase
        if name is not None and state.is_main_process:
            store.write_json(sub / "summary.json", summary, continue_with)
    return summary, sub


def loop_train(*args, **kwargs):
    from plmcli.train.loop import train

    return train(*args, **kwargs)


def objective(recipe, tok, special_ids):
    """The recipe's (or phase's) objective over the corpus' tokenizer."""
    from plmcli.objectives.registry import objective_class

    return objective_class(recipe.objective_name)(recipe.objective, tok, special_ids, recipe.train.seq_len)


def check_sizes(r, stages, vocab: int) -> None:
    """The tokenizer must fit the model's vocabulary and every phase's sequences its positions."""
    model_vocab = r.model.vocab_size
    if model_vocab < vocab:
        raise PlmError(f"the tokenizer has {vocab} tokens but model.vocab_size is {model_vocab}",
                       f"--set model.vocab_size={vocab} (or 0 to follow the tokenizer), or use a smaller tokenizer")
    max_pos = getattr(r.model, "max_positions", None)
    for st in stages:
        if max_pos and st.train.seq_len > max_pos:
            raise PlmError(f"train.seq_len {st.train.seq_len} exceeds the model's max_positions {max_pos}",
                           f"--set train.seq_len={max_pos} (longer texts are chunked into sequences of seq_len)")
