"""CoNLL-2003 named-entity recognition (Tjong Kim Sang & De Meulder 2003): one tag per word, the
format shared by most NER data sets.

A file holds one word per line, its columns separated by whitespace (CoNLL-2003 English: word POS
chunk NER); the first column is the word and the last its tag. A blank line ends a sentence and
`-DOCSTART-` lines (document boundaries) are skipped. Every line of a file has the column count of its
first word line; a test file with a single column is unlabeled (predicted, not scored).

Tags are IOB: O, B-TYPE, I-TYPE. The original CoNLL-2003 files are IOB1, where an entity starts with
I- and B- only separates two adjacent entities of one type; they are rewritten to IOB2 (every entity
starts with B-, what seqeval's strict view, the CRF's constraints and most copies use): an I-X that
does not follow B-X or I-X becomes B-X. On IOB2 data this changes nothing, so it is always applied;
the count of rewritten tags is kept per sentence. The tag set is read from the training file (sorted,
"O" first) and saved with the finetuned run; a dev or test tag outside it is an error.

Scored as CoNLL's conlleval does, by seqeval (`seqeval.metrics`, default mode): entity-level micro
precision / recall / F1 (an entity counts when its type and both ends match) and token accuracy.
Main metric F1. Test predictions are written in conlleval's input format, `word gold predicted` per
line (IOB2 gold), a blank line after each sentence.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from plmcli.data.tasks import Task
from plmcli.errors import PlmError, needs

LAYOUTS = (
    {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"},  # the CoNLL-2003 release
    {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"},  # its common IOB2 copies (HF, BERT-NER)
)
_TAG = re.compile(r"O|[BI]-\S+")


@dataclass
class Sentence:
    words: list[str]
    tags: list[int] | None
    """Indices into the task's tag set (IOB2); None for an unlabeled test file."""
    id: str
    converted: int = 0
    """Tags rewritten from IOB1 to IOB2 in this sentence."""


def iob1_to_iob2(tags: list[str]) -> tuple[list[str], int]:
    """(IOB2 tags, how many were rewritten): an I-X that does not continue an X entity starts one, as B-X."""
    out, n = [], 0
    for i, tag in enumerate(tags):
        if tag.startswith("I-"):
            prev = out[i - 1] if i else "O"
            if prev[2:] != tag[2:]:  # after O ("O"[2:] is ""), or after another type
                tag, n = "B-" + tag[2:], n + 1
        out.append(tag)
    return out, n


