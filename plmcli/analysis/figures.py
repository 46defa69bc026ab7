"""Shared figure plumbing: matplotlib off-screen, and PNGs written whole or not at all."""

from __future__ import annotations

from pathlib import Path

from plmcli.errors import needs

FEATURE = "PNG figures (plm attention / probe / plot)"
"""What matplotlib is for, in the error naming the plot extra when it is missing (errors.needs)."""
DPI = 110
"""Readable at 100% zoom on an ordinary screen without becoming a multi-megabyte file."""


def pyplot():
    """matplotlib.pyplot on the Agg backend: plm runs on servers and in CI with no display.

    Imported lazily so commands that draw nothing do not pay matplotlib's import time.
    """
    matplotlib = needs("matplotlib", "plot", FEATURE)
    matplotlib.use("Agg", force=True)
    return needs("matplotlib.pyplot", "plot", FEATURE)


def save_png(fig, path: str | Path) -> Path:
    """Write `fig` to `path` through a temp file and a rename, then close it (figures hold memory)."""
    from plmcli.data.store import atomic_path

    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
