"""The RACE reader on hand-written, clearly synthetic RACE-format files (no RACE data ships in ../shared):
RACE's own layout (one JSON article per .txt under train/high, train/middle, ...), .json and .jsonl files, the
Hub's flat rows, and one-line errors for what cannot be read."""

import json

import pytest

from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.race import RaceExample, RaceTask, read_race
from plmcli.data.tasks.registry import get_task
from plmcli.errors import PlmError
from race_data import ARTICLES, write_race_dir


def test_reads_race_folders(tmp_path):
    task = get_task("race")
    splits = task.load(str(write_race_dir(tmp_path / "RACE")))
    assert sorted(splits) == ["dev", "test", "train"] and task.num_labels == 4
    assert task.label_names == ("A", "B", "C", "D") and task.objective == "choice" and task.state() == {"choices": 4}
    train = splits["train"]
    # high/ before middle/, files in name order, questions in article order
    assert [e.id for e in train] == ["high1.txt-0", "high1.txt-1", "middle7.txt-0", "middle9.txt-0"]
    assert [e.label for e in train] == [1, 2, 2, 3]
    e = train[1]
    assert isinstance(e, RaceExample) and e.context == ARTICLES[0]["article"]
    assert e.question == "When does he water them?" and e.endings == ["At night", "At noon", "Every morning", "Never"]
    # the test split's answers are kept when its files have them (plm zero-shot --split test scores them)
    assert [x.label for x in splits["test"]] == [1, 2, 2, 3]


def test_json_jsonl_and_hub_rows(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(ARTICLES[:2]))  # a list of articles
    hub = [{"example_id": "middle9.txt", "article": ARTICLES[2]["article"], "question": "Mia went to the lake _ .",
            "options": ["by bus", "on foot", "by car", "by bike"], "answer": "D"}]
    (tmp_path / "dev.jsonl").write_text("\n".join(json.dumps(r) for r in hub) + "\n\n")
    unlabeled = {k: v for k, v in ARTICLES[1].items() if k != "answers"}
    (tmp_path / "t.txt").write_text(json.dumps(unlabeled))
    task = get_task("race", TaskOptions(test=str(tmp_path / "t.txt")))
    splits = task.load(str(tmp_path))
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [3, 1, 1]
    assert splits["dev"][0] == RaceExample(ARTICLES[2]["article"], ["by bus", "on foot", "by car", "by bike"], 3,
                                           "middle9.txt", "Mia went to the lake _ .")
    assert splits["test"][0].label is None and splits["test"][0].id == "middle7.txt-0"


def test_option_count_from_the_data(tmp_path):
    three = [{**a, "options": [o[:3] for o in a["options"]], "answers": ["A"] * len(a["questions"])} for a in ARTICLES]
    task = get_task("race")
    task.load(str(write_race_dir(tmp_path / "R", ("train", "dev"), three)))
    assert task.num_labels == 3 and task.label_names == ("A", "B", "C")
    fresh = RaceTask()
    fresh.restore({"choices": 3})
    assert fresh.label_names == ("A", "B", "C")


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(answers=["B", "E"]), "the answer to question 1 is 'E', not one of A, B, C, D"),
    (lambda a: a.update(answers=["B"]), "2 questions but 1 answers"),
    (lambda a: a["options"][1].pop(), "question high1.txt-1 has 3 options, the first one 4"),
    (lambda a: a.pop("article"), "no article key"),
    (lambda a: a["options"].pop(), "2 questions but 1 option lists"),
])
def test_bad_articles_are_one_line(tmp_path, change, message):
    article = json.loads(json.dumps(ARTICLES[0]))
    change(article)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(article))
    with pytest.raises(PlmError) as e:
        read_race(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_and_broken_files(tmp_path):
    write_race_dir(tmp_path / "R", ("train",))
    with pytest.raises(PlmError, match="has no dev/: RACE finetuning needs train and dev"):
        get_task("race").load(str(tmp_path / "R"))
    (tmp_path / "R" / "dev").mkdir()
    with pytest.raises(PlmError, match="holds no .txt, .json or .jsonl files"):
        get_task("race").load(str(tmp_path / "R"))
    (tmp_path / "R" / "dev" / "x.txt").write_text('{"article": "cut')
    with pytest.raises(PlmError, match=r"x.txt is not JSON \(Unterminated string"):
        get_task("race").load(str(tmp_path / "R"))
    with pytest.raises(PlmError, match="--data-dir .* is not a directory"):
        get_task("race").load(str(tmp_path / "nowhere"))


def test_split_discovery_is_the_choice_base_s(tmp_path):
    """SWAG and RACE find their splits through one helper (ChoiceTask.files) with their own names: a folder name
    (RACE's train/) is a folder only, a file name a file only, and a file option wins over --data-dir."""
    from plmcli.data.tasks.choice import ChoiceTask
    from plmcli.data.tasks.swag import SwagTask

    assert RaceTask.files is ChoiceTask.files and SwagTask.files is ChoiceTask.files
    root = write_race_dir(tmp_path / "R", ("train", "dev"))
    (root / "dev.json").write_text("[]")  # train/ and dev/ come first in RACE's names
    (root / "test.json").mkdir()  # a folder under a file's name is not a test file
    own = tmp_path / "mine.jsonl"
    own.write_text("")
    paths = get_task("race", TaskOptions(train=str(own))).files(str(root))
    assert paths == {"train": own, "dev": root / "dev"}
    (tmp_path / "S").mkdir()
    (tmp_path / "S" / "train.csv").write_text("")
    (tmp_path / "S" / "val.csv").mkdir()  # swagaf's names are files
    with pytest.raises(PlmError, match="has no val.csv: SWAG finetuning needs a train and a dev file"):
        get_task("swag").files(str(tmp_path / "S"))
