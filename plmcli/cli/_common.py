"""What every `plm` command module shares: the error reporting group, json printing, option parsers, and the
flags generated from config fields.

The one private module of plmcli.cli: command modules import it, never plmcli.cli itself or each other.
It imports plmcli.api only inside functions, and only once something failed, so `plm --help` starts fast.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Optional

import typer
from typer.core import TyperGroup

from plmcli.errors import PlmError

state = {"debug": False}


def stderr():
    from rich.console import Console

    return Console(stderr=True)


def print_json(obj) -> None:
    """Strict JSON on stdout: a non-finite number (an unsmoothed n-gram's ppl inf) is null (data.store.finite)."""
    from plmcli.data.store import json_text

    typer.echo(json_text(obj, indent=2, ensure_ascii=False))


def floats(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlmError(f"{name} '{text}' is not a comma-separated list of numbers", f"e.g. {name} 0.4,0.3,0.2,0.1") from None


def parse_duration(text: str | None) -> float | None:
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise PlmError(f"--time-budget '{text}' is not a duration", "write seconds or e.g. 90s, 10m, 1.5h") from None


def process() -> tuple[int, int]:
    """(rank, world size) under a multi-process launcher (accelerate launch, torchrun); (0, 1) without one."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def report(e: BaseException, command: str) -> tuple[str, int]:
    """The one line for an exception that escaped `command`, and the exit code (see `plm --help`)."""
    from plmcli import api  # only once something failed: keeps startup light
    from plmcli.errors import Interrupted, os_error, stop_signal

    if isinstance(e, Interrupted):
        return f"interrupted — {e.message}", e.exit_code
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM / SIGUSR1 as Terminated: 128 + the signal, as a kill
        import signal

        name = stop_signal(e)
        return f"interrupted{'' if name == 'SIGINT' else ' by ' + name} — nothing was written", 128 + signal.Signals[name]
    plm = api.find_plm_error(e)  # datasets wraps ours raised in its generators and workers
    if plm is not None:
        return f"error: {plm}", 2
    cause = e
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return f"error: {os_error(cause, api.chosen_places())}", 2
    return (f"error: internal error in `{command}`: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            f" — this is a bug in plm; `plm --debug {command.removeprefix('plm ')} …` shows the traceback to report"), 1


PASS = (typer.Exit, typer.Abort, typer.TyperException)  # Typer's own exits and usage errors


class ReportingGroup(TyperGroup):
    """Catches, once for every command under it, any exception that escapes: one line on stderr and an
    exit code (see `plm --help`); with --debug the traceback instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (Exception, KeyboardInterrupt) as e:
            if state["debug"]:
                raise
            if is_usage_error(e):  # an unknown, missing or malformed option: one line too, not click's box
                typer.echo(usage_line(e, _command(ctx)), err=True)
                raise typer.Exit(2) from None
            if isinstance(e, PASS):
                raise
            command = _command(ctx)
            line, code = report(e, command)
            rank, world = process()  # each process says it once: the line may come from only one of them
            if world > 1:
                head, _, rest = line.partition(" ")
                line = f"{head.rstrip(':')} (process {rank} of {world}){':' * head.endswith(':')} {rest}"
            typer.echo(line, err=True)
            raise typer.Exit(code) from None


def _command(ctx) -> str:
    """`plm SUBCOMMAND …` as typed below the program, whatever name it was started under."""
    names, c = [ctx.invoked_subcommand], ctx
    while c.parent is not None:
        names.insert(0, c.info_name)
        c = c.parent
    return " ".join(["plm", *filter(None, names)])


def is_usage_error(e: BaseException) -> bool:
    """click's UsageError, from click itself or the copy Typer ≥ 0.20 vendors (typer._click): told by class name."""
    return any(c.__name__ == "UsageError" for c in type(e).__mro__)


def usage_line(e, command: str) -> str:
    """click's usage error as the one `error: what — how to fix` line every other error is."""
    if type(e).__name__ == "NoSuchOption":
        close = list(vars(e).get("possibilities") or [])
        fix = f"did you mean {' or '.join(close[:2])}?" if close else f"`{command} --help` lists its options"
        return f"error: {command} has no option {vars(e).get('option_name')} — {fix}"
    msg = e.format_message().strip().replace("\n", " ").rstrip(".")
    return f"error: {msg[0].lower() + msg[1:] if msg else 'bad usage'} — see `{command} --help`"


class Commands:
    """A command module's commands, added to the one app by plmcli.cli (`register`): a module declares
    them without importing the app, so no command module imports plmcli.cli or another one."""

    def __init__(self):
        self.entries: list = []

    def command(self, name: str | None = None):
        """Like `app.command`, deferred until `register`."""

        def add(fn):
            self.entries.append((name, fn))
            return fn

        return add

    def register(self, app: typer.Typer) -> None:
        for name, fn in self.entries:
            app.command(name)(fn)


class Program(typer.Typer):
    """The `plm` process (console script, python -m plmcli). While a command runs, SIGTERM and SIGUSR1 stop it
    as Ctrl-C does (errors.Terminated), so a scheduler's kill removes temp files too; a training loop defers
    all three to a step boundary. Once a command has ended, its exit code is decided and a late signal has
    nothing left to stop. Ignored from then on, it can no longer kill the interpreter's teardown (which would
    exit by the signal with no message) or print tracebacks from exit handlers. In-process callers (CliRunner)
    do not pass here, so their signals are left alone."""

    def __call__(self, *args, **kwargs):
        import signal
        import threading

        from plmcli.train.signals import SCHEDULER_SIGNALS, raise_terminated

        main = threading.current_thread() is threading.main_thread()
        if main:  # a scheduler's SIGTERM / SIGUSR1 unwinds as Ctrl-C does (temp files removed); training defers them
            for s in SCHEDULER_SIGNALS:
                if signal.getsignal(s) == signal.SIG_DFL:
                    signal.signal(s, raise_terminated)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            if main:
                for s in (signal.SIGINT, *SCHEDULER_SIGNALS):
                    signal.signal(s, signal.SIG_IGN)


# ---------------------------------------------------------------- flags generated from config fields


@dataclass(frozen=True)
class Flag:
    """A config key (section.field) offered as a flag; `names` where it is not --<field-name> (--from for
    model.from_run); `panel` groups it in --help."""

    key: str
    names: tuple = ()
    panel: str | None = None


def config_flags(root, flags: tuple):
    """A Typer command decorator: one option per Flag of `flags` (keys of the config class `root`: FinetuneConfig,
    Recipe), whose type, help and checks are its field's (config.flag_spec). The command gets `flags`: the override
    layer of those given (config.flag_layer), which beats --set."""
    from plmcli.config import flag_spec

    specs = [(f, flag_spec(root, f.key), (f.names or ("--" + f.key.split(".")[1].replace("_", "-"),))) for f in flags]

    def wrap(fn):
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != "flags"]
        for f, spec, names in specs:
            option = typer.Option(None, *names, help=spec.help, metavar=spec.metavar, rich_help_panel=f.panel,
                                  show_default=False)
            params.append(inspect.Parameter(_flag_param(f.key), inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=Optional[spec.kind]))

        @functools.wraps(fn)
        def command(**kwargs):
            from plmcli.config import flag_layer

            given = {f.key: (kwargs.pop(_flag_param(f.key)), names[0]) for f, _, names in specs}
            return fn(**kwargs, flags=flag_layer(root, {k: v for k, v in given.items() if v[0] is not None}))

        command.__signature__ = sig.replace(parameters=params)
        return command

    return wrap


def _flag_param(key: str) -> str:
    return "flag_" + key.replace(".", "__")
