"""Running one loop on many processes: the process group, the accelerate backends, caches built once,
weights written once.

`plm pretrain` / `plm finetune` run unchanged under `accelerate launch` or `torchrun`. Every process
builds the same model from the same seed; the main process alone writes the run directory. The
configs shipped in plmcli/recipes/accelerate/ (ddp, fsdp, deepspeed-zero2, deepspeed-zero3) are
plain `accelerate launch --config_file` files; `plm recipes accelerate` prints where they are. FSDP
(FSDP2) shards on GPUs and on CPU processes (gloo) alike; its checkpoints reshard onto any process count.

Data is prepared once (`main_builds_first`, `built_once`): the job's main process builds every cache
(tokenized corpus, flat token files, packed rows, masking units, static instances) while the others
wait on a group of their own with a long timeout (PREPARE_TIMEOUT); then the main process of each other
node reads it, or builds its node's own copy when that node does not see the job's cache (a node-local
PLM_CACHE); then the rest read. So several nodes need a shared PLM_CACHE, or each node builds its own;
a node whose prepared corpus differs from the main process's stops every process with one line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
import sys
from contextlib import contextmanager
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from plmcli.errors import PlmError

DIST_TIMEOUT = 1800
"""Seconds, the default of train.dist_timeout: how long a training collective waits for the other processes
before the job fails (a dead node is noticed after this). Waiting for data preparation has its own."""
PREPARE_TIMEOUT = 24 * 3600
"""Seconds the other processes wait while one prepares the data (tokenizing a real corpus takes hours)."""

FSDP2_TORCH = "2.6"
"""The first torch with `torch.distributed.fsdp.fully_shard`, which accelerate's FSDP2 wraps."""

T = TypeVar("T")


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
    """A DeepSpeed config without DeepSpeed, or an FSDP2 config on a torch without it: one line instead of
    accelerate's ImportError.

    `accelerate launch` stops on its own before plm starts; this catches the same config reaching plm
    through its environment variables (torchrun, a cluster script that exports ACCELERATE_USE_DEEPSPEED).
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and importlib.util.find_spec("deepspeed") is None:
        raise PlmError("the accelerate config asks for DeepSpeed, which is not installed",
                       "pip install deepspeed (or launch with plm's ddp.yaml or fsdp.yaml: plm recipes accelerate)")
    if fsdp_launched() and os.environ.get("FSDP_VERSION", "1") == "2":
        import torch

        if not _version_at_least(torch.__version__.split("+")[0], FSDP2_TORCH):
            raise PlmError(f"the accelerate config asks for FSDP2, which needs torch>={FSDP2_TORCH} (this is {torch.__version__})",
                           "pip install -U torch (or launch with plm's ddp.yaml: plm recipes accelerate ddp)")


def process_state(timeout_s: int = DIST_TIMEOUT):
    """This process's accelerate PartialState: the process group, created once per process, and beside it
    the group that waits for data preparation (`preparation_group`).

    `timeout_s` bounds every training collective (train.dist_timeout): a process that died is noticed
    after it. The long waits while one process prepares data do not count against it.
    """
    from accelerate import PartialState

    check_backend_installed()
    if timeout_s <= 0:
        raise PlmError(f"train.dist_timeout {timeout_s} must be a positive number of seconds", "e.g. 1800 (30 minutes)")
    state = PartialState(cpu=use_cpu(), timeout=timedelta(seconds=timeout_s))
    launched = _launched_world()
    if state.num_processes != launched:
        raise PlmError(f"{launched} processes were launched but accelerate joined {state.num_processes} "
                       f"(device {state.device}); they would each train alone and overwrite one another's files",
                       "launch on a machine whose accelerator has a collective backend (CUDA), or with --cpu")
    preparation_group()  # every process gets here at the same point: new_group is a collective
    _relaunch_fsdp(state)
    return state


def preparation_group():
    """The process group the others wait on while data is prepared, with PREPARE_TIMEOUT; None on one process.

    Its own group, so that the hours of tokenizing do not set the training collectives' timeout; gloo
    (beside NCCL on GPUs) because the wait is on the host and should hold no GPU stream. Made once per
    default process group, by every process (`process_state` calls it).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return _group_beside(dist.group.WORLD)


