"""Parameter counts of the shipped recipes, kept in plmcli/recipes/params.json so that `plm recipes`
lists them from the YAML alone: no torch import, no model built.

Each entry carries a fingerprint of what the count depends on in the recipe file (the resolved model
section, and tokenizer.vocab_size, which fills a model.vocab_size of 0). An entry whose fingerprint no
longer matches its recipe is recounted on the meta device, so an edited recipe is never listed with a
stale number, only more slowly. A count that changes with the model code alone (a new bias, a changed
default) leaves the fingerprint as it was: tests/test_recipes.py compares every entry with a fresh
count and names the command that rewrites the table:

    python -m plmcli.recipe_params
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

TABLE_NAME = "params.json"
REGENERATE = "python -m plmcli.recipe_params"


def table_path() -> Path:
    from plmcli.config import recipe_dir

    return Path(str(recipe_dir() / TABLE_NAME))


def fingerprint(raw: dict) -> str:
    """What a recipe's parameter count depends on in its YAML (`config.raw_recipe`), hashed."""
    key = {"model": raw.get("model"), "vocab_size": (raw.get("tokenizer") or {}).get("vocab_size")}
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
    from plmcli.config import load_recipe, raw_recipe, shipped_recipes

    return {name: {"params": count_params(load_recipe(name)), "fingerprint": fingerprint(raw_recipe(name))}
            for name in shipped_recipes()}


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
