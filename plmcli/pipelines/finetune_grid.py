"""`plm finetune` over a grid: the finetuning protocol of Devlin et al. 2018 (§5.1, §A.3) in one command.

BERT picks its finetuning learning rate, epochs and batch size on dev from a small grid (lr ∈ {5e-5, 4e-5,
3e-5, 2e-5}, epochs ∈ {2, 3, 4}, batch ∈ {16, 32}) and, on small data sets where finetuning is unstable,
restarts with other seeds and keeps the best dev run. `grid_cells` expands a FinetuneConfig's `grid`
section into those runs; `run_grid` finetunes each with the one finetune (run_finetune) into its own
complete finetune directory OUT/grid/<lr>-<epochs>-<batch>-seed<k>/, then:

- OUT/grid.json: every run (its dev metrics) and every setting (the main dev metric per seed, mean and
  sample standard deviation over the seeds), the best run named; OUT/grid.md: the same as a table.
- OUT itself becomes the best run, copied (not linked: a copy survives moving OUT, and Windows needs no
  link rights): config.json, model.safetensors, tokenizer.json, finetune.yaml, the predictions, and
  metrics.json last, so `--eval-only --from OUT` and every reader of a finetuned run take OUT as one run.
- OUT/grid.yaml: the grid's own config (`plm finetune --config OUT/grid.yaml --out OUT2` runs it again).

A grid stopped part way (Ctrl-C, a kill, a failure) keeps its finished runs: the same command into the
same OUT skips every run whose metrics.json is there and finetunes the rest afresh (one finetune does not
resume mid-run: an unfinished run's directory is removed first). Finetuning is seeded, so a re-run run
ends as it would have.
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from plmcli.config import FinetuneConfig
from plmcli.config_sections import FinetuneGridConfig
from plmcli.data import store
from plmcli.data.outdir import discard
from plmcli.errors import Interrupted, PlmError, stop_signal
from plmcli.pipelines.finetune import run_finetune
from plmcli.runs import FINISHED_FINETUNE, FROM, check_new_run_dir, resolve_run, runs_root

GRID_DIR = "grid"
"""OUT/grid/: one complete finetune directory per run of the grid."""
GRID_JSON = "grid.json"
GRID_MD = "grid.md"
GRID_CONFIG = "grid.yaml"
"""OUT/grid.yaml: the grid's config; a re-run into OUT must match it to reuse OUT's finished runs."""


@dataclass(frozen=True)
class Cell:
    """One finetune of the grid."""

    lr: float
    epochs: int
    batch_size: int
    seed: int

    @property
    def name(self) -> str:
        return f"{auto(self.lr)}-{auto(self.epochs)}-{self.batch_size}-seed{self.seed}"

    @property
    def setting(self) -> tuple:
        return self.lr, self.epochs, self.batch_size


def auto(value) -> str:
    """A grid setting as shown: a number, or "auto" where the config leaves it to the backbone's size
    (pipelines.finetune.size_defaults chooses it in each run and records it in the run's metrics.json)."""
    return "auto" if value is None else f"{value:g}"


def grid_cells(cfg: FinetuneConfig) -> list[Cell]:
    """The runs of cfg's grid, settings in the order given (lr slowest), seeds train.seed, train.seed + 1, …"""
    g, t = cfg.grid, cfg.train
    return [Cell(lr, epochs, batch, t.seed + k) for lr in g.lr or [cfg.optim.lr] for epochs in g.epochs or [t.epochs]
            for batch in g.batch_size or [t.global_batch_size] for k in range(g.seeds)]


def is_grid(cfg: FinetuneConfig) -> bool:
    """Whether cfg asks for more than one finetune (a grid of one is a plain finetune)."""
    return len(grid_cells(cfg)) > 1


def cell_config(cfg: FinetuneConfig, cell: Cell) -> FinetuneConfig:
    """The config of one run: the grid's settings in the train and optim sections, no grid left."""
    return replace(cfg, grid=FinetuneGridConfig(), optim=replace(cfg.optim, lr=cell.lr),
                   train=replace(cfg.train, epochs=cell.epochs, global_batch_size=cell.batch_size, seed=cell.seed))


def summarise(runs: list[dict]) -> tuple[list[dict], int | None]:
    """(one row per setting: its runs' main dev metric per seed, their mean and sample standard deviation
    (ddof 1; None for one seed), the index of the best run): the best run is the one with the highest
    main dev metric (every task metric is higher-better, as the finetune keeps its best epoch), the first
    of equals."""
    settings: dict[tuple, dict] = {}
    for r in runs:
        row = settings.setdefault((r["lr"], r["epochs"], r["batch_size"]), {
            "lr": r["lr"], "epochs": r["epochs"], "batch_size": r["batch_size"], "seeds": [], "metric": []})
        row["seeds"].append(r["seed"])
        row["metric"].append(r["metric"])
    for row in settings.values():
        known = [m for m in row["metric"] if m is not None]
        row["mean"] = statistics.fmean(known) if known else None
        row["std"] = statistics.stdev(known) if len(known) > 1 else None
    scored = [i for i, r in enumerate(runs) if r["metric"] is not None]
    best = max(scored, key=lambda i: runs[i]["metric"]) if scored else None
    if best is not None:
        key = (runs[best]["lr"], runs[best]["epochs"], runs[best]["batch_size"])
        for k, row in settings.items():
            row["best"] = k == key
    return list(settings.values()), best


def run_grid(cfg: FinetuneConfig, out: str | None = None, console=None) -> dict:
    """Finetune every run of cfg's grid into OUT/grid/, keep the best dev run as OUT; returns OUT/grid.json."""
    from rich.console import Console

    from plmcli.data.tasks.registry import get_task
    from plmcli.train.distributed import process_state

    console = console or Console(stderr=True)
    t = get_task(cfg.task.name, cfg.task_options())
    _check_grid(cfg)
    run = resolve_run(cfg.model.from_run, FROM).resolve()
    # pinned: every run of the grid finetunes the same run, whatever runs/latest becomes meanwhile
    cfg = replace(cfg, model=replace(cfg.model, from_run=str(run)))
    cells = grid_cells(cfg)
    out_dir = Path(out) if out else runs_root() / f"{run.name}-{t.name}-grid-{time.strftime('%Y%m%d-%H%M%S')}"
    state = process_state()
    made = _check_out(out_dir, cfg)  # every process checks, before any work
    state.wait_for_everyone()
    if state.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / FINISHED_FINETUNE).unlink(missing_ok=True)  # OUT is the best run again only once all are done
        store.write_text(out_dir / GRID_CONFIG, cfg.to_yaml())
    state.wait_for_everyone()
    runs = _run_cells(cfg, cells, out_dir, made, t.main_metric, console, state)
    result = _result(cfg, cells, runs, t.name, t.main_metric, out_dir)
    if state.is_main_process:
        _write_result(out_dir, result)
        console.print(grid_table(result))
    state.wait_for_everyone()
    return result


