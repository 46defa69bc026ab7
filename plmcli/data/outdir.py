"""Checks on an output directory the user names (`--out`), and the cleanup of one a failed command made.

Building an output whole or not at all is data/store.py's `atomic_dir` / `build_atomically`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from plmcli.errors import PlmError


def find_plm_error(e: BaseException) -> PlmError | None:
    """datasets wraps errors raised inside generators and map workers; dig ours out of the chain."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PlmError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def check_writable(out, flag: str = "--out") -> None:
    """PlmError unless the output `out` (a directory, or a file to write) can be created where it is meant
    to go, found before any work: the nearest existing directory must take a new entry. The check leaves
    nothing behind (a probe directory, made and removed)."""
    out = Path(out)
    base = out if out.is_dir() else out.parent if out.exists() else out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise PlmError(f"cannot write {out}: {base} is a file, not a directory", f"choose a writable {flag}")
    probe = base / f".plm-write-check-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise PlmError(f"cannot write {out}: {e.strerror or e}", f"choose a writable {flag}") from None


def discard(out_dir: Path, made: bool) -> None:
    """Remove what a command wrote into `out_dir`: the directory itself if the command made it, else its
    contents (an empty directory the user made stays)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return
    for child in [out_dir] if made else list(out_dir.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
