"""Corpora kept the way `datasets` users keep them: JSON Lines / JSON / CSV / Parquet files with a text
column, a directory written by `save_to_disk`, or a Hub dataset (`NAME`, `NAME:CONFIG`, `NAME:CONFIG:SPLIT`).

Such an input reads as the text file whose content is its rows' texts separated by blank lines: each
row is a document (a blank line inside a row also separates documents, as in a text file), its lines
end in "\\n" and CRLF reads as LF. So a corpus tokenizes and scores exactly as that text file would,
and corpus.py keeps one reader of text inputs. Rows are read in batches (load_dataset(streaming=True),
or the memory-mapped Arrow files of a saved dataset), never a whole column at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Iterator

from plmcli.errors import PlmError

BUILDERS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json", ".csv": "csv",
            ".csv.gz": "csv", ".parquet": "parquet"}
"""File name endings read through a `datasets` builder (anything else is plain text)."""
FORMAT_NAMES = {"json": "JSON Lines / JSON", "csv": "CSV", "parquet": "Parquet", "disk": "saved dataset", "hub": "Hub dataset"}
BATCH_ROWS = 1000
# NAME, NAME:CONFIG or NAME:CONFIG:SPLIT, NAME optionally owner/name, as the Hub spells them.
_HUB = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+){0,2}$")
_PATHLIKE_ENDINGS = (".txt", ".gz", ".tsv", ".tokens", ".raw", *BUILDERS)


class TableInput(str):
    """One table of rows to read: the string is the input as the user named it (a path or a Hub name);
    `kind` is a BUILDERS value, "disk" or "hub"; `split` the split read (None: the only one)."""

    def __new__(cls, spec: str, kind: str, column: str, split: str | None = None, config: str | None = None,
                path: str | None = None):
        self = super().__new__(cls, spec)
        self.kind, self.column, self.split, self.config, self.path = kind, column, split, config, path
        return self

    def __reduce__(self):  # picklable for tokenize's worker processes
        return TableInput, (str(self), self.kind, self.column, self.split, self.config, self.path)

    def describe(self) -> str:
        return f"'{self}'" + (f" (split {self.split})" if self.split else "")


class ColumnRequest(str):
    """An input argument that has not been resolved yet, with the --text-column to read it by."""

    def __new__(cls, spec: str, column: str):
        self = super().__new__(cls, spec)
        self.column = column
        return self

    def __reduce__(self):
        return ColumnRequest, (str(self), self.column)


def with_text_column(inputs, column: str | None) -> list[str]:
    """Input arguments that carry `column` (--text-column) to wherever they are read."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    return [ColumnRequest(str(i), column) if column else str(i) for i in inputs]


def builder_of(path: str) -> str | None:
    name = path.lower()
    return next((b for end, b in BUILDERS.items() if name.endswith(end)), None)


