"""Checkpoints and run-directory files, always written to a temp path and renamed into place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from plmcli.errors import PlmError

LOOP_STATE = "loop_state.json"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step-*") if (p / LOOP_STATE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise PlmError(f"no checkpoint to resume in {run_dir}", "start without --resume, or point --out at a run that saved checkpoints")
    return found[-1]


def save_checkpoint(accelerator, run_dir: Path, step: int, loop_state: dict, keep: int) -> Path:
    """accelerate's save_state (weights, optimizer, scheduler, RNG) + the loop's data position.

    Every process calls it: each saves its RNG state (and, under FSDP / DeepSpeed, its shard) into one
    temp directory, which the main process alone renames into place once all of them are done. On
    several machines the run directory must be on a filesystem they share.
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.parent / f".{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=False)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_json(tmp / LOOP_STATE, loop_state)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def read_loop_state(path: Path) -> dict:
    """The loop's state in a checkpoint (step, data position, the world size and global batch that wrote it)."""
    return json.loads((Path(path) / LOOP_STATE).read_text())


def load_checkpoint(accelerator, path: Path) -> dict:
    """accelerate's load_state on every process; each restores its own RNG from random_states_<rank>."""
    accelerator.load_state(str(path))
    return read_loop_state(path)


def write_json(path: Path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def runs_root() -> Path:
    return Path(os.environ.get("PLM_RUNS", "runs"))


def point_latest(run_dir: Path) -> None:
    """runs/latest -> run_dir, swapped atomically so readers never see a missing link."""
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.relpath(Path(run_dir).resolve(), root.resolve()))
    tmp = root / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, root / "latest")