@functools.lru_cache(maxsize=1)  # one per default group: a new one (tests make several in turn) makes its own
def _group_beside(world):
    """The preparation group of the default process group `world` (every process makes it, in the same order)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=PREPARE_TIMEOUT))


def build_turn(state) -> int:
    """When this process builds a cache: 0 the job's main process, 1 the main process of another node,
    2 the rest (they only read)."""
    if state.process_index == 0:
        return 0
    return 1 if state.local_process_index == 0 else 2


BUILD_TURNS = 3


def _agree(group, failure: tuple | None) -> None:
    """The end of one build turn, on the preparation group: every process learns whether a builder failed,
    and stops in the builder's words (a builder itself raises its own exception after this)."""
    import torch.distributed as dist

    reports: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, failure, group=group)
    failed = next((r for r in reports if r is not None), None)
    if failed is not None and failure is None:
        raise PlmError(*failed)


def _failure(e: Exception, rank: int) -> tuple[str, str]:
    """What the waiting processes say when a builder failed: its own one line, or where to look."""
    if isinstance(e, PlmError):
        return e.message, e.hint
    return (f"process {rank} failed while preparing the data ({type(e).__name__}: {e})",
            "see that process's traceback above")


@contextmanager
def main_builds_first(state=None) -> Iterator[None]:
    """The body (which builds a cache if it is missing, else reads it) runs on the job's main process first,
    then on each other node's main process (a shared PLM_CACHE: it reads; a node-local one: it builds that
    node's copy), then on the rest, which only read. The waits are on `preparation_group`, not on the
    training collectives' timeout. A body that fails stops every process with its message, not a hang.
    """
    group = preparation_group()
    if group is None:
        yield
        return
    if state is None:
        from accelerate import PartialState

        state = PartialState()
    mine = build_turn(state)
    for _ in range(mine):
        _agree(group, None)
    try:
        yield
    except Exception as e:
        _agree(group, _failure(e, state.process_index))
        raise
    for _ in range(mine, BUILD_TURNS):
        _agree(group, None)


def built_once(state, build: Callable[[], T], fingerprint: Callable[[T], str]) -> T:
    """`build()` under `main_builds_first`, then `fingerprint(result)` compared across the processes: a node
    whose data differs from the main process's (other text behind the same --data) stops every process
    with one line naming it, instead of training each node on its own data."""
    group = preparation_group()
    if group is None:
        return build()
    import torch.distributed as dist

    with main_builds_first(state):  # a fingerprint that cannot be read fails there too, in one line everywhere
        result = build()
        stamp = fingerprint(result)
    # torchrun (and accelerate launch, which runs it) names the node; other launchers: its host and ranks
    node = f"node {os.environ['GROUP_RANK']}" if os.environ.get("GROUP_RANK", "").isdigit() else "a node"
    mine = (stamp, node, socket.gethostname(), state.process_index)
    seen: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, mine, group=group)
    other = [s for s in seen if s[0] != seen[0][0]]
    if other:
        _, node, host, rank = other[0]
        raise PlmError(f"{node} ({host}, process {rank}) prepared other data than the main process's node "
                       f"(fingerprint {other[0][0][:12]}, not {seen[0][0][:12]}: other text behind the same --data, or "
                       "another tokenizer)", "give every node the same --data files (copy them from the first node), "
                       "or put the data and PLM_CACHE on a filesystem all nodes share")
    return result


def on_main(state, work: Callable[[], T]) -> T:
    """`work()` on the main process alone (an n-gram fit: minutes to hours) while the others wait on
    `preparation_group`, not on the training collectives' timeout; every process returns its result."""
    group = preparation_group()
    if group is None:
        return work()
    import torch.distributed as dist

    out = [None]
    with main_builds_first(state):  # a failure on the main process stops the others in its words
        if state.is_main_process:
            out = [work()]
    dist.broadcast_object_list(out, src=0, group=group)
    return out[0]


def sharded(accelerator) -> bool:
    """FSDP and DeepSpeed hold the weights (or optimizer state) in pieces across the processes."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def fsdp_launched() -> bool:
    """The launch asks for FSDP: `accelerate launch` with an FSDP config, or its variables exported by a script."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def _launched_type(device):
    """The distributed type accelerate gives a launch on `device` before any plugin (its own rule)."""
    from accelerate.utils import DistributedType

    if device.type == "cpu":
        return DistributedType.MULTI_CPU
    return DistributedType.MULTI_GPU if device.type == "cuda" else DistributedType(f"MULTI_{device.type.upper()}")


