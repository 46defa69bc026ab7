"""What the pipelines share: the data shipped inside the package, and quiet `datasets` off a terminal."""

from __future__ import annotations

from pathlib import Path


def quiet_datasets_off_terminal() -> None:
    """datasets' progress bars help on a terminal and only clutter logs elsewhere.

    Through the environment variable datasets reads when it is imported, not by importing it here: a run
    whose corpus is already tokenized never needs datasets, and importing it costs seconds of start-up.
    A value the user set stays (datasets gives it priority over disable_progress_bars too)."""
    import os
    import sys

    if not sys.stderr.isatty():
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        if "datasets" in sys.modules:  # imported already: its config has read the environment
            sys.modules["datasets"].disable_progress_bars()


def default_corpus(name: str = "shakespeare-sample.txt") -> str:
    """A small corpus shipped inside the package, so the first `plm pretrain` needs no data."""
    from plmcli.config import shipped_sample

    return str(shipped_sample(name))


SAMPLE_DATA_DIRS = ("glue-sample",)
"""Task samples shipped in plmcli/corpus/ (data/ in the repository), named by `--data-dir NAME` anywhere."""


def sample_data_dir(data_dir: str | None) -> str | None:
    """`data_dir`, or the shipped sample it names when no such directory exists here (`--data-dir glue-sample`
    works after `pip install`, outside the repository)."""
    if data_dir and not Path(data_dir).exists() and Path(data_dir).name in SAMPLE_DATA_DIRS:
        return default_corpus(Path(data_dir).name)
    return data_dir
