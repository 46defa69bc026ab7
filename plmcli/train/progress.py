"""What a person watches during training: a rich progress bar (or plain lines off a terminal),
metrics.jsonl, and TensorBoard events when tensorboard is installed."""

from __future__ import annotations

import json
from pathlib import Path


def _fmt(row: dict | None, ev: dict) -> str:
    parts = []
    if row:
        parts.append(f"loss {row.get('loss', float('nan')):.4f}")
        parts.append(f"lr {row['lr']:.2e}")
        parts.append(f"{row['tok_per_s']:,.0f} tok/s")
        if "mfu" in row:
            parts.append(f"MFU {100 * row['mfu']:.1f}%")
    if ev.get("val_loss") is not None:
        parts.append(f"val {ev['val_loss']:.4f}")
    return "  ".join(parts)


class TrainProgress:
    def __init__(self, console, total: int, start: int, enabled: bool = True):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.row: dict | None = None
        self.progress = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
            )
            self.task = self.progress.add_task("train", total=total, completed=start, info="")
            self.progress.start()

    def update(self, step: int, row: dict | None, ev: dict) -> None:
        if not self.enabled:
            return
        self.row = row or self.row
        if self.live:
            self.progress.update(self.task, completed=step, info=_fmt(self.row, ev))
        else:  # a log file gets each training row once, and each evaluation once
            self.console.print(f"step {step}  {_fmt(row, ev if row is None else {})}", highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class MetricsLog:
    """Appends to metrics.jsonl (so a resumed run continues the same file) and mirrors to TensorBoard."""

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.enabled = enabled
        self.last: dict = {}
        self.file = open(Path(run_dir) / "metrics.jsonl", "a", encoding="utf-8") if enabled else None
        self.tb = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tb"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def write(self, row: dict) -> None:
        if "loss" in row:
            self.last = row
        if not self.enabled:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
