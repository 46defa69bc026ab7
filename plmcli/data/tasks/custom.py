"""Your own data: `--task classification | regression | pair-classification` from TSV, CSV or JSONL.

`--train`, `--dev` and optionally `--test` (or train.*, dev.*, test.* in `--data-dir`) are read by
extension: .tsv/.txt split on tabs without quoting (as GLUE's files: a review may hold a bare `"`),
.csv through the csv module (quoted fields may hold commas and newlines), .jsonl/.json/.ndjson one
JSON object per line. TSV and CSV need a header row, unless the columns are given as 0-based numbers
(`--text-col 0 --label-col 1`: THUCNews' `title<TAB>label` lines). Columns not named are guessed
(TEXT_GUESSES, LABEL_GUESSES below); an id column (ID_GUESSES: id, idx, qid, ...) names the test
predictions, else the row number (0-based) does. The predictions go to OUT/predictions.tsv as
`id<TAB>prediction` (label names, or values for regression). pair-classification reads two texts
(the second guessed from PAIR_GUESSES); classification and regression read a second one when
--text-pair-col names it (STS-style scoring of pairs).

Classes are the labels seen in the training file, sorted (numerically when they are all numbers), and
are saved in the finetuned run (`state()`): `--eval-only` and `load_finetuned` rebuild the same head,
and a dev label outside that set is an error, never a silent new class. Test rows need no label
(a label column in the test file is not read).

Metrics: accuracy (main) and macro-F1 for classes; for regression Pearson (main) and Spearman.
Pearson is the main one because the head is trained with MSE to predict the values themselves and
the predictions are written as values: a linear fit to the gold values is what the model is asked
for, while Spearman would score any monotone distortion of the scale as perfect. (GLUE's STS-B keeps
Spearman, as the BERT paper reports it; that task lives in glue.py.)
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from plmcli.data.tasks import Example, Task
from plmcli.errors import PlmError

FORMATS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
"""File extension -> how its rows are read."""
TEXT_GUESSES = ("text", "sentence", "text_a", "sentence1", "question1", "premise", "content", "review", "title")
PAIR_GUESSES = ("text_b", "sentence2", "question2", "hypothesis")
LABEL_GUESSES = ("label", "labels", "gold_label", "class", "score", "target")
ID_GUESSES = ("id", "idx", "qid", "index", "guid")
_FLAGS = {"text": "--text-col", "pair": "--text-pair-col", "label": "--label-col"}
_GUESSES = {"text": TEXT_GUESSES, "pair": PAIR_GUESSES, "label": LABEL_GUESSES}


@dataclass
class Table:
    """One file's rows as dicts (column -> raw value) with their line numbers, and its columns
    (None: a headerless TSV/CSV read by column numbers, whose keys are "0", "1", ...)."""

    path: Path
    columns: list | None
    rows: list  # [(line, {column: value})]


@dataclass
class OwnDataTask(Task):
    name: str = "classification"
    objective: str = "classify"
    regression: bool = False
    pairs: bool = False
    """pair-classification: every example is a pair (text a, text b); the others read a second text
    only when --text-pair-col names one."""
    symmetric_pair: bool = False
    """Task.symmetric_pair: regression on pairs scores their similarity (STS-style), read in both orders from a causal LM."""
    num_labels: int = 2
    """Set by load() from the training labels (or by restore()); 1 for regression."""
    label_names: tuple = ()
    metrics: tuple = ("accuracy", "macro_f1")
    main_metric: str = "accuracy"
    eval_splits: dict = field(default_factory=lambda: {"dev": ""})
    test_splits: dict = field(default_factory=lambda: {"test": "predictions.tsv"})
    restored: bool = False
    """restore() fixed the label set: load() checks the data against it instead of rediscovering it."""

    def __post_init__(self):
        if self.regression:
            self.num_labels, self.metrics, self.main_metric = 1, ("pearson", "spearman"), "pearson"

    # -------------------------------------------------------------- state

    def state(self) -> dict:
        return {"label_names": list(self.label_names)}

    def restore(self, state: dict) -> None:
        names = state.get("label_names")
        if names is None:
            return
        self.label_names = tuple(str(n) for n in names)
        if not self.regression:
            self.num_labels = len(self.label_names)
        self.restored = True

    # -------------------------------------------------------------- reading

    def load(self, data_dir: str | None) -> dict[str, list[Example]]:
        files = self._files(data_dir)
        tables = {split: read_table(path, self._headerless()) for split, path in files.items()}
        splits, lines, label_cols = {}, {}, {}
        for split, table in tables.items():
            splits[split], lines[split], label_cols[split] = self._examples(table, labeled=split != "test")
        splits.setdefault("train", [])  # eval-only without --train: nothing to train on, nothing needed
        if self.regression:
            if not self.restored:  # what the one output predicts: the label column's name
                self.label_names = (label_cols.get("train") or label_cols["dev"],)
            return splits
        if not self.restored:
            found = {e.label for e in splits["train"]}
            if len(found) < 2:
                raise PlmError(f"{files['train']}: every training example has the label {next(iter(found))!r}; "
                               "classification needs at least two classes",
                               "check --label-col, or pass a training file with more than one class")
            self.label_names = tuple(sorted(found, key=_label_order(found)))
            self.num_labels = len(self.label_names)
        index = {name: i for i, name in enumerate(self.label_names)}
        for split in ("train", "dev"):
            for e, line in zip(splits[split], lines.get(split, ())):
                if e.label not in index:
                    raise self._unknown_label(e.label, tables[split].path, line, files.get("train"))
                e.label = index[e.label]
        return splits

    def _unknown_label(self, label: str, path: Path, line: int, train: Path | None) -> PlmError:
        shown = ", ".join(self.label_names[:20]) + (", ..." if len(self.label_names) > 20 else "")
        if self.restored:
            return PlmError(f"{path} line {line}: label {label!r} is not one of the finetuned run's "
                            f"{len(self.label_names)} labels ({shown})",
                            "score this run only on data with the labels it was trained on")
        return PlmError(f"{path} line {line}: label {label!r} never occurs in the training file {train} "
                        f"(its {len(self.label_names)} labels: {shown})",
                        "fix the label, or add examples of it to the training file")

    def _files(self, data_dir) -> dict[str, Path]:
        o = self.options
        given = {"train": o.train, "dev": o.dev, "test": o.test}
        folder = Path(data_dir) if data_dir else None
        if folder is not None and not folder.is_dir():
            raise PlmError(f"--data-dir {folder} is not a directory",
                           "pass a folder holding train.tsv, dev.tsv (and test.tsv), or give --train and --dev")
        files = {}
        for split, name in given.items():
            if name:
                path = Path(name)
                if not path.is_file():
                    raise PlmError(f"--{split} {path} not found", f"pass the path of your {split} file")
                files[split] = path
            elif folder is not None:
                found = [folder / f"{split}{ext}" for ext in FORMATS if (folder / f"{split}{ext}").is_file()]
                if found:
                    files[split] = found[0]
        need = ("dev",) if self.restored else ("train", "dev")  # eval-only needs no training data
        missing = " and ".join(f"--{s}" for s in need if s not in files)
        if missing:
            where = f" (--data-dir {folder} has no such train.*/dev.* file)" if folder else ""
            raise PlmError(f"--task {self.name} needs {missing}: files in TSV, CSV or JSONL{where}",
                           f"e.g. plm finetune --task {self.name} --train train.tsv --dev dev.tsv "
                           "--text-col sentence --label-col label")
        return files

    def _headerless(self) -> bool:
        """Columns given as numbers mean TSV/CSV files without a header row."""
        given = {role: self._given(role) for role in _FLAGS if self._given(role)}
        numeric = {role for role, col in given.items() if col.strip().isdigit()}
        if numeric and numeric != set(given):
            raise PlmError(f"{', '.join(_FLAGS[r] for r in given)}: give every column as a name (files with a header) "
                           "or every one as a 0-based number (files without one), not a mix",
                           "e.g. --text-col 0 --label-col 1 for `text<TAB>label` lines")
        return bool(numeric)

    def _examples(self, table: Table, labeled: bool) -> tuple[list[Example], list[int], str | None]:
        """The file's examples (labels still raw strings, or floats for regression), their line
        numbers, and its label column."""
        text = self._column(table, "text", required=True)
        pair = self._column(table, "pair", required=self.pairs or bool(self._given("pair")))
        label = self._column(table, "label", required=True) if labeled else None
        if pair is None and self._given("text") is None and table.columns:
            loose = [c for c in PAIR_GUESSES if c in table.columns]
            if loose:  # e.g. sentence1 + sentence2 read as single sentences: half the input silently dropped
                raise PlmError(f"{table.path} has a second-text column '{loose[0]}' that --task {self.name} "
                               "would ignore", f"pass --text-pair-col {loose[0]} to read pairs, "
                               f"or --text-col {text} to read {text} alone")
        if table.columns is None and label is not None:
            line, first = table.rows[0]
            if str(first.get(label, "")).strip().lower() in LABEL_GUESSES:
                raise PlmError(f"{table.path} line {line} looks like a header ('{first[label]}'), but the columns "
                               "were given as numbers (files without a header)",
                               "name the columns instead, e.g. --text-col text_a --label-col label")
        used = (text, pair, label)
        ident = next((c for c in ID_GUESSES if table.columns and c in table.columns and c not in used), None)
        examples = []
        for n, (line, row) in enumerate(table.rows):
            examples.append(Example(_field(table, line, row, text),
                                    _field(table, line, row, pair) if pair is not None else None,
                                    self._label(table, line, _field(table, line, row, label)) if labeled else None,
                                    _field(table, line, row, ident) if ident else str(n)))
        if not examples:
            raise PlmError(f"{table.path} has no examples", "pass a file with a header row and at least one data row")
        return examples, [line for line, _ in table.rows], label

    def _column(self, table: Table, role: str, required: bool) -> str | None:
        """The column of `role` in this file: the one given, else the first guess it has."""
        given = self._given(role)
        cols = table.columns
        if given is not None:
            given = given.strip() if cols is None else given
            if cols is not None and given not in cols:
                raise PlmError(f"{table.path} has no column '{given}' ({_FLAGS[role]}); its columns: {_shown(cols)}",
                               f"pass {_FLAGS[role]} with one of those names")
            return given
        if not required:
            return None
        if cols is None:
            raise PlmError(f"{_FLAGS[role]} is missing: with columns given as numbers (no header) it cannot be guessed",
                           f"give {_FLAGS[role]} as a 0-based column number too")
        found = next((c for c in _GUESSES[role] if c in cols), None)
        if found is None:
            raise PlmError(f"{table.path}: no {role} column found (looked for {', '.join(_GUESSES[role])}); "
                           f"its columns: {_shown(cols)}",
                           f"name it with {_FLAGS[role]}; a file without a header row takes 0-based column numbers, "
                           f"e.g. --text-col 0 --label-col 1")
        return found

    def _given(self, role: str) -> str | None:
        o = self.options
        return {"text": o.text_col, "pair": o.text_pair_col, "label": o.label_col}[role]

    def _label(self, table: Table, line: int, raw: str):
        raw = raw.strip()
        if not raw:
            raise PlmError(f"{table.path} line {line}: the label is empty", "every train and dev row needs a label")
        if not self.regression:
            return raw
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise PlmError(f"{table.path} line {line}: regression label {raw!r} is not a finite number",
                           "regression labels are numbers (e.g. 3.5); for classes use --task classification")
        return value

    # -------------------------------------------------------------- scoring and writing

    def format_prediction(self, pred) -> str:
        if self.regression:
            return f"{float(pred):.6g}"
        return self.label_names[int(pred)]

    def write_predictions(self, path: Path, ids, preds) -> None:
        lines = ["id\tprediction"] + [f"{i}\t{self.format_prediction(p)}" for i, p in zip(ids, preds)]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ files


def read_table(path: Path, headerless: bool = False) -> Table:
    """A TSV, CSV or JSONL file as a Table (format from the extension)."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise PlmError(f"{path}: unknown file type '{path.suffix}'",
                       "name it .tsv or .txt (tab-separated), .csv (comma-separated, quoted) "
                       "or .jsonl (one JSON object a line)")
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: drop a BOM (Excel's CSV export writes one)
    except UnicodeDecodeError as e:
        raise PlmError(f"{path} is not UTF-8 text (byte {e.start})", "save the file as UTF-8") from None
    if kind == "jsonl":
        return _read_jsonl(path, text)
    if kind == "tsv":
        # split("\n"), not splitlines(): text may hold \x0b, \x1c or U+2028, which are not line ends here.
        rows = [(n, line.rstrip("\r").split("\t")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    else:
        rows, reader, end = [], csv.reader(io.StringIO(text, newline="")), 0
        for fields in reader:
            start, end = end + 1, reader.line_num  # a quoted field may span lines: report where the row starts
            if any(f.strip() for f in fields):
                rows.append((start, fields))
    if not rows:
        raise PlmError(f"{path} is empty", "pass a file with a header row and data rows")
    if headerless:
        return Table(path, None, [(n, {str(i): f for i, f in enumerate(fields)}) for n, fields in rows])
    header = [c.strip() for c in rows[0][1]]
    return Table(path, header, [(n, dict(zip(header, fields))) for n, fields in rows[1:]])


def _read_jsonl(path: Path, text: str) -> Table:
    rows, columns = [], None
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlmError(f"{path} line {n}: not JSON ({e.msg})",
                           "write one JSON object per line (JSON Lines)") from None
        if not isinstance(obj, dict):
            raise PlmError(f"{path} line {n}: a JSON {type(obj).__name__}, not an object",
                           "write one JSON object per line, e.g. {\"text\": \"...\", \"label\": \"pos\"}")
        columns = columns if columns is not None else list(obj)
        rows.append((n, obj))
    if not rows:
        raise PlmError(f"{path} is empty", "write one JSON object per line")
    return Table(path, columns, rows)


def _field(table: Table, line: int, row: dict, column: str) -> str:
    if column not in row or row[column] is None:
        if table.columns is None:
            what = f"has {len(row)} fields, column {column} (0-based) is missing"
        elif FORMATS[table.path.suffix.lower()] == "jsonl":
            what = f"has no '{column}'"
        else:
            what = f"has {len(row)} of the header's {len(table.columns)} fields, none for '{column}'"
        raise PlmError(f"{table.path} line {line} {what}", "every row needs the text and label columns")
    value = row[column]
    if isinstance(value, (dict, list)):
        raise PlmError(f"{table.path} line {line}: '{column}' is a JSON {type(value).__name__}, not a string",
                       "give texts and labels as strings or numbers")
    return value if isinstance(value, str) else json.dumps(value)  # 1 -> "1", true -> "true"


def _label_order(labels):
    """Sort key: numerically when every label is a number ("2" before "10"), else as strings."""
    try:
        [float(x) for x in labels]
    except ValueError:
        return str
    return lambda x: (float(x), x)


def _shown(columns: list) -> str:
    return ", ".join(columns[:15]) + (", ..." if len(columns) > 15 else "") if columns else "(none)"


CLASSIFICATION = OwnDataTask(name="classification")
REGRESSION = OwnDataTask(name="regression", regression=True, symmetric_pair=True)
PAIR_CLASSIFICATION = OwnDataTask(name="pair-classification", pairs=True)
