"""Recipes: plain YAML validated into typed dataclasses, with `--set section.key=value` overrides.

A recipe has six sections. `model` and `objective` are validated against the dataclass that the
registry names for the chosen family / objective, so a GPT recipe cannot carry a BERT-only key.
`extends: other-recipe` starts from another recipe and overrides it key by key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml

from plmcli.config_sections import (Count, DataConfig, Divides, FinetuneGridConfig, FinetuneModelConfig,
                                    FinetuneOptimConfig, FinetuneTaskConfig, FinetuneTrainConfig, Folded, Fraction,
                                    MixedPrecision, NonNegative, OptimizerName, Positive, Probability, Rule,
                                    ScheduleName, Seed, Size, TaskOptions, TokenizerConfig, Workers)
from plmcli.errors import PlmError

# libyaml's loader builds the same values ten times faster: `plm recipes` reads every shipped recipe.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class TrainConfig:
    seq_len: Size = 128
    """Tokens per training sequence (at most the model's max_positions)."""
    global_batch_size: Size = 32
    """Sequences per optimizer step, over all processes; accumulation = global / (micro × world)."""
    micro_batch_size: Count = 0
    """Sequences per forward pass on one device; 0 = the whole global batch (no accumulation)."""
    max_steps: Size = 1000
    """Optimizer steps; also the horizon of the learning-rate schedule."""
    max_tokens: Optional[Size] = None
    """Stop after this many training tokens (whichever of max_steps / max_tokens comes first)."""
    time_budget: Optional[Positive] = None
    """Stop after this many seconds of wall time (a checkpoint is written)."""
    mixed_precision: MixedPrecision = "auto"
    """auto | no | bf16 | fp16. auto: bf16 on a GPU that has it, fp16 (with loss scaling) on one that does not
    (V100, T4), fp32 on a CPU."""
    tf32: bool = True
    """GPUs: let fp32 matmuls and convolutions use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation;
    several times the plain fp32 rate on A100 / H100). false: exact fp32."""
    grad_clip: NonNegative = 1.0
    """Clip the global gradient norm to this; 0 disables."""
    max_nonfinite_steps: Size = 10
    """Stop after this many optimizer steps in a row with a non-finite loss (or gradient norm, when clipping;
    under fp16, an overflow its loss scaler skipped). Each is skipped (no update; the schedule moves on) but
    counts as a step: its data is consumed."""
    min_loss_scale: Positive = 1.0
    """fp16: stop when the dynamic loss scale falls below this (below 1 the gradients overflow fp16 even
    unscaled: the run is diverging, and every further step would be skipped)."""
    eval_every: Count = 200
    """Evaluate on the validation split every N steps (and at the end); 0 = only at the end."""
    eval_batches: Count = 50
    """Validation batches per evaluation, of micro_batch_size sequences (global_batch_size when that is 0),
    whatever the number of processes; 0 = the whole split."""
    save_every: Count = 1000
    """Write a resumable checkpoint every N steps (and at the end); 0 = only at the end."""
    save_every_minutes: Optional[Positive] = None
    """Also write one when this many minutes of training passed since the last (a preempted or crashed job
    loses at most that much); the step-based interval still applies."""
    keep_checkpoints: Size = 2
    """How many recent checkpoints to keep."""
    log_every: Size = 10
    """Log loss / lr / throughput every N steps."""
    seed: Seed = 1337
    """Seeds model init, data order, masking and dropout."""
    num_workers: Workers = "auto"
    """DataLoader worker processes that build the training batches. auto: none on a CPU-only run (the model
    needs the cores); with an accelerator, the cores this process may use shared among the node's processes,
    less one for the training process itself, at most 8 and at least 1."""
    compile: bool = False
    """torch.compile the model (GPU runs)."""
    activation_checkpointing: bool = False
    """Keep only each Transformer block's input for backward and recompute the block's activations there (one
    more forward: ~1/3 more compute per step): a large model, a long seq_len or a bigger micro_batch_size then
    fits in GPU memory. Turn it on when a step runs out of memory; the gradients are the same."""
    dist_timeout: Size = 1800
    """Multi-process runs: seconds a training collective waits for the other processes before the job fails
    (a dead node). Waiting while the main process prepares the data has its own 24-hour limit."""


@dataclass
class OptimConfig:
    name: Annotated[OptimizerName, Folded()] = "adamw"
    """adamw | adam | lamb | sgd."""
    lr: Positive = 3e-4
    """Peak learning rate."""
    weight_decay: NonNegative = 0.01
    """Decoupled weight decay on matrices (never on biases or norm weights)."""
    betas: Annotated[list, Rule(lambda b, _: len(b) == 2 and all(0 <= x < 1 for x in b),
                                "must be two moment decay rates in [0, 1)")] = field(default_factory=lambda: [0.9, 0.999])
    """Adam / LAMB moment decay rates."""
    eps: Positive = 1e-8
    """Adam / LAMB denominator epsilon."""
    momentum: Probability = 0.0
    """SGD momentum."""
    schedule: Annotated[ScheduleName, Folded()] = "linear"
    """linear | cosine | constant | inverse-sqrt | polynomial | step."""
    warmup_steps: Count = 0
    """Linear warmup steps."""
    min_lr_ratio: Fraction = 0.0
    """The decayed learning rate as a fraction of lr."""
    power: Positive = 1.0
    """Exponent of the polynomial schedule."""
    decay_factor: Positive = 0.5
    """step schedule: multiply the lr by this every `decay_every` steps (Zaremba et al.: 0.5 per epoch)."""
    decay_every: Size = 1000
    """step schedule: steps between two decays."""
    decay_start: Count = 0
    """step schedule: the first decay happens after this many steps."""


SECTIONS = ("model", "tokenizer", "data", "objective", "train", "optim")
TOP_KEYS = ("name", "description", "extends", "phases") + SECTIONS
PHASE_KEYS = ("name", "max_steps", "set")


@dataclass
class Recipe:
    name: str
    description: str
    family: str
    objective_name: str
    model: Any
    tokenizer: TokenizerConfig
    data: DataConfig
    objective: Any
    train: TrainConfig
    optim: OptimConfig
    phases: list = field(default_factory=list)
    """Training phases run in order, each continuing the previous weights with a fresh optimizer and
    schedule (BERT's seq-128 then seq-512): dicts {name, max_steps, set: {section.key: value}}."""
    raw: dict = field(default_factory=dict, repr=False)
    cli: dict = field(default_factory=dict, repr=False)

    def phase(self, i: int) -> "Recipe":
        """The recipe of phase i: the base with that phase's overrides and max_steps."""
        ph = self.phases[i]
        over = parse_overrides([f"{k}={_yaml_scalar(v)}" for k, v in (ph.get("set") or {}).items()])
        over = _merge(over, {"train": {"max_steps": ph["max_steps"]}})
        base = {k: v for k, v in self.raw.items() if k != "phases"}
        # --set beats the phase's own settings, so a smoke test can shrink every phase at once.
        return _from_raw(_merge(_merge(base, over), self.cli))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            **({"phases": self.phases} if self.phases else {}),
            **{s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS},
        } | {
            "model": {"family": self.family, **dataclasses.asdict(self.model)},
            "objective": {"name": self.objective_name, **dataclasses.asdict(self.objective)},
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------- loading


def recipe_dir():
    return resources.files("plmcli") / "recipes"


def shipped_recipes() -> list[str]:
    return sorted(p.name[:-5] for p in recipe_dir().iterdir() if p.name.endswith(".yaml"))


def _read_raw(name_or_path: str, seen: tuple = (), folder: Path | None = None) -> dict:
    """A recipe's YAML with its `extends` chain merged in. A recipe file's `extends` path is looked up from that
    file's own folder (as the file means it), wherever plm runs; `seen` holds the chain so far (each file by its
    resolved path, so ./c.yaml and c.yaml are one recipe)."""
    path = Path(name_or_path)
    if folder is not None and not path.is_absolute() and (name_or_path.endswith((".yaml", ".yml"))
                                                          or (folder / path).is_file()):
        path = folder / path
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise PlmError(f"recipe file '{path}' does not exist", "check the path, or name a shipped recipe (plm recipes)")
        text, label, key = path.read_text(encoding="utf-8"), str(path), str(path.resolve())
    else:
        res = recipe_dir() / f"{name_or_path}.yaml"
        if not res.is_file():
            close = difflib.get_close_matches(name_or_path, shipped_recipes(), n=4, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "run `plm recipes` to list them, or pass a .yaml path"
            raise PlmError(f"unknown recipe '{name_or_path}'", hint)
        text, label, key = res.read_text(encoding="utf-8"), name_or_path, name_or_path
    if key in [k for k, _ in seen]:
        chain = " → ".join([lbl for _, lbl in seen] + [label])
        raise PlmError(f"recipe {seen[0][1]} extends itself ({chain})", "break the cycle of `extends`")
    raw = _yaml_mapping(text, f"recipe {label}", SECTIONS)
    _reject_unknown(raw, TOP_KEYS, "recipe")
    raw.setdefault("name", path.stem if label == str(path) else name_or_path)
    base = raw.pop("extends", None)
    if base:
        if not isinstance(base, str):
            raise PlmError(f"recipe {label}: extends must name one recipe or .yaml file, not {base!r}",
                           "e.g. extends: bert-mini")
        parent = _read_raw(base, seen + ((key, label),), path.parent if label == str(path) else None)
        parent.pop("description", None)
        raw = _merge(parent, raw)
    return raw


def _yaml_mapping(text: str, label: str, sections) -> dict:
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as e:
        raise PlmError(f"{label} is not valid YAML ({str(e).splitlines()[0]})", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise PlmError(f"{label} must be a mapping of sections", f"use the sections {', '.join(sections)}")
    return raw


def raw_recipe(name_or_path: str) -> dict:
    """The recipe as its YAML says, `extends` resolved, not validated against the family's Config
    (which would import the model module, and with it torch): enough to list a recipe."""
    return _read_raw(name_or_path)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "special_tokens":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _reject_unknown(raw: dict, allowed, where: str) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(allowed)}"
            raise PlmError(f"unknown key '{key}' in {where}", hint)


def parse_overrides(items: list[str] | None) -> dict:
    """`section.key=value` strings into a nested dict; values parsed as YAML scalars."""
    out: dict = {}
    for item in items or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise PlmError(f"--set '{item}' is not of the form section.key=value", "e.g. --set train.max_steps=500")
        key, value = item.split("=", 1)
        try:
            parsed = yaml.safe_load(value) if value != "" else None
        except yaml.YAMLError:
            parsed = value
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parsed
    return out


def load_recipe(name_or_path: str, overrides: list[str] | dict | None = None) -> Recipe:
    raw = _read_raw(name_or_path)
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    _reject_unknown(over, SECTIONS + ("name", "description"), "--set")
    recipe = _from_raw(_merge(raw, over))
    recipe.raw, recipe.cli = raw, over
    for i in range(len(recipe.phases)):  # every phase must resolve now, not hours into a run
        recipe.phase(i)
    return recipe


def _yaml_scalar(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...").strip()


def _check_phases(phases, label) -> list:
    if not isinstance(phases, list) or not phases:
        raise PlmError(f"recipe {label}: phases must be a non-empty list", "write phases: [{name: p1, max_steps: N, set: {...}}, ...]")
    for i, ph in enumerate(phases):
        if not isinstance(ph, dict):
            raise PlmError(f"recipe {label}: phase {i + 1} is not a mapping", "write {name: ..., max_steps: N, set: {...}}")
        _reject_unknown(ph, PHASE_KEYS, f"phase {i + 1}")
        if not isinstance(ph.get("max_steps"), int) or ph["max_steps"] < 1:
            raise PlmError(f"recipe {label}: phase {i + 1} needs max_steps ≥ 1", "add max_steps: N to the phase")
        ph.setdefault("name", f"phase{i + 1}")
        if not isinstance(ph.get("set") or {}, dict):
            raise PlmError(f"recipe {label}: phase {ph['name']} set must map section.key to values", "e.g. set: {train.seq_len: 512}")
    return phases


def _from_raw(raw: dict) -> Recipe:
    from plmcli.models.registry import model_config_class
    from plmcli.objectives.registry import objective_config_class

    model_raw = dict(raw.get("model") or {})
    family = model_raw.pop("family", None)
    if not family:
        raise PlmError(f"recipe {raw['name']} has no model.family", "set model.family, e.g. gpt")
    obj_raw = dict(raw.get("objective") or {})
    obj_name = obj_raw.pop("name", None)
    if not obj_name:
        raise PlmError(f"recipe {raw['name']} has no objective.name", "set objective.name, e.g. clm")
    model_cfg = build_section(model_config_class(family), model_raw, "model")
    obj_cfg = build_section(objective_config_class(obj_name), obj_raw, "objective")
    recipe = Recipe(
        name=str(raw["name"]),
        description=str(raw.get("description") or ""),
        family=family,
        objective_name=obj_name,
        model=model_cfg,
        tokenizer=build_section(TokenizerConfig, raw.get("tokenizer") or {}, "tokenizer"),
        data=build_section(DataConfig, raw.get("data") or {}, "data"),
        objective=obj_cfg,
        train=build_section(TrainConfig, raw.get("train") or {}, "train"),
        optim=build_section(OptimConfig, raw.get("optim") or {}, "optim"),
        phases=_check_phases(raw["phases"], raw["name"]) if raw.get("phases") is not None else [],
        raw=raw,
    )
    _check_recipe(recipe)
    return recipe


def _check_recipe(r: Recipe) -> None:
    """What no single field's type can say: the fields' own ranges were checked as they were built."""
    t = r.train
    if t.micro_batch_size and t.global_batch_size % t.micro_batch_size:
        raise PlmError(
            f"train.global_batch_size {t.global_batch_size} is not a multiple of train.micro_batch_size {t.micro_batch_size}",
            "pick a micro batch that divides the global batch",
        )


# ---------------------------------------------------------------- finetuning


FINETUNE_SECTIONS = ("task", "model", "train", "optim", "grid")


@dataclass
class LoopRecipe:
    """What THE loop (plmcli.train.loop) reads of a recipe: its train and optim sections. A finetune builds
    one from its FinetuneConfig; a pretraining Recipe is read the same way."""

    train: TrainConfig
    optim: OptimConfig


@dataclass
class FinetuneConfig:
    """`plm finetune`'s settings: the task, the run it starts from, the training and the optimizer.

    Loaded from YAML (`--config FILE`) with `--set section.key=value` overrides by `load_finetune_config`;
    every flag of `plm finetune` sets one of these keys."""

    task: FinetuneTaskConfig = field(default_factory=FinetuneTaskConfig)
    model: FinetuneModelConfig = field(default_factory=FinetuneModelConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    optim: FinetuneOptimConfig = field(default_factory=FinetuneOptimConfig)
    grid: FinetuneGridConfig = field(default_factory=FinetuneGridConfig)
    """Several finetunes in one command, the best dev one kept (plmcli.pipelines.finetune_grid)."""

    def task_options(self) -> TaskOptions:
        """The part of the task section the task itself reads (a finetuned run's config.json keeps it)."""
        return TaskOptions(**{f.name: getattr(self.task, f.name) for f in dataclasses.fields(TaskOptions)})

    def to_dict(self) -> dict:
        task = dataclasses.asdict(self.task)
        first = {k: task.pop(k) for k in ("name", "data_dir", "max_seq_len")}  # what a reader looks for first
        out = {"task": first | task, **{s: dataclasses.asdict(getattr(self, s)) for s in FINETUNE_SECTIONS[1:]}}
        if self.grid == FinetuneGridConfig():  # one finetune's config reads as it did before grids
            del out["grid"]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


def load_finetune_config(path: str | None = None, overrides: list[str] | dict | None = None,
                         flags: dict | None = None) -> FinetuneConfig:
    """A FinetuneConfig from the YAML file `path` (None: the defaults), with `overrides` on top
    (`section.key=value` strings, --set, or a nested dict) and `flags` (a nested dict, what plm finetune's
    flags set) on top of those. Unknown keys, values of the wrong type and choices outside a Literal are
    one-line PlmErrors here, before anything runs."""
    raw = _read_finetune_file(path) if path else {}
    over = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    _reject_unknown(over, FINETUNE_SECTIONS, "--set")
    merged = _merge(_merge(raw, over), flags or {})
    cfg = FinetuneConfig(**{s: build_section(cls, merged.get(s) or {}, s) for s, cls in (
        ("task", FinetuneTaskConfig), ("model", FinetuneModelConfig), ("train", FinetuneTrainConfig),
        ("optim", FinetuneOptimConfig), ("grid", FinetuneGridConfig))})
    t = cfg.train
    if t.micro_batch_size and t.batch_size % t.micro_batch_size:
        raise PlmError(f"train.batch_size {t.batch_size} is not a multiple of train.micro_batch_size {t.micro_batch_size}",
                       "pick a micro batch that divides the batch")
    return cfg


def _read_finetune_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise PlmError(f"finetune config '{path}' does not exist",
                       "check the path; a finished finetune writes its own as OUT/finetune.yaml")
    raw = _yaml_mapping(p.read_text(encoding="utf-8"), f"finetune config {path}", FINETUNE_SECTIONS)
    _reject_unknown(raw, FINETUNE_SECTIONS, "finetune config")
    return raw


# ------------------------------------------------------------- typing


def build_section(cls, raw: dict, where: str):
    if not isinstance(raw, dict):
        raise PlmError(f"section '{where}' must be a mapping", f"write {where}: followed by key: value lines")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    _reject_unknown(raw, list(fields), where)
    hints = typing.get_type_hints(cls, include_extras=True)
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in raw.items()}
    _check_values(fields, hints, kwargs, where)
    return cls(**kwargs)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _check_values(fields: dict, hints: dict, kwargs: dict, where: str) -> None:
    """Every field against what its type declares (config_sections: Literal, Range, Divides, Rule), defaults
    included, so a recipe fails at load and never hours into a run. Cross-field checks come last: they
    read fields that must already be valid."""
    values = {k: kwargs[k] if k in kwargs else _default(f) for k, f in fields.items()}
    checks = [(k, c) for k in fields for c in _constraints(hints[k])]
    for k, c in sorted(checks, key=lambda kc: isinstance(kc[1], (Divides, Rule))):
        v = values[k]
        if v is None or c.holds(v, values):
            continue
        default = _default(fields[k])
        key = f"{where}.{k}"
        if isinstance(c, Rule):
            hint = c.hint or (f"e.g. --set {key}={_yaml_scalar(default)}" if c.holds(default, values) else f"change {key}")
            raise PlmError(f"{key} {v} {c.says.format(where=where, **values)}", hint.format(where=where, **values))
        if isinstance(c, tuple):  # the choices of a Literal
            raise PlmError(f"{key} {v!r} is not one of {', '.join(map(str, c.choices))}", f"e.g. --set {key}={c.choices[0]}")
        if isinstance(c, Divides):
            total = values[c.other]
            fit = max(n for n in range(1, min(v, total) + 1) if total % n == 0)
            raise PlmError(f"{where}.{c.other} {total} is not divisible by {key} {v}",
                           f"pick {k} dividing {c.other}, e.g. --set {key}={fit}")
        raise PlmError(f"{key} {v} must be {c}", f"e.g. --set {key}={_example(c, default, values)}")


def check_value(cls, name: str, value, label: str) -> None:
    """One field's `value` against what its type declares (its own checks: the cross-field rules need the whole
    section), the error naming `label` as the user typed it (a flag: `--epochs 0 is out of range: must be ≥ 1`).
    A flag and its config key are one declaration: the field."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    tp = typing.get_type_hints(cls, include_extras=True)[name]
    v = _coerce(value, tp, label)
    for c in _constraints(tp):
        if v is None or isinstance(c, (Divides, Rule)) or c.holds(v, {}):
            continue
        default = _default(f)
        if isinstance(c, _Choices):
            raise PlmError(f"{label} {value!r} is not one of {', '.join(map(str, c.choices))}",
                           f"use {label} {default if default in c.choices else c.choices[0]}")
        raise PlmError(f"{label} {value} is out of range: must be {c}",  # as typed: -1, not the float -1.0
                       f"e.g. {label} {_yaml_scalar(_example(c, default, {}))}" + (", or leave it out" if default is None else ""))


def _example(c, default, values: dict):
    """A value for a hint: the field's default where it meets the check `c`, else one inside its Range."""
    return default if default is not None and c.holds(default, values) else _inside(c)


def _inside(r) -> float:
    """A value within the Range `r`, for a hint when the field's default is not one (None)."""
    if not r.lo_open:
        return r.lo
    return (r.lo + r.hi) / 2 if r.hi is not None else r.lo + 1


class _Choices(tuple):
    """A Literal's values as a check: the value must be one of them."""

    @property
    def choices(self):
        return tuple(self)

    def holds(self, v, values: dict) -> bool:
        return v in self


def _constraints(tp) -> list:
    """The checks a field's type declares: Annotated metadata and Literal choices, through Optional."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [c for a in typing.get_args(tp) if a is not type(None) for c in _constraints(a)]
    if origin is Annotated:
        return [*_constraints(tp.__origin__), *(m for m in tp.__metadata__ if hasattr(m, "holds"))]
    if origin is Literal:
        return [_Choices(typing.get_args(tp))]
    return []


def _coerce(value, tp, where: str):
    origin = typing.get_origin(tp)
    if origin is Annotated:  # the constraints are checked once every field is built
        if any(isinstance(m, Folded) for m in tp.__metadata__) and isinstance(value, str):
            folded = value.strip().lower()
            value = folded if folded in typing.get_args(tp.__origin__) else value  # else the error shows it as written
        return _coerce(value, tp.__origin__, where)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and str(value).lower() not in choices:  # YAML 1.1 reads no / off / yes as booleans
            value = next((c for c in choices if c in (("yes", "on", "true") if value else ("no", "off", "false"))), value)
        return _coerce(value, type(choices[0]), where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        refused = []
        for arm in args:  # the first type that takes the value (a count, else the word auto)
            try:
                return _coerce(value, arm, where)
            except PlmError as e:
                refused.append(e)
        raise refused[0]
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(where, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _type_error(where, value, "an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise _type_error(where, value, "a number")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(where, value, "a string")
    if tp is list or origin is list:
        item = typing.get_args(tp)  # list[float]: each item coerced as a float field is; a lone value, a list of one
        if item:
            items = value if isinstance(value, (list, tuple)) else [value]
            return [_coerce(v, item[0], where) for v in items]
        if isinstance(value, (list, tuple)):
            return list(value)
        raise _type_error(where, value, "a list, e.g. [0.9, 0.999]")
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise _type_error(where, value, "a mapping")
    return value


def _type_error(where, value, want) -> PlmError:
    return PlmError(f"{where} = {value!r} is not {want}", f"e.g. --set {where}=<{want.split(',')[0]}>")


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a config dataclass (the string literal after each field)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
            docs[a.target.id] = str(b.value.value)
    return docs
