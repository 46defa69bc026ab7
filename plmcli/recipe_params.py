"""Parameter counts of the shipped recipes, kept in plmcli/recipes/params.json so that `plm recipes`
lists them from the YAML alone: no torch import, no model built.

Each entry carries a fingerprint of everything its count depends on: the resolved model section and
tokenizer.vocab_size (which fills a model.vocab_size of 0) from the recipe file, and the bytes of the model code
(plmcli/models and plmcli/kernels, read as files), since a count can change with the code alone (a new bias, a
changed default). An entry whose fingerprint no longer matches is recounted on the meta device and the table
rewritten where the package folder is writable (`current_table`): the table keeps itself current, with no
command to run; the first listing after a change is the slow one. tests/test_recipes.py checks every entry
against a fresh count. To rewrite every entry at once:

    python -m plmcli.recipe_params
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from plmcli.errors import PlmError

TABLE_NAME = "params.json"
REGENERATE = "python -m plmcli.recipe_params"


def table_path() -> Path:
    from plmcli.config import recipe_dir

    return Path(str(recipe_dir() / TABLE_NAME))


@functools.cache
def code_fingerprint() -> str:
    """The model code's bytes hashed, file by file (read, not imported: listing stays torch-free)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for package in ("models", "kernels"):
        for path in sorted((root / package).rglob("*.py")):
            h.update(f"{path.relative_to(root).as_posix()}\0".encode("utf-8") + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def fingerprint(raw: dict) -> str:
    """What a recipe's parameter count depends on: its YAML (`config.raw_recipe`) and the model code, hashed."""
    key = {"model": raw.get("model"), "vocab_size": (raw.get("tokenizer") or {}).get("vocab_size"),
           "code": code_fingerprint()}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def read_table(path: Path | None = None) -> dict:
    """{recipe name: {"params", "fingerprint"}}; empty when the table is missing or unreadable (then every
    count is computed, slowly but right)."""
    try:
        table = json.loads((path or table_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def table_params(name: str, raw: dict, table: dict) -> int | None:
    """The parameter count `table` holds for recipe `name`, or None when it has none or its entry is stale."""
    entry = table.get(name)
    if isinstance(entry, dict) and entry.get("fingerprint") == fingerprint(raw):
        return int(entry["params"])
    return None


def count_params(recipe) -> int:
    """Parameter count of the recipe's model (built on the meta device: no memory, no time), at the tokenizer's
    vocabulary: a `pad_vocab_multiple` adds rows that no token uses (plmcli.models.vocab), a layout for the tensor
    cores and not capacity, so the count is the one the papers publish and `plm recipes` compares with them."""
    from dataclasses import replace

    import torch

    from plmcli.models.registry import build_model
    from plmcli.models.vocab import PadsVocab

    cfg = replace(recipe.model)
    if cfg.vocab_size == 0:
        cfg.vocab_size = recipe.tokenizer.vocab_size
    if isinstance(cfg, PadsVocab):
        cfg.pad_vocab_multiple = 1
    with torch.device("meta"):
        model = build_model(recipe.family, cfg)
    return sum(p.numel() for p in model.parameters())


def recipe_params(name: str, raw: dict, table: dict) -> int:
    """The parameter count of shipped recipe `name` (its YAML `raw`): from `table` while its fingerprint
    matches, else counted on the meta device (imports torch)."""
    known = table_params(name, raw, table)
    if known is not None:
        return known
    from plmcli.config import load_recipe

    return count_params(load_recipe(name))


def build_table() -> dict:
    """Count every shipped recipe afresh (builds each model on the meta device: seconds)."""
    return current_table({}, write=False)


def current_table(table: dict | None = None, write: bool = True) -> dict:
    """`table` (default: the shipped one) with exactly the shipped recipes, each entry whose fingerprint is stale
    or missing counted afresh (this alone imports torch); written back when anything changed and `write`, unless the
    package folder is read-only (an installed package keeps the table it shipped with and recounts)."""
    from plmcli.config import load_recipe, raw_recipe, shipped_recipes

    old = read_table() if table is None else table
    new = {}
    for name in shipped_recipes():
        raw = raw_recipe(name)
        fp, entry = fingerprint(raw), old.get(name)
        fresh = isinstance(entry, dict) and entry.get("fingerprint") == fp
        new[name] = entry if fresh else {"params": count_params(load_recipe(name)), "fingerprint": fp}
    if write and new != old:
        try:
            write_table(new)
        except (OSError, PlmError):
            pass  # a read-only install: counted each time, correctly, just not kept
    return new


def write_table(table: dict, path: Path | None = None) -> Path:
    """Write `table` to `path` (default: the shipped one) through a temp file, so it is never half-written."""
    from plmcli.data.store import atomic_path

    path = path or table_path()
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o644)  # the table ships with the package: readable whatever the umask
    return path


def main() -> None:
    old, new = read_table(), build_table()
    path = write_table(new)
    changed = sorted(n for n in new.keys() | old.keys() if old.get(n) != new.get(n))
    print(f"{path}: {len(new)} recipes; {len(changed)} entries changed{': ' + ', '.join(changed) if changed else ''}")


if __name__ == "__main__":
    main()
