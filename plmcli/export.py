"""`plm export`: a finished run in a format other tools read.

A format is a method the run's model provides (`write_<format>(path)`), so a family opts in by
implementing it: n-gram runs write ARPA (`write_arpa`), readable by KenLM, SRILM and the like.
"""

from __future__ import annotations

from pathlib import Path

from plmcli.errors import PlmError

FORMATS = {"arpa": "write_arpa"}
"""Format name -> the model method that writes it."""


def export(run: str | None, format: str, out: str) -> Path:
    """Write run `run` (default runs/latest) as `format` to `out`; returns the path written."""
    from plmcli.api import load_run

    if format not in FORMATS:
        raise PlmError(f"unknown export format '{format}'", f"use one of: {', '.join(FORMATS)}")
    model, _, cfg = load_run(run)
    writer = getattr(model, FORMATS[format], None)
    if writer is None:
        raise PlmError(f"run {run or 'runs/latest'} ({cfg['family']}) cannot be exported as {format}",
                       "ARPA holds n-gram models only: export a run trained with an ngram-* recipe")
    return writer(Path(out))
