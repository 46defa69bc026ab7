"""SWAG (Zellers et al. 2018, "SWAG: A Large-Scale Adversarial Dataset for Grounded Commonsense Inference"):
multiple choice — which of the endings follows a caption from a video.

Any CSV with SWAG's columns is read: `,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,...,ending3,label`
(the leading unnamed column is the row index of rowanz/swagaf's files; the test file has no label). Files come from
--train/--dev/--test, or from --data-dir holding train.csv / val.csv / test.csv (swagaf's names); a file option wins
over the folder for its split. The number of choices is the number of `ending<k>` columns, and every row must fill
all of them: a count that varies within a file would give examples of different sizes, so it is an error naming the
line. Each choice reads as Hugging Face's run_swag builds it: context = sent1, ending k = sent2 + " " + ending<k>
(sent2 is the start of the second sentence, e.g. "Someone"; the endings continue it).

Scored by accuracy; test predictions (`index<TAB>prediction`, as GLUE's files) are the chosen ending's index.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from plmcli.data.tasks.choice import ChoiceExample, ChoiceTask, SplitFiles
from plmcli.errors import PlmError

_ENDING = re.compile(r"ending(\d+)$")


@dataclass
class SwagTask(ChoiceTask):
    name: str = "swag"
    label_names: tuple = ("0", "1", "2", "3")
    test_splits: dict = field(default_factory=lambda: {"test": "SWAG.tsv"})
    split_files: ClassVar[SplitFiles] = SplitFiles(
        names={"train": ("train.csv",), "dev": ("val.csv",), "test": ("test.csv",)},  # swagaf's names
        holding="SWAG's train.csv and val.csv (and test.csv)", needs="a train and a dev file", given="file",
        how="pass --train FILE --dev FILE (SWAG-format CSVs), or --data-dir holding train.csv and val.csv",
        existing="pass an existing SWAG-format CSV file")

    # -------------------------------------------------------------- reading

    def load(self, data_dir: str | None) -> dict[str, list[ChoiceExample]]:
        """Splits train, dev and (when given) test."""
        paths = self.files(data_dir)
        splits, choices = {}, {}
        for split, path in paths.items():
            splits[split], choices[path] = self.read_file(path, labeled=split != "test")
        first = paths["train"]
        for path, k in choices.items():
            if k != choices[first]:
                raise PlmError(f"{path} has {k} endings per row (ending0..ending{k - 1}) but {first} has {choices[first]}",
                               "every file of a run needs the same number of choices")
        self.set_choices(choices[first])
        return splits

    def read_file(self, path: Path, labeled: bool) -> tuple[list[ChoiceExample], int]:
        """(examples, number of choices) of one SWAG-format CSV."""
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise PlmError(f"{path} is not UTF-8 text (byte {e.start})", "pass SWAG's csv files as downloaded") from None
        reader = csv.reader(io.StringIO(text, newline=""))
        header = [c.strip() for c in next(reader, [])]
        endings = sorted((int(m.group(1)), i) for i, c in enumerate(header) if (m := _ENDING.match(c)))
        k = len(endings)
        need = ["sent1", "sent2"] + (["label"] if labeled else [])
        if [n for n, _ in endings] != list(range(k)) or k < 2 or any(c not in header for c in need):
            shown = ", ".join(header[:14]) + (", ..." if len(header) > 14 else "")
            raise PlmError(f"{path}: expected a header with the columns {', '.join(need[:2])}, ending0, ending1, ..."
                           f"{', label' if labeled else ''}; found: {shown or 'nothing'}",
                           "pass a CSV in SWAG's layout (,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0..3,label)")
        col = {c: header.index(c) for c in need}
        ending_cols = [i for _, i in endings]
        id_col = 0 if header[0] == "" else None  # swagaf's leading unnamed index column
        out, end = [], reader.line_num
        for row in reader:
            line, end = end + 1, reader.line_num  # the record's first line (a quoted field may span several)
            if not any(f.strip() for f in row):
                continue
            filled = [j for j, i in enumerate(ending_cols) if i < len(row) and row[i].strip()]
            if len(filled) != k:
                empty = next(f"ending{j}" for j in range(k) if j not in filled)
                raise PlmError(f"{path}:{line}: {len(filled)} of {k} endings filled ({empty} is empty or missing)",
                               f"every row needs all {k} endings (the choice count cannot vary within a file): fill or drop the row")
            if any(i >= len(row) for i in col.values()):
                raise PlmError(f"{path}:{line}: {len(row)} fields, expected {len(header)}",
                               "the row is cut or not quoted as CSV")
            label = _label(row[col["label"]], k, path, line) if labeled else None
            ident = row[id_col].strip() if id_col is not None and row[id_col].strip() else str(len(out))
            start = row[col["sent2"]].strip()
            out.append(ChoiceExample(row[col["sent1"]].strip(), [f"{start} {row[i].strip()}".strip() for i in ending_cols],
                                     label, ident))
        if not out:
            raise PlmError(f"{path} has a header but no examples", "pass a SWAG-format CSV with rows")
        return out, k


def _label(raw: str, k: int, path, line: int) -> int:
    raw = raw.strip()
    if not raw.isdigit() or int(raw) >= k:
        raise PlmError(f"{path}:{line}: label {raw!r} is not an ending index 0..{k - 1}",
                       "SWAG labels are the index of the right ending")
    return int(raw)