def is_saved_dataset(p: Path) -> bool:
    """A directory written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    return (p / "dataset_dict.json").is_file() or ((p / "state.json").is_file() and (p / "dataset_info.json").is_file())


def looks_like_hub_name(arg: str) -> bool:
    return bool(_HUB.match(arg)) and not arg.lower().endswith(_PATHLIKE_ENDINGS)


def resolve(arg: str, column: str, for_eval: bool) -> list[TableInput]:
    """The tables of a saved-dataset directory, a data file or a Hub name: a DatasetDict contributes its
    train split and its validation split (for_eval: its test split, else validation, else train)."""
    p = Path(arg)
    if p.is_dir():
        return _pick(arg, "disk", column, _saved_splits(p), for_eval, path=str(p))
    if p.is_file():
        return [TableInput(arg, builder_of(arg), column, path=str(p))]
    name, config, split = (arg.split(":") + [None, None])[:3]
    if split:
        return [TableInput(arg, "hub", column, split, config or None, name)]
    return _pick(arg, "hub", column, _hub_splits(arg, name, config or None), for_eval, config=config or None, path=name)


def _pick(arg, kind, column, splits: list[str] | None, for_eval: bool, **where) -> list[TableInput]:
    if splits is None:  # a plain Dataset
        return [TableInput(arg, kind, column, **where)]
    if for_eval:
        chosen = next(([s] for s in ("test", "validation", "train") if s in splits), None)
    else:
        chosen = ["train"] + (["validation"] if "validation" in splits else []) if "train" in splits else None
    if chosen is None:
        hint = (f"name the split: {arg}:{splits[0]}" if kind == "hub" else
                "save the split to train on as 'train' (DatasetDict.save_to_disk), or save that split alone")
        raise PlmError(f"{arg} has no {'test, validation or ' if for_eval else ''}train split (its splits: {', '.join(splits)})", hint)
    return [TableInput(arg, kind, column, s, **where) for s in chosen]


def _saved_splits(p: Path) -> list[str] | None:
    import json

    if not (p / "dataset_dict.json").is_file():
        return None
    try:
        return list(json.loads((p / "dataset_dict.json").read_text())["splits"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PlmError(f"cannot read the saved dataset '{p}': dataset_dict.json is damaged ({e})",
                       "save it again with DatasetDict.save_to_disk") from None


def _hub_splits(arg: str, name: str, config: str | None) -> list[str]:
    try:
        from datasets import get_dataset_split_names

        return list(get_dataset_split_names(name, config))
    except Exception as e:
        raise hub_error(arg, e) from None


def hub_error(arg: str, e: BaseException) -> PlmError:
    first = (str(e).splitlines() or [type(e).__name__])[0]
    return PlmError(f"input '{arg}' is not a file, and loading it as a Hub dataset failed ({first})",
                    "check the path, or the Hub name (NAME, NAME:CONFIG or NAME:CONFIG:SPLIT, as load_dataset takes them) "
                    "and the network")


def stats(t: TableInput) -> dict:
    """What identifies a table's content for the corpus cache key."""
    entry = {"kind": t.kind, "column": t.column, "split": t.split}
    if t.kind == "hub":
        return {**entry, "hub": t.path, "config": t.config}
    p = Path(t.path)
    if p.is_dir():  # a saved dataset: every file's name, size and time (save_to_disk rewrites its files)
        h = hashlib.sha256()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            st = f.stat()
            h.update(f"{f.relative_to(p)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return {**entry, "path": str(p.resolve()), "files": h.hexdigest()}
    st = os.stat(p)
    return {**entry, "path": str(p.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns}


def size(t: TableInput) -> int:
    """Bytes on disk (for the progress bar; 0 when unknown)."""
    if t.kind == "hub":
        return 0
    p = Path(t.path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def _batches(t: TableInput) -> Iterator[list]:
    """The text column of `t`, BATCH_ROWS values at a time."""
    if t.kind == "disk":
        from datasets import load_from_disk

        ds = load_from_disk(t.path)
        ds = ds[t.split] if t.split else ds
        _check_column(t, ds.column_names)
        for tbl in ds.select_columns([t.column]).with_format("arrow").iter(batch_size=BATCH_ROWS):
            yield tbl.column(0).to_pylist()
        return
    from datasets import load_dataset

    with _quiet_datasets():
        if t.kind == "hub":
            ds = load_dataset(t.path, t.config, split=t.split, streaming=True)
        else:
            ds = load_dataset(t.kind, data_files=str(Path(t.path).resolve()), split="train", streaming=True)
        if ds.column_names is not None:  # Parquet, JSON with known features: checked before reading rows
            _check_column(t, ds.column_names)
        it = ds.iter(batch_size=BATCH_ROWS)
    while True:
        with _quiet_datasets():
            batch = next(it, None)
        if batch is None:
            return
        _check_column(t, list(batch))
        yield batch[t.column]


@contextlib.contextmanager
def _quiet_datasets():
    """datasets logs a broken file as an error line of its own before raising; ours is the one line."""
    import logging

    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _check_column(t: TableInput, columns: list[str]) -> None:
    if t.column not in columns:
        raise PlmError(f"{t.describe()} has no column '{t.column}' (its columns: {', '.join(columns) or 'none'})",
                       "name the text column with --text-column (or data.text_column)")


def rows(t: TableInput) -> Iterator[str]:
    """The texts of `t`'s rows, in order (a missing value reads as an empty text)."""
    try:
        for values in _batches(t):
            for v in values:
                if v is None:
                    v = ""
                elif not isinstance(v, str):
                    raise PlmError(f"column '{t.column}' of {t.describe()} holds {type(v).__name__} values, not text",
                                   "name a text column with --text-column")
                yield v
    except PlmError:
        raise
    except Exception as e:  # datasets / pyarrow report a broken file in many ways; name the file
        if t.kind == "hub":
            raise hub_error(str(t), e) from None
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise PlmError(f"cannot read {t.describe()} as {FORMAT_NAMES[t.kind]}: {first}",
                       "check the file (or rename it to .txt to read it as plain text)") from None


def lines(t: TableInput) -> Iterator[str]:
    """`t` as lines of text: each row's lines ending in "\\n", a blank line between rows."""
    for i, text in enumerate(rows(t)):
        if i:
            yield "\n"
        parts = text.split("\n")
        if parts[-1] == "":
            parts.pop()
        for part in parts:
            yield (part[:-1] if part.endswith("\r") else part) + "\n"
