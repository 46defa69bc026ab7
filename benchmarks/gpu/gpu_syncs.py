"""gpu-check's syncs part: how often a training step makes the host wait for the GPU, and where.

A GPU runs the work the host queued; a read of a device value (`.item()`, `bool(t)`, a blocking copy,
`nonzero`) makes the host wait until the queue is empty, and the GPU then idles while the next step is
queued. The loop is written to read nothing on steps that neither log, evaluate nor checkpoint (ARCHITECTURE.md, "GPU first";
tests/train/test_host_syncs.py checks the ops on a CPU); this counts what a GPU run really does:
torch.cuda.set_sync_debug_mode("warn") turns each synchronizing CUDA call into a warning, recorded with the
Python line that made it and the innermost plmcli line on the stack, and `_Training.optimizer_step` /
`after_step` are wrapped to mark where each step begins and ends, so every warning is put in its step.
It sees what torch's sync debug mode sees: copies to the host and stream synchronizations (`.item()`, `.cpu()`,
`nonzero`, a blocking copy); an explicit torch.cuda.synchronize() or Event.synchronize() is not among them.
"""

from __future__ import annotations

import linecache
import threading
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common
from benchmarks.gpu.gpu_check import Ctx, Section, _status, pretrain_run

SYNC_TEXT = "called a synchronizing CUDA operation"  # c10/cuda's warn_or_error_on_sync
MARKED = {"optimizer_step": "step", "after_step": "after"}  # _Training's methods -> the phase they mark


@dataclass(frozen=True)
class Mark:
    """Entering `phase` of optimizer step `step` ("step": its micro-batches and update, `optimizer_step`;
    "after": its logging, evaluation and checkpoint, `after_step`), or leaving either ("out")."""

    phase: str
    step: int


@dataclass(frozen=True)
class Sync:
    """One synchronizing call: the Python line that made it (file:line, with its code), the innermost plmcli
    line on the stack then (None when none was), and the thread (a DataLoader pin-memory thread is not the loop)."""

    site: str
    code: str = ""
    plm: str | None = None
    thread: str = "MainThread"

    def describe(self) -> str:
        text = f"{self.site}" + (f" `{self.code}`" if self.code else "")
        if self.plm and self.plm != self.site:
            text += f" (from {self.plm})"
        return text + ("" if self.thread == "MainThread" else f" [thread {self.thread}]")


def short(filename: str) -> str:
    """A path as a reader finds it: from plmcli/ or benchmarks/ on, or inside site-packages."""
    p = filename.replace("\\", "/")
    for root in ("/plmcli/", "/benchmarks/"):
        if root in p:
            return p[p.rindex(root) + 1:]
    for lib in ("/site-packages/", "/dist-packages/"):
        if lib in p:
            return p[p.rindex(lib) + len(lib):]
    return p


def as_sync(event) -> Sync | None:
    """A recorded Sync as it is; a warnings.WarningMessage (catch_warnings(record=True)) as a Sync when it is
    the sync warning; anything else (another warning) None."""
    if isinstance(event, Sync):
        return event
    if SYNC_TEXT not in str(getattr(event, "message", "")):
        return None
    code = linecache.getline(event.filename, event.lineno).strip()
    return Sync(f"{short(event.filename)}:{event.lineno}", code)


def busy_steps(last: int, log_every: int, eval_every: int, save_every: int) -> set[int]:
    """The steps whose `after_step` logs, evaluates or checkpoints (reads the device by design): every
    log_every / eval_every / save_every-th step (0 = never) and the last, whose stop reason does all three."""
    return {s for s in range(1, last + 1)
            if s == last or s % log_every == 0 or (eval_every and s % eval_every == 0) or (save_every and s % save_every == 0)}


