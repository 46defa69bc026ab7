"""The signals that stop a training run at an optimizer-step boundary, and how its processes handle them."""

from __future__ import annotations

import signal
import threading

from plmcli.errors import Terminated

# Signals that ask a run to stop at the next optimizer-step boundary, with a checkpoint of that step:
# Ctrl-C, and the ones a scheduler sends before it kills a job (Slurm's preemption, scancel, the end of the
# time limit, Kubernetes, torchrun send SIGTERM; Slurm's `--signal=USR1@SECONDS` warns ahead of time).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name))
SCHEDULER_SIGNALS = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)


def raise_terminated(signum, frame):
    """The handler of SCHEDULER_SIGNALS in a `plm` process while no training loop defers them."""
    raise Terminated(signal.Signals(signum).name)


class DeferredStop:
    """While training, a stop signal only sets `requested` (its name): the loop stops at the next
    optimizer-step boundary, agreed by every process, so a checkpoint never holds part of a step.
    A second Ctrl-C means "stop now" and raises KeyboardInterrupt at once; a second SIGTERM / SIGUSR1
    changes nothing (a scheduler's warning is often followed by its SIGTERM). Installed only in the
    main thread (Python runs signal handlers there)."""

    def __init__(self):
        self.requested: str | None = None
        self.previous: dict = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = self.requested or signal.Signals(signum).name

    def install(self) -> "DeferredStop":
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers: a terminal's Ctrl-C reaches the whole process group and a scheduler signals every
    process of the job; a worker that died of it would break the main process's deferred stop, so the
    main process alone decides when to stop (its workers end with it)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def signal_number(name: str | None) -> int:
    return signal.Signals[name].value if name else 0
