"""Zero-shot evaluation (Radford et al. 2019, §3): a causal LM scores a task it was never
finetuned on by the likelihood it gives each verbalised label or option after a prompt.

classification  GLUE's classification tasks and own `classification` / `pair-classification` data: every label
                has a verbaliser, the text that continues the prompt for it (SST-2: " It was great." /
                " It was terrible."); the prediction is the label whose verbaliser is most likely.
choice          SWAG and RACE: every option, formatted by `option`, continues the prompt.
lambada         a text file of passages, one a line (LAMBADA, Paperno et al. 2016): the last word is predicted
                from the rest. Accuracy: every token of the word is the model's argmax given the tokens before
                it (greedy decoding finds the word); also the perplexity of the last words.
generate        `score: generate` (translation, squad): the model writes each prediction greedily after the
                prompt, and `metric` scores it (BLEU, SQuAD's F1): plmcli.eval.zero_shot_generate.

A continuation c after a prompt p scores log P(c | p) = Σ_t log p(c_t | p, c_<t), "sum", or that sum over c's
token count, "mean". The default is sum for verbalised labels (the label's probability) and mean for options,
which differ in length (GPT-3's per-token normalisation, Brown et al. 2020 §2.4); both accuracies are
reported, `score` picks the predictions. Each row is [bos, else eos] + prompt + continuation, prompt and
continuation encoded apart (a continuation has the same tokens after every prompt); a row longer than the
window (eval-ppl's: the run's training seq_len, capped by its positions) loses prompt tokens from its start.

Prompts and verbalisers are data: a zero-shot config (YAML, the keys of ZeroShotConfig), shipped for some
tasks in plmcli/recipes/zero-shot/<task>.yaml; a --config file and flags go over it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch

from plmcli.config_schema import Count, Range, check_option
from plmcli.errors import PlmError
from plmcli.eval.prompts import fill

LAMBADA = "lambada"
"""The task name of last-word prediction on a text file (no reader in the task registry: its data is text)."""

ZeroShotScore = Literal["sum", "mean", "generate"]
"""sum: log P(continuation | prompt); mean: that over the continuation's tokens; generate: no continuations, the
model's greedy continuation of the prompt is the prediction (plmcli.eval.zero_shot_generate)."""

GeneratedMetric = Literal["bleu", "squad_f1"]
"""What scores generated predictions: bleu (sacrebleu's corpus_bleu), squad_f1 (SQuAD v1.1's F1 and exact match)."""

CONFIG_DIR = "zero-shot"
"""Under plmcli/recipes: the shipped zero-shot configs, one per task (sst2.yaml, race.yaml, ...)."""


@dataclass
class ZeroShotConfig:
    """What `plm zero-shot` scores and how it asks the model (a YAML file of these keys; flags go over it)."""

    task: str = "sst2"
    """A task with labels (GLUE's classification tasks, classification, pair-classification), with options
    (swag, race), or lambada."""
    split: str = "dev"
    """The split scored (the task's names: dev, test, dev_mismatched, ...); lambada reads `data`."""
    data_dir: Optional[str] = None
    """The task's data folder, as for plm finetune (glue-sample: the shipped SST-2 sample)."""
    data: Optional[str] = None
    """lambada: the text file, one passage a line (.gz, .jsonl with a text key, - for stdin)."""
    prompt: str = ""
    """The text before each continuation, a template of the example's fields: {text} and {text_b}
    (classification), {context} and {question} (choice; RACE has questions). "" = the fields in that order."""
    verbalizers: dict = field(default_factory=dict)
    """Classification: label (its name or index) -> the text that continues the prompt for it;
    {} = a space and the label's name."""
    option: str = " {option}"
    """Multiple choice: how an option continues the prompt ({option})."""
    score: Optional[ZeroShotScore] = None
    """sum | mean: what picks the prediction; none = sum for verbalised labels, mean for options. generate: the
    model writes the prediction (greedy, until `stop`), read from `data` and scored by `metric`."""
    max_examples: Count = 0
    """Score the first N examples of the split only; 0 = all."""
    metric: Optional[GeneratedMetric] = None
    """score generate: bleu (translation pairs) | squad_f1 (questions on passages: F1 and exact match)."""
    shot: str = ""
    """score generate: the template of each solved example before the prompt (its fields and the answer's:
    {source} {target} for pairs; {context} {question} {answer} for questions)."""
    shots: Count = 0
    """score generate: solved examples before each prompt, the data's first rows (not scored)."""
    turn: str = "Q: {question}\nA: {answer}\n"
    """score generate, CoQA: how each earlier question and answer of the conversation reads, in {history}."""
    stop: str = "\n"
    """score generate: decoding ends at this text (not part of the prediction)."""
    max_new_tokens: Count = 32
    """score generate: at most this many tokens per prediction."""