def _check_grid(cfg: FinetuneConfig) -> None:
    g, t = cfg.grid, cfg.train
    names = [f"{lr:g}" for lr in g.lr]
    if len(set(names)) < len(names):  # a run's directory is its name: two runs in one would mix
        raise PlmError(f"--lr {','.join(map(str, g.lr))} has values equal to 6 digits ({', '.join(names)})",
                       "give learning rates that differ within 6 significant digits")
    if t.max_steps and len(g.epochs) > 1:
        raise PlmError(f"--epochs {','.join(map(str, g.epochs))} with --max-steps {t.max_steps}: every run would stop "
                       f"at step {t.max_steps} whatever its epochs", "give one --epochs, or leave --max-steps out")


def _check_out(out_dir: Path, cfg: FinetuneConfig) -> bool:
    """Whether OUT is new (made by this grid); an OUT holding this very grid is taken back (its finished runs
    are kept), any other non-empty OUT refused."""
    marker = out_dir / GRID_CONFIG
    if marker.is_file():
        if marker.read_text(encoding="utf-8") != cfg.to_yaml():
            raise PlmError(f"output directory {out_dir} holds another grid (its {GRID_CONFIG} differs from this one's)",
                           "run the command that made it to finish it, or choose another --out")
        return False
    check_new_run_dir(out_dir, "output directory", "choose another --out, or delete it")
    return not out_dir.exists()


