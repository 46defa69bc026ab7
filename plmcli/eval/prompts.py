"""Prompt templates: an example's fields put into a template (plm zero-shot's prompts, verbalisers and options)."""

from __future__ import annotations

import string

from plmcli.errors import PlmError


def fill(template: str, fields: dict, key: str) -> str:
    """`template` with the example's `fields`; a field the examples lack is a PlmError naming the ones they have."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise PlmError(f"{key} {template!r} is not a template ({e})",
                       "write fields as {text}; a literal brace as {{ or }}") from None
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise PlmError(f"{key} {template!r} names {{{unknown[0]}}}, a field these examples do not have",
                       f"use {', '.join('{' + f + '}' for f in fields)}")
    return template.format_map(fields)