GENERATE_KEYS = ("metric", "shot", "shots", "turn", "stop", "max_new_tokens")
"""The keys only `score: generate` reads (left out of the other tasks' results)."""


# ---------------------------------------------------------------- the config


def shipped_config(task: str) -> dict:
    """The shipped zero-shot config of `task` (plmcli/recipes/zero-shot/<task>.yaml) as a mapping; {} for none."""
    from plmcli.config import recipe_dir

    path = recipe_dir() / CONFIG_DIR / f"{task.lower()}.yaml"
    return read_config(path, shipped=True) if path.is_file() else {}


def read_config(path, shipped: bool = False) -> dict:
    import yaml

    p = Path(str(path))
    if not shipped and not p.is_file():
        raise PlmError(f"zero-shot config '{path}' does not exist", "check the path (keys: task, prompt, verbalizers, ...)")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise PlmError(f"zero-shot config {path} is not valid YAML ({str(e).splitlines()[0]})", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise PlmError(f"zero-shot config {path} must be a mapping of keys",
                       "write key: value lines (task, prompt, verbalizers, option, score, ...)")
    return raw


def zero_shot_config(path: str | None = None, flags: dict | None = None) -> ZeroShotConfig:
    """The task's shipped config, under the file `path`, under `flags` (None values: not given). A mapping
    (verbalizers) is replaced whole, never merged: a file's labels are all its labels."""
    import re

    from plmcli.config_schema import build_section

    given = {k: v for k, v in (flags or {}).items() if v is not None}
    own = read_config(path) if path else {}
    task = given.get("task") or own.get("task") or ZeroShotConfig.task
    merged = {**shipped_config(str(task)), **own, **given}
    try:
        return build_section(ZeroShotConfig, merged, "zero-shot")
    except PlmError as e:  # the command has no --set: its hint names the flag of the key
        flag = re.sub(r"--set zero-shot\.(\w+)", lambda m: "--" + m.group(1).replace("_", "-"), e.hint)
        raise PlmError(e.message, flag) from None


# ---------------------------------------------------------------- scoring continuations


@dataclass
class Scored:
    """One continuation: log P(continuation | context) summed over its tokens, their count, and whether each
    token is the model's argmax (greedy decoding would produce the continuation)."""

    loglik: float
    tokens: int
    greedy: bool

    @property
    def mean(self) -> float:
        return self.loglik / self.tokens


def check_model(model) -> None:
    """The models zero-shot reads: stateless causal LMs with final states and an output layer (gpt runs)."""
    from plmcli.models.base import HasHidden, HasLMHead, HasPositionLimit, traits_of

    traits = traits_of(model)
    if not (traits.causal and not traits.stateful and isinstance(model, HasHidden) and isinstance(model, HasLMHead)
            and isinstance(model, HasPositionLimit)):
        raise PlmError(f"zero-shot scoring needs a causal LM that reads whole sequences, and a "
                       f"{type(model).__name__} run is not one", "pass a gpt run (plm pretrain --recipe gpt-mini)")


@torch.no_grad()
def score_continuations(model, rows: list[tuple[list[int], list[int]]], window: int, batch_size: int = 8,
                        device="cpu") -> list[Scored]:
    """Scored(log P(continuation | context)) of each (context ids, continuation ids) row.

    A row reads its last `window` tokens and predicts every continuation token (a row needs one context
    token: the first is never predicted); the output layer is computed at those positions only.
    """
    out: list[Scored] = []
    for lo in range(0, len(rows), batch_size):
        batch = rows[lo:lo + batch_size]
        inputs = [window_inputs(ctx, cont, window) for ctx, cont in batch]
        x = torch.zeros(len(batch), max(map(len, inputs)), dtype=torch.long)  # right padding: never seen
        sel = torch.zeros(x.shape, dtype=torch.bool)
        for r, ((_, cont), row) in enumerate(zip(batch, inputs)):
            x[r, :len(row)] = torch.tensor(row)
            sel[r, len(row) - len(cont):len(row)] = True  # the positions that predict the continuation
        targets = torch.tensor([t for _, cont in batch for t in cont])
        h = model.hidden(x.to(device))  # (B, T, C)
        logits = model.lm_head(h[sel.to(device)]).float().cpu()  # (continuation tokens, V), row by row
        lp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0].double()
        hit = logits.argmax(-1) == targets
        at = 0
        for _, cont in batch:
            n = len(cont)
            out.append(Scored(float(lp[at:at + n].sum()), n, bool(hit[at:at + n].all())))
            at += n
    return out


