"""The library surface: what each CLI command calls. Everything here raises PlmError on bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError
from plmcli.pipelines.common import quiet_datasets_off_terminal, sample_data_dir


# ---------------------------------------------------------------- recipes


def default_corpus(name: str = "shakespeare-sample.txt") -> str:
    """The path of a sample shipped with plm (plmcli/corpus/: the default corpora, glue-sample, ...)."""
    from plmcli.pipelines.common import default_corpus as shipped

    return shipped(name)


def list_recipes() -> list[dict]:
    """Every shipped recipe: name, family, objective, params, description.

    Read from the YAML files and the shipped parameter table (plmcli/recipe_params.py), so listing
    imports no torch and builds no model while the table is current (it brings itself up to date when the
    recipes or the model code change); tests/test_recipes.py validates every shipped recipe."""
    from plmcli.config import raw_recipe, shipped_recipes
    from plmcli.recipe_params import current_table

    table = current_table()
    rows = []
    for name in shipped_recipes():
        raw = raw_recipe(name)
        rows.append({"name": name, "family": (raw.get("model") or {}).get("family"),
                     "objective": (raw.get("objective") or {}).get("name"),
                     "params": table[name]["params"], "description": str(raw.get("description") or "")})
    return rows


def count_params(recipe) -> int:
    """Parameter count of the recipe's model (built on the meta device: no memory, no time)."""
    from plmcli.recipe_params import count_params as count

    return count(recipe)


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

    # checked as typed and before any reading: replace() below skips the tokenizer section's own range checks
    for flag, value, allowed, hint in (("--vocab-size", vocab_size, Range(1), "e.g. --vocab-size 8192, or leave it out"),
                                       ("--min-frequency", min_frequency, Range(0), "e.g. --min-frequency 2, or leave it out"),
                                       ("--num-proc", num_proc, Range(1), "e.g. --num-proc 4, or leave it out"),
                                       ("--val-fraction", val_fraction, Range(0, 1, hi_open=True), "e.g. --val-fraction 0.05")):
        check_option(flag, value, allowed, hint)
    check_writable(out)
    quiet_datasets_off_terminal()
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
    return tokenize_corpus(inputs, out, cfg, doc_per_line=doc_per_line, val_fraction=val_fraction,
                           num_proc=num_proc, force=force, split_sentences=split_sentences, column=text_column)


# ---------------------------------------------------------------- make-mlm-data


def make_mlm_data(corpus_dir: str, out: str, max_seq_len: int = 128, short_seq_prob: float = 0.1, dupe_factor: int = 5,
                  mask_prob: float = 0.15, max_predictions: int = 20, pairs: str = "nsp", masking: str = "token",
                  seed: int = 12345, num_proc: int = 1, force: bool = False, span_p: float = 0.2, span_max: int = 10,
                  lexicon: str | None = None, ngram_probs=(0.4, 0.3, 0.2, 0.1), packing: str = "full_sentences",
                  knowledge_units: str | None = None, mask_count: str = "reference",
                  ngram_start_prob: float | None = None) -> dict:
    """Static masked-LM instances from a `plm tokenize` directory (BERT create_pretraining_data semantics).

    `packing` (pairs none): full_sentences (RoBERTa's FULL-SENTENCES) | doc_sentences (no instance spans two documents).

    ngram_probs shapes masking "ngram" (P(n words), n = 1, 2, ...); span_p / span_max shape masking "span" (SpanBERT);
    `lexicon` gives the units of masking "knowledge" (ERNIE), or `knowledge_units` (phrases | entities) has jieba's
    tagger find them. `mask_count` (reference: Google's count, [CLS]/[SEP] included | maskable) and
    `ngram_start_prob` (masking "ngram_per_word"; None = derived): plmcli.data.masking_options.MaskingOptions.
    """
    from plmcli.data.mlm_data import make_mlm_data as build
    from plmcli.data.outdir import check_writable

    check_writable(out)
    quiet_datasets_off_terminal()
    return build(corpus_dir, out, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                 mask_prob=mask_prob, max_predictions=max_predictions, pairs=pairs, masking=masking, seed=seed,
                 num_proc=num_proc, force=force, span_p=span_p, span_max=span_max, lexicon=lexicon,
                 ngram_probs=ngram_probs, packing=packing, knowledge_units=knowledge_units, mask_count=mask_count,
                 ngram_start_prob=ngram_start_prob)


# ---------------------------------------------------------------- pretrain


def pretrain(recipe=None, data: list[str] | None = None, out: str | None = None, overrides=None, *,
             time_budget: float | None = None, resume: bool | str = False, stop_after: int | None = None,
             streaming: bool = False, console=None) -> dict:
    """Train a model from a recipe; returns the run summary (also written to RUN/summary.json).

    `recipe`: a shipped recipe's name, a .yaml path, or a plmcli.config.Recipe (config.load_recipe), and
    `overrides` over a name or path: `section.key=value` strings or a dict (nested, or {"train.max_steps": 500});
    every setting is a recipe key. A recipe with `phases` trains them in order (RUN/phases/<name>/ each), every
    phase continuing the previous one's weights with a fresh optimizer and schedule. `streaming`: read, tokenize
    and pack the text files as training goes (plmcli/data/streaming.py) instead of tokenizing them first.
    `resume` continues RUN from its last checkpoint (`overrides` over its recipe); a run stopped before its first
    one starts again from step 0 (its recipe, tokenizer and config are there); `resume="auto"` continues the run
    at `out` when there is one and starts it there when not (one command for a requeued job). One process at a
    time trains into a run. `time_budget`: seconds for the whole run, its phases together. SIGINT, SIGTERM and
    SIGUSR1 stop it at the next optimizer step with a checkpoint of that step (plmcli.errors.Interrupted).
    """
    from plmcli.pipelines.pretrain import pretrain as run_pretrain

    return run_pretrain(recipe, data, out, overrides, time_budget=time_budget, resume=resume, stop_after=stop_after,
                        streaming=streaming, console=console)


# ---------------------------------------------------------------- finetune


def finetune_config(path: str | None = None, overrides=None):
    """A plmcli.config.FinetuneConfig: the YAML file `path` (sections task, model, train, optim, grid; a finished
    finetune's OUT/finetune.yaml is one; None: the defaults) with `overrides` over it (`section.key=value`
    strings, or a dict: nested, or {"task.name": "sst2", "train.epochs": 2}). Checked as it loads: an unknown
    key or a value out of its range is a PlmError naming it."""
    from plmcli.config import load_finetune_config

    return load_finetune_config(path, overrides)


def finetune(config, out: str | None = None, *, eval_only: bool = False, console=None) -> dict:
    """Finetune as the FinetuneConfig `config` says (see finetune_config) into `out` (default
    runs/<run>-<task>-<time>); returns OUT/metrics.json (see plmcli.pipelines.finetune).

    A config whose grid section lists several lr / epochs / batch sizes or seeds is a grid
    (pipelines/finetune_grid.py): every combination finetuned, the best dev run kept; it returns OUT/grid.json.
    `eval_only`: model.from_run is a finetuned run of the task: score its dev set, predict test, train nothing.
    """
    from plmcli.pipelines.finetune import run_finetune
    from plmcli.pipelines.finetune_grid import cell_config, grid_cells, run_grid

    if not config.task.name:
        raise PlmError("no task given", "pass --task NAME (e.g. --task sst2), or name it in the --config file "
                       "(task: {name: sst2}) or with --set task.name=sst2")
    cfg = replace(config, task=replace(config.task, data_dir=sample_data_dir(config.task.data_dir)),
                  model=replace(config.model, from_run=local_run(config.model.from_run)))
    quiet_datasets_off_terminal()
    cells = grid_cells(cfg)
    if len(cells) > 1 and eval_only:
        raise PlmError(f"--eval-only scores one finetuned run, not a grid of {len(cells)}",
                       "leave out the lists of --lr/--epochs/--batch-size, --seeds and the config's grid section")
    if len(cells) > 1:
        return run_grid(cfg, out, console)
    return run_finetune(cell_config(cfg, cells[0]), out, eval_only, console)


