"""Experiment tracking through accelerate's trackers (train.report_to): TensorBoard, Weights & Biases, MLflow and
Aim get every row metrics.jsonl gets (its numbers, under the same names, at its step), from the main process.

The trackers are accelerate's own: `make_accelerator` hands `log_with` to the Accelerator, `start` runs
init_trackers, progress.MetricsLog logs each row and `finish` ends them. TensorBoard writes into RUN/tb/ as plm's
own writer did (accelerate's tracker by name would write RUN/<name>/), so it is given as accelerate's
TensorBoardTracker made for that folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plmcli.errors import PlmError

PACKAGES = {"tensorboard": ("tensorboard", ""), "wandb": ("wandb", ""), "mlflow": ("mlflow", " (or mlflow-skinny)"),
            "aim": ("aim", " (or 'aim<4')")}
"""Tracker -> (the package it needs, another way to install it for the error's hint)."""


def tracker_names(report_to) -> list[str]:
    """train.report_to as tracker names (none, null and [] are no tracker), each one's package checked as accelerate
    checks it (else it would drop the tracker with a warning): a missing one is one PlmError line, before anything
    is built."""
    from accelerate.utils import is_aim_available, is_mlflow_available, is_tensorboard_available, is_wandb_available

    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available, "mlflow": is_mlflow_available,
                 "aim": is_aim_available}
    names = [n for n in report_to or [] if n != "none"]
    for name in names:
        if not available[name]():
            package, other = PACKAGES[name]
            raise PlmError(f"train.report_to {name} needs the {package} package", f"pip install 'plm[trackers]'{other}")
    return names


def log_with(report_to, run_dir) -> list:
    """What Accelerator(log_with=...) takes for train.report_to: the names, tensorboard as a tracker of RUN/tb/;
    None for none (accelerate warns of an empty list)."""
    names = tracker_names(report_to)
    if "tensorboard" not in names:
        return names or None
    from accelerate.tracking import TensorBoardTracker

    return [TensorBoardTracker("tb", str(run_dir)) if n == "tensorboard" else n for n in names]


def settings(recipe) -> dict:
    """The recipe's train and optim settings as one flat dict (train.seq_len: 128) of values every tracker takes:
    numbers, booleans and strings; a list is written comma-separated, an unset (None) setting is left out."""
    flat = {}
    for section in ("train", "optim"):
        for key, value in dataclasses.asdict(getattr(recipe, section)).items():
            if isinstance(value, (list, tuple)):
                value = ",".join(map(str, value))
            if value is not None:
                flat[f"{section}.{key}"] = value
    return flat


def start(accelerator, run_dir, recipe) -> None:
    """init_trackers: the project and the run named after the run directory, the recipe's settings as its config."""
    if not accelerator.log_with:
        return
    name = Path(run_dir).resolve().name
    accelerator.init_trackers(name, config=settings(recipe),
                              init_kwargs={"mlflow": {"run_name": name}, "wandb": {"name": name, "dir": str(run_dir)}})


def numbers(row: dict) -> dict:
    """What a tracker logs of a metrics.jsonl row: its numbers (booleans are no metric), the step aside."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def finish(accelerator) -> None:
    """Each tracker's end (files flushed and closed, the MLflow or W&B run ended). Not accelerator.end_training:
    that also destroys the process group, which plm makes once per process (distributed.process_state) and
    uses after a run (the summary's barrier, the next phase, a finetune grid's next run)."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers = []
