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


class Interrupted(Exception):
    """Ctrl-C (SIGINT) handled by a command: `message` says what the interrupt left behind and how to
    continue (e.g. "the checkpoint of step 26 is in runs/x; continue with `plm pretrain --resume --out runs/x`").

    The CLI prints `interrupted — <message>` and exits 130; a bare KeyboardInterrupt that no command
    handled means nothing was written."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