# ---------------------------------------------------------------- export


def export(run: str | None, format: str, out: str, force: bool = False, push_to_hub: str | None = None) -> dict:
    """Write a run in another tool's format: arpa (n-gram runs), hf (a transformers directory) or word2vec (word2vec runs);
    returns {"format", "out", ...} (hf adds architecture, parameters and what was left out, see plmcli.interop.export).
    `push_to_hub` (hf only): then upload `out` to that Hub model repo, created if missing ("pushed": {"repo", "url"})."""
    from plmcli.interop.export import export_report
    from plmcli.interop.hub import push

    if push_to_hub and format != "hf":
        raise PlmError(f"--push-to-hub uploads a transformers directory, not {format}", "add --format hf")
    res = export_report(local_run(run), format, out, force)
    return {**res, "pushed": push(res["out"], push_to_hub)} if push_to_hub else res


def import_hf(source: str, out: str | None = None, force: bool = False) -> dict:
    """A transformers model as a plm run directory at `out` (see plmcli.interop.hf): a local directory, or a
    Hugging Face Hub id (`org/name[@REVISION]`, see plmcli.interop.hub; `out` defaults to runs/hub/<org>--<name>,
    which is reused, {"reused": True}, when already converted). Returns {"out", "family", "model_type",
    "fresh": modules initialised because the checkpoint lacks them, ...}."""
    from plmcli.data.outdir import check_writable
    from plmcli.interop.hf import import_hf as import_dir
    from plmcli.interop.hub import import_hub, is_hub_name

    if is_hub_name(source):
        return import_hub(source, out, force)
    if out is None and not Path(source).exists():
        raise PlmError(f"{source} is neither a local directory nor a Hub model id",
                       "pass a transformers directory and --out RUN, or a Hub id (bert-base-uncased, ORG/NAME@REVISION)")
    if out is None:
        raise PlmError(f"no --out given for the local directory {source}",
                       "pass --out RUN (only a Hub model id has a default: runs/hub/<org>--<name>)")
    check_writable(out)
    return import_dir(source, out, force)


# ---------------------------------------------------------------- runs


def local_run(run: str | None) -> str | None:
    """`run` as the lower layers take it: a Hugging Face Hub id (`bert-base-uncased`, `org/name@REVISION`) that
    names no local path becomes the plm run it converts to (runs/hub/..., fetched and converted on first use:
    plmcli.interop.hub); anything else is returned as it is. Every door that takes a run passes it through here,
    since plmcli.runs sits below interop and cannot fetch."""
    from plmcli.interop.hub import local_run as convert

    return convert(run)


def resolve_run(run: str | None, usage: str = "--model RUN") -> Path:
    """A finished run's directory (None: runs/latest; a Hub id: see local_run); `usage` is how the calling
    command takes a run, for the hints (see plmcli.runs)."""
    from plmcli.runs import resolve_run as resolve

    return resolve(local_run(run), usage)


def load_run(run: str | None, usage: str = "--model RUN", doing: str = "use it"):
    """(model in eval mode, tokenizer, run config) of a finished language-model run, or of a Hub id (local_run;
    see plmcli.runs)."""
    from plmcli.runs import load_run as load

    return load(local_run(run), usage, doing)


# ---------------------------------------------------------------- eval-ppl


