"""Every registered family at its tiny size, read from the family class (`LanguageModel.tiny`): the one place a
family's test size is written, so a family registered in plmcli.models.registry reaches every family-wide suite."""

from __future__ import annotations

import torch

from plmcli.config import parse_overrides
from plmcli.config_schema import build_section
from plmcli.models.registry import FAMILIES, build_model, model_class


def families() -> list[str]:
    """The registered families, read when a suite is collected (so one registered by a plugin is among them)."""
    return sorted(FAMILIES)


def tiny_overrides(family: str) -> list[str]:
    """The family's `--set` overrides for a seconds-sized model (model, objective and data keys)."""
    return list(model_class(family).tiny)


def tiny_config(family: str, extra: list[str] | tuple[str, ...] = ()):
    """The family's Config from its defaults and the `model.` keys of its tiny overrides (then `extra`): no recipe
    needed, so a family without shipped recipes builds too."""
    section = parse_overrides([o for o in [*tiny_overrides(family), *extra] if o.startswith("model.")])
    return build_section(model_class(family).Config, section.get("model", {}), "model")


def tiny_model(family: str, extra: list[str] | tuple[str, ...] = (), seed: int = 0):
    """The family built at its tiny config, seeded, in eval mode (no dropout)."""
    torch.manual_seed(seed)
    return build_model(family, tiny_config(family, extra)).eval()
