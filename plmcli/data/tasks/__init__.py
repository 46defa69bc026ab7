"""Finetuning tasks: one file per task family (glue.py, later squad, ner, swag) + one registry line.

A task knows how to read its data into splits of `Example`s, which objective trains it, how it is
scored and how its test predictions are written. Encoding to ids lives here too, shared by every
task that feeds [CLS] a [SEP] (b [SEP]) to an encoder (or a [SEP] (b [SEP]) [CLS], XLNet's layout; the
layouts themselves live in plmcli.data.pairs).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plmcli.config_sections import TaskOptions  # noqa: F401  (a typed section of finetune's config; read here)
from plmcli.data.pairs import encode_framed, encoder_frame, truncate_pair  # noqa: F401  (truncate_pair: its old home)
from plmcli.data.store import write_meta  # noqa: F401  (the task objectives write their data's meta.json through it)
from plmcli.errors import PlmError


@dataclass
class Example:
    text_a: str
    text_b: str | None = None
    label: int | float | None = None
    """Class index (GLUE label order), a float for regression, None where the split is unlabeled."""
    id: str | None = None
    """The example's id in its file (the test set's `index`), for submission files."""


class Task:
    """What `plm finetune` needs from a task. Subclasses (or instances) fill in the attributes."""

    options: TaskOptions = TaskOptions()
    """Set by `fresh_task` (registry.get_task); read-only for the task."""
    name: str = ""
    suite: str = ""
    """The benchmark the task belongs to (GLUE), named in messages; "" for none."""
    skipped: dict | None = None
    """Rows the reader dropped, by file (reported in metrics.json); None: the task drops none."""
    objective: str = "classify"
    """The objective (plmcli.objectives.registry) that trains it."""
    num_labels: int = 2
    """Classes; 1 = regression."""
    symmetric_pair: bool = False
    """A similarity or paraphrase task on sentence pairs, whose two sentences have no natural order (STS-B, MRPC,
    QQP; not entailment): GPT-style transfer from a causal LM reads both orderings and adds their features
    (Radford et al. 2018, §3.3 "Similarity")."""
    label_names: tuple = ()
    metrics: tuple = ("accuracy",)
    main_metric: str = "accuracy"
    """Selects the best checkpoint (higher is better)."""
    eval_splits: dict = {"dev": ""}
    """Split -> prefix of its metric names; the first is the main dev set."""
    test_splits: dict = {"test": "predictions.tsv"}
    """Split -> submission file name."""

    def load(self, data_dir: str | None) -> dict[str, list[Example]]:
        raise NotImplementedError

    def state(self) -> dict:
        """What a finetuned run must remember to rebuild this task (labels discovered in the data)."""
        return {}

    def restore(self, state: dict) -> None:
        """Rebuild from `state()` (eval-only runs, loading a finetuned model)."""

    def score(self, preds, labels) -> dict[str, float]:
        from plmcli.data.tasks.metrics import compute

        return compute(self.metrics, preds, labels)

    def format_prediction(self, pred) -> str:
        if self.num_labels == 1:
            return f"{float(pred):.3f}"
        return str(self.label_names[int(pred)])

    def write_predictions(self, path: Path, ids, preds) -> None:
        lines = ["index\tprediction"] + [f"{i}\t{self.format_prediction(p)}" for i, p in zip(ids, preds)]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def fresh_task(entry, options: TaskOptions | None = None) -> Task:
    """A Task of its own from a registry entry: a class is instantiated, an instance deep-copied (a task keeps
    what it found in the data, labels among them); `options` None = the defaults."""
    task = entry() if isinstance(entry, type) else copy.deepcopy(entry)
    task.options = options or TaskOptions()
    return task


# ------------------------------------------------------------------ encoding


def require_roles(special_ids: dict, roles=("cls", "sep")) -> None:
    """PlmError unless the run's tokenizer defines every special-token role in `roles`."""
    missing = [r for r in roles if r not in special_ids]
    if missing:
        raise PlmError(f"the run's tokenizer has no {' / '.join(missing)} token",
                       "finetune from an encoder run whose tokenizer defines the cls and sep roles (bert recipes)")


def encode_pairs(tokenizer, special_ids: dict, texts_a: list[str], texts_b: list[str] | None,
                 max_seq_len: int, chunk: int = 8192, layout: str = "cls_first") -> dict[str, np.ndarray]:
    """Each example as its encoder reads it, truncated longest-first to `max_seq_len`:
    layout "cls_first" (BERT) [CLS] a [SEP] (b [SEP]); "cls_last" (XLNet) a [SEP] (b [SEP]) [CLS].
    The arrays of plmcli.data.pairs.encode_framed."""
    frame = encoder_frame(layout, special_ids.get("cls"), special_ids.get("sep"))  # a bad layout: ValueError first
    require_roles(special_ids, ("cls", "sep"))
    return encode_framed(tokenizer, frame, texts_a, texts_b, max_seq_len, chunk)


def save_split(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays)


def load_split(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


