"""Checkpoints and run-directory files, always written to a temp path and renamed into place."""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from plmcli.data.store import process_alive, writing
from plmcli.errors import PlmError
from plmcli.runs import LOCK, LOOP_STATE, checkpoint_dir, list_checkpoints


class RunStopped(PlmError):
    """Training stopped on a fault found after it started (non-finite loss, a peer process lost): the run
    directory stays, resumable from its last complete checkpoint (as after errors.WriteFailed)."""


@dataclass
class LoopState:
    """Where the one loop stands: what a checkpoint holds besides accelerate's state (its loop_state.json), and
    what the loop updates as it trains. A field a checkpoint written by an older plm lacks takes its default."""

    step: int = 0
    """Optimizer steps done."""
    micro_batches: int = 0
    """This process's micro-batches drawn: where its data order continues."""
    tokens: int = 0
    """Training tokens read, over every process."""
    elapsed: float = 0.0
    """Seconds of training, over every start of the run."""
    train_loss: float | None = None
    """The last logged training loss."""
    last_eval: dict = field(default_factory=dict)
    """The last validation metrics."""
    best: dict = field(default_factory=dict)
    """The step and metrics of the best validation so far (train.select_metric)."""
    nonfinite_steps: int = 0
    """Optimizer steps skipped for a non-finite loss or gradient."""
    saved_elapsed: float = 0.0
    """`elapsed` at the last checkpoint (train.save_every_minutes counts from it)."""
    data_position: dict | None = None
    """A streaming run's position in every file (data/streaming.py); None for a dataset read by index."""
    world_size: int | None = None
    """The processes that wrote the checkpoint; None: not recorded (read as this launch's)."""
    global_batch_size: int | None = None
    """Samples per optimizer step when the checkpoint was written."""
    micro_batch_size: int | None = None
    """Samples per micro-batch when the checkpoint was written."""

    @classmethod
    def from_json(cls, obj: dict) -> "LoopState":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names and v is not None} if obj else {})

    def to_json(self) -> dict:
        return asdict(self)


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise PlmError(f"no checkpoint to resume in {run_dir}", "start without --resume, or point --out at a run that saved checkpoints")
    return found[-1]


def save_checkpoint(accelerator, run_dir: Path, step: int, loop_state: LoopState, keep: int,
                    continue_with: str | None = None) -> Path:
    """accelerate's save_state (weights, optimizer, scheduler, RNG) + the loop's data position.

    Every process calls it: each saves its RNG state (and, under FSDP / DeepSpeed, its shard) into one
    temp directory, which the main process alone renames into place once all of them are done. On
    several machines the run directory must be on a filesystem they share. A write that fails (disk
    full) leaves no temp directory and the previous checkpoints as they were.
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.parent / f".{final.name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    def needed() -> int | None:  # the last checkpoint's size is what this one needs: a full disk says how much to free
        previous = list_checkpoints(run_dir)
        return sum(f.stat().st_size for f in previous[-1].rglob("*") if f.is_file()) if previous else None

    with writing(f"the checkpoint of step {step}", tmp, continue_with, needed):
        accelerator.save_state(str(tmp), safe_serialization=False)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            # Plainly: the directory is the temp path, renamed into place whole.
            (tmp / LOOP_STATE).write_text(json.dumps(loop_state.to_json(), indent=2, ensure_ascii=False) + "\n",
                                          encoding="utf-8")
            from plmcli.data.store import swap_into

            swap_into(tmp, final)
            for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def read_loop_state(path: Path) -> LoopState:
    """The loop's state in a checkpoint (step, data position, the world size and global batch that wrote it)."""
    return LoopState.from_json(json.loads((Path(path) / LOOP_STATE).read_text()))


