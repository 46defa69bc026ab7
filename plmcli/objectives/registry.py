"""Training objectives: one line each. An objective's class carries its `Config` dataclass."""

from __future__ import annotations

from plmcli.registry_util import resolve

OBJECTIVES: dict[str, str] = {
    "clm": "plmcli.objectives.clm:CausalLM",
    "mlm": "plmcli.objectives.mlm:MaskedLM",
    "classify": "plmcli.objectives.classify:Classify",
}


def objective_class(name: str):
    return resolve(OBJECTIVES, name, "objective")


def objective_config_class(name: str):
    return objective_class(name).Config