def _relaunch_fsdp(state) -> None:
    """Let the next Accelerator of this process decide FSDP afresh, as the first one did.

    An Accelerator that starts FSDP writes FSDP into the process's state; the next one (a recipe's next
    phase, a finetune after a pretrain in one process) reads that back, skips the branch that attaches its
    FSDP plugin, and fails when it shards. Put back the type the launch had, from which accelerate decides.
    """
    from accelerate.utils import DistributedType

    if state.distributed_type == DistributedType.FSDP:
        state.distributed_type = _launched_type(state.device)


def _shard_on_cpu(accelerator) -> None:
    """FSDP on CPU processes (gloo), where accelerate would run an FSDP launch as plain DDP.

    accelerate makes FSDP only out of a launch on accelerators; on CPUs it leaves the processes MULTI_CPU
    and drops the plugin, so a run asked to shard would replicate instead, and write DDP checkpoints.
    torch's FSDP2 (`fully_shard`) runs over gloo, so plm gives the state what accelerate gives a GPU
    launch: the plugin (from the launch's variables, with the run's precision) and the FSDP type, in the
    process's state too, where accelerate's helpers read it.
    """
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if not fsdp_launched() or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise PlmError(f"FSDP version {plugin.fsdp_version} (fsdp_version in the accelerate config) does not run on CPU "
                       "processes; FSDP2 does", "launch with plm's fsdp.yaml (plm recipes accelerate fsdp), or set "
                       "fsdp_version: 2 in yours")
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = PartialState().distributed_type = DistributedType.FSDP


def check_resume_world(accelerator, path: Path, was_world: int, world: int) -> None:
    """Refuse a checkpoint that this launch's process count cannot load.

    DDP checkpoints hold whole tensors; FSDP's (SHARDED_STATE_DICT) are torch.distributed.checkpoint
    directories, which reshard on load onto any number of processes. DeepSpeed's ZeRO files hold one
    partition per process and load only onto as many.
    """
    from accelerate.utils import DistributedType

    if was_world != world and accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise PlmError(f"checkpoint {path} holds DeepSpeed state partitioned over {was_world} processes, and {world} "
                       "were launched", f"resume with {was_world} processes")


DEEPSPEED_BF16_OVERFLOW_CHECK = "0.17.1"
"""The first DeepSpeed whose config has bf16.check_grad_overflow (ZeRO-2 skips a step whose gradients are not finite)."""


def deepspeed_skips_nonfinite(stage: int, precision: str, version: str) -> dict | None:
    """What makes DeepSpeed skip a non-finite step as the loop promises, or None where nothing does.

    The engine steps inside `backward`, before the loop sees the loss, so the loop cannot skip the step
    itself. fp16: DeepSpeed's loss scaler checks every step's gradients and skips an overflow (every
    stage): nothing to add (an empty dict). bf16 on ZeRO-2: the same check, when the config asks for it
    (its default only from DeepSpeed 0.19.3). ZeRO-3 and ZeRO-1 in bf16, and fp32 everywhere, apply
    whatever the gradients hold.
    """
    if precision == "fp16":
        return {}
    if precision == "bf16" and stage == 2 and _version_at_least(version, DEEPSPEED_BF16_OVERFLOW_CHECK):
        return {"bf16": {"check_grad_overflow": True}}
    return None


def _version_at_least(version: str, floor: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) >= Version(floor)
    except InvalidVersion:
        return False


