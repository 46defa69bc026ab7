"""What a person watches during training: a time estimate before the first step, a rich progress bar
(or plain lines off a terminal), metrics.jsonl, and the same rows to the trackers of train.report_to."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from plmcli.train import trackers

FAR_S = 3 * 86400  # a run estimated longer than this is far too big for the device: say what would fit
FIT_S = 86400  # the --max-steps a hint proposes fit in about a day
# The refined estimate skips the first micro-batches of a session: the first pays for the allocator growing,
# kernel selection (oneDNN primitives, cuBLAS/cuDNN heuristics), DataLoader workers starting and, with
# accum = 1, the optimizer's lazily created state; one more absorbs what is left of that. torch.compile
# compiles on the first call and may recompile on the second (a new shape marks dimensions dynamic), so a
# compiled run skips one more. Then STEADY micro-batches are timed: their mean × accum is an optimizer step.
WARMUP = 2
WARMUP_COMPILED = 3
STEADY = 3


def duration(s: float) -> str:
    """A span of seconds as a person reads it: 40ms, 3.5s, 3m12s, 5h20m, 4.5 days, 5.9 years."""
    if s < 0.01:
        return f"{s * 1e3:.1f}ms"
    if s < 1:
        return f"{s * 1e3:.0f}ms"
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 2 * 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    if s < 365 * 86400:
        return f"{s / 86400:.1f} days"
    return f"{s / (365.25 * 86400):.1f} years"


@functools.lru_cache(maxsize=8)
def device_flops(device_type: str, index: int | None = None, precision: str = "no") -> float:
    """FLOP/s of square matmuls on this device in the run's precision, measured once per process.

    Dense matmul is the best case: training also runs elementwise ops, attention softmax and the
    optimizer, so a time derived from this is a lower bound. Built from torch.ones, not torch.randn:
    drawing from the global RNG would shift every later dropout mask (and break bitwise resume).
    """
    import torch

    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    cuda = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32) if cuda else torch.float32
    n = 4096 if cuda else 384
    a = torch.ones(n, n, device=device, dtype=dtype)
    b = torch.ones(n, n, device=device, dtype=dtype)

    def timed(reps: int) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    timed(1)  # warm-up: kernel selection, thread pool start
    reps = 1
    while timed(reps) < 0.005 and reps < 1024:  # long enough to be more than timer noise
        reps *= 4
    # The best of a few: on a shared machine a single timing mostly measures the neighbours.
    return 2 * n ** 3 * reps / max(min(timed(reps) for _ in range(5)), 1e-9)


def _smaller_recipe(family: str, params: int, of: str = "") -> tuple[str, int] | None:
    """The shipped recipe of `family` with the fewest parameters, if it has fewer than `params`; one of the same
    line as recipe `of` (its first word: bert-base -> bert-mini, not roberta-mini of the same family) when there is one.

    Read from the shipped parameter table; an entry gone stale (its recipe edited) is skipped rather
    than recounted, which would build a model just to word a hint."""
    from plmcli.config import raw_recipe, shipped_recipes
    from plmcli.recipe_params import read_table, table_params

    table, found = read_table(), []
    for name in shipped_recipes():
        raw = raw_recipe(name)
        if (raw.get("model") or {}).get("family") != family:
            continue
        n = table_params(name, raw, table)
        if n is not None and 0 < n < params:
            found.append((n, name))
    line = [f for f in found if f[1].split("-")[0] == of.split("-")[0]]
    n, best = min(line or found) if found else (0, None)
    return (best, n) if best else None


def _fmt(row: dict | None, ev: dict) -> str:
    parts = []
    if row:
        parts.append(f"loss {row.get('loss', float('nan')):.4f}")
        parts.append(f"lr {row['lr']:.2e}")
        parts.append(f"{row['tok_per_s']:,.0f} tok/s")
        if "mfu" in row:
            parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if ev.get("val_loss") is not None:
        parts.append(f"val {ev['val_loss']:.4f}" + _per_source(ev))
    return "  ".join(parts)


def _per_source(ev: dict) -> str:
    """A mix's validation loss per source (val_loss/NAME, data/mixing.py) after the pooled one, when it is short:
    up to 3 sources of up to 12 characters; metrics.jsonl has them all."""
    each = {k.split("/", 1)[1]: v for k, v in ev.items() if k.startswith("val_loss/")}
    if not each or len(each) > 3 or max(len(n) for n in each) > 12:
        return ""
    return " (" + ", ".join(f"{n} {v:.3f}" for n, v in each.items()) + ")"


class TrainProgress:
    """The bar (on a terminal) or sparse lines (in a log), fed host-side numbers only.

    `step` and `micro_batch` run every optimizer step / micro-batch and never read a device tensor
    (that would wait for the device each time); the loss shown is the last logged one. The ETA is this
    session's mean time per optimizer step (evaluations and checkpoints included), and until two steps
    are done the steady estimate `micro_batch` printed, else the one `begin` printed. `compiled` (the model
    runs under torch.compile) skips one more warm-up micro-batch; `clock` is for tests.
    """

    def __init__(self, console, total: int, start: int, enabled: bool = True, accum: int = 1, clock=time.perf_counter,
                 compiled: bool = False):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.total, self.start, self.accum, self.clock = total, start, accum, clock
        self.row: dict | None = None
        self.progress = None
        self.micro = 0  # micro-batches done in the current optimizer step
        self.seen = 0  # micro-batches done in this session
        self.warmup = WARMUP_COMPILED if compiled else WARMUP
        self.t_steady = None  # when the warm-up micro-batches ended (device work included): a time or a GPU event
        self.t_end = None  # when the steady window ended, until its estimate is printed
        self.first_step: tuple[int, float] | None = None  # (step, time) when this session's first step ended
        self.last_step: tuple[int, float] | None = None
        self.per_step: float | None = None  # the estimate, seconds per optimizer step
        self.device = None
        self.hinted = False
        self.plan: dict = {}
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[micro]}"),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=total, completed=start, info="", micro="", eta="-")
            self.progress.start()

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def begin(self, run_dir, recipe, model, fpt: float | None, device, world: int = 1, precision: str = "no",
              flops: float | None = None) -> None:
        """Say where the run goes, how many steps it has, and about how long they will take.

        The time is the model's training FLOPs per token (`fpt`, else 6 × parameters) × the tokens of
        an optimizer step, over this device's measured matmul FLOP/s (`flops` to skip measuring): a lower
        bound, and so is its hint. A few steady micro-batches after warm-up refine it (`micro_batch`).
        """
        if not self.enabled:
            return
        left = self.total - self.start
        if left <= 0:
            self._print(f"training {run_dir}: all {self.total:,} optimizer steps are done")
            return
        t = recipe.train
        params = sum(p.numel() for p in model.parameters())
        tokens = t.global_batch_size * t.seq_len
        per_token = fpt or 6 * params
        if flops is None:
            flops = device_flops(device.type, device.index, precision)
        self.device = device
        from plmcli.config import Recipe

        # A pretraining recipe has shipped siblings to shrink to; finetuning passes only train/optim settings.
        self.plan = {"name": recipe.name, "family": recipe.family} if isinstance(recipe, Recipe) else {"name": "this run"}
        self.plan["params"] = params
        self.per_step = per_token * tokens / (flops * world)
        accum = f", {self.accum} micro-batches each" if self.accum > 1 else ""
        steps = f"{left:,} more optimizer steps, {self.start + 1:,} to {self.total:,}" if self.start else f"{left:,} optimizer steps"
        self._print(f"training {run_dir}: {steps} ({t.global_batch_size} × {t.seq_len} tokens{accum})")
        procs = f" × {world} processes" if world > 1 else ""
        self._print(f"estimate: at least {duration(self.per_step)} per optimizer step, {duration(self.per_step * left)} "
                    f"for the run ({per_token:.2g} FLOPs per token × {tokens:,} tokens per step at the "
                    f"{flops:.2g} FLOP/s{procs} a matmul probe measured on {self._device_name()}; "
                    f"refined from {STEADY} steady micro-batches after {self.warmup} warm-up ones)")
        self._hint_if_far("at least {}, by the matmul probe", bound=True)

    def _device_name(self) -> str:
        if self.device is not None and self.device.type == "cuda":
            import torch

            return torch.cuda.get_device_name(self.device)
        return "this CPU" if self.device is None or self.device.type == "cpu" else str(self.device)

    def _hint_if_far(self, says: str, bound: bool = False) -> None:
        """Once: when the estimate is days beyond FAR_S, what would fit (a smaller recipe, fewer steps, a GPU).

        `says` words the run's time (`{}` takes it); `bound`: the estimate is a lower bound (the probe's), so the
        steps it fits into a day are at most that many."""
        if self.hinted or self.per_step is None or self.per_step * (self.total - self.start) <= FAR_S:
            return
        self.hinted = True
        p = self.plan
        ways = []
        smaller = _smaller_recipe(p["family"], p["params"], p.get("name", "")) if "family" in p else None
        if smaller:
            ways.append(f"a smaller {p['family']} recipe (--recipe {smaller[0]}, {smaller[1] / 1e6:,.1f}M parameters "
                        f"against {p['params'] / 1e6:,.1f}M)")
        if (fit := int(FIT_S // self.per_step)) >= 1:
            ways.append(f"fewer steps (at most --max-steps {fit:,} fit in a day)" if bound else
                        f"fewer steps (--max-steps {fit:,} takes about a day)")
        ways.append("more GPUs" if self.device is not None and self.device.type == "cuda" else "a GPU")
        ways = ", ".join(ways[:-1]) + " or " + ways[-1] if len(ways) > 1 else ways[0]
        self._print(f"hint: {p['name']} is far too big for {self._device_name()} "
                    f"({says.format(duration(self.per_step * (self.total - self.start)))}): try {ways}")

    def _mark(self):
        """Now, as the device sees it: on a GPU an event queued behind the work launched so far (a host clock
        would have to wait for that work to count it), else the host clock."""
        if self.device is not None and self.device.type == "cuda":
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    def micro_batch(self) -> None:
        """One micro-batch done: the bar shows k of accum; after the warm-up ones, STEADY timed ones refine the
        estimate (once a session; a session shorter than that keeps the estimate `begin` printed)."""
        if not self.enabled:
            return
        self.micro += 1
        self.seen += 1
        if self.per_step is not None and self.seen in (self.warmup, self.warmup + STEADY):
            if self.seen == self.warmup:
                self.t_steady = self._mark()
            else:
                self.t_end = self._mark()
        self._steady_window()
        if self.live and self.accum > 1:
            self.progress.update(self.task, micro=f"micro-batch {self.micro}/{self.accum}", eta=self.eta())

    def _steady_window(self) -> None:
        """Once the steady window's end has been reached on the device (a GPU event is polled, never waited
        for): the refined estimate and its hint."""
        if self.t_end is None:
            return
        if isinstance(self.t_end, float):
            took = self.t_end - self.t_steady
        elif self.t_end.query():
            took = self.t_steady.elapsed_time(self.t_end) / 1000
        else:
            return
        self.t_end = None
        mean = took / STEADY
        self.per_step = mean * self.accum
        left = self.total - self.start
        self._print(f"estimate: ~{duration(self.per_step)} per optimizer step, ~{duration(self.per_step * left)} "
                    f"for the run ({duration(mean)} a micro-batch, the mean of {STEADY} steady micro-batches after "
                    f"{self.warmup} warm-up ones)")
        self._hint_if_far(f"about {{}}, timed over {STEADY} steady micro-batches")

    def step(self, step: int) -> None:
        """One optimizer step done: the bar moves and its ETA follows."""
        if not self.enabled:
            return
        self.micro = 0
        now = self.clock()
        self.first_step = self.first_step or (step, now)
        self.last_step = (step, now)
        if self.live:
            self.progress.update(self.task, completed=step, micro="", eta=self.eta())

    def eta(self) -> str:
        """Time left: mean seconds per step since this session's first step, else the estimate."""
        if self.last_step and self.last_step[0] > self.first_step[0]:
            (s0, t0), (s1, t1) = self.first_step, self.last_step
            per_step = (t1 - t0) / (s1 - s0)
            return duration(per_step * (self.total - s1))
        if self.per_step is None:
            return "-"
        done = self.last_step[0] if self.last_step else self.start
        return "~" + duration(self.per_step * (self.total - done))

    def update(self, step: int, row: dict | None, ev: dict) -> None:
        if not self.enabled:
            return
        self.row = row or self.row
        if self.live:
            self.progress.update(self.task, completed=step, info=_fmt(self.row, ev))
        else:  # a log file gets each training row once, and each evaluation once
            self._print(f"step {step}  {_fmt(row, ev if row is None else {})}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class StageProgress:
    """Progress through a command's long stages (plm probe's vectors and probes, plm generate's tokens), on stderr.

    On a terminal a transient rich bar (done / total, elapsed, time left); `delay`: seconds of work before it
    first shows, so that work done sooner never flashes one. Off a terminal (a log, a pipe, CI, tests) nothing,
    as datasets' bars there (pipelines/common.py), unless `log_every` (seconds) is set: then, as pretrain logs
    its steps, a plain line when a stage starts and at most that often while it runs. `start(what, total)`
    begins a stage in place of the one before; `advance(n)` moves it."""

    def __init__(self, console, delay: float = 0.0, log_every: float | None = None, clock=time.monotonic):
        self.progress, self.console = None, None
        if console is not None and console.is_terminal:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)
        elif console is not None and log_every is not None:
            self.console = console
        self.task = None
        self.delay, self.log_every, self.clock = delay, log_every, clock
        self.since = self.logged = clock()
        self.shown = False
        self.stage = ("", 0, 0, self.since)  # off a terminal: what, done, total, when it started

    def __enter__(self):
        self.since = self.clock()
        self._show()
        return self

    def __exit__(self, *exc):
        if self.shown:
            self.progress.stop()

    def _show(self) -> None:
        if self.progress and not self.shown and self.clock() - self.since >= self.delay:
            self.progress.start()
            self.shown = True

    def _line(self, text: str) -> None:
        self.logged = self.clock()
        self.console.print(text, highlight=False, soft_wrap=True)

    def start(self, what: str, total: int) -> None:
        if self.progress:
            if self.task is not None:
                self.progress.remove_task(self.task)
            self.task = self.progress.add_task(what, total=total)
            if self.shown:  # every stage is seen, however soon the next replaces it
                self.progress.refresh()
        elif self.console:
            self.stage = (what, 0, total, self.clock())
            self._line(f"{what}: 0/{total:,}")

    def advance(self, n: int = 1) -> None:
        if self.progress:
            self.progress.advance(self.task, n)
            self._show()
        elif self.console:
            what, done, total, began = self.stage
            self.stage = (what, done + n, total, began)
            if self.clock() - self.logged >= self.log_every:
                self._line(f"{what}: {done + n:,}/{total:,} ({duration(self.clock() - began)})")


