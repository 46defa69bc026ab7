"""Training curves: `plm plot RUN [RUN…]` draws the runs' metrics.jsonl, one panel per metric, runs overlaid.

metrics.jsonl (plmcli/train/progress.py) holds train rows (step, tokens, loss, lr, tok_per_s, …) and eval
rows (step, tokens, val_loss, val_ppl, …). A resumed run appends to the same file from its last
checkpoint, so a step can appear twice: the later row wins, it belongs to the run that continued.
Malformed lines (a line cut short while a run is writing, stray text) are skipped and counted, not fatal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from plmcli.errors import PlmError, needs

X_AXES = {"step": "optimizer step", "tokens": "training tokens"}
NOT_METRICS = {"step", "tokens", "elapsed_s"}
TITLES = {"loss": "training loss", "lr": "learning rate", "tok_per_s": "throughput (tokens/s)",
          "grad_norm": "gradient norm (before clipping)", "mfu": "model FLOPs utilisation", "val_ppl": "validation perplexity"}
LOG_SPAN = 3.0
"""Losses and perplexities spanning at least this ratio get a log y axis: the early drop would flatten the rest."""


@dataclass
class RunMetrics:
    path: Path
    label: str
    rows: list[dict] = field(default_factory=list)
    skipped: int = 0
    """Lines of metrics.jsonl that were not a JSON object."""

    def series(self, metric: str, x: str) -> tuple[list[float], list[float]]:
        """(x values, metric values) of the rows that have both, in step order, the last row of a step kept."""
        by_step = {}
        for row in self.rows:
            if _number(row.get(metric)) and _number(row.get(x)) and _number(row.get("step")):
                by_step[row["step"]] = (row[x], row[metric])
        pts = [by_step[s] for s in sorted(by_step)]
        return [p[0] for p in pts], [p[1] for p in pts]

    def metrics(self) -> set[str]:
        return {k for row in self.rows for k, v in row.items() if k not in NOT_METRICS and _number(v)}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_metrics(run: str | Path) -> RunMetrics:
    """A run's metrics.jsonl, malformed lines skipped and counted."""
    path = Path(run)
    log = path / "metrics.jsonl"
    if not log.is_file():
        phases = sorted(p.parent for p in path.glob("phases/*/metrics.jsonl"))
        hint = (f"a phased run keeps one per phase: pass {' '.join(map(str, phases))}" if phases
                else "pass a run directory written by `plm pretrain` or `plm finetune`")
        raise PlmError(f"{path} has no metrics.jsonl" if path.is_dir() else f"{path} is not a directory", hint)
    res = RunMetrics(path, path.resolve().name or str(path))
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                res.rows.append(row)
            else:
                res.skipped += 1
    if not res.rows:
        raise PlmError(f"{log} has no metric rows" + (f" ({res.skipped} malformed lines)" if res.skipped else ""),
                       "plot a run that has logged at least one step (train.log_every)")
    return res


def _labels(runs: list[RunMetrics]) -> None:
    """Legend names: the run directory's name, with its parent where two runs share one."""
    names = [r.label for r in runs]
    for r in runs:
        if names.count(r.label) > 1:
            r.label = "/".join(r.path.resolve().parts[-2:])
    seen: dict[str, int] = {}
    for r in runs:  # the same directory twice
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} ({seen[r.label]})"


def choose_metrics(runs: list[RunMetrics], requested: list[str] | None) -> list[str]:
    """The requested metrics (each must be in some run), or by default: loss, every val_* metric, lr."""
    present = set().union(*(r.metrics() for r in runs))
    if requested:
        missing = [m for m in requested if m not in present]
        if missing:
            raise PlmError(f"no run has metric {', '.join(repr(m) for m in missing)}",
                           f"available: {', '.join(sorted(present))}")
        return list(dict.fromkeys(requested))
    chosen = (["loss"] if "loss" in present else []) + sorted(m for m in present if m.startswith("val_")) \
        + (["lr"] if "lr" in present else [])
    if not chosen:
        raise PlmError("the runs logged none of loss, val_*, lr", f"pick with --metrics from: {', '.join(sorted(present))}")
    return chosen


def title(metric: str) -> str:
    if metric in TITLES:
        return TITLES[metric]
    if metric.startswith("val_"):
        return "validation " + metric[4:].replace("_", " ")
    return metric.replace("_", " ")


def make_figure(runs: list[RunMetrics], metrics: list[str], x: str = "step"):
    """The matplotlib Figure: one panel per metric (title, x and y labels), one line per run."""
    from plmcli.analysis.figures import FEATURE, pyplot

    plt = pyplot()
    EngFormatter = needs("matplotlib.ticker", "plot", FEATURE).EngFormatter
    cols = 2 if len(metrics) == 4 else min(3, len(metrics))  # 2 × 2 rather than a row of 3 over a lone panel
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.4 * rows), layout="constrained", squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for ax, metric in zip(axes.flat, metrics):
        values = []
        for i, run in enumerate(runs):
            xs, ys = run.series(metric, x)
            if not xs:
                continue
            # Evaluations are a few points: markers show where they are; dense train logs read better as lines.
            (line,) = ax.plot(xs, ys, color=colors[i % len(colors)], label=run.label, linewidth=1.4,
                              marker="o" if len(xs) <= 30 else None, markersize=3.5)
            handles.setdefault(run.label, line)
            values += ys
        ax.set_title(title(metric))
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if x == "tokens":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        if (metric.endswith("loss") or metric.endswith("ppl")) and values and min(values) > 0 \
                and max(values) / min(values) >= LOG_SPAN:
            ax.set_yscale("log")
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    if len(runs) > 1:
        fig.legend(list(handles.values()), list(handles), loc="outside upper center", ncol=min(len(handles), 4),
                   frameon=False)
    else:
        fig.suptitle(runs[0].label)
    return fig


def plot_runs(runs: list[str], out: str | None = None, metrics: list[str] | None = None, x: str = "step") -> dict:
    """Draw the runs' training curves into a PNG; returns {out, runs, metrics, x, skipped_lines}.

    Default out: RUN/plots.png for one run, ./plm-plot.png for several. Every check runs before the file is written.
    """
    from plmcli.analysis.figures import save_png

    if not runs:
        raise PlmError("no run given", "pass one or more run directories: plm plot runs/a runs/b")
    if x not in X_AXES:
        raise PlmError(f"--x '{x}' is not an x axis", f"one of: {', '.join(X_AXES)}")
    data = [read_metrics(r) for r in runs]
    _labels(data)
    chosen = choose_metrics(data, metrics)
    if not any(r.series(m, x)[0] for r in data for m in chosen):
        raise PlmError(f"no row of the runs has both '{x}' and any of {', '.join(chosen)}", "try --x step")
    target = Path(out) if out else (Path(runs[0]) / "plots.png" if len(runs) == 1 else Path("plm-plot.png"))
    if target.suffix.lower() != ".png":
        raise PlmError(f"--out {target} is not a .png file", "e.g. --out curves.png")
    save_png(make_figure(data, chosen, x), target)
    return {"out": str(target), "runs": [r.label for r in data], "metrics": chosen, "x": x,
            "skipped_lines": {r.label: r.skipped for r in data if r.skipped}}
