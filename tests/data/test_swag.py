"""The SWAG reader on hand-written, clearly synthetic SWAG-format CSVs (no SWAG data ships in ../shared)."""

import csv
from pathlib import Path

import pytest

from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tasks.swag import SwagTask
from plmcli.errors import PlmError

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source"]


def write(path: Path, rows: list[list[str]], endings: int = 4, labeled: bool = True, header=None) -> Path:
    head = header or HEADER + [f"ending{k}" for k in range(endings)] + (["label"] if labeled else [])
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([head, *rows])
    return path


def row(i, sent1, sent2, endings, label=None):
    return [str(i), f"synthetic-{i}", str(100 + i), f"{sent1} {sent2}", sent1, sent2, "gold", *endings] + \
        ([] if label is None else [str(label)])


ROWS = [
    row(0, "A chef slices onions on a board.", "She", ["drops them into a hot pan.", "sings to the moon.",
                                                        "paints the fence.", "jumps over a car."], 0),
    # a quoted field with a comma and a line break: the record spans lines 3-4
    row(1, "A man kneels by a flat tyre, frowning.", "He", ["reads a poem\nto a cat.", "pumps air into the tyre.",
                                                             "bakes a cake.", "swims away."], 1),
    row(2, "Two kids build a sandcastle.", "They", ["fly a kite indoors.", "eat the sand.", "pour water into the moat.",
                                                     "sleep."], 2),
]


def test_reads_swag_columns(tmp_path):
    path = write(tmp_path / "train.csv", ROWS)
    examples, k = SwagTask().read_file(path, labeled=True)
    assert k == 4 and len(examples) == 3
    e = examples[1]
    assert e.context == "A man kneels by a flat tyre, frowning."
    # ending k = sent2 + " " + ending<k>, as Hugging Face's run_swag builds it
    assert e.endings == ["He reads a poem\nto a cat.", "He pumps air into the tyre.", "He bakes a cake.", "He swims away."]
    assert [x.label for x in examples] == [0, 1, 2] and [x.id for x in examples] == ["0", "1", "2"]


def test_choice_count_from_the_header(tmp_path):
    five = [row(i, "A cat sits.", "It", [f"does thing {j}." for j in range(5)], i % 5) for i in range(3)]
    task = get_task("swag", TaskOptions(train=str(write(tmp_path / "a.csv", five, endings=5)),
                                        dev=str(write(tmp_path / "b.csv", five[:2], endings=5))))
    splits = task.load(None)
    assert task.num_labels == 5 and task.label_names == ("0", "1", "2", "3", "4")
    assert task.state() == {"choices": 5} and sorted(splits) == ["dev", "train"]
    fresh = get_task("swag")
    assert fresh.num_labels == 4 and fresh.objective == "choice" and fresh.main_metric == "accuracy"
    fresh.restore({"choices": 5})
    assert fresh.num_labels == 5 and fresh.label_names[-1] == "4"


def test_data_dir_and_file_options(tmp_path):
    d = tmp_path / "swag"
    d.mkdir()
    write(d / "train.csv", ROWS)
    write(d / "val.csv", ROWS[:2])
    write(d / "test.csv", [r[:-1] for r in ROWS], labeled=False)
    splits = get_task("swag").load(str(d))
    assert {s: len(v) for s, v in splits.items()} == {"train": 3, "dev": 2, "test": 3}
    assert all(e.label is None for e in splits["test"])
    # a file option replaces the folder's file for its split only
    other = write(tmp_path / "dev2.csv", ROWS[2:])
    splits = get_task("swag", TaskOptions(dev=str(other))).load(str(d))
    assert {s: len(v) for s, v in splits.items()} == {"train": 3, "dev": 1, "test": 3}
    # without the unnamed index column, ids are positions
    plain = [r[1:] for r in ROWS]
    path = write(tmp_path / "plain.csv", plain, header=HEADER[1:] + [f"ending{k}" for k in range(4)] + ["label"])
    assert [e.id for e in SwagTask().read_file(path, True)[0]] == ["0", "1", "2"]


def test_predictions_file(tmp_path):
    task = SwagTask()
    task.write_predictions(tmp_path / task.test_splits["test"], ["7", "9"], [2, 0])
    assert (tmp_path / "SWAG.tsv").read_text() == "index\tprediction\n7\t2\n9\t0\n"


@pytest.mark.parametrize("ending, line", [(2, 2), (3, 5)])
def test_varying_choice_count_names_file_and_line(tmp_path, ending, line):
    rows = [list(r) for r in ROWS]
    rows[0 if line == 2 else 2][7 + ending] = " "  # line 2 = first row; the 3rd row starts on line 5
    path = write(tmp_path / "train.csv", rows)
    with pytest.raises(PlmError) as e:
        SwagTask().read_file(path, labeled=True)
    assert str(e.value).startswith(f"{path}:{line}: 3 of 4 endings filled (ending{ending} is empty or missing)")
    # a row cut short (its last endings and label missing) is the same error
    path = write(tmp_path / "cut.csv", [ROWS[0], ROWS[1][:9]])
    with pytest.raises(PlmError, match=r"cut.csv:3: 2 of 4 endings filled \(ending2"):
        SwagTask().read_file(path, labeled=True)


def test_bad_files(tmp_path):
    bad_label = [list(r) for r in ROWS]
    bad_label[1][-1] = "4"
    with pytest.raises(PlmError, match=r"train.csv:3: label '4' is not an ending index 0..3"):
        SwagTask().read_file(write(tmp_path / "train.csv", bad_label), labeled=True)
    with pytest.raises(PlmError, match="expected a header with the columns sent1, sent2, ending0, ending1, ..., label"):
        SwagTask().read_file(write(tmp_path / "nolabel.csv", [r[:-1] for r in ROWS], labeled=False), labeled=True)
    gap = HEADER + ["ending0", "ending2", "label"]
    with pytest.raises(PlmError, match="expected a header"):
        SwagTask().read_file(write(tmp_path / "gap.csv", [], header=gap), labeled=True)
    with pytest.raises(PlmError, match="has a header but no examples"):
        SwagTask().read_file(write(tmp_path / "empty.csv", []), labeled=True)
    # different choice counts across files
    three = [row(0, "A cat sits.", "It", ["purrs.", "barks.", "flies."], 0)]
    opts = TaskOptions(train=str(write(tmp_path / "t.csv", ROWS)), dev=str(write(tmp_path / "d.csv", three, endings=3)))
    with pytest.raises(PlmError, match=r"d.csv has 3 endings per row \(ending0..ending2\) but .*t.csv has 4"):
        get_task("swag", opts).load(None)
    with pytest.raises(PlmError, match="no dev file given: SWAG finetuning needs a train and a dev file"):
        get_task("swag", TaskOptions(train=str(tmp_path / "t.csv"))).load(None)
    with pytest.raises(PlmError, match="has no val.csv"):
        get_task("swag", TaskOptions()).load(str(tmp_path))  # t.csv, d.csv: not swagaf's names; train.csv is there
    with pytest.raises(PlmError, match="missing.csv not found"):
        get_task("swag", TaskOptions(train=str(tmp_path / "t.csv"), dev=str(tmp_path / "missing.csv"))).load(None)
