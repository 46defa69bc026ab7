"""Every numeric option of every `plm` command, walked with 0 and -1.

Each value is either refused — exit 2, one `error: … — …` line naming the option, no traceback, nothing
written — or declared a value in VALUES below, and then reaches plmcli.api exactly as typed: never read as
"not given" by an `x or default`, never clamped. An option missing from VALUES fails the test, so every new
one gets decided. Nothing is trained or loaded: refusals come before a run is read, and an accepted value is
caught where the command hands it to plmcli.api.
"""

import inspect
import json

import pytest
import typer

from helpers import assert_clean_error, run
from plmcli import api
from plmcli.cli import app
from plmcli.errors import PlmError

# (command, option) -> (what 0 means, what -1 means); None = refused. A value's entry says why it is one.
SEED = "any integer: numpy's streams take it masked to 64 bits, so -1 is a stream of its own"
TORCH_SEED = "torch seeds any 64-bit integer; -1 is a stream of its own"
VALUES = {
    ("tokenize", "--vocab-size"): (None, None),
    ("tokenize", "--min-frequency"): ("every piece may enter the vocabulary (as with 1)", None),
    ("tokenize", "--val-fraction"): ("no validation split (the help says 0 = none)", None),
    ("tokenize", "--num-proc"): (None, None),
    ("make-mlm-data", "--max-seq-len"): (None, None),
    ("make-mlm-data", "--short-seq-prob"): ("every instance has the full target length", None),
    ("make-mlm-data", "--dupe-factor"): (None, None),
    ("make-mlm-data", "--mask-prob"): (None, None),
    ("make-mlm-data", "--max-predictions"): ("no cap (the help says so)", None),
    ("make-mlm-data", "--span-p"): (None, None),
    ("make-mlm-data", "--span-max"): (None, None),
    ("make-mlm-data", "--ngram-start-prob"): (None, None),  # a probability in (0, 1); left out: derived from --mask-prob
    ("make-mlm-data", "--seed"): (SEED, SEED),
    ("make-mlm-data", "--num-proc"): (None, None),
    ("pretrain", "--max-steps"): (None, None),
    ("pretrain", "--max-tokens"): (None, None),  # 0 once trained every step
    ("pretrain", "--stop-after"): (None, None),
    ("finetune", "--seed"): ("a seed like any other", None),  # -1 once failed in numpy after the run was loaded
    ("finetune", "--seeds"): (None, None),
    ("finetune", "--max-seq-len"): (None, None),
    ("finetune", "--max-steps"): (None, None),
    ("finetune", "--warmup-ratio"): ("no warmup: the peak rate from the first step", None),
    ("finetune", "--weight-decay"): ("no weight decay", None),
    ("finetune", "--dropout"): ("no dropout in the backbone", None),
    ("finetune", "--classifier-dropout"): ("no dropout before the head", None),
    ("finetune", "--doc-stride"): (None, None),
    ("finetune", "--max-query-len"): (None, None),
    ("finetune", "--max-answer-len"): (None, None),
    ("finetune", "--n-best"): (None, None),
    ("finetune", "--aux-lm-weight"): ("the task loss alone (the help says so)", None),
    ("finetune", "--lora-r"): ("no LoRA: the whole model finetunes (the help says 0 = off)", None),
    ("finetune", "--lora-alpha"): (None, None),
    ("finetune", "--lora-dropout"): ("no dropout on the adapters' input", None),
    ("eval-ppl", "--max-length"): (None, None),
    ("eval-ppl", "--stride"): (None, None),
    ("eval-ppl", "--batch-size"): (None, None),
    ("eval-ppl", "--mem-len"): ("no memory: each segment alone (the help says so)", None),
    ("eval-ppl", "--tgt-len"): (None, None),
    ("eval-ppl", "--max-tokens-per-batch"): (None, None),
    ("eval-vectors", "--restrict-vocab"): (None, None),
    ("generate", "--max-new-tokens"): ("nothing generated: an empty output per prompt", None),
    ("generate", "--num-beams"): (None, None),
    ("generate", "--top-k"): ("no top-k filter (the help says so)", None),
    ("generate", "--top-p"): (None, None),
    ("generate", "--temperature"): (None, None),  # 0 is --strategy greedy, which the message names
    ("generate", "--seed"): (TORCH_SEED, TORCH_SEED),
    ("generate", "--length-penalty"): ("beams ranked by total log-probability", "shorter beams favoured"),
    ("generate", "--batch-size"): (None, None),
    ("zero-shot", "--max-examples"): ("every example (the help says 0 = all, as the config's max_examples)", None),
    ("zero-shot", "--shots"): ("no solved examples before the prompt (zero-shot proper)", None),
    ("zero-shot", "--max-length"): (None, None),
    ("zero-shot", "--batch-size"): (None, None),
    ("lm-eval", "--num-fewshot"): ("zero-shot: no examples before each question", None),
    ("lm-eval", "--limit"): (None, None),
    ("lm-eval", "--batch-size"): (None, None),
    ("lm-eval", "--bootstrap-iters"): ("no bootstrapped stderrs (the help says 0: none)", None),
    ("attention", "--max-seq-len"): (None, None),  # 0 was once the default
    ("attention", "--max-lines"): (None, None),
    ("attention", "--batch-size"): (None, None),
    ("probe", "--max-sentences"): (None, None),
    ("probe", "--max-dev-sentences"): (None, None),
    ("probe", "--seed"): ("a seed like any other", None),
    ("probe", "--batch-size"): (None, None),
}