class Conll2003(Task):
    name = "conll2003"
    objective = "tagging"
    metrics = ("precision", "recall", "f1", "accuracy")
    main_metric = "f1"

    def __init__(self):
        self.label_names: tuple = ()
        self.restored = False
        self.eval_splits = {"dev": ""}
        self.test_splits = {"test": "test_predictions.txt"}
        self._test: dict[str, Sentence] = {}

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def state(self) -> dict:
        return {"tags": list(self.label_names)}

    def restore(self, state: dict) -> None:
        """Keep the finetuned run's tag set: load() then refuses tags outside it instead of rediscovering."""
        if state.get("tags"):
            self.label_names, self.restored = tuple(state["tags"]), True

    # -------------------------------------------------------------- reading

    def files(self, data_dir: str | None) -> dict[str, Path]:
        """split -> file: --train/--dev/--test, else the CoNLL-2003 (or IOB2 copy) names in --data-dir."""
        o = self.options
        given = {s: Path(f) for s, f in (("train", o.train), ("dev", o.dev), ("test", o.test)) if f}
        found: dict[str, Path] = {}
        if data_dir is not None:
            root = Path(data_dir)
            if not root.is_dir():
                raise PlmError(f"--data-dir {root} is not a directory",
                               "pass the folder holding eng.train, eng.testa, eng.testb (or train.txt, valid.txt, test.txt)")
            layout = next((lay for lay in LAYOUTS if (root / lay["train"]).is_file() or (root / lay["dev"]).is_file()), None)
            if layout is None:
                raise PlmError(f"--data-dir {root} has neither eng.train/eng.testa nor train.txt/valid.txt",
                               "pass the CoNLL-2003 folder, or the files with --train/--dev/--test")
            found = {s: root / n for s, n in layout.items() if (root / n).is_file()}
        elif not given:
            raise PlmError("conll2003 needs its data: no --data-dir and no --train/--dev given",
                           "pass --data-dir path/to/conll2003 (eng.train, eng.testa, eng.testb) or --train F --dev F")
        files = {**found, **given}
        for split, path in given.items():
            if not path.is_file():
                raise PlmError(f"--{split} {path} is not a file", f"pass the CoNLL-format {split} file")
        needed = ["dev"] if self.restored else ["train", "dev"]  # a finetuned run's tags need no train file
        missing = [s for s in needed if s not in files]
        if missing:
            where = f" in {data_dir}" if data_dir else ""
            raise PlmError(f"conll2003 has no {' and no '.join(missing)} file{where}",
                           f"pass --{missing[0]} FILE (CoNLL format: word ... tag per line, blank line between sentences)")
        return files

    def load(self, data_dir: str | None) -> dict[str, list[Sentence]]:
        """Splits train (unless restored without one), dev and, when there is a test file, test."""
        files = self.files(data_dir)
        raw = {split: read_conll(path, labeled=split != "test") for split, path in files.items()}
        if not self.restored:
            seen = {t for _, tags, _ in raw["train"] for t in iob1_to_iob2(tags)[0]}
            self.label_names = tuple(sorted(seen, key=lambda t: (t != "O", t)))
        index = {t: i for i, t in enumerate(self.label_names)}
        splits = {}
        for split, rows in raw.items():
            out = []
            for n, (words, tags, lines) in enumerate(rows):
                if tags is None:
                    out.append(Sentence(words, None, f"{split}-{n}"))
                    continue
                tags2, converted = iob1_to_iob2(tags)
                for tag, raw_tag, line in zip(tags2, tags, lines):
                    if tag not in index:
                        origin = "the finetuned run's tags" if self.restored else "the tags of the training file"
                        shown = repr(tag) if tag == raw_tag else f"{raw_tag!r} ({tag} in IOB2)"
                        raise PlmError(f"{files[split]}:{line}: tag {shown} is not among {origin} "
                                       f"({', '.join(self.label_names)})",
                                       "use files with the training data's tag set (or train on data that has this tag)")
                out.append(Sentence(words, [index[t] for t in tags2], f"{split}-{n}", converted))
            splits[split] = out
        self._test = {s.id: s for split in self.test_splits for s in splits.get(split, [])}
        return splits

    # -------------------------------------------------------------- scoring and writing

    def tag_names(self, seq) -> list[str]:
        return [self.label_names[int(i)] for i in seq]

    def score(self, preds, labels) -> dict[str, float]:
        """Entity-level micro precision / recall / F1 (seqeval, conlleval semantics) and token accuracy,
        over sentences given as sequences of tag indices."""
        m = needs("seqeval.metrics", "tasks", "CoNLL entity-level scoring (conlleval semantics)")
        accuracy_score, f1_score, precision_score, recall_score = m.accuracy_score, m.f1_score, m.precision_score, m.recall_score

        y_pred = [self.tag_names(p) for p in preds]
        y_true = [self.tag_names(g) for g in labels]
        if not y_true:
            return {m: 0.0 for m in self.metrics}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no predicted or no gold entities: seqeval warns and scores 0
            return {"precision": float(precision_score(y_true, y_pred)), "recall": float(recall_score(y_true, y_pred)),
                    "f1": float(f1_score(y_true, y_pred)), "accuracy": float(accuracy_score(y_true, y_pred))}

    def write_predictions(self, path: Path, ids, preds) -> None:
        """conlleval's input: `word gold predicted` (or `word predicted` when unlabeled), sentences apart."""
        lines = []
        for ident, pred in zip(ids, preds):
            s = self._test[str(ident)]
            gold = self.tag_names(s.tags) if s.tags is not None else None
            for k, (word, tag) in enumerate(zip(s.words, self.tag_names(pred))):
                lines.append(f"{word} {gold[k]} {tag}" if gold else f"{word} {tag}")
            lines.append("")
        Path(path).write_text("\n".join(lines) + "\n" if lines else "", encoding="utf-8")


def read_conll(path: Path, labeled: bool, column: int = -1) -> list[tuple[list[str], list[str] | None, list[int]]]:
    """Sentences of a CoNLL-format file as (words, raw tags or None, line numbers).

    `column`: where the tags are; the last (NER, checked to be IOB) unless another is asked for
    (CoNLL-2003's POS is 1, chunk 2: `plm probe`), taken as written.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PlmError(f"{path} is not UTF-8 text (byte {e.start})", "convert the file to UTF-8") from None
    sentences, words, tags, lines = [], [], [], []
    width = None

    def end():
        if words:
            sentences.append((words[:], tags[:] if width > 1 else None, lines[:]))
            words.clear(), tags.clear(), lines.clear()

    for n, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            end()
            continue
        if width is None:
            width, width_line = len(fields), n
            if width < 2 and labeled:
                raise PlmError(f"{path}:{n}: one column, so no tags",
                               "a CoNLL file has the word first and its tag last on each line (word ... tag)")
            if labeled and column >= width:
                raise PlmError(f"{path}:{n}: {width} columns, so no column {column + 1} to read tags from",
                               "pass a CoNLL-2003 file: word POS chunk NER on each line")
        if len(fields) != width:
            cols = f"{len(fields)} column" + "s" * (len(fields) != 1)
            raise PlmError(f"{path}:{n}: {cols} where the file's first word line ({width_line}) has {width}",
                           "every word line needs the same columns (word ... tag); is the file cut or mixed?")
        if width > 1:
            if column == -1 and not _TAG.fullmatch(fields[-1]):
                raise PlmError(f"{path}:{n}: tag {fields[-1]!r} is not an IOB tag (O, B-TYPE, I-TYPE)",
                               "the tag must be the last column; convert IOBES/BILOU tags to IOB2 first")
            tags.append(fields[column])
        words.append(fields[0])
        lines.append(n)
    if width is not None:
        end()
    if not sentences:
        raise PlmError(f"{path} holds no sentences",
                       "pass a CoNLL-format file: word ... tag per line, blank lines between sentences")
    return sentences