def _run_cells(cfg: FinetuneConfig, cells: list[Cell], out_dir: Path, made: bool, main_metric: str, console,
               state) -> list[dict]:
    """Each run's metrics.json: read back where it is there (a finished run of an earlier try), else finetuned."""
    import json

    runs: list[dict] = []
    began, ran = time.perf_counter(), 0
    for i, cell in enumerate(cells):
        cell_dir = out_dir / GRID_DIR / cell.name
        head = f"grid {i + 1}/{len(cells)}: lr {auto(cell.lr)}, {auto(cell.epochs)} epochs, batch {cell.batch_size}, seed {cell.seed}"
        if (cell_dir / FINISHED_FINETUNE).is_file():
            res = json.loads((cell_dir / FINISHED_FINETUNE).read_text(encoding="utf-8"))
            runs.append(_run_row(cell, res, reused=True))
            console.print(f"{head}: finished before, kept — dev {_metric_text(runs[-1])}", highlight=False, soft_wrap=True)
            continue
        if state.is_main_process:
            store.remove(cell_dir)  # an unfinished try (killed): a finetune starts afresh
        state.wait_for_everyone()
        console.print(f"{head} → {cell_dir}", highlight=False, soft_wrap=True)
        try:
            res = run_finetune(cell_config(cfg, cell), str(cell_dir), False, console)
        except (KeyboardInterrupt, Interrupted) as e:
            raise Interrupted(_stopped(out_dir, made, i, len(cells), len(runs), state.is_main_process),
                              stop_signal(e)) from e
        except BaseException:
            if not runs and state.is_main_process:
                discard(out_dir, made)  # nothing finished: nothing half-written stays
            raise
        runs.append(_run_row(cell, res, reused=False))
        ran += 1
        per_run = (time.perf_counter() - began) / ran
        console.print(_progress_line(i + 1, len(cells), runs, main_metric, per_run * (len(cells) - i - 1)))
    return runs


def _stopped(out_dir: Path, made: bool, i: int, n: int, kept: int, main: bool) -> str:
    if not kept:
        if main:
            discard(out_dir, made)
        return (f"the grid stopped in its first run, before any finished; {out_dir} was "
                f"{'removed' if made else 'emptied'} — run the same command again")
    runs = "1 finished run stays" if kept == 1 else f"{kept} finished runs stay"
    return (f"the grid stopped in run {i + 1} of {n}; its {runs} in "
            f"{out_dir / GRID_DIR} — the same command with --out {out_dir} finetunes only the rest")


def _run_row(cell: Cell, res: dict, reused: bool) -> dict:
    main = res.get("main_metric")
    ran = res.get("settings") or {}
    # An "auto" setting as the run resolved it (size_defaults), so the table shows the lr and epochs trained with.
    resolved = {k: ran.get(k) for k in ("lr", "epochs") if getattr(cell, k) is None}
    return {**asdict(cell), **resolved, "dir": f"{GRID_DIR}/{cell.name}", "metric": (res.get("dev") or {}).get(main),
            "dev": res.get("dev") or {}, "best_epoch": res.get("best_epoch"), "steps": res.get("steps"),
            "elapsed_s": res.get("elapsed_s"), "reused": reused}


def _metric_text(row: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in row["dev"].items() if isinstance(v, (int, float))) or "none"