def _deepspeed_nonfinite(ds_config: dict, max_nonfinite_steps: int) -> None:
    """Make the DeepSpeed engine skip non-finite steps, or refuse the run where it cannot, unless the run stops at
    the first one (train.max_nonfinite_steps=1: nothing is saved after it, the last checkpoint stays good)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("deepspeed")
    except PackageNotFoundError:  # a config checked without DeepSpeed (it is refused before a run starts)
        installed = ""
    precision = next((p for p in ("fp16", "bf16") if str(ds_config.get(p, {}).get("enabled", False)).lower() == "true"), "fp32")
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    guard = deepspeed_skips_nonfinite(stage, precision, installed)
    if guard is None:
        if max_nonfinite_steps > 1:
            raise PlmError(f"DeepSpeed ZeRO-{stage} in {precision} applies a step whose gradients are not finite (its engine "
                           "steps inside backward, before plm sees the loss), so plm cannot skip such a step",
                           "use train.mixed_precision=fp16 (its loss scaler skips them), or bf16 with deepspeed-zero2 and "
                           f"deepspeed>={DEEPSPEED_BF16_OVERFLOW_CHECK}, or --set train.max_nonfinite_steps=1 to stop at the "
                           "first one (the last checkpoint stays good)")
        return
    for section, values in guard.items():
        ds_config.setdefault(section, {}).update(values)


def configure_backend(accelerator, model, train_cfg, optim_name: str, micro: int, accum: int) -> None:
    """Fit the launched backend to the recipe before accelerator.prepare.

    DeepSpeed takes its batch sizes, accumulation and clipping from its own config: plm writes the
    recipe's values there (a global batch belongs to the recipe, not to the launch config), and makes its
    engine skip non-finite steps or refuses the run. FSDP shards on CPU processes too, and its transformer
    wrap keeps the block classes this model has (one fsdp.yaml serves every family; accelerate would
    refuse a class name the model lacks).
    """
    _shard_on_cpu(accelerator)
    if sharded(accelerator) and optim_name.lower() == "lamb":
        raise PlmError("optim.name=lamb scales each parameter tensor by its own trust ratio, and FSDP / DeepSpeed "
                       "hand the optimizer flattened or sharded pieces of them",
                       "launch with plm's ddp.yaml (plm recipes accelerate), or --set optim.name=adamw")
    ds = accelerator.state.deepspeed_plugin
    if ds is not None:
        ds.deepspeed_config.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
                                   train_batch_size=train_cfg.global_batch_size,
                                   gradient_clipping=train_cfg.grad_clip if train_cfg.grad_clip > 0 else 0.0)
        _deepspeed_nonfinite(ds.deepspeed_config, train_cfg.max_nonfinite_steps)
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None and fsdp.transformer_cls_names_to_wrap:
        present = {type(m).__name__ for m in model.modules()}
        fsdp.transformer_cls_names_to_wrap = [n for n in fsdp.transformer_cls_names_to_wrap if n in present]


def tied_names(model) -> dict[str, str]:
    """Tied weights (GPT's lm_head = wte): dropped name -> kept name, as safetensors' save_model keeps them.

    Read from the module before accelerate wraps it: a gathered FSDP / DeepSpeed state dict no longer
    shows which entries shared storage. A model FSDP sharded already (a recipe's next phase) shows it
    by its parameters: one DTensor under two names.
    """
    groups: dict[tuple, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if _is_dtensor(t):  # a shard has no storage of the whole tensor to compare
            groups.setdefault((id(t),), []).append(name)
        elif t.device.type != "meta" and t.numel():
            groups.setdefault((t.untyped_storage().data_ptr(), t.data_ptr(), tuple(t.shape)), []).append(name)
    return {drop: names[0] for names in map(sorted, groups.values()) for drop in names[1:]}


def full_norm(norm):
    """A gradient norm as a plain tensor, the same on every process. Under FSDP2, accelerate before 1.16 returns
    torch's norm of the sharded gradients as a DTensor, which the loop's all-reduce and float() cannot take."""
    return norm.full_tensor() if _is_dtensor(norm) else norm


def _is_dtensor(t) -> bool:
    # Not imported yet: nothing made a DTensor (and importing it would cost a DDP run ~0.7 s).
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def save_weights(accelerator, model, run_dir: Path, tied: dict[str, str]) -> None:
    """RUN/model.safetensors, written once by the main process (temp file + rename).

    Call it on every process: under FSDP / DeepSpeed ZeRO-3 the full weights are gathered from all.
    """
    from safetensors.torch import save_file, save_model

    from plmcli.data.store import atomic_path

    tmp, final = Path(run_dir) / ".model.safetensors.tmp", Path(run_dir) / "model.safetensors"
    state = accelerator.get_state_dict(model) if sharded(accelerator) else None  # collective
    if accelerator.is_main_process:
        def needed() -> int:  # what a full disk must make room for
            weights = state if state is not None else accelerator.unwrap_model(model).state_dict()
            return sum(t.nbytes for k, t in weights.items() if k not in tied)

        with atomic_path(final, tmp, needed=needed):
            if state is not None:
                save_file({k: v.contiguous() for k, v in state.items() if k not in tied}, str(tmp), metadata=dict(tied) or None)
            else:
                save_model(accelerator.unwrap_model(model), str(tmp))
            # safetensors creates its file 0600; the weights get the mode any file would (0644 under umask 022).
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    accelerator.wait_for_everyone()
