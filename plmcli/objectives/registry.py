"""Training objectives: one line each. An objective's class carries its `Config` dataclass."""

from __future__ import annotations

from plmcli.registry_util import resolve

OBJECTIVES: dict[str, str] = {
    "clm": "plmcli.objectives.clm:CausalLM",
    "mlm": "plmcli.objectives.mlm:MaskedLM",
    "ernie2": "plmcli.objectives.ernie2:Ernie2",
    "classify": "plmcli.objectives.classify:Classify",
    "qa": "plmcli.objectives.qa:SpanQA",
    "tagging": "plmcli.objectives.tagging:Tagging",
    "choice": "plmcli.objectives.choice:Choice",
    "counts": "plmcli.objectives.ngram:Counting",
    "translation": "plmcli.objectives.seq2seq:Translation",
    "denoising": "plmcli.objectives.seq2seq:Denoising",
    "bptt": "plmcli.objectives.bptt:TruncatedBPTT",
    "bilm": "plmcli.objectives.bilm:BidirectionalLM",
    "rtd": "plmcli.objectives.rtd:ReplacedTokenDetection",
    "plm": "plmcli.objectives.plm:PermutationLM",
}


def objective_class(name: str):
    return resolve(OBJECTIVES, name, "objective")


def objective_config_class(name: str):
    return objective_class(name).Config