def attribute(events, busy: set[int]) -> dict:
    """Put each sync of `events` (Marks and warnings, in the order they happened) in its place.

    quiet: inside a step that neither logs, evaluates nor checkpoints, after the first (the goal is 0);
    first: step 1 (CUDA's lazy start-up: handles, workspaces, the first pinned buffers), unless it is busy;
    busy: inside a logging / evaluation / checkpoint step (its optimizer_step or after_step);
    setup: before step 1 (data, model, optimizer); outside: after the last step (weights, summary).
    """
    phase, step = "setup", 0
    quiet: dict[int, list[tuple[str, Sync]]] = {}
    cats: dict[str, list[Sync]] = {"quiet": [], "first": [], "busy": [], "setup": [], "outside": []}
    quiet_in = Counter()
    for e in events:
        if isinstance(e, Mark):
            phase, step = e.phase, e.step
            if phase == "step" and step not in busy and step != 1:
                quiet.setdefault(step, [])
            continue
        s = as_sync(e)
        if s is None:
            continue
        if phase in ("setup", "out"):
            cats["setup" if phase == "setup" else "outside"].append(s)
        elif step in busy:
            cats["busy"].append(s)
        elif step == 1:
            cats["first"].append(s)
        else:
            quiet.setdefault(step, []).append((phase, s))
            cats["quiet"].append(s)
            quiet_in[phase] += 1
    return {"quiet_steps": len(quiet), "quiet": len(cats["quiet"]),
            "quiet_max": max((len(v) for v in quiet.values()), default=0),
            "quiet_steps_with_syncs": sum(1 for v in quiet.values() if v),
            "quiet_in_optimizer_step": quiet_in["step"], "quiet_in_after_step": quiet_in["after"],
            **{k: len(v) for k, v in cats.items() if k != "quiet"},
            "sites": {k: Counter(s.describe() for s in v).most_common() for k, v in cats.items() if v}}


