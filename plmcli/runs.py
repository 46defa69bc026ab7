"""The run directory: the one module that reads and writes one (its config, tokenizer, language model,
finetuned task model, checkpoints, runs/latest, creation and discard). It decides whether a run is
complete, intact and of the kind a command needs, so eval-ppl, finetune --from, generate and export
refuse a damaged or unfinished run with the same one-line error instead of a traceback.

Its operations are functions of the run's path (and its config.json, once read): the pipelines pass both along,
so an object around them would be a second way to do each thing.

A caller names how its user passes a run (`usage`: "--model RUN", "--from RUN", "plm generate RUN", ...),
and every hint is written with it: each command takes its run differently.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from plmcli.errors import PlmError

RUN_CONFIG = "config.json"
WEIGHTS = "model.safetensors"
FINISHED_FINETUNE = "metrics.json"
"""Written last by `plm finetune` (atomically): a finetuned run without it was interrupted or killed."""
TOKENIZER = "tokenizer.json"
RECIPE = "recipe.yaml"
LOCK = ".lock"
LOOP_STATE = "loop_state.json"
"""Written last into a checkpoint: a checkpoint directory without it is incomplete."""
LATEST = "latest"
FROM = "--from RUN"
"""How finetune takes its run, for the hints."""


# ---------------------------------------------------------------- where runs live


def runs_root() -> Path:
    return Path(os.environ.get("PLM_RUNS", "runs"))


def point_latest(run_dir: Path) -> None:
    """runs/latest -> run_dir, swapped atomically so readers never see a missing link."""
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.relpath(Path(run_dir).resolve(), root.resolve()))
    from plmcli.data.store import atomic_path

    with atomic_path(root / LATEST, root / ".latest.tmp") as tmp:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)


def latest_target() -> str | None:
    """Where runs/latest points now (to point it back there if a new run is discarded)."""
    latest = runs_root() / LATEST
    return os.readlink(latest) if latest.is_symlink() else None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step-*") if (p / LOOP_STATE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def run_label(run: str | None, path: Path) -> str:
    """How messages name a run: as the user passed it, or runs/latest with the run it points at."""
    return str(run) if run else f"runs/latest ({path.resolve().name})"


def _pass(usage: str, path="RUN") -> str:
    """The caller's way to pass a run (a flag, or the command with a positional RUN), with `path` in place of RUN."""
    text = usage.replace("RUN", str(path))
    return text if usage.startswith("-") else f"`{text}`"


def resolve_run(run: str | None, usage: str = "--model RUN") -> Path:
    """The directory of a finished run (None: runs/latest) whose config.json is sound; PlmError otherwise."""
    path = Path(run) if run else runs_root() / LATEST
    if not (path / RUN_CONFIG).is_file():
        if run is None:
            raise PlmError("no run given and runs/latest does not exist",
                           f"pass {_pass(usage)} (a directory `plm pretrain` wrote), or train one with `plm pretrain`")
        raise PlmError(f"{path} is not a plm run directory (no {RUN_CONFIG})",
                       f"pass {_pass(usage)} with RUN the directory `plm pretrain` wrote")
    cfg = run_config(path)
    label = run_label(run, path)
    if cfg.get("finetune") and not (path / FINISHED_FINETUNE).is_file():
        raise PlmError(f"{label} is an unfinished finetune (no {FINISHED_FINETUNE}: it was interrupted or killed)",
                       "run the finetune again")
    if not any(path.glob("model.*")):
        raise PlmError(f"run {label} has no {WEIGHTS} yet",
                       f"let the run finish, or resume it with `plm pretrain --resume --out {path}`")
    return path


def run_config(path: Path) -> dict:
    """RUN/config.json, checked: a JSON object naming a known family whose model section is valid."""
    from plmcli.config_schema import build_section
    from plmcli.models.registry import model_config_class

    file = Path(path) / RUN_CONFIG
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PlmError(f"{file} is damaged (not JSON: {_first_line(e)})", _rewrite_hint(path)) from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("family"), str) or not isinstance(cfg.get("model"), dict):
        raise PlmError(f"{file} is damaged (it needs a 'family' name and a 'model' section)", _rewrite_hint(path))
    try:
        build_section(model_config_class(cfg["family"]), cfg["model"], "model")
    except PlmError as e:
        raise PlmError(f"{file} is damaged ({e.message})", _rewrite_hint(path)) from e
    except (TypeError, ValueError, AssertionError) as e:  # a Config's own checks (__post_init__)
        raise PlmError(f"{file} is damaged (its model section: {_first_line(e)})", _rewrite_hint(path)) from e
    return cfg


