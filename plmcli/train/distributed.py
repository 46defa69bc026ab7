"""Running one loop on many processes: the process group, the accelerate backends, weights written once.

`plm pretrain` / `plm finetune` run unchanged under `accelerate launch` or `torchrun`. Every process
builds the same model from the same seed; the main process alone writes the run directory. The
configs shipped in plmcli/recipes/accelerate/ (ddp, fsdp, deepspeed-zero2, deepspeed-zero3) are
plain `accelerate launch --config_file` files; `plm recipes accelerate` prints where they are.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta
from importlib import resources
from pathlib import Path

from plmcli.errors import PlmError

DIST_TIMEOUT = 7200  # seconds; the default of train.dist_timeout


def accelerate_configs() -> dict[str, Path]:
    """name -> path of each `accelerate launch --config_file` file shipped with plm."""
    root = resources.files("plmcli") / "recipes" / "accelerate"
    return {p.name[:-5]: Path(str(p)) for p in sorted(root.iterdir(), key=lambda p: p.name) if p.name.endswith(".yaml")}


def _launched_world() -> int:
    """The process count a launcher (torchrun, accelerate launch, mpirun) announced, 1 without one."""
    for key in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def use_cpu() -> bool:
    """Train on the CPU: asked for (`accelerate launch --cpu`), or there is no accelerator to use.

    accelerate must be told: without cpu=True it sets up no process group on a machine without a
    GPU, and N launched processes then each train alone and race on the same run directory.
    MPS has no collective backend, so a multi-process launch on a Mac uses the CPU (gloo) as well.
    """
    import torch

    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    if hasattr(torch, "accelerator"):
        device = torch.accelerator.current_accelerator()
        return device is None or (device.type == "mps" and _launched_world() > 1)
    return not torch.cuda.is_available()


def check_backend_installed() -> None:
    """A DeepSpeed config without DeepSpeed: one line instead of accelerate's ImportError.

    `accelerate launch` stops on its own before plm starts; this catches the same config reaching plm
    through its environment variables (torchrun, a cluster script that exports ACCELERATE_USE_DEEPSPEED).
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and importlib.util.find_spec("deepspeed") is None:
        raise PlmError("the accelerate config asks for DeepSpeed, which is not installed",
                       "pip install deepspeed (or launch with plm's ddp.yaml or fsdp.yaml: plm recipes accelerate)")


def process_state(timeout_s: int = DIST_TIMEOUT):
    """This process's accelerate PartialState: the process group, created once per process.

    `timeout_s` bounds every wait on the other processes; the longest is the main process tokenizing
    a corpus while the others wait at a barrier, hence the generous default (train.dist_timeout).
    """
    from accelerate import PartialState

    check_backend_installed()
    if timeout_s <= 0:
        raise PlmError(f"train.dist_timeout {timeout_s} must be a positive number of seconds", "e.g. 7200 (two hours)")
    state = PartialState(cpu=use_cpu(), timeout=timedelta(seconds=timeout_s))
    launched = _launched_world()
    if state.num_processes != launched:
        raise PlmError(f"{launched} processes were launched but accelerate joined {state.num_processes} "
                       f"(device {state.device}); they would each train alone and overwrite one another's files",
                       "launch on a machine whose accelerator has a collective backend (CUDA), or with --cpu")
    return state


def sharded(accelerator) -> bool:
    """FSDP and DeepSpeed hold the weights (or optimizer state) in pieces across the processes."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def configure_backend(accelerator, model, train_cfg, optim_name: str, micro: int, accum: int) -> None:
    """Fit the launched backend to the recipe before accelerator.prepare.

    DeepSpeed takes its batch sizes, accumulation and clipping from its own config: plm writes the
    recipe's values there (a global batch belongs to the recipe, not to the launch config). FSDP's
    transformer wrap keeps the block classes this model has (one fsdp.yaml serves every family;
    accelerate would refuse a class name the model lacks).
    """
    if sharded(accelerator) and optim_name.lower() == "lamb":
        raise PlmError("optim.name=lamb scales each parameter tensor by its own trust ratio, and FSDP / DeepSpeed "
                       "hand the optimizer flattened or sharded pieces of them",
                       "launch with plm's ddp.yaml (plm recipes accelerate), or --set optim.name=adamw")
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:
        ds.deepspeed_config.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
                                   train_batch_size=train_cfg.global_batch_size,
                                   gradient_clipping=train_cfg.grad_clip if train_cfg.grad_clip > 0 else 0.0)
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None and fsdp.transformer_cls_names_to_wrap:
        present = {type(m).__name__ for m in model.modules()}
        fsdp.transformer_cls_names_to_wrap = [n for n in fsdp.transformer_cls_names_to_wrap if n in present]


def tied_names(model) -> dict[str, str]:
    """Tied weights (GPT's lm_head = wte): dropped name -> kept name, as safetensors' save_model keeps them.

    Read from the module before accelerate wraps it: a gathered FSDP / DeepSpeed state dict no longer
    shows which entries shared storage.
    """
    groups: dict[tuple, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if t.device.type != "meta" and t.numel():
            groups.setdefault((t.untyped_storage().data_ptr(), t.data_ptr(), tuple(t.shape)), []).append(name)
    return {drop: names[0] for names in map(sorted, groups.values()) for drop in names[1:]}


def save_weights(accelerator, model, run_dir: Path, tied: dict[str, str]) -> None:
    """RUN/model.safetensors, written once by the main process (temp file + rename).

    Call it on every process: under FSDP / DeepSpeed ZeRO-3 the full weights are gathered from all.
    """
    from safetensors.torch import save_file, save_model

    from plmcli.data.store import atomic_path

    tmp, final = Path(run_dir) / ".model.safetensors.tmp", Path(run_dir) / "model.safetensors"
    state = accelerator.get_state_dict(model) if sharded(accelerator) else None  # collective
    if accelerator.is_main_process:
        with atomic_path(final, tmp):
            if state is not None:
                save_file({k: v.contiguous() for k, v in state.items() if k not in tied}, str(tmp), metadata=dict(tied) or None)
            else:
                save_model(accelerator.unwrap_model(model), str(tmp))
            # safetensors creates its file 0600; the weights get the mode any file would (0644 under umask 022).
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    accelerator.wait_for_everyone()
