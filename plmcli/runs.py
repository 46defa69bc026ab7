"""Reading a run directory: the one place that decides whether a run is complete, intact and of the
kind a command needs, so eval-ppl, finetune --from, generate and export refuse a damaged or unfinished
run with the same one-line error instead of a traceback.

A caller names how its user passes a run (`usage`: "--model RUN", "--from RUN", "plm generate RUN", ...),
and every hint is written with it: each command takes its run differently.
"""

from __future__ import annotations

import json
from pathlib import Path

from plmcli.errors import PlmError

RUN_CONFIG = "config.json"
WEIGHTS = "model.safetensors"
FINISHED_FINETUNE = "metrics.json"
"""Written last by `plm finetune` (atomically): a finetuned run without it was interrupted or killed."""


def _label(run: str | None, path: Path) -> str:
    return str(run) if run else f"runs/latest ({path.resolve().name})"


def _pass(usage: str, path="RUN") -> str:
    """The caller's way to pass a run (a flag, or the command with a positional RUN), with `path` in place of RUN."""
    text = usage.replace("RUN", str(path))
    return text if usage.startswith("-") else f"`{text}`"


def resolve_run(run: str | None, usage: str = "--model RUN") -> Path:
    """The directory of a finished run (None: runs/latest) whose config.json is sound; PlmError otherwise."""
    from plmcli.train.checkpoint import runs_root

    path = Path(run) if run else runs_root() / "latest"
    if not (path / RUN_CONFIG).is_file():
        if run is None:
            raise PlmError("no run given and runs/latest does not exist",
                           f"pass {_pass(usage)} (a directory `plm pretrain` wrote), or train one with `plm pretrain`")
        raise PlmError(f"{path} is not a plm run directory (no {RUN_CONFIG})",
                       f"pass {_pass(usage)} with RUN the directory `plm pretrain` wrote")
    cfg = run_config(path)
    label = _label(run, path)
    if cfg.get("finetune") and not (path / FINISHED_FINETUNE).is_file():
        raise PlmError(f"{label} is an unfinished finetune (no {FINISHED_FINETUNE}: it was interrupted or killed)",
                       "run the finetune again")
    if not any(path.glob("model.*")):
        raise PlmError(f"run {label} has no {WEIGHTS} yet",
                       f"let the run finish, or resume it with `plm pretrain --resume --out {path}`")
    return path


def run_config(path: Path) -> dict:
    """RUN/config.json, checked: a JSON object naming a known family whose model section is valid."""
    from plmcli.config import build_section
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
    raise PlmError(f"run {_label(run, path)} is finetuned on {ft.get('task')} (its weights are a task model, "
                   "not a language model)", instead)


def build_run_model(path: Path, cfg: dict):
    """The run's model, freshly initialised from its (checked) config.json."""
    from plmcli.config import build_section
    from plmcli.models.registry import build_model, model_config_class

    model_cfg = build_section(model_config_class(cfg["family"]), cfg["model"], "model")
    try:
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
    model = build_run_model(path, cfg)
    if hasattr(model, "load_run_weights"):  # state whose shapes depend on the data (n-gram count tables)
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
        return load_tokenizer(Path(path) / "tokenizer.json")
    except PlmError as e:
        raise PlmError(e.message, _rewrite_hint(path, cfg)) from e


def load_run(run: str | None, usage: str = "--model RUN", doing: str = "use it"):
    """(model in eval mode, tokenizer, run config) of a finished language-model run."""
    path = resolve_run(run, usage)
    cfg = run_config(path)
    refuse_task_model(path, cfg, run, usage, doing)
    model = load_run_model(path, cfg)
    return model, load_run_tokenizer(path, cfg), cfg


def _rewrite_hint(path: Path, cfg: dict | None = None) -> str:
    """How to get a sound run back, from what wrote it."""
    path = Path(path)
    cfg = cfg or {}
    if cfg.get("finetune"):
        return "run the finetune again"
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