def window_inputs(ctx: list[int], cont: list[int], window: int) -> list[int]:
    """The inputs of a row: the last window + 1 tokens of context + continuation, less the last (a target only)."""
    if not cont:
        raise PlmError("a continuation encodes to no tokens", "give every verbaliser / option some text")
    if not ctx:
        raise PlmError("a prompt encodes to no tokens and the run's tokenizer has no bos or eos to start it",
                       "give the prompt some text")
    if len(cont) > window:
        raise PlmError(f"a continuation of {len(cont)} tokens does not fit the window of {window}",
                       "pass a larger --max-length (up to the model's positions) or shorten the verbalisers / options")
    return (ctx + cont)[-(window + 1):-1]


# ---------------------------------------------------------------- a task's examples as rows


def task_kind(task) -> str:
    """classification or choice, from the objective that finetunes the task; other tasks are refused."""
    if task.objective == "choice":
        return "choice"
    if task.objective == "classify" and task.num_labels >= 2:
        return "classification"
    what = "a regression" if task.objective == "classify" else f"trained by objective {task.objective}"
    raise PlmError(f"zero-shot scores labels or options, and {task.name} is {what} task",
                   "pass --task sst2 (or another classification task), swag, race, or lambada")


def verbalisers(cfg: ZeroShotConfig, task) -> list[str]:
    """The continuation of each label, in class order: cfg.verbalizers by label name or index."""
    names = [str(n) for n in task.label_names]
    given = {str(k): str(v) for k, v in cfg.verbalizers.items()}
    if not given:
        return [f" {n}" for n in names]
    known = set(names) | {str(i) for i in range(len(names))}
    stray = sorted(set(given) - known)
    if stray:
        raise PlmError(f"verbaliser for {stray[0]!r}, which is no label of {task.name}", f"its labels: {', '.join(names)}")
    out = [given.get(n, given.get(str(i))) for i, n in enumerate(names)]
    missing = [n for n, v in zip(names, out) if v is None]
    if missing:
        raise PlmError(f"no verbaliser for label {missing[0]} of {task.name}",
                       f"give one for each of {', '.join(names)}, e.g. --verbalizer '{missing[0]}= It was ...'")
    return out


def classification_rows(cfg: ZeroShotConfig, task, examples, encode, prefix: list[int]) -> tuple[list, list[str], str]:
    """(rows: one per example and label, the continuations, the prompt template)."""
    conts = verbalisers(cfg, task)
    pair = any(e.text_b is not None for e in examples)
    template = cfg.prompt or ("{text} {text_b}" if pair else "{text}")
    fill(template, {"text": "", "text_b": ""}, "prompt")  # its own errors first (a field the examples lack)
    if "{text}" not in template.replace("{{", ""):  # every example would get the same prompt: nothing to classify
        raise PlmError(f"prompt {template!r} has no {{text}}: every example would be scored on the same words",
                       "put {text} where the example goes, e.g. --prompt 'Review: {text}'")
    enc_conts = [encode(c) for c in conts]
    rows = []
    for e in examples:
        fields = {"text": str(e.text_a).strip(), "text_b": str(e.text_b or "").strip()}
        ctx = prefix + encode(fill(template, fields, "prompt"))
        rows += [(ctx, c) for c in enc_conts]
    return rows, conts, template