# Decided, not yet done (the command is being changed elsewhere): strict, so the fix makes these fail until removed.
PENDING: dict = {}


def numeric_options():
    """(command, option, python name) of every int or float option of every command, subcommands included."""
    found, todo = [], [([], typer.main.get_command(app))]
    while todo:
        path, command = todo.pop()
        todo += [([*path, name], sub) for name, sub in getattr(command, "commands", {}).items()]
        for p in command.params:
            if p.param_type_name == "option" and _number_type(p) is not None:
                found.append((" ".join(path), p.opts[0], p.name))
    return sorted(found)


def _number_type(param):
    """int or float for a numeric option: a Typer that vendors click keeps its annotation, an older one click's type."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        return descriptor.annotation if descriptor.annotation in (int, float) else None
    name = type(param.type).__name__  # IntParamType, IntRange, FloatParamType, FloatRange
    return int if name.startswith("Int") else float if name.startswith("Float") else None


OPTIONS = numeric_options()


def cases(accepted: bool):
    for command, option, name in OPTIONS:
        for i, value in enumerate((0, -1)):
            meaning = VALUES.get((command, option), (None, None))[i]
            if (meaning is not None) == accepted:
                pending = PENDING.get((command, option, value))
                marks = [pytest.mark.xfail(reason=pending, strict=True)] if pending else []
                yield pytest.param(command, option, name, value, marks=marks, id=f"{command} {option} {value}")


def arguments(command: str, tmp_path):
    """The least a command needs to parse and reach its checks. Every input is missing, so a value that is
    not refused fails on the input instead, naming no option."""
    text, none, out = tmp_path / "none.txt", tmp_path / "none", ["--out", tmp_path / "out"]
    if command == "probe":
        return [stub_run(tmp_path / "stub"), "--task", "pos", "--train", text, "--dev", text, *out]
    return {
        "tokenize": [text, *out],
        "make-mlm-data": [none, *out],
        "pretrain": ["--recipe", "gpt-mini", "--data", text, *out],
        "finetune": ["--task", "sst2", "--from", none, *out],
        "eval-ppl": [text, "--model", none],
        "eval-vectors": [none, "--analogies", text],
        "generate": [none, "--prompt", "x"],
        "zero-shot": [none],
        "lm-eval": [none, "--tasks", "x"],
        "attention": [none, "x", *out],
    }[command]


def stub_run(path):
    """A run as far as its config.json goes, with no weights to load: probe checks its options only after
    reading the run's family."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"family": "gpt", "model": {}, "tokenizer": {}}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_every_numeric_option_is_decided():
    """A new numeric option must say here what its 0 and -1 do; a removed one leaves the table."""
    seen = {(command, option) for command, option, _ in OPTIONS}
    assert seen - set(VALUES) == set(), "decide 0 and -1 for these options in VALUES"
    assert set(VALUES) - seen == set(), "these options are gone: drop them from VALUES"


@pytest.mark.parametrize("command, option, name, value", cases(accepted=False))
def test_refused(command, option, name, value, tmp_path):
    res = run(*command.split(), *arguments(command, tmp_path), option, value)
    assert_clean_error(res, option)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, option, name, value", cases(accepted=True))
def test_accepted_as_typed(command, option, name, value, tmp_path, monkeypatch):
    res = run(*command.split(), *arguments(command, tmp_path), option, value)
    assert_clean_error(res)  # on the missing input, not on the value
    assert option not in res.stderr, res.stderr
    function = getattr(api, command.replace("-", "_"))
    calls = []

    def record(*args, **kwargs):
        calls.append(inspect.signature(function).bind(*args, **kwargs).arguments)
        raise PlmError("stopped by the test", "the options were handed over")

    monkeypatch.setattr(api, function.__name__, record)
    res = run(*command.split(), *arguments(command, tmp_path), option, value)
    assert_clean_error(res, "stopped by the test")
    handed = _handed(calls[0], name)
    assert type(handed) in (int, float) and handed == value, calls[0]


def _handed(arguments: dict, name: str):
    """The value an api function got for the option `name`: its argument, or — for a flag generated from a config
    field (plmcli.cli._common.config_flags names it flag_<section>__<field>) — that key of the config or the
    overrides it was handed."""
    if not name.startswith("flag_"):
        return arguments[name]
    section, field = name.removeprefix("flag_").split("__")
    if "overrides" in arguments:  # pretrain: a recipe name and the override layers over it
        return arguments["overrides"][section][field]
    return getattr(getattr(arguments["config"], section), field)  # finetune: the FinetuneConfig