def eval_ppl(files: list[str], model: str | None = None, max_length: int | None = None, stride: int | None = None,
             batch_size: int = 8, console=None, mem_len: int | None = None, tgt_len: int | None = None,
             max_tokens_per_batch: int | None = None, text_column: str | None = None) -> dict:
    """Perplexity of `files` under a run, by the scorer its family's `traits.scoring` names (plmcli.eval.scoring;
    the conventions are plmcli.eval.perplexity's).

    Causal LMs are scored with sliding windows, stateful RNNs with their state carried, n-grams sentence by
    sentence, encoder-decoders target given source, masked LMs by pseudo-perplexity (`pseudo: True`, batched by
    `max_tokens_per_batch`). `mem_len` and `tgt_len` (memory and segment length) apply to families with memory
    (`has_memory`: Transformer-XL, XLNet). `files` may be `datasets` inputs (data/tables.py), read by `text_column`.
    """
    import torch

    from plmcli.data.tables import with_text_column
    from plmcli.eval import scoring
    from plmcli.eval.perplexity import check_lengths
    from plmcli.models.registry import model_class
    from plmcli.runs import refuse_task_model, run_config

    files = with_text_column(files, text_column)
    check_lengths(max_length=(max_length, 1), stride=(stride, 1), tgt_len=(tgt_len, 1), mem_len=(mem_len, 0),
                  batch_size=(batch_size, 1), max_tokens_per_batch=(max_tokens_per_batch, 1))
    model = local_run(model)
    path = resolve_run(model, "--model RUN")
    run_cfg = run_config(path)
    refuse_task_model(path, run_cfg, model, "--model RUN", "score text")
    family = run_cfg["family"]
    scoring.check_options(model_class(family), family, model or "runs/latest", mem_len=mem_len, tgt_len=tgt_len,
                          max_tokens_per_batch=max_tokens_per_batch)
    net, tok, cfg = load_run(model, "--model RUN", "score text")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return scoring.score(net, files, tok, cfg, max_length=max_length, stride=stride, batch_size=batch_size,
                         device=device, mem_len=mem_len, tgt_len=tgt_len, max_tokens_per_batch=max_tokens_per_batch)