def choice_rows(cfg: ZeroShotConfig, examples, encode, prefix: list[int]) -> tuple[list, str]:
    """(rows: one per example and option, the prompt template)."""
    from plmcli.data.tasks.race import RaceExample

    asks = any(isinstance(e, RaceExample) and e.question for e in examples)
    template = cfg.prompt or ("{context} {question}" if asks else "{context}")
    rows = []
    for e in examples:
        fields = {"context": e.context.strip(), "question": e.question.strip() if isinstance(e, RaceExample) else ""}
        ctx = prefix + encode(fill(template, fields, "prompt"))
        rows += [(ctx, encode(fill(cfg.option, {"option": o.strip()}, "option"))) for o in e.endings]
    return rows, template


def task_examples(cfg: ZeroShotConfig):
    """(the task, its kind, the examples of cfg.split, the first cfg.max_examples of them when set)."""
    from plmcli.data.tasks.registry import get_task

    task = get_task(cfg.task)
    if cfg.data is not None:
        raise PlmError(f"--data is lambada's text file, and {task.name} reads its data from --data-dir",
                       f"pass --data-dir (the folder plm finetune --task {task.name} reads)")
    kind = task_kind(task)
    splits = task.load(cfg.data_dir)
    if cfg.split not in splits:
        raise PlmError(f"{task.name} has no {cfg.split} split here", f"pass --split {' or '.join(splits)}")
    examples = splits[cfg.split][: cfg.max_examples or None]
    if any(e.label is None for e in examples):
        raise PlmError(f"the {cfg.split} split of {task.name} has no labels to score", "pass --split dev")
    return task, kind, examples


def score_task(model, encode, prefix, cfg: ZeroShotConfig, window: int, batch_size: int, device) -> dict:
    """Accuracy (and the task's metrics) of predicting each example's label / option by likelihood."""
    task, kind, examples = task_examples(cfg)
    if kind == "classification":
        rows, conts, template = classification_rows(cfg, task, examples, encode, prefix)
        shown = {"verbalizers": dict(zip(map(str, task.label_names), conts))}
    else:
        rows, template = choice_rows(cfg, examples, encode, prefix)
        shown = {"option": cfg.option}
    k = len(rows) // len(examples)
    scored = score_continuations(model, rows, window, batch_size, device)
    loglik = np.array([s.loglik for s in scored]).reshape(-1, k)
    tokens = np.array([s.tokens for s in scored]).reshape(-1, k)
    by = {"sum": loglik, "mean": loglik / tokens}
    chosen = cfg.score or ("sum" if kind == "classification" else "mean")
    labels = np.array([e.label for e in examples], dtype=np.int64)
    preds = by[chosen].argmax(1)
    res = {"task": task.name, "kind": kind, "split": cfg.split, "examples": len(examples), "score": chosen,
           **task.score(preds, labels), **{f"accuracy_{m}": float((v.argmax(1) == labels).mean()) for m, v in by.items()},
           "prompt": template, **shown}
    res["predictions"] = [{"id": e.id, "label": int(y), "prediction": int(p), "loglik": [float(x) for x in ll],
                           "tokens": [int(t) for t in n]}
                          for e, y, p, ll, n in zip(examples, labels, preds, loglik, tokens)]
    return res


# ---------------------------------------------------------------- LAMBADA-style last words


