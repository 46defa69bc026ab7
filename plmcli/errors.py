"""The one exception the CLI turns into a clean `error: ... — ...` line and exit code 2."""

from __future__ import annotations


class PlmError(Exception):
    """A user-facing error: `message` says what is wrong, `hint` says how to fix it."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


EXTRAS = {"jieba": "zh", "seqeval": "tasks", "nltk": "tasks", "matplotlib": "plot", "mlflow": "trackers", "wandb": "trackers",
          "peft": "lora", "lm_eval": "lm-eval", "sacrebleu": "tasks", "thulac": "zh-ner"}
"""The optional packages (top-level module) and the pyproject extra that installs each
(tests/test_extras.py holds this and pyproject's [project.optional-dependencies] to agreeing)."""


def needs(module: str, extra: str, feature: str):
    """Import `module` (dotted names too: "matplotlib.pyplot", "jieba.posseg") and return it; when it is not
    installed, raise one PlmError line naming the feature and the extra that installs it. Call it where the
    feature starts (inside the function, so the import stays lazy), e.g.
    `needs("jieba", "zh", "Chinese word segmentation (tokenizer.segment=jieba, whole-word masking, ERNIE units)")`."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        missing = e.name  # the module that was not found (None when the error does not say)
        if missing is None or missing.split(".")[0] == package:
            raise PlmError(f"{feature} needs {package}, which is not installed", f"pip install 'plm[{extra}]'") from None
        # installed, but something it imports is missing or broken: say what, on the same one line
        reason = " ".join(str(e).split())
        raise PlmError(f"{feature} needs {package}, which failed to import ({reason})", f"pip install 'plm[{extra}]'") from None


class WriteFailed(PlmError):
    """A file could not be written (disk full, quota, file size limit): its temp file is gone, and the files
    written before it are intact (data.store.writing)."""

    fix: str = ""
    """How to make room, without the way to continue."""
    continued: bool = False
    """The hint names the command that continues (an enclosing write need not add one)."""


RESUMABLE_EXIT = 75
"""The exit code of a run stopped by SIGTERM or SIGUSR1 (a scheduler's preemption, time limit, or warning)
after checkpointing its last step: the same command with --auto-resume (or --resume) continues it
(EX_TEMPFAIL: a temporary failure, try again)."""


class Interrupted(Exception):
    """A stop signal handled by a command: Ctrl-C (SIGINT), or a scheduler's SIGTERM / SIGUSR1. `message`
    says what the stop left behind and how to continue (e.g. "the checkpoint of step 26 is in runs/x;
    continue with `plm pretrain --resume --out runs/x`").

    The CLI prints `interrupted — <message>` and exits with `exit_code`: 130 after Ctrl-C, RESUMABLE_EXIT
    after SIGTERM / SIGUSR1. A bare KeyboardInterrupt that no command handled means nothing was written."""

    def __init__(self, message: str, signal_name: str = "SIGINT"):
        super().__init__(message)
        self.message = message
        self.signal_name = signal_name
        self.exit_code = 130 if signal_name == "SIGINT" else RESUMABLE_EXIT


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGUSR1 reaching a `plm` process outside a training loop (which defers them to a step
    boundary): raised in the main thread as Ctrl-C raises KeyboardInterrupt, so the same unwinding removes
    every temp file and half-built output on the way out (a scheduler's kill would leave them)."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def stop_signal(e: BaseException) -> str:
    """The signal behind a stop: SIGTERM / SIGUSR1 for Terminated and Interrupted, else Ctrl-C's SIGINT."""
    return e.signal_name if isinstance(e, (Terminated, Interrupted)) else "SIGINT"


# errno values that can only come from writing: the fix is to make room or write elsewhere.
_WRITE_ERRNOS = {"EROFS", "ENOSPC", "EDQUOT", "EFBIG"}
_FIXES = {
    "EROFS": "choose a location on a writable filesystem",
    "ENOSPC": "free space on that filesystem, or write somewhere with room",
    "EDQUOT": "free space within your quota, or write somewhere with room",
    "EFBIG": "the file exceeds the size limit (ulimit -f, or the filesystem's); raise it or write elsewhere",
    "EACCES": "check its permissions, or choose a location you may write to",
    "EPERM": "check its permissions, or choose a location you may write to",
    "ENOTDIR": "a file stands where a directory is needed; remove it or choose another path",
    "EISDIR": "a directory stands where a file is needed; pass a file",
    "ENOENT": "check the path",
}


def os_error(e: OSError, places: dict[str, tuple[str, str]] | None = None) -> PlmError:
    """An OSError as `cannot write/read <path>: <strerror> — <fix>`.

    `places` maps a directory plm chose for the user (the cache, the runs) to (its name, how to change it):
    a path inside one gets that hint, since the user never typed the path that failed."""
    import errno
    import os
    from pathlib import Path

    code = errno.errorcode.get(e.errno or 0, "")
    reason = e.strerror or str(e)
    path = e.filename if e.filename not in (None, "") else None
    fix = _FIXES.get(code, "check the path and its filesystem")
    if path is None:
        return PlmError(f"cannot write: {reason}" if code in _WRITE_ERRNOS else f"input/output failed: {reason}", fix)
    path = os.fsdecode(path)
    if code in _WRITE_ERRNOS or (code in ("EACCES", "EPERM") and not (os.path.exists(path) and not os.access(path, os.R_OK))):
        verb = "write"
    elif code == "ENOTDIR":
        verb = "use"
    else:
        verb = "read"
    for place, (name, how) in (places or {}).items():
        try:
            inside = Path(path).resolve().is_relative_to(Path(place).resolve())
        except (OSError, ValueError):
            inside = False
        if inside:
            fix = f"{fix}: {name} is {place}; {how}"
            break
    return PlmError(f"cannot {verb} {path}: {reason}", fix)