def refuse_task_model(path: Path, cfg: dict, run: str | None, usage: str, doing: str) -> None:
    """A finetuned run's weights are a task model (backbone + head), not a language model: name the
    pretrained run it came from, which its config.json records, as what to pass instead."""
    ft = cfg.get("finetune")
    if not ft:
        return
    source = ft.get("from_run")
    instead = f"{doing} with the run it was finetuned from: {_pass(usage, source)}" if source else \
        f"{doing} with the pretrained run it was finetuned from"
    raise PlmError(f"run {run_label(run, path)} is finetuned on {ft.get('task')} (its weights are a task model, "
                   "not a language model)", instead)


def build_run_model(path: Path, cfg: dict, init: bool = True):
    """The run's model from its (checked) config.json: freshly initialised, or with `init=False` left for
    the caller to load every weight into: drawing 110M random numbers takes a bert-base about a second."""
    from contextlib import nullcontext

    from plmcli.config_schema import build_section
    from plmcli.models.registry import build_model, model_config_class
    from plmcli.models.skip_init import NoRandomInit

    model_cfg = build_section(model_config_class(cfg["family"]), cfg["model"], "model")
    try:
        with nullcontext() if init else NoRandomInit():
            return build_model(cfg["family"], model_cfg)
    except PlmError as e:
        raise PlmError(f"{Path(path) / RUN_CONFIG} is damaged ({e.message})", _rewrite_hint(path)) from e
    except (TypeError, ValueError, AssertionError, RuntimeError) as e:
        raise PlmError(f"{Path(path) / RUN_CONFIG} is damaged (its model section cannot be built: {_first_line(e)})",
                       _rewrite_hint(path)) from e


def load_weights(module, path: Path, cfg: dict) -> None:
    """Load RUN/model.safetensors into `module` (strictly), refusing a damaged file or weights that
    hold NaN/inf (a run that diverged): the file is read once, and the loaded tensors it holds checked."""
    import torch
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    file = Path(path) / WEIGHTS
    if not file.is_file():
        raise PlmError(f"run {path} has no {WEIGHTS}", _rewrite_hint(path, cfg))
    try:
        with safe_open(str(file), "pt") as f:  # the header only: which tensors the file holds
            names = list(f.keys())
        load_model(module, str(file))
    except (SafetensorError, OSError) as e:
        raise PlmError(f"{file} is damaged ({_first_line(e)})", _rewrite_hint(path, cfg)) from e
    except (RuntimeError, KeyError) as e:  # readable, but not this config's model: missing / unexpected / shapes
        raise PlmError(f"the weights in {file} do not fit its {RUN_CONFIG} ({_first_line(e)})",
                       _rewrite_hint(path, cfg)) from e
    # Only what the file holds: a module's unsaved buffers (masks) may be -inf by design.
    state = module.state_dict()
    bad = [n for n in names if n in state and state[n].is_floating_point() and not bool(torch.isfinite(state[n]).all())]
    if bad:
        again = "run the finetune again with a lower --lr" if cfg.get("finetune") else \
            "retrain it with a lower learning rate, e.g. --set optim.lr=3e-4"
        raise PlmError(f"the weights of run {path} hold NaN/inf ({len(bad)} tensor{'s' * (len(bad) > 1)}, "
                       f"e.g. {bad[0]}): its training diverged", again)


def load_run_model(path: Path, cfg: dict):
    """The run's model with its weights, in eval mode."""
    from plmcli.models.base import LoadsRunWeights

    model = build_run_model(path, cfg, init=False)  # every weight comes from the run
    if isinstance(model, LoadsRunWeights):  # state whose shapes depend on the data (n-gram count tables)
        try:
            model.load_run_weights(path)
        except PlmError:
            raise
        except Exception as e:  # numpy / zipfile errors of a damaged file, whatever their class
            raise PlmError(f"the weights of run {path} are damaged ({_first_line(e)})", _rewrite_hint(path, cfg)) from e
    else:
        load_weights(model, path, cfg)
    return model.eval()