def score_lambada(model, encode, prefix, cfg: ZeroShotConfig, window: int, batch_size: int, device) -> dict:
    """Last-word accuracy (greedy: every token of the word the argmax) and the perplexity of the last words."""
    from plmcli.data.text import iter_text_lines

    if not cfg.data:
        raise PlmError("lambada needs its text file", "pass --data FILE (one passage a line; its last word is predicted)")
    passages, rows = [], []
    for n, line in enumerate(iter_text_lines([cfg.data]), 1):
        text = line.strip()
        if not text:
            continue
        context, _, word = text.rpartition(" ")
        if not context.strip():
            raise PlmError(f"{cfg.data} line {n}: a single word, nothing to predict it from",
                           "give one passage a line; its last word (after the last space) is predicted")
        passages.append({"line": n, "word": word})
        rows.append((prefix + encode(context.rstrip()), encode(" " + word)))
        if cfg.max_examples and len(rows) == cfg.max_examples:
            break
    if not rows:
        raise PlmError(f"{cfg.data} holds no passages", "give one passage a line")
    scored = score_continuations(model, rows, window, batch_size, device)
    for p, s in zip(passages, scored):
        p.update(loglik=s.loglik, tokens=s.tokens, correct=s.greedy)
    return {"task": LAMBADA, "kind": LAMBADA, "data": cfg.data, "examples": len(rows),
            "accuracy": float(np.mean([s.greedy for s in scored])),
            "ppl": math.exp(-sum(s.loglik for s in scored) / len(scored)),
            "tokens": int(sum(s.tokens for s in scored)), "predictions": passages}


# ---------------------------------------------------------------- the command


def zero_shot(run: str | None, cfg: ZeroShotConfig, max_length: int | None = None, batch_size: int = 8,
              device=None) -> dict:
    """Score cfg.task with the causal LM of `run` (None: runs/latest), nothing finetuned. The result: the
    metrics, what was asked (prompt, verbalizers / option, score) and `predictions`, one per example."""
    from plmcli.eval.perplexity import start_role, start_token, window_length
    from plmcli.models.base import traits_of
    from plmcli.models.registry import model_class
    from plmcli.runs import load_run_at, resolve_run, run_config, run_label

    check_option("--batch-size", batch_size, Range(1), "e.g. --batch-size 8")
    if max_length is not None and max_length < 1:  # before the run is loaded: its positions bound it from above
        raise PlmError(f"--max-length {max_length} must be ≥ 1", "e.g. --max-length 128, or leave it out for the "
                       "run's training seq_len")
    path = resolve_run(run, "RUN")
    run_cfg = run_config(path)
    family = run_cfg["family"]
    traits = traits_of(model_class(family))
    if not traits.causal or traits.stateful:  # before loading the weights
        raise PlmError(f"zero-shot scoring needs a causal LM that reads whole sequences, and run {run_label(run, path)} is a "
                       f"{family} model", "pass a gpt run (plm pretrain --recipe gpt-mini)")
    model, tok, _ = load_run_at(path, run_cfg, run, "RUN", "score a task zero-shot")
    check_model(model)
    positions = model.max_positions
    window, why = window_length(max_length, positions, run_cfg.get("seq_len"))
    if not 1 <= window <= positions:
        raise PlmError(f"--max-length {window} is outside 1..{positions} (the model's positions)",
                       f"use --max-length ≤ {positions}")
    start = start_role(run_cfg)
    prefix = [start_token(run_cfg)] if start else []
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    if cfg.score == "generate":
        from plmcli.eval.zero_shot_generate import score_generated

        window, why = positions, "the model's positions: generation crops the prompt as plm generate does"
        res = score_generated((model, tok, run_cfg), cfg, batch_size, device)
    else:
        scorer = score_lambada if cfg.task.lower() == LAMBADA else score_task
        res = scorer(model, encode, prefix, cfg, window, batch_size, device)
    res.update(run=run_label(run, path), window=window, window_from=why,
               first_token=f"after {start}" if start else "after the prompt's first token (no bos/eos)",
               config={k: v for k, v in asdict(cfg).items() if v not in (None, {}, "")
                       and (cfg.score == "generate" or k not in GENERATE_KEYS)})
    return res
