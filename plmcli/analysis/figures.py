"""Shared figure plumbing: matplotlib off-screen, and PNGs written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

DPI = 110
"""Readable at 100% zoom on an ordinary screen without becoming a multi-megabyte file."""


def pyplot():
    """matplotlib.pyplot on the Agg backend: plm runs on servers and in CI with no display.

    Imported lazily so commands that draw nothing do not pay matplotlib's import time.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path) -> Path:
    """Write `fig` to `path` through a temp file and a rename, then close it (figures hold memory)."""
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
