"""Finetuning tasks: one line each (name -> "module:Task"), imported only when asked for."""

from __future__ import annotations

from plmcli.data.tasks import fresh_task
from plmcli.registry_util import resolve

TASKS: dict[str, str] = {
    "cola": "plmcli.data.tasks.glue:COLA",
    "sst2": "plmcli.data.tasks.glue:SST2",
    "mrpc": "plmcli.data.tasks.glue:MRPC",
    "stsb": "plmcli.data.tasks.glue:STSB",
    "qqp": "plmcli.data.tasks.glue:QQP",
    "mnli": "plmcli.data.tasks.glue:MNLI",
    "qnli": "plmcli.data.tasks.glue:QNLI",
    "rte": "plmcli.data.tasks.glue:RTE",
    "wnli": "plmcli.data.tasks.glue:WNLI",
    "squad": "plmcli.data.tasks.squad:SQUAD",
    "cmrc2018": "plmcli.data.tasks.squad:CMRC2018",
    "conll2003": "plmcli.data.tasks.conll:Conll2003",
    "swag": "plmcli.data.tasks.swag:SwagTask",
    "race": "plmcli.data.tasks.race:RaceTask",
    "classification": "plmcli.data.tasks.custom:CLASSIFICATION",
    "regression": "plmcli.data.tasks.custom:REGRESSION",
    "pair-classification": "plmcli.data.tasks.custom:PAIR_CLASSIFICATION",
}


def get_task(name: str, options=None):
    """A fresh Task for `name` ("SST-2", "sts_b" find sst2, stsb) with `options` (a TaskOptions; None = the defaults)."""
    key = name.lower()
    if key not in TASKS:
        key = key.replace("-", "").replace("_", "")
    return fresh_task(resolve(TASKS, key, "task"), options)


def task_names() -> list[str]:
    return list(TASKS)