def load_checkpoint(accelerator, path: Path) -> LoopState:
    """accelerate's load_state on every process; each restores its own RNG from random_states_<rank>.

    An FSDP checkpoint (torch.distributed.checkpoint directories) loads onto any number of processes,
    each reading its own shards of the saved tensors; one written under another backend is refused.
    """
    wrote, runs = checkpoint_backend(path), running_backend(accelerator)
    if wrote != runs:
        raise PlmError(f"checkpoint {path} holds {_BACKENDS[wrote][0]} state, and this launch runs {_BACKENDS[runs][0]}",
                       f"resume it under the launch that wrote it ({_BACKENDS[wrote][1]})")
    accelerator.load_state(str(path))
    return read_loop_state(path)


# backend: (its state in words, the launch that runs it)
_BACKENDS = {"fsdp": ("FSDP-sharded", "plm's fsdp.yaml: plm recipes accelerate fsdp"),
             "deepspeed": ("DeepSpeed ZeRO", "plm's deepspeed-zero2.yaml or deepspeed-zero3.yaml"),
             "ddp": ("whole (one process or DDP)", "torchrun, or plm's ddp.yaml")}


def checkpoint_backend(path: Path) -> str:
    """Who wrote checkpoint `path`, from the files accelerate's save_state leaves: 'fsdp' (pytorch_model_fsdp_0/,
    or pytorch_model_fsdp.bin for a full state dict), 'deepspeed' (the engine's pytorch_model/) or 'ddp'."""
    path = Path(path)
    if any(path.glob("pytorch_model_fsdp*")):
        return "fsdp"
    return "deepspeed" if (path / "pytorch_model").is_dir() else "ddp"


def running_backend(accelerator) -> str:
    """'fsdp', 'deepspeed' or 'ddp' (every other launch keeps whole tensors): what this launch's save_state writes."""
    from accelerate.utils import DistributedType

    return {DistributedType.FSDP: "fsdp", DistributedType.DEEPSPEED: "deepspeed"}.get(accelerator.distributed_type, "ddp")


_NO_FLOCK = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOLCK, errno.EINVAL})
# A holder writes its line right after creating the file: an empty file older than this lost its writer.
_EMPTY_STALE_S = 60.0


def _holder_line() -> str:
    import socket

    return f"{os.getpid()} {socket.gethostname()}\n"


def _holder(text: str | None) -> tuple[int, str] | None:
    """(pid, host) of a lock file's `pid host` line (host "" in the pid-only files of older versions);
    None when empty or garbled, as a holder killed between create and write leaves it."""
    parts = (text or "").split()
    if not parts or not parts[0].isdigit() or int(parts[0]) <= 0:
        return None
    return int(parts[0]), parts[1] if len(parts) > 1 else ""


def _elsewhere(host: str) -> bool:
    import socket

    return host not in ("", socket.gethostname())


def _read_lock(path: Path) -> tuple[str | None, tuple, float] | None:
    """(text, identity, age in seconds) of a lock file, text None when unreadable; None when it is gone.
    The identity tells this file from a newer one made at the same path, even on a reused inode."""
    import time

    try:
        with open(path, "rb") as f:
            st, data = os.fstat(f.fileno()), f.read(512)
    except FileNotFoundError:
        return None
    except PermissionError:
        try:
            st, data = os.stat(path), None
        except FileNotFoundError:
            return None
    text = None if data is None else data.decode(errors="replace")
    return text, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, data), time.time() - st.st_mtime


