"""RACE (Lai et al. 2017, "RACE: Large-scale ReAding Comprehension Dataset From Examinations"): multiple choice
with a passage, a question and its options — which option answers the question about the passage.

RACE's own layout is read: one JSON object per article,
`{"article": str, "questions": [str], "options": [[str, ...] per question], "answers": ["A".."D"], "id": str}`,
each question one example. The download holds such objects one per .txt file under `train/high/`,
`train/middle/`, `dev/...`, `test/...`; a split may also be one `.json` file (an object or a list of them) or
a `.jsonl` file (one object a line), and the Hub's flat rows (`ehovy/race`: `article`, `question`, `options`,
`answer`, `example_id`, one question a row) are read too. Files come from --train/--dev/--test (a file or a
folder, read recursively in name order) or from --data-dir holding train/ dev/ test/ (folders, or
train.json(l), dev.json(l), test.json(l)); a file option wins over the folder for its split. Every question
needs the same number of options (RACE: 4); one with another count is an error naming the file.

The inputs (plmcli.objectives.choice) are GPT's multiple-choice transform with the question between its own
delimiters, `<s> passage $ question $ option_k <e>` (Radford et al. 2018, §3.3), and for encoders
`[CLS] passage [SEP] question option_k [SEP]`, as BERT-style RACE systems read it. Scored by accuracy. The test
split needs no answers; finetuning writes its predictions (`index<TAB>A..D`) to RACE.tsv, ids `<article id>-<question
number>`, and the answers its files hold (RACE's do) are kept as labels, which `plm zero-shot --split test` scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from plmcli.data.tasks.choice import ChoiceExample, ChoiceTask, SplitFiles
from plmcli.errors import PlmError

SUFFIXES = (".txt", ".json", ".jsonl")
"""The files a folder split is read from (RACE's downloads hold .txt files of JSON)."""


@dataclass
class RaceExample(ChoiceExample):
    """A multiple-choice question about a passage: `context` is the passage, `endings` the options."""

    question: str = ""


@dataclass
class RaceTask(ChoiceTask):
    name: str = "race"
    label_names: tuple = ("A", "B", "C", "D")
    test_splits: dict = field(default_factory=lambda: {"test": "RACE.tsv"})
    split_files: ClassVar[SplitFiles] = SplitFiles(
        names={s: (f"{s}/", f"{s}.jsonl", f"{s}.json") for s in ("train", "dev", "test")},
        holding="RACE's train/ and dev/ (and test/)", needs="train and dev questions", given="data",
        how="pass --data-dir holding RACE's train/ and dev/ folders, or --train and --dev (files or folders)",
        existing="pass an existing RACE file or folder", folders=True)

    def choice_name(self, i: int) -> str:
        """RACE names its options by letter (answers "A".."D")."""
        return chr(ord("A") + i)

    # -------------------------------------------------------------- reading

    def load(self, data_dir: str | None) -> dict[str, list[RaceExample]]:
        """Splits train, dev and (when given) test."""
        paths = self.files(data_dir)
        splits, choices = {}, {}
        for split, path in paths.items():
            splits[split] = read_race(path, labeled=split != "test")
            choices[split] = len(splits[split][0].endings)
        for split, k in choices.items():
            if k != choices["train"]:
                raise PlmError(f"{paths[split]} has {k} options per question but {paths['train']} has {choices['train']}",
                               "every split of a run needs the same number of options")
        self.set_choices(choices["train"])
        return splits


def race_files(path: Path) -> list[Path]:
    """The files of one split: `path` itself, or the .txt/.json/.jsonl files under the folder, in name order."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise PlmError(f"{path} holds no .txt, .json or .jsonl files",
                       "pass RACE's split folder (e.g. RACE/dev, holding high/ and middle/) or one of its files")
    return files


def read_race(path: Path, labeled: bool = True) -> list[RaceExample]:
    """Every question of a RACE file or folder. `labeled`: each question needs its answer (train, dev)."""
    out: list[RaceExample] = []
    for file in race_files(Path(path)):
        for where, obj in _objects(file):
            out.extend(_questions(obj, where, labeled, default_id=file.stem))
    if not out:
        raise PlmError(f"{path} holds no questions", "pass RACE-format JSON: article, questions, options, answers")
    k = len(out[0].endings)
    for e in out:
        if len(e.endings) != k:
            raise PlmError(f"{path}: question {e.id} has {len(e.endings)} options, the first one {k}",
                           "every question needs the same number of options (RACE: 4)")
    return out


def _objects(file: Path):
    """(where, object) for each JSON object of a file: a .jsonl line, or a .json/.txt document (an object or a list)."""
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlmError(f"{file} is not UTF-8 text (byte {e.start})", "pass RACE's files as downloaded") from None
    if file.suffix.lower() == ".jsonl":
        docs = [(f"{file}:{n}", line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    else:
        docs = [(str(file), text)]
    for where, doc in docs:
        try:
            obj = json.loads(doc)
        except json.JSONDecodeError as e:
            raise PlmError(f"{where} is not JSON ({e.msg} at line {e.lineno} column {e.colno})",
                           "pass RACE's JSON files (.txt as downloaded, .json, or .jsonl with one object a line)") from None
        for i, item in enumerate(obj if isinstance(obj, list) else [obj]):
            if not isinstance(item, dict):
                raise PlmError(f"{where}: item {i} is not a JSON object", "each article is an object with article, "
                               "questions, options, answers")
            yield where, item


def _questions(obj: dict, where: str, labeled: bool, default_id: str) -> list[RaceExample]:
    """The examples of one article object: RACE's lists (questions, options, answers) or the Hub's flat row."""
    flat = "questions" not in obj and "question" in obj
    need = ["article", "question", "options"] if flat else ["article", "questions", "options"]
    if labeled:
        need.append("answer" if flat else "answers")
    absent = [k for k in need if k not in obj]
    if absent:
        raise PlmError(f"{where}: no {', '.join(absent)} key", "RACE objects hold article, questions, options, "
                       "answers (or the Hub's article, question, options, answer)")
    article = _text(obj["article"], where, "article")
    if flat:
        ident = str(obj.get("example_id", default_id))
        questions, options, answers = [obj["question"]], [obj["options"]], [obj.get("answer")]
    else:
        ident = str(obj.get("id", default_id))
        questions, options, answers = obj["questions"], obj["options"], obj.get("answers")
        if not isinstance(questions, list) or not isinstance(options, list) or len(options) != len(questions):
            raise PlmError(f"{where}: {_count(questions)} questions but {_count(options)} option lists",
                           "RACE gives one list of options per question")
        if answers is not None and (not isinstance(answers, list) or len(answers) != len(questions)):
            raise PlmError(f"{where}: {_count(questions)} questions but {_count(answers)} answers",
                           "RACE gives one answer letter per question")
        answers = answers or [None] * len(questions)
    out = []
    for q, (question, opts, answer) in enumerate(zip(questions, options, answers)):
        if not isinstance(opts, list) or len(opts) < 2:
            raise PlmError(f"{where}: question {q} has {_count(opts)} options", "give each question two or more options")
        texts = [_text(o, where, f"option {i} of question {q}") for i, o in enumerate(opts)]
        label = _answer(answer, len(texts), where, q) if labeled or answer is not None else None
        name = ident if flat else f"{ident}-{q}"
        out.append(RaceExample(article, texts, label, name, _text(question, where, f"question {q}")))
    return out


def _text(value, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise PlmError(f"{where}: {what} is not a string", "RACE's article, questions and options are strings")
    return value.strip()


def _count(value) -> str:
    return str(len(value)) if isinstance(value, list) else "no list of"


def _answer(raw, k: int, where: str, q: int) -> int:
    letters = [chr(ord("A") + i) for i in range(k)]
    if not isinstance(raw, str) or raw.strip().upper() not in letters:
        raise PlmError(f"{where}: the answer to question {q} is {raw!r}, not one of {', '.join(letters)}",
                       "RACE answers are the letter of the right option")
    return letters.index(raw.strip().upper())