def load_run_tokenizer(path: Path, cfg: dict | None = None):
    from plmcli.data.tokenizers import load_tokenizer

    try:
        tok = load_tokenizer(Path(path) / TOKENIZER)
    except PlmError as e:
        raise PlmError(e.message, _rewrite_hint(path, cfg)) from e
    # A tokenizer.json swapped for a bigger one would index past the embedding (an IndexError deep in a forward).
    vocab = ((cfg or {}).get("model") or {}).get("vocab_size")
    if isinstance(vocab, int) and 0 < vocab < tok.get_vocab_size():
        raise PlmError(f"run {path}: its tokenizer.json has {tok.get_vocab_size():,} tokens but the model only "
                       f"{vocab:,} (model.vocab_size)", "put back the tokenizer.json the run was trained with")
    return tok


def load_run(run: str | None, usage: str = "--model RUN", doing: str = "use it"):
    """(model in eval mode, tokenizer, run config) of a finished language-model run; a finetuned run is refused
    (its weights are a task model)."""
    path = resolve_run(run, usage)
    return load_run_at(path, run_config(path), run, usage, doing)


def load_run_at(path: Path, cfg: dict, run: str | None, usage: str = "--model RUN", doing: str = "use it"):
    """load_run for a caller that has resolved the run and read its config already (to check its family first)."""
    refuse_task_model(path, cfg, run, usage, doing)
    return load_run_model(path, cfg), load_run_tokenizer(path, cfg), cfg


# ---------------------------------------------------------------- finetuned runs: backbone + task head


def task_objective(task, tok, special_ids: dict, seq_len: int, backbone_cls, classifier_dropout=None):
    """The objective that trains `task` on a backbone of class `backbone_cls` (its declared pair layout
    decides where [CLS] goes; a causal LM's is "causal": GPT's input transforms). Every finetuning
    objective's Config takes task, num_labels and classifier_dropout."""
    from plmcli.objectives.registry import objective_class

    obj_cls = objective_class(task.objective)
    cfg = obj_cls.Config(task=task.name, num_labels=task.num_labels, classifier_dropout=classifier_dropout)
    layout = backbone_cls.traits.pair_layout or "cls_first"
    return obj_cls(cfg, tok, special_ids, seq_len, task=task, layout=layout)


def load_encoder(run: Path, cfg: dict, pretrained: bool = True, seed: int = 0):
    """The run's backbone (encoder, or decoder for GPT-style transfer), with its weights (`pretrained`)
    or freshly initialised under `seed`. A finetuned run holds backbone + task head weights: its
    backbone part is taken.
    """
    import torch

    torch.manual_seed(seed)
    encoder = build_run_model(run, cfg)
    if pretrained:
        target = finetuned_model(run, cfg, None, encoder)[0] if cfg.get("finetune") else encoder
        load_weights(target, run, cfg)
    return encoder


def finetuned_model(run: Path, cfg: dict, tok=None, backbone=None):
    """(task model, objective) of a finetuned run as its config.json describes it: the weights loaded
    unless a `backbone` is given (then the caller loads them into the returned model)."""
    from plmcli.config_sections import TaskOptions
    from plmcli.data.tasks.registry import get_task
    from plmcli.objectives.heads import configure_features

    ft = cfg["finetune"]
    task = get_task(ft["task"], TaskOptions(**ft.get("options", {})))
    task.restore(ft.get("task_state", {}))
    tok = tok or load_run_tokenizer(run, cfg)
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    given = backbone is not None
    if not given:
        backbone = load_encoder(run, {**cfg, "finetune": None}, pretrained=False)
    obj = task_objective(task, tok, special_ids, ft["max_seq_len"], type(backbone), ft.get("classifier_dropout"))
    model = obj.build_model(backbone)
    # the mix / wider head the finetune trained, so its weights load; not frozen again: loaded, it only reads
    configure_features(model, ft.get("features", "last"), elmo_at_output=ft.get("elmo_at_output", False))
    if not given:
        load_weights(model, run, cfg)
        model.eval()
    return model, obj