def lm_eval(run: str | None, tasks, num_fewshot: int | None = None, limit: float | None = None, batch_size: int = 8,
            include_path: str | None = None, output: str | None = None, bootstrap_iters: int = 100000) -> dict:
    """Score `tasks` (names or a comma-separated string) of lm-evaluation-harness with a causal LM run
    (plmcli.interop.lm_eval: each request scored by the run's eval-ppl scorer). `include_path`: a folder of
    task YAMLs of your own; `limit`: the first N documents of each task (a fraction below 1: that share);
    `bootstrap_iters`: 0 skips the harness' bootstrapped stderrs. Returns {run, tasks: {task: {metric: value}},
    n-shot, versions}; `output` also gets the harness' results and task configs as JSON."""
    import difflib
    import json

    from plmcli.errors import needs

    harness = needs("lm_eval", "lm-eval", "plm lm-eval")
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks or []) if t.strip()]
    if not names:
        raise PlmError("no task given", "pass --tasks NAME[,NAME...] (lm-eval's names, or those of --include-path YAMLs)")
    for flag, value, allowed in (("--num-fewshot", num_fewshot, Range(0)), ("--limit", limit, Range(0, lo_open=True)),
                                 ("--batch-size", batch_size, Range(1)), ("--bootstrap-iters", bootstrap_iters, Range(0))):
        check_option(flag, value, allowed, f"e.g. {flag} 8")
    if include_path is not None and not Path(include_path).is_dir():
        raise PlmError(f"--include-path {include_path} is not a folder", "pass the folder that holds your task YAMLs")
    if output:
        from plmcli.data.outdir import check_writable

        check_writable(output, "--output")
    path = resolve_run(run, "RUN")  # a missing run is said before the harness indexes its tasks
    manager = needs("lm_eval.tasks", "lm-eval", "plm lm-eval").TaskManager(include_path=include_path)
    for name in names:
        if not manager.match_tasks([name]):
            close = difflib.get_close_matches(name, manager.all_tasks, n=3, cutoff=0.6)
            raise PlmError(f"lm-eval has no task '{name}'", f"did you mean {', '.join(close)}?" if close else
                           "list them with `lm_eval ls tasks`; your own: --include-path DIR")
    from plmcli.interop.lm_eval import PlmLM

    model = PlmLM(str(path), batch_size=batch_size)
    quiet_datasets_off_terminal()
    res = harness.simple_evaluate(model=model, tasks=names, num_fewshot=num_fewshot, limit=limit,
                                  task_manager=manager, bootstrap_iters=bootstrap_iters, log_samples=False)
    scores = {task: {(k[:-len(",none")] if k.endswith(",none") else k): v for k, v in metrics.items() if k != "alias"}
              for task, metrics in res["results"].items()}
    out = {"run": run or "runs/latest", "tasks": scores, "n-shot": res.get("n-shot", {}),
           "versions": res.get("versions", {}), "limit": limit}
    if output:
        from plmcli.data.store import write_text

        handle_non_serializable = needs("lm_eval.utils", "lm-eval", "plm lm-eval").handle_non_serializable

        Path(output).parent.mkdir(parents=True, exist_ok=True)
        full = {**out, "results": res["results"], "configs": res.get("configs", {})}
        write_text(output, json.dumps(full, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n")
        out["output"] = output
    return out


# ---------------------------------------------------------------- eval-vectors


def eval_vectors(vectors: str | None = None, analogies: str | None = None, similarity: str | None = None,
                 restrict_vocab: int = 300000, case_insensitive: bool = True) -> dict:
    """Score static word vectors `vectors` (a word2vec run, default runs/latest, or a word2vec text file) on word
    analogies (questions-words.txt: accuracy per section and in total, OOV questions counted) and/or word
    similarity (WordSim-353 TSV: Spearman's ρ, OOV pairs counted), as gensim's KeyedVectors scores them
    (see plmcli.eval.vectors)."""
    from plmcli.eval.vectors import evaluate

    return evaluate(vectors, analogies, similarity, restrict_vocab, case_insensitive)


# ---------------------------------------------------------------- generate


def generate(model: str | None = None, prompts: list[str] | None = None, input_file: str | None = None,
             max_new_tokens: int = 50, strategy: str = "greedy", num_beams: int = 4, top_k: int = 0,
             top_p: float = 1.0, temperature: float = 1.0, seed: int = 0, length_penalty: float = 1.0,
             batch_size: int = 16, console=None, stop: str | list[str] | None = None) -> list[dict]:
    """Generate from a run for each prompt (--prompt texts, then the non-blank lines of --input);
    returns [{"prompt", "output"}] where output is the generated text only (see plmcli.generate).
    `console`: where a long generation shows its progress (a rich Console on stderr; None: nowhere).
    `stop`: a string or several; a greedy or sampled row ends once its text holds one, and is cut before it."""
    from plmcli.data.text import iter_text_lines
    from plmcli.generate import generate as run_generate

    texts = list(prompts or [])
    if input_file:
        texts += [line.rstrip("\n") for line in iter_text_lines([input_file]) if line.strip()]
    if not texts:
        raise PlmError("no prompts given", "pass --prompt TEXT (repeatable) or --input FILE (one prompt per line)")
    check_option("--batch-size", batch_size, Range(1), "e.g. --batch-size 16")
    outputs = run_generate(local_run(model), texts, max_new_tokens=max_new_tokens, strategy=strategy, num_beams=num_beams,
                           top_k=top_k, top_p=top_p, temperature=temperature, seed=seed,
                           length_penalty=length_penalty, batch_size=batch_size, console=console, stop=stop)
    return [{"prompt": p, "output": o} for p, o in zip(texts, outputs)]


# ---------------------------------------------------------------- zero-shot


def zero_shot(run: str | None = None, task: str | None = None, config: str | None = None, data_dir: str | None = None,
              data: str | None = None, split: str | None = None, prompt: str | None = None,
              verbalizers: dict | None = None, option: str | None = None, score: str | None = None,
              max_examples: int | None = None, max_length: int | None = None, batch_size: int = 8,
              predictions: str | None = None, shots: int | None = None) -> dict:
    """Score a task with a causal LM run and no finetuning (plmcli.eval.zero_shot): the task's shipped config
    (prompt, verbalizers, option, score; score generate: shots, metric, ...), under the YAML file `config`, under
    the other arguments (None: not given). Returns the metrics, what was asked and `predictions` (one dict per example), which `predictions`
    also writes as JSON Lines."""
    import json

    from plmcli.data.store import write_text
    from plmcli.eval.zero_shot import zero_shot as score_zero_shot
    from plmcli.eval.zero_shot import zero_shot_config

    cfg = zero_shot_config(config, dict(task=task, data_dir=data_dir, data=data, split=split, prompt=prompt,
                                        verbalizers=verbalizers, option=option, score=score, max_examples=max_examples,
                                        shots=shots))
    cfg = replace(cfg, data_dir=sample_data_dir(cfg.data_dir))
    if predictions:  # before the scoring, not after it
        from plmcli.data.outdir import check_writable

        check_writable(predictions, "--predictions")
    quiet_datasets_off_terminal()
    res = score_zero_shot(local_run(run), cfg, max_length=max_length, batch_size=batch_size)
    if predictions:
        Path(predictions).parent.mkdir(parents=True, exist_ok=True)  # a new folder is made, as --out's are
        write_text(predictions, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in res["predictions"]))
        res["predictions_file"] = predictions
    return res


# ---------------------------------------------------------------- insight, and what the CLI's error line needs
# Thin doors for plmcli.cli, which reaches nothing below this module.


def plot(runs: list[str], out: str | None = None, metrics: list[str] | None = None, x: str = "step") -> dict:
    """Training curves of runs' metrics.jsonl into a PNG (see plmcli.analysis.plot.plot_runs)."""
    from plmcli.analysis.plot import plot_runs

    return plot_runs(runs, out, metrics, x)


def attention(run: str | None, text: str | None = None, text_pair: str | None = None, corpus: str | None = None,
              out: str | None = None, max_seq_len: int | None = None, batch_size: int = 16,
              max_lines: int | None = None) -> dict:
    """Attention heatmaps, per-head patterns and a heatmap per pattern of a run (see plmcli.analysis.attention)."""
    from plmcli.analysis.attention import attention as run_attention

    return run_attention(local_run(run), text, text_pair, corpus, out, max_seq_len, batch_size, max_lines)


def print_attention(res: dict, console=None) -> None:
    from plmcli.analysis.attention_report import print_report

    print_report(res, console)


def probe(run: str | None, task: str, out: str, data_dir: str | None = None, train: str | None = None,
          dev: str | None = None, max_sentences: int | None = 2000, max_dev_sentences: int | None = 500,
          seed: int = 0, batch_size: int = 32, console=None) -> dict:
    """A linear probe per layer of a run (see plmcli.analysis.probe.probe)."""
    from plmcli.analysis.probe import probe as run_probe

    return run_probe(local_run(run), task, out, data_dir, train, dev, max_sentences, max_dev_sentences, seed, batch_size,
                     console=console)


def print_probe(res: dict, console=None) -> None:
    from plmcli.analysis.probe import print_report

    print_report(res, console)


def find_plm_error(e: BaseException) -> PlmError | None:
    """Ours, dug out of the chain of an exception (datasets wraps it in its generators and workers)."""
    from plmcli.data.outdir import find_plm_error as find

    return find(e)


def chosen_places() -> dict:
    """Directories plm picks for the user (see errors.os_error): a failure inside one names its setting."""
    import os

    from plmcli.data.corpus import default_cache_dir

    places = {}
    try:
        places[str(default_cache_dir(check=False))] = ("PLM_CACHE", "export PLM_CACHE=<a writable directory> to move the cache")
    except Exception:  # noqa: BLE001 — a hint must never hide the error it explains
        pass
    places[os.environ.get("PLM_RUNS", "runs")] = ("PLM_RUNS", "pass --out <a writable directory>, or export PLM_RUNS=<one>")
    return places
