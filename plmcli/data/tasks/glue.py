"""GLUE (Wang et al. 2018): nine sentence / sentence-pair tasks in the standard GLUE directory layout.

Each task reads `train.tsv`, its dev file(s) and, when present, its unlabeled test file(s) from
`--data-dir` (the GLUE folder holding SST-2/, CoLA/, ... or one task's folder), or from the Hub's
`nyu-mll/glue` when no folder is given. The files are tab-separated without quoting (MRPC's strings
contain bare `"`), so lines are split on tabs, never parsed as CSV. Quirks handled: the UTF-8 BOM
before MRPC's header, CoLA's headerless train/dev files, STS-B's and MNLI's many columns (found by
header name), QQP's test `id` column. Class indices follow the Hub's GLUE label order.

Main metrics follow the BERT paper's reporting: F1 for MRPC and QQP, Spearman for STS-B, MCC for
CoLA, accuracy elsewhere (MNLI: matched).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from plmcli.data.tasks import Example, Task
from plmcli.errors import PlmError

_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}


@dataclass
class GlueTask(Task):
    name: str = ""
    suite: str = "GLUE"
    folder: str = ""
    """The task's folder in the GLUE download (SST-2, CoLA, ...); also names the submission file."""
    columns: tuple = ()
    """Header names of text a (and text b)."""
    label_column: str | None = "label"
    label_values: tuple = ("0", "1")
    """The labels as written in the files, in class order (empty for regression)."""
    label_names: tuple = ()
    metrics: tuple = ("accuracy",)
    main_metric: str = "accuracy"
    hub_columns: tuple = ()
    num_labels: int = 2
    symmetric_pair: bool = False
    """Task.symmetric_pair: the similarity and paraphrase tasks (STS-B, MRPC, QQP), read in both orders from a causal LM."""
    headerless: dict | None = None
    """Positions of text and label in a file without a header (CoLA train/dev)."""
    lenient: bool = False
    """Skip rows with missing fields instead of failing (QQP's train file has a few)."""
    files: dict = field(default_factory=lambda: dict(_FILES))
    eval_splits: dict = field(default_factory=lambda: {"dev": ""})
    test_splits: dict = field(default_factory=dict)
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "dev": "validation", "test": "test"})
    skipped: dict = field(default_factory=dict)
    """File -> rows skipped by a lenient read (reported in metrics.json)."""

    def __post_init__(self):
        self.test_splits = self.test_splits or {"test": f"{self.folder}.tsv"}
        self.label_names = self.label_names or self.label_values

    # -------------------------------------------------------------- reading

    def load(self, data_dir: str | None) -> dict[str, list[Example]]:
        """Splits train, dev (MNLI: + dev_mismatched) and whichever test splits exist."""
        self.skipped = {}
        if data_dir is None:
            return self._load_hub()
        folder = self.find_folder(data_dir)
        splits = {}
        for split, name in self.files.items():
            path = folder / name
            if not path.is_file():
                if split.startswith("test"):  # unlabeled; without it there are just no predictions to write
                    continue
                needed = ", ".join(n for s, n in self.files.items() if not s.startswith("test"))
                raise PlmError(f"{path} not found: GLUE {self.folder} needs {needed} in {folder}",
                               "pass the folder of the standard GLUE download (download_glue_data.py layout)")
            splits[split] = self.read_file(path, labeled=not split.startswith("test"))
        return splits

    def find_folder(self, data_dir) -> Path:
        root = Path(data_dir)
        if not root.is_dir():
            raise PlmError(f"--data-dir {root} is not a directory",
                           f"pass the GLUE folder (holding {self.folder}/, ...) or the {self.folder} folder itself")
        for child in sorted(root.iterdir()):
            if child.is_dir() and _norm(child.name) == self.name:
                return child
        if _norm(root.name) == self.name:
            return root
        if _norm(root.name) in GLUE_TASKS:
            raise PlmError(f"--data-dir {root} is the folder of another GLUE task, not {self.folder}",
                           f"pass --data-dir {root.parent} (the folder holding {self.folder}/) or {self.folder}/ itself")
        if (root / self.files["train"]).is_file():
            return root  # a task folder under an unusual name
        raise PlmError(f"--data-dir {root} has no {self.folder}/ folder",
                       f"pass the GLUE folder holding {self.folder}/ (any case), or the {self.folder} folder itself")

    def read_file(self, path: Path, labeled: bool) -> list[Example]:
        try:
            text = Path(path).read_text(encoding="utf-8-sig")  # -sig drops MRPC's BOM
        except UnicodeDecodeError as e:
            raise PlmError(f"{path} is not UTF-8 text (byte {e.start})", "pass GLUE's tsv files as downloaded") from None
        # split("\n"), not splitlines(): sentences may hold \x0b, \x1c or U+2028, which are not line ends here.
        rows = [(n, line.rstrip("\r").split("\t")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
        if not rows:
            raise PlmError(f"{path} is empty", f"pass GLUE {self.folder}'s {path.name}")
        need = list(self.columns) + ([self.label_column] if labeled and self.label_column else [])
        header = [c.strip() for c in rows[0][1]]
        if all(c in header for c in need):
            where = {c: header.index(c) for c in need}
            id_col = next((header.index(c) for c in ("index", "id") if c in header), None)
            rows = rows[1:]
        elif self.headerless and labeled and len(header) == self.headerless["ncols"]:
            where = {self.columns[0]: self.headerless["text"], self.label_column: self.headerless["label"]}
            id_col = None
        else:
            shown = ", ".join(header[:12]) + (", ..." if len(header) > 12 else "")
            layout = f" (or {self.headerless['ncols']} columns without a header)" if self.headerless else ""
            raise PlmError(f"{path}: expected a header with the columns {', '.join(need)}{layout}; found: {shown}",
                           f"pass GLUE {self.folder}'s {path.name} in the standard layout")
        width = max(where.values()) + 1
        out, skipped = [], 0
        for n, fields in rows:
            if len(fields) < width:
                if self.lenient:
                    skipped += 1
                    continue
                raise PlmError(f"{path} line {n}: {len(fields)} tab-separated fields, expected at least {width}",
                               "the file is cut or not GLUE's tsv (tabs, no quoting)")
            b = fields[where[self.columns[1]]] if len(self.columns) > 1 else None
            label = self.parse_label(fields[where[self.label_column]], path, n) if labeled else None
            ident = fields[id_col] if id_col is not None and id_col < len(fields) else str(len(out))
            out.append(Example(fields[where[self.columns[0]]], b, label, ident))
        if skipped:
            self.skipped[str(path)] = skipped
        if not out:
            raise PlmError(f"{path} has a header but no examples", f"pass GLUE {self.folder}'s {path.name}")
        return out

    def parse_label(self, raw: str, path, line: int):
        raw = raw.strip()
        if self.num_labels == 1:
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")
            if not 0.0 <= value <= 5.0:
                raise PlmError(f"{path} line {line}: score {raw!r} is not a number in [0, 5]",
                               f"GLUE {self.folder} labels are similarity scores from 0 to 5")
            return value
        if raw not in self.label_values:
            raise PlmError(f"{path} line {line}: label {raw!r} is not a {self.folder} label",
                           f"valid labels: {', '.join(self.label_values)}")
        return self.label_values.index(raw)

    def _load_hub(self) -> dict[str, list[Example]]:
        offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                      for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        hint = f"pass --data-dir path/to/glue (the GLUE folder holding {self.folder}/)"
        if offline:
            raise PlmError("no --data-dir given and the Hub is unreachable (offline mode is set)", hint)
        try:
            import datasets

            ds = datasets.load_dataset("nyu-mll/glue", self.name)
        except Exception as e:  # no network, DNS, proxy, ...: all mean "give me a folder"
            raise PlmError(f"no --data-dir given and the Hub is unreachable ({type(e).__name__})", hint) from e
        splits = {}
        for split, hub in self.hub_splits.items():
            if hub not in ds:
                continue
            d, a, b = ds[hub], self.hub_columns[0], self.hub_columns[1] if len(self.hub_columns) > 1 else None
            labeled = not split.startswith("test")
            splits[split] = [Example(r[a], r[b] if b else None,
                                     (float(r["label"]) if self.num_labels == 1 else int(r["label"])) if labeled else None,
                                     str(r["idx"])) for r in d]
        return splits

    # -------------------------------------------------------------- writing

    def format_prediction(self, pred) -> str:
        """GLUE's submission labels: 0/1 for most, entailment-style words for MNLI/QNLI/RTE."""
        if self.num_labels == 1:
            return f"{min(max(float(pred), 0.0), 5.0):.3f}"
        return self.label_values[int(pred)]


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


NLI3 = ("entailment", "neutral", "contradiction")
NLI2 = ("entailment", "not_entailment")

COLA = GlueTask(name="cola", folder="CoLA", columns=("sentence",), label_names=("unacceptable", "acceptable"),
                metrics=("mcc", "accuracy"), main_metric="mcc", hub_columns=("sentence",),
                headerless={"ncols": 4, "text": 3, "label": 1})
SST2 = GlueTask(name="sst2", folder="SST-2", columns=("sentence",), label_names=("negative", "positive"),
                hub_columns=("sentence",))
MRPC = GlueTask(name="mrpc", folder="MRPC", columns=("#1 String", "#2 String"), label_column="Quality",
                label_names=("not_equivalent", "equivalent"), metrics=("f1", "accuracy"), main_metric="f1",
                hub_columns=("sentence1", "sentence2"), symmetric_pair=True)
STSB = GlueTask(name="stsb", folder="STS-B", columns=("sentence1", "sentence2"), label_column="score",
                label_values=(), label_names=("score",), num_labels=1, metrics=("pearson", "spearman"),
                main_metric="spearman", hub_columns=("sentence1", "sentence2"), symmetric_pair=True)
QQP = GlueTask(name="qqp", folder="QQP", columns=("question1", "question2"), label_column="is_duplicate",
               label_names=("not_duplicate", "duplicate"), metrics=("accuracy", "f1"), main_metric="f1",
               hub_columns=("question1", "question2"), lenient=True, symmetric_pair=True)
MNLI = GlueTask(name="mnli", folder="MNLI", columns=("sentence1", "sentence2"), label_column="gold_label",
                label_values=NLI3, num_labels=3, hub_columns=("premise", "hypothesis"),
                files={"train": "train.tsv", "dev": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
                       "test": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv",
                       "test_ax": "../diagnostic/diagnostic.tsv"},
                eval_splits={"dev": "", "dev_mismatched": "mismatched_"},
                test_splits={"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "test_ax": "AX.tsv"},
                hub_splits={"train": "train", "dev": "validation_matched", "dev_mismatched": "validation_mismatched",
                            "test": "test_matched", "test_mismatched": "test_mismatched"})
QNLI = GlueTask(name="qnli", folder="QNLI", columns=("question", "sentence"), label_values=NLI2,
                hub_columns=("question", "sentence"))
RTE = GlueTask(name="rte", folder="RTE", columns=("sentence1", "sentence2"), label_values=NLI2,
               hub_columns=("sentence1", "sentence2"))
WNLI = GlueTask(name="wnli", folder="WNLI", columns=("sentence1", "sentence2"),
                label_names=("not_entailment", "entailment"), hub_columns=("sentence1", "sentence2"))

GLUE_TASKS = {t.name: t for t in (COLA, SST2, MRPC, STSB, QQP, MNLI, QNLI, RTE, WNLI)}