class SyncRecorder:
    """While open: every synchronizing CUDA call a warning (when `debug`), recorded as a Sync in `events`
    between the Marks of `_Training.optimizer_step` / `after_step`; other warnings shown once each."""

    def __init__(self, debug: bool):
        self.debug = debug
        self.events: list = []
        self._shown: set = set()

    def __enter__(self) -> "SyncRecorder":
        from plmcli.train import loop

        # catch_warnings(record=True) would keep the warnings but not the stack they came from; a showwarning
        # hook sees both, and catch_warnings puts the previous hook and filters back on the way out.
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")  # the default filter shows a line's warning once: every sync counts
        self._previous = warnings.showwarning
        warnings.showwarning = self._warned
        self._cls = loop._Training
        self._methods = {name: self._cls.__dict__[name] for name in MARKED}
        for name, phase in MARKED.items():
            setattr(self._cls, name, self._marked(self._methods[name], phase))
        if self.debug:
            import torch

            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self.debug:
            import torch

            torch.cuda.set_sync_debug_mode("default")
        for name, fn in self._methods.items():
            setattr(self._cls, name, fn)
        self._catch.__exit__(*exc)

    def _marked(self, fn, phase: str):
        events = self.events

        def marked(training, *args, **kwargs):
            # optimizer_step runs step loop.step + 1; after_step follows it, the count already moved on
            events.append(Mark(phase, training.loop.step + (phase == "step")))
            try:
                return fn(training, *args, **kwargs)
            finally:
                events.append(Mark("out", training.loop.step))

        return marked

    def _warned(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_TEXT not in str(message):
            key = (str(message), filename, lineno)
            if key not in self._shown:
                self._shown.add(key)
                self._previous(message, category, filename, lineno, file, line)
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/plmcli/" in f.filename.replace("\\", "/")]
        plm = f"{short(frames[-1].filename)}:{frames[-1].lineno}" if frames else None
        code = linecache.getline(filename, lineno).strip()
        self.events.append(Sync(f"{short(filename)}:{lineno}", code, plm, threading.current_thread().name))


# ---------------------------------------------------------------- the part


def measure_syncs(ctx: Ctx) -> Section:
    import yaml

    a, n = ctx.args, ctx.args.sync_steps
    runs = []
    for recipe, workers in ((a.gpt, "auto"), (a.bert, "auto"), (a.gpt, "0"), (a.bert, "0")):
        label = Path(recipe).stem
        over = [f"train.mixed_precision={ctx.precision('bf16')}", f"train.log_every={n}", "train.eval_every=0",
                "train.save_every=0", "train.eval_batches=2", f"train.num_workers={workers}"]
        with SyncRecorder(ctx.cuda) as rec:
            res = pretrain_run(ctx, recipe, f"{label}-w{workers}", over, n)
        saved = res["out"] / "recipe.yaml"
        t = yaml.safe_load(saved.read_text())["train"] if saved.is_file() else {"log_every": n, "eval_every": 0, "save_every": 0}
        last = res["summary"].get("steps") or max((m.step for m in rec.events if isinstance(m, Mark)), default=n)
        res.update(label=label, workers=workers, steps=last,
                   syncs=attribute(rec.events, busy_steps(last, t["log_every"], t["eval_every"], t["save_every"])))
        runs.append(res)
        for line in report_lines(res):
            print(line)
    return _section(ctx, runs)


def report_lines(res: dict) -> list[str]:
    s = res["syncs"]
    lines = [f"{res['label']} num_workers={res['workers']}: {res['steps']} steps; {s['quiet']} syncs in "
             f"{s['quiet_steps']} quiet steps (max {s['quiet_max']} a step; goal 0), {s['first']} in step 1, "
             f"{s['busy']} in logging/evaluation/checkpoint steps, {s['setup']} before step 1, {s['outside']} after the "
             f"last; {_status(res)}"]
    for cat in ("quiet", "first", "busy"):
        for site, count in s["sites"].get(cat, []):
            lines.append(f"  {cat}: {count} × {site}")
    return lines


def _section(ctx: Ctx, runs: list[dict]) -> Section:
    a = ctx.args
    goal = all(r["syncs"]["quiet"] == 0 for r in runs)
    same = {r["label"]: [x["syncs"]["quiet"] + x["syncs"]["first"] for x in runs if x["label"] == r["label"]] for r in runs}
    workers_note = "; ".join(f"`{k}`: {v[0]} with auto, {v[1]} with 0" for k, v in same.items() if len(v) == 2)
    text = f"""
`{a.gpt}` and `{a.bert}`, with their own data settings (bert-mini's static NSP instances are padded batches,
which a GPU runs unpadded), pretrain {a.sync_steps} steps in bf16 through `plmcli.api.pretrain`
with `torch.cuda.set_sync_debug_mode("warn")`, logging, evaluating and checkpointing only at the last step;
each run once with the default `train.num_workers=auto` and once with `0`. Every "called a synchronizing
CUDA operation" warning is put in the optimizer step it happened in (`_Training.optimizer_step` and
`after_step` wrapped to mark each step's bounds).

- **quiet steps**: steps 2 … {a.sync_steps - 1}, which neither log, evaluate nor checkpoint. Goal: 0 syncs in
  each. {'**Met**' if goal else '**Not met**'} in every run.
- **step 1** (CUDA's lazy start-up) and the **last step** (logging, the final evaluation and checkpoint read the
  device by design) are counted apart, as are the syncs **before step 1** (data, model, optimizer) and
  **after** it (weights, summary).
- Syncs in steps 1 … {a.sync_steps - 1} by worker setting (0 adds none when the counts match): {workers_note}.
"""
    headers = ["recipe", "num_workers", "steps", "syncs in quiet steps (max a step)", "step 1",
               "logging / eval / checkpoint step", "before step 1", "after the last", "status"]
    rows = [[f"`{r['label']}`", r["workers"], r["steps"], f"{r['syncs']['quiet']} in {r['syncs']['quiet_steps']} "
             f"({r['syncs']['quiet_max']})", r["syncs"]["first"], r["syncs"]["busy"], r["syncs"]["setup"],
             r["syncs"]["outside"], _status(r)] for r in runs]
    sites = []
    for r in runs:
        for cat, what in (("quiet", "quiet steps"), ("first", "step 1"), ("busy", "the last step")):
            top = r["syncs"]["sites"].get(cat, [])[:6]
            if top:
                sites.append(f"- `{r['label']}` workers {r['workers']}, {what}: "
                             + "; ".join(f"{c} × {site}" for site, c in top))
    table = common.markdown_table(headers, rows) + ("\n\nWhere the syncs come from (file:line of the call, the "
                                                    "plmcli line on the stack):\n\n" + "\n".join(sites) if sites else "")
    record = {"goal_met": goal, "runs": [{"recipe": r["label"], "workers": r["workers"], "steps": r["steps"],
                                          "error": r["error"], **r["syncs"]} for r in runs]}
    return Section("host syncs per optimizer step", text, table, record, all(not r["error"] for r in runs))
