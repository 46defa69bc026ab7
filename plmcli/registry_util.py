"""Lazy name -> class tables; a family or objective is imported only when a recipe asks for it."""

from __future__ import annotations

import difflib
import importlib

from plmcli.errors import PlmError


def resolve(table: dict[str, str], name: str, what: str):
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(table))}"
        raise PlmError(f"unknown {what} '{name}'", hint)
    module, _, attr = table[name].partition(":")
    return getattr(importlib.import_module(module), attr)