def _progress_line(done: int, total: int, runs: list[dict], main_metric: str, left_s: float):
    """The bar over the grid, printed as each run ends (the run's own bar is live meanwhile: one live display
    at a time), with that run's main dev metric and the best so far."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    scored = [r["metric"] for r in runs if r["metric"] is not None]
    last = runs[-1]["metric"]
    line = Table.grid(padding=(0, 1))
    for _ in range(5):
        line.add_column(no_wrap=True)
    line.add_row("[bold]grid", ProgressBar(total=total, completed=done, width=24), f"{done}/{total}",
                 f"dev {main_metric} {'–' if last is None else f'{last:.4f}'}"
                 + (f" (best {max(scored):.4f})" if scored else ""), f"ETA {_duration(left_s)}" if done < total else "")
    return line


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _result(cfg: FinetuneConfig, cells: list[Cell], runs: list[dict], task: str, main_metric: str, out_dir: Path) -> dict:
    settings, best = summarise(runs)
    if best is None:
        raise PlmError(f"no run of the grid has a dev {main_metric} to pick the best run by",
                       "give the task a dev set (--dev, or a --data-dir with one)")
    g = cfg.grid
    return {
        "task": task, "main_metric": main_metric, "from_run": cfg.model.from_run,
        "out_dir": str(out_dir),
        "grid": {"lr": g.lr or [cfg.optim.lr], "epochs": g.epochs or [cfg.train.epochs],
                 "batch_size": g.batch_size or [cfg.train.global_batch_size], "seeds": [cfg.train.seed + k for k in range(g.seeds)]},
        "runs": runs, "settings": settings, "best": runs[best], "dev": runs[best]["dev"],
        "elapsed_s": round(sum(r["elapsed_s"] or 0 for r in runs), 2), "cells": len(cells),
    }


def _write_result(out_dir: Path, result: dict) -> None:
    """grid.json and grid.md, then the best run's files into OUT, its metrics.json last: OUT reads as a
    finished finetune only once it is the best run whole."""
    import json

    store.write_json(out_dir / GRID_JSON, result)
    store.write_text(out_dir / GRID_MD, grid_markdown(result))
    best = out_dir / result["best"]["dir"]
    for f in sorted(best.iterdir()):
        if f.is_file() and f.name != FINISHED_FINETUNE:
            with store.atomic_path(out_dir / f.name) as tmp:
                shutil.copyfile(f, tmp)
    metrics = json.loads((best / FINISHED_FINETUNE).read_text(encoding="utf-8"))
    metrics.update(out_dir=str(out_dir), grid={"run": result["best"]["dir"], "summary": GRID_JSON})
    store.write_json(out_dir / FINISHED_FINETUNE, metrics)


def _rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The summary table: a row per setting, a column per seed, mean ± std; the best run starred."""
    seeds, best = result["grid"]["seeds"], result["best"]
    header = ["lr", "epochs", "batch", *(f"seed {s}" for s in seeds), f"mean ± std ({result['main_metric']})"]
    rows = []
    for st in result["settings"]:
        here = (st["lr"], st["epochs"], st["batch_size"]) == (best["lr"], best["epochs"], best["batch_size"])
        cells = []
        for seed, m in zip(st["seeds"], st["metric"]):
            cells.append("–" if m is None else f"{m:.4f}" + (" *" if here and seed == best["seed"] else ""))
        spread = "–" if st["std"] is None else f"{st['std']:.4f}"
        mean = "–" if st["mean"] is None else f"{st['mean']:.4f} ± {spread}"
        rows.append([auto(st["lr"]), auto(st["epochs"]), str(st["batch_size"]), *cells, mean])
    return header, rows


def _best_line(result: dict) -> str:
    b = result["best"]
    return (f"best (*): lr {auto(b['lr'])}, {auto(b['epochs'])} epochs, batch {b['batch_size']}, seed {b['seed']}: dev "
            f"{result['main_metric']} {b['metric']:.4f} ({b['dir']}, now also {result['out_dir']} itself)")


def grid_markdown(result: dict) -> str:
    """OUT/grid.md: the summary table in Markdown, and the best run."""
    header, rows = _rows(result)
    lines = [f"# {result['task']} grid from {result['from_run']}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"std: sample standard deviation over the seeds (n − 1); – for one seed. {_best_line(result)}.", ""]
    return "\n".join(lines)


def grid_table(result: dict):
    """The summary table as rich prints it."""
    from rich.table import Table

    header, rows = _rows(result)
    table = Table(title=f"{result['task']}: {len(result['runs'])} finetunes, dev {result['main_metric']}",
                  caption=_best_line(result))
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*r)
    return table
