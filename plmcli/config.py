"""Recipes: plain YAML validated into typed dataclasses, with `--set section.key=value` overrides.

A recipe has six sections. `model` and `objective` are validated against the dataclass that the
registry names for the chosen family / objective, so a GPT recipe cannot carry a BERT-only key.
`extends: other-recipe` starts from another recipe and overrides it key by key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Optional

import yaml

from plmcli.config_schema import (Count, Folded, Fraction, NonNegative, Positive, Probability, Rule, Seed, Size, Workers,
                                   build_section, canonical, check_value, field_docs, plain_type, reject_unknown, yaml_scalar)
from plmcli.config_sections import (DataConfig, FinetuneGridConfig, FinetuneLoraConfig, FinetuneModelConfig, FinetuneTaskConfig,
                                     MixedPrecision, OptimizerName, ReportTo, ScheduleName, TaskOptions, TokenizerConfig,
                                     default_trackers)
from plmcli.errors import PlmError

# libyaml's loader builds the same values ten times faster: `plm recipes` reads every shipped recipe.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class TrainConfig:
    """The `train` section, pretraining's and finetuning's: a finetune reads it with FINETUNE_DEFAULTS."""

    seq_len: Size = 128
    """Tokens per training sequence (at most the model's max_positions). Pretraining only: a finetune's
    examples are task.max_seq_len long."""
    global_batch_size: Size = 32
    """Sequences (finetuning: examples) per optimizer step, over all processes; accumulation = global /
    (micro × world). Also read as `batch_size`."""
    micro_batch_size: Count = 0
    """Sequences per forward pass on one device; 0 = the whole global batch (no accumulation)."""
    max_steps: Optional[Size] = 1000
    """Optimizer steps; also the horizon of the learning-rate schedule. Finetuning: none = epochs × the
    steps of an epoch."""
    epochs: Optional[Size] = None
    """Finetuning: epochs; dev is evaluated after each and the best weights are kept. none = by the backbone's
    size: 3 (Devlin et al.) for BERT-base-size models, more for small ones. Pretraining counts max_steps."""
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
    """Evaluate on the validation split every N steps (and at the end); 0 = only at the end (finetuning:
    after every epoch, keeping the best dev weights)."""
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
    log_every: Count = 10
    """Log loss / lr / throughput every N steps; 0 (finetuning) = four times an epoch, at most every 50 steps."""
    seed: Seed = 1337
    """Seeds model init (a finetune's task head), data order, masking and dropout."""
    num_workers: Workers = "auto"
    """DataLoader worker processes that build the training batches. auto: none on a CPU-only run (the model
    needs the cores); with an accelerator, the cores this process may use shared among the node's processes,
    less one for the training process itself, at most 8 and at least 1."""
    compile: bool = False
    """torch.compile the model: on a GPU, faster steps after a first step that compiles for a minute or so."""
    activation_checkpointing: bool = False
    """Keep only each Transformer block's input for backward and recompute the block's activations there (one
    more forward: ~1/3 more compute per step): a large model, a long seq_len or a bigger micro_batch_size then
    fits in GPU memory. Turn it on when a step runs out of memory; the gradients are the same."""
    dist_timeout: Size = 1800
    """Multi-process runs: seconds a training collective waits for the other processes before the job fails
    (a dead node). Waiting while the main process prepares the data has its own 24-hour limit."""
    report_to: Optional[ReportTo] = field(default_factory=default_trackers)
    """Trackers that get every metrics.jsonl row (through accelerate, main process only): tensorboard (events in
    RUN/tb/) | wandb | mlflow | aim, several allowed (tensorboard,mlflow), or none. Default: tensorboard when it is
    installed, else none. The run's name there is its directory's name."""


@dataclass
class OptimConfig:
    name: Annotated[OptimizerName, Folded()] = "adamw"
    """adamw | adam | lamb | sgd."""
    lr: Optional[Positive] = 3e-4
    """Peak learning rate. Finetuning: none = by the backbone's size: 2e-5 (Devlin et al.) for BERT-base-size
    models, higher for small ones (Turc et al. 2019)."""
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
    warmup_ratio: Optional[Probability] = None
    """Warm up over this share of the steps instead of warmup_steps; 0 = no warmup (finetuning's default: 0.1,
    Devlin et al.)."""
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

    def warmup(self, total_steps: int) -> int:
        """Warmup steps of a run of `total_steps`: warmup_ratio's share, else warmup_steps as far as it goes
        (a smoke test's --max-steps 3 keeps the recipe's warmup)."""
        if self.warmup_ratio is not None:
            return int(self.warmup_ratio * total_steps)
        return min(self.warmup_steps, total_steps)


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
        over = parse_overrides([f"{k}={yaml_scalar(v)}" for k, v in (ph.get("set") or {}).items()])
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


def shipped_sample(name: str) -> Path:
    """A sample shipped inside the package (plmcli/corpus/, data/ in the repository: the default corpora,
    glue-sample, lexicons, ...), so it is found after `pip install`, outside the repository."""
    return Path(str(resources.files("plmcli") / "corpus" / name))


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
    reject_unknown(raw, TOP_KEYS, "recipe")
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


def parse_overrides(items: list[str] | dict | None) -> dict:
    """`section.key=value` strings into a nested dict; values parsed as YAML scalars. A dict is nested already, or
    keyed by `section.key` ({"train.epochs": 2}, values as they are)."""
    if isinstance(items, dict):
        out: dict = {}
        for key, value in items.items():
            section, dot, name = str(key).partition(".")
            out = _merge(out, {section: {name: value}} if dot else {key: value})
        return out
    out = {}
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


def override_layers(*layers) -> dict:
    """Override layers (each `section.key=value` strings, a nested dict or a {"section.key": value} dict), later ones
    beating earlier ones key by key: --set, then the flags a command was given."""
    return functools.reduce(_merge, (canonical(parse_overrides(layer)) for layer in layers), {})


def load_recipe(name_or_path: str, overrides: list[str] | dict | None = None) -> Recipe:
    raw = _read_raw(name_or_path)
    over = canonical(parse_overrides(overrides))
    reject_unknown(over, SECTIONS + ("name", "description"), "--set")
    recipe = _from_raw(_merge(raw, over))
    recipe.raw, recipe.cli = raw, over
    for i in range(len(recipe.phases)):  # every phase must resolve now, not hours into a run
        recipe.phase(i)
    return recipe


def _check_phases(phases, label) -> list:
    if not isinstance(phases, list) or not phases:
        raise PlmError(f"recipe {label}: phases must be a non-empty list", "write phases: [{name: p1, max_steps: N, set: {...}}, ...]")
    for i, ph in enumerate(phases):
        if not isinstance(ph, dict):
            raise PlmError(f"recipe {label}: phase {i + 1} is not a mapping", "write {name: ..., max_steps: N, set: {...}}")
        reject_unknown(ph, PHASE_KEYS, f"phase {i + 1}")
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
    """What no single field's type can say (the fields' own ranges were checked as they were built), and what
    pretraining asks of the train and optim sections that a finetune, which shares them, does not."""
    t = r.train
    for key, value, wrong, hint in (("train.max_steps", t.max_steps, t.max_steps is None, "e.g. --set train.max_steps=1000"),
                                    ("optim.lr", r.optim.lr, r.optim.lr is None, "e.g. --set optim.lr=3e-4"),
                                    ("train.epochs", t.epochs, t.epochs is not None, "set train.max_steps instead"),
                                    ("train.log_every", t.log_every, t.log_every == 0, "e.g. --set train.log_every=10")):
        if wrong:
            says = "is finetuning's: pretraining counts steps" if key == "train.epochs" else "must be ≥ 1" if value == 0 \
                else "must be set for pretraining"
            raise PlmError(f"{key} {yaml_scalar(value)} {says}", hint)
    if t.micro_batch_size and t.global_batch_size % t.micro_batch_size:
        raise PlmError(
            f"train.global_batch_size {t.global_batch_size} is not a multiple of train.micro_batch_size {t.micro_batch_size}",
            "pick a micro batch that divides the global batch",
        )


# ---------------------------------------------------------------- finetuning


FINETUNE_SECTIONS = ("task", "model", "lora", "train", "optim", "grid")

FINETUNE_DEFAULTS = {
    "train": {"global_batch_size": 32, "max_steps": None, "eval_every": 0, "eval_batches": 0, "save_every": 0,
              "keep_checkpoints": 1, "log_every": 0, "seed": 42},
    "optim": {"lr": None, "warmup_ratio": 0.1},
}
"""Where a finetune's train and optim sections differ from pretraining's (Devlin et al. 2018 §4.1: dev after every
epoch on the whole dev set, the best weights kept; the lr and epochs chosen from the backbone's size; 10% warmup).
A finetune does not resume, so it keeps no checkpoints."""

FINETUNE_REFUSES = {"train.seq_len": "a finetune's examples are task.max_seq_len long — e.g. --set task.max_seq_len=256"}
"""Keys of the shared sections that mean nothing to a finetune: set, they are refused; they are not written to
OUT/finetune.yaml."""


def _finetune_section(section: str, cls):
    return lambda: cls(**FINETUNE_DEFAULTS[section])


@dataclass
class FinetuneConfig:
    """`plm finetune`'s settings: the task, the run it starts from, the training and the optimizer.

    Loaded from YAML (`--config FILE`) with `--set section.key=value` overrides by `load_finetune_config`;
    every flag of `plm finetune` sets one of these keys. The train and optim sections are pretraining's, with
    FINETUNE_DEFAULTS."""

    task: FinetuneTaskConfig = field(default_factory=FinetuneTaskConfig)
    model: FinetuneModelConfig = field(default_factory=FinetuneModelConfig)
    lora: FinetuneLoraConfig = field(default_factory=FinetuneLoraConfig)
    """LoRA adapters instead of updating the backbone (plmcli.train.lora); r 0 = off."""
    train: TrainConfig = field(default_factory=_finetune_section("train", TrainConfig))
    optim: OptimConfig = field(default_factory=_finetune_section("optim", OptimConfig))
    grid: FinetuneGridConfig = field(default_factory=FinetuneGridConfig)
    """Several finetunes in one command, the best dev one kept (plmcli.pipelines.finetune_grid)."""

    def task_options(self) -> TaskOptions:
        """The part of the task section the task itself reads (a finetuned run's config.json keeps it)."""
        return TaskOptions(**{f.name: getattr(self.task, f.name) for f in dataclasses.fields(TaskOptions)})

    def to_dict(self) -> dict:
        task = dataclasses.asdict(self.task)
        first = {k: task.pop(k) for k in ("name", "data_dir", "max_seq_len")}  # what a reader looks for first
        out = {"task": first | task, **{s: dataclasses.asdict(getattr(self, s)) for s in FINETUNE_SECTIONS[1:]}}
        for key in FINETUNE_REFUSES:
            section, name = key.split(".")
            del out[section][name]
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
    over = parse_overrides(overrides)
    reject_unknown(over, FINETUNE_SECTIONS, "--set")
    layers = [canonical(layer) for layer in (FINETUNE_DEFAULTS, raw, over, flags or {})]
    merged = functools.reduce(_merge, layers)
    for key, hint in FINETUNE_REFUSES.items():
        section, name = key.split(".")
        if any(name in (layer.get(section) or {}) for layer in layers[1:]):
            raise PlmError(f"{key} is not a finetune setting", hint)
    cfg = FinetuneConfig(**{s: build_section(cls, merged.get(s) or {}, s) for s, cls in (
        ("task", FinetuneTaskConfig), ("model", FinetuneModelConfig), ("lora", FinetuneLoraConfig), ("train", TrainConfig),
        ("optim", OptimConfig), ("grid", FinetuneGridConfig))})
    t = cfg.train
    if t.micro_batch_size and t.global_batch_size % t.micro_batch_size:
        raise PlmError(f"train.batch_size {t.global_batch_size} is not a multiple of train.micro_batch_size "
                       f"{t.micro_batch_size}", "pick a micro batch that divides the batch")
    return cfg


def _read_finetune_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise PlmError(f"finetune config '{path}' does not exist",
                       "check the path; a finished finetune writes its own as OUT/finetune.yaml")
    raw = _yaml_mapping(p.read_text(encoding="utf-8"), f"finetune config {path}", FINETUNE_SECTIONS)
    reject_unknown(raw, FINETUNE_SECTIONS, "finetune config")
    return raw


# ---------------------------------------------------------------- flags


@dataclass(frozen=True)
class FlagSpec:
    """What a command-line flag of a config key takes, as its field declares it (plmcli.cli generates the flag)."""

    key: str
    cls: type
    """The section's dataclass."""
    kind: type
    """bool, int, float or str: the value typed after the flag (str for a choice, and for a list)."""
    choices: tuple | None
    axis: str | None
    """The grid key that a comma list of values sets (grid.lr for optim.lr)."""
    help: str
    metavar: str | None = None
    """What --help shows for a value that is a list: N[,N…] (a grid's), A[,B…] (a list field's comma string)."""


def _section_classes(root) -> dict:
    """section -> its dataclass, of the config class `root` (FinetuneConfig, Recipe)."""
    return {k: v for k, v in typing.get_type_hints(root).items() if dataclasses.is_dataclass(v)}


def _axes(root) -> dict:
    """key -> the grid key whose list varies it, in `root`'s sections."""
    out = {}
    for section, cls in _section_classes(root).items():
        for name, tp in typing.get_type_hints(cls, include_extras=True).items():
            axis = plain_type(tp)[2]
            if axis is not None:
                out[axis.key] = f"{section}.{name}"
    return out


def flag_spec(root, key: str) -> FlagSpec:
    """The flag of `key` (section.field of the config class `root`): its type, choices and help, the field's
    docstring with the key it sets and its default (when `root` has defaults: a finetune's; a recipe's are the
    recipe's own)."""
    section, name = key.split(".")
    cls = _section_classes(root)[section]
    kind, choices, _ = plain_type(typing.get_type_hints(cls, include_extras=True)[name])
    axis = _axes(root).get(key)
    part = next(f for f in dataclasses.fields(root) if f.name == section)
    default = getattr(part.default_factory(), name) if part.default_factory is not dataclasses.MISSING else None
    text = " ".join(field_docs(cls).get(name, "").split())
    if axis:
        example = "5e-5,3e-5,2e-5" if kind is float else "2,3,4" if name == "epochs" else "16,32"
        text += f" A comma list ({example}) finetunes each: a grid (= {axis})."
    shown = "" if default in (None, False, [], "") else f"; default {default:g}" if isinstance(default, float) \
        else f"; default {default}"
    metavar = "N[,N…]" if axis else "A[,B…]" if kind is list else None  # a list field's coercion splits a comma string
    return FlagSpec(key, cls, str if axis or choices or kind is list else kind, choices, axis, f"{text} (= {key}{shown})",
                    metavar)


def flag_layer(root, given: dict) -> dict:
    """The override layer (a nested dict, over --set) of the flags given: {key: (value, the flag as typed)}, each
    value checked by its field, the error naming the flag. A key that a grid varies also takes a comma list: several
    values set the grid's list, one value the key itself, emptying the grid's list (a flag beats a config file's
    grid)."""
    layer: dict = {}
    axes = _axes(root)
    for key, (value, label) in given.items():
        spec = flag_spec(root, key)
        values = _flag_values(value, label, spec) if spec.axis else [value]
        for v in values:
            check_value(spec.cls, key.split(".")[1], v, label)
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise PlmError(f"{label} lists {twice} twice", "give each value once")
        sets = {axes[key]: values} if len(values) > 1 else {key: values[0], **({axes[key]: []} if key in axes else {})}
        layer = _merge(layer, parse_overrides(sets))
    return layer


def _flag_values(text, label: str, spec: FlagSpec) -> list:
    """A grid flag's value: one number, or a comma list of them."""
    if not isinstance(text, str):
        return list(text) if isinstance(text, (list, tuple)) else [text]
    item = plain_type(typing.get_type_hints(spec.cls, include_extras=True)[spec.key.split(".")[1]])[0]
    try:
        return [item(x) for x in text.split(",")]
    except ValueError:
        what, example = ("whole numbers", "2,3,4") if item is int else ("numbers", "5e-5,3e-5,2e-5")
        raise PlmError(f"{label} '{text}' is not a number or a comma-separated list of {what}",
                       f"e.g. {label} {example}") from None