def load_finetuned(run_dir: str, usage: str = FROM):
    """(task model in eval mode, tokenizer, config) of a `plm finetune` output directory."""
    path = resolve_run(run_dir, usage)
    cfg = run_config(path)
    if not cfg.get("finetune"):
        raise PlmError(f"{path} is not a finetuned run (its config.json has no 'finetune' section)",
                       "pass a directory written by `plm finetune`")
    tok = load_run_tokenizer(path, cfg)
    model, _ = finetuned_model(path, cfg, tok)
    return model, tok, cfg


# ---------------------------------------------------------------- a run being trained


def check_new_run_dir(run_dir: Path, what: str = "run directory",
                      hint: str = "choose another --out, delete it, or add --resume to continue it (a run stopped "
                                  "before its first checkpoint starts again from step 0)") -> None:
    """A new run goes into a missing or empty directory that can be written."""
    from plmcli.data.outdir import check_writable

    if run_dir.exists() and any(run_dir.iterdir()):
        raise PlmError(f"{what} {run_dir} already exists and is not empty", hint)
    check_writable(run_dir)


def trained(run_dir: Path) -> bool:
    """Whether a run directory holds anything of training: a logged step, a checkpoint or weights."""
    metrics = list(run_dir.glob("metrics.jsonl")) + list(run_dir.glob("phases/*/metrics.jsonl"))
    return any(m.stat().st_size for m in metrics) or any(run_dir.glob("**/checkpoints/step-*")) \
        or any(run_dir.glob(f"**/{WEIGHTS}"))


def has_progress(run_dir: Path) -> bool:
    """Whether a run has something to resume from: a complete checkpoint or a finished phase (else, or
    for a fitted run without checkpoints, --resume starts it again from step 0)."""
    subs = [run_dir, *(p for p in run_dir.glob("phases/*") if p.is_dir())]
    return any(list_checkpoints(sub) for sub in subs) or any(run_dir.glob("phases/*/summary.json"))


def clear_progress(run_dir: Path) -> None:
    """What a run wrote while training (logs, partial checkpoints, weights), keeping the files it was made with."""
    keep = {RECIPE, TOKENIZER, RUN_CONFIG, LOCK}
    for child in run_dir.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def discard_run(run_dir: Path, previous_latest: str | None, made_dir: bool) -> None:
    """Remove what this call wrote into run_dir (the directory too if it made it), and point runs/latest
    back where it pointed before."""
    from plmcli.data.outdir import discard

    discard(run_dir, made_dir)
    latest = runs_root() / LATEST
    if latest.is_symlink() and not latest.exists():  # it points at the removed run
        latest.unlink()
        if previous_latest is not None:
            os.symlink(previous_latest, latest, target_is_directory=True)


def load_phase_weights(model, run_dir: Path) -> None:
    """A finished phase's weights (RUN/phases/NAME/model.safetensors), which the next phase continues."""
    from safetensors.torch import load_model

    load_model(model, str(Path(run_dir) / WEIGHTS))


def _rewrite_hint(path: Path, cfg: dict | None = None) -> str:
    """How to get a sound run back, from what wrote it."""
    path = Path(path)
    cfg = cfg or {}
    if cfg.get("finetune"):
        return "run the finetune again"
    hub = cfg["imported_from"].get("hub") if isinstance(cfg.get("imported_from"), dict) else None
    if isinstance(hub, dict) and hub.get("repo_id"):  # a Hugging Face Hub model (plmcli.interop.hub)
        name = hub["repo_id"] + (f"@{hub['revision']}" if hub.get("revision") else "")
        return f"import it again: plm import {name} --out {path} --force"
    if isinstance(cfg.get("imported_from"), dict) and cfg["imported_from"].get("path"):
        return f"import it again: plm import {cfg['imported_from']['path']} --out {path} --force"
    if cfg and any(path.glob("**/checkpoints/step-*")):
        return f"`plm pretrain --resume --out {path}` rewrites it from the run's last checkpoint (or re-run the pretrain)"
    if (path / "recipe.yaml").is_file():
        return f"re-run the pretrain (its recipe: {path / 'recipe.yaml'})"
    return "re-create the run with the command that wrote it (plm pretrain, plm finetune or plm import)"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