class MetricsLog:
    """Appends to metrics.jsonl (so a resumed run continues the same file) and gives each row to the run's trackers
    (train.report_to: `tracked` is the (accelerator, recipe) whose trackers start here; trackers.py)."""

    def __init__(self, run_dir: Path, enabled: bool = True, step: int = 0, tracked: tuple | None = None):
        self.enabled = enabled
        self.last: dict = {}
        path = Path(run_dir) / "metrics.jsonl"
        if enabled and path.is_file():
            _cut_back(path, step)
        self.file = open(path, "a", encoding="utf-8") if enabled else None
        self.accelerator = tracked[0] if tracked else None
        if tracked:
            trackers.start(self.accelerator, run_dir, tracked[1])

    def write(self, row: dict) -> None:
        if "loss" in row:
            self.last = row
        if not self.enabled:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.accelerator is not None and self.accelerator.trackers:
            self.accelerator.log(trackers.numbers(row), step=row["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.accelerator is not None:
            trackers.finish(self.accelerator)
            self.accelerator = None


def _cut_back(path: Path, step: int) -> None:
    """Drop the rows of steps after `step`, where a resumed run starts again: a run killed after its last
    checkpoint logged steps it now redoes, and their rows would come twice (a plot would zigzag). A row that
    is not whole JSON (cut off by the kill) goes too. Written to a temp file and renamed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    keep = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or row.get("step", 0) <= step:
            keep.append(line)
    if len(keep) == len(lines):  # nothing to drop (a finished run resumed): the file stays as it is
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
    tmp.replace(path)