class RunLock:
    """One trainer at a time per run directory, through RUN/.lock holding the holder's `pid host` line.

    Where the filesystem has flock, an exclusive flock on the file: the kernel drops it when its holder dies
    (kill -9 included), so it is never stale; the file goes on release, and a process that locked a file just
    unlinked tries again on the new one. Where flock is missing, whoever creates the file (O_EXCL) holds the
    lock, and a file whose holder is gone is taken over: a dead pid on this host, or an empty file older than
    a minute. A holder on another host cannot be checked, so its lock stands until someone deletes the file."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.line = _holder_line()
        self.fd: int | None = None  # flock: the locked descriptor
        self.mine: tuple | None = None  # no flock: (st_dev, st_ino) of the file this lock created
        try:
            self._flock()
        except OSError as e:
            raise self._cannot(e) from None

    def _flock(self) -> None:
        import fcntl

        while True:
            try:
                fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                try:
                    fd, created = os.open(self.path, os.O_RDWR), False
                except FileNotFoundError:
                    continue  # released between the two opens
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    text = os.pread(fd, 512, 0).decode(errors="replace")
                finally:
                    os.close(fd)
                raise self._held(text) from None
            except OSError as e:
                if e.errno in _NO_FLOCK and created:
                    return self._own(fd)  # made with O_EXCL: that file is the lock already
                os.close(fd)
                if e.errno in _NO_FLOCK:
                    return self._exclusive()
                raise
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, self.line.encode(), 0)
        except OSError:
            self.path.unlink(missing_ok=True)
            os.close(fd)
            raise
        self.fd = fd

    def _exclusive(self) -> None:
        for _ in range(8):  # each round removes one stale file; a busy contest ends in a refusal, not a spin
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._clear_if_stale()
                continue
            return self._own(fd)
        raise self._held(None)

    def _own(self, fd: int) -> None:
        try:
            st = os.fstat(fd)
            os.write(fd, self.line.encode())
        except OSError:
            self.path.unlink(missing_ok=True)  # an empty file would block the run for a minute
            raise
        finally:
            os.close(fd)
        self.mine = (st.st_dev, st.st_ino)

    def _clear_if_stale(self) -> None:
        """Remove the lock file if its holder is gone; else refuse, naming the holder."""
        seen = _read_lock(self.path)
        if seen is None:
            return  # released meanwhile
        text, identity, age = seen
        holder = _holder(text)
        if holder is None:
            if age < _EMPTY_STALE_S:
                raise self._held(text)
        elif _elsewhere(holder[1]) or process_alive(holder[0]):
            raise self._held(text, may_delete=True)
        self._set_aside(identity)

    def _set_aside(self, identity: tuple) -> None:
        """Remove the stale file judged by `identity`, and nothing newer: two processes that both found it
        stale race here, and the slower must not remove the fresh lock the faster one made meanwhile.
        Renaming to a unique name first is atomic; a file that turns out newer goes back."""
        import secrets

        aside = self.path.with_name(f"{LOCK}.stale-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # the other one set it aside first; O_EXCL picks the winner
        seen = _read_lock(aside)
        if seen is not None and seen[1] != identity:
            try:
                os.link(aside, self.path)  # fails, rather than overwrite, if a third made one meanwhile
            except FileExistsError:
                pass
            except OSError:  # no hard links on this filesystem
                os.rename(aside, self.path)
                return
        aside.unlink(missing_ok=True)

    def _held(self, text: str | None, may_delete: bool = False) -> PlmError:
        holder = _holder(text)
        who = "another process" if holder is None else f"process {holder[0]}"
        hint = "wait for it to finish (or stop it), or choose another --out"
        if holder is not None and _elsewhere(holder[1]):
            who += f" on host {holder[1]}"
            if may_delete:
                hint += f"; if that job is gone, delete {self.path}"
        return PlmError(f"run {self.run_dir} is being trained by {who}", hint)

    def _cannot(self, e: OSError) -> PlmError:
        from plmcli.errors import os_error

        fix = os_error(OSError(e.errno, e.strerror or str(e), str(self.path))).hint
        return PlmError(f"cannot lock run {self.run_dir} ({self.path}): {e.strerror or e}", fix)

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still held, so no one locks the old file meanwhile
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None
        if self.mine is not None:
            mine, self.mine = self.mine, None
            seen = _read_lock(self.path)
            # Only our own file: one deleted by hand may since hold another trainer's line.
            if seen is not None and seen[1][:2] == mine and seen[0] == self.line:
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
