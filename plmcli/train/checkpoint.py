"""Checkpoints and run-directory files, always written to a temp path and renamed into place."""

from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from plmcli.errors import PlmError
from plmcli.runs import LOCK, LOOP_STATE, checkpoint_dir, list_checkpoints  # noqa: F401  (a run's layout lives in runs)


class RunStopped(PlmError):
    """Training stopped on a fault found after it started (non-finite loss, a file that cannot be written):
    the run directory stays, resumable from its last complete checkpoint."""


class WriteFailed(RunStopped):
    """A run file could not be written (disk full, file size limit): the temp file is gone and the files
    written before it are intact."""


@contextmanager
def writing(what: str, tmp: Path, continue_with: str | None = None):
    """Around a temp-file-then-rename write of `what`: a failure removes the temp file or directory, and an
    OSError becomes a one-line WriteFailed naming what and where."""
    try:
        yield
    except BaseException as e:  # a Ctrl-C mid-write too leaves no temp litter
        tmp = Path(tmp)
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        # torch.save reports a failed write as a RuntimeError of its zip writer, without the errno.
        torch_write = isinstance(e, RuntimeError) and any(w in str(e) for w in ("inline_container", "PytorchStreamWriter"))
        if not (isinstance(e, OSError) or torch_write):
            raise
        reason = _write_failure(e, tmp.parent)
        then = f", then continue with `{continue_with}`" if continue_with else ", then run it again"
        fix = "raise the file size limit (ulimit -f)" if "ulimit" in reason else "free some space there (or write elsewhere)"
        raise WriteFailed(f"cannot write {what} in {tmp.parent}: {reason}", f"{fix}{then}; the files written before are intact") from e


def _write_failure(e: BaseException, where: Path) -> str:
    """Why a write failed, in the user's words."""
    known = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
             errno.EFBIG: "file too large (over the file size limit, ulimit -f)"}
    if isinstance(e, OSError) and e.errno in known:
        return known[e.errno]
    import resource

    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return known[errno.EFBIG]
    try:
        if shutil.disk_usage(where).free < 16 << 20:
            return known[errno.ENOSPC]
    except OSError:
        pass
    return ((e.strerror if isinstance(e, OSError) else None) or str(e)).lower()


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise PlmError(f"no checkpoint to resume in {run_dir}", "start without --resume, or point --out at a run that saved checkpoints")
    return found[-1]


def save_checkpoint(accelerator, run_dir: Path, step: int, loop_state: dict, keep: int,
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
    with writing(f"the checkpoint of step {step}", tmp, continue_with):
        accelerator.save_state(str(tmp), safe_serialization=False)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            # Plainly: the directory is the temp path, renamed into place whole.
            (tmp / LOOP_STATE).write_text(json.dumps(loop_state, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            from plmcli.data.store import swap_into

            swap_into(tmp, final)
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


def write_json(path: Path, obj, continue_with: str | None = None) -> None:
    """Strict JSON (summary.json, metrics.json): a non-finite number (an n-gram's val_ppl inf, a correlation of
    constant predictions) is null, as `plm ... --json` prints it (data.store.json_text)."""
    from plmcli.data.store import json_text

    write_text(path, json_text(obj, indent=2, ensure_ascii=False) + "\n", continue_with)


def write_text(path: Path, text: str, continue_with: str | None = None) -> None:
    from plmcli.data.store import atomic_path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path.name, tmp, continue_with), atomic_path(path, tmp):
        tmp.write_text(text, encoding="utf-8")


class RunLock:
    """An exclusive flock on RUN/.lock while a process trains into RUN: a second trainer refuses, and the
    kernel drops the lock when its holder dies (kill -9 included), so a lock is never stale. The file
    goes when the lock is released; a process that locked a file just unlinked tries again on the new one."""

    def __init__(self, run_dir: Path):
        import fcntl

        self.path = Path(run_dir) / LOCK
        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "another process"
                os.close(self.fd)
                raise PlmError(f"run {run_dir} is being trained by process {holder}",
                               "wait for it to finish (or stop it), or choose another --out") from None
            try:
                if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(self.fd)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still held, so no one locks the old file meanwhile
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

