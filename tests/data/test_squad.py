"""SQuAD-format reading (squad, cmrc2018) and the two official scorers, against hand-computed values."""

import json

import pytest

from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tasks.squad import (cmrc_exact, cmrc_f1, cmrc_segments, normalize_answer, score_answers, squad_exact,
                                     squad_f1)
from plmcli.errors import PlmError

PASSAGE = "The Eiffel Tower was built in 1889 by Gustave Eiffel in Paris."


def squad_json(path, qas, context=PASSAGE):
    """qas: (id, question, [(answer text, answer_start)])."""
    doc = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": i, "question": q, "answers": [{"text": t, "answer_start": s} for t, s in answers]} for i, q, answers in qas]}]}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# ------------------------------------------------------------------ SQuAD v1.1 scoring


def test_squad_normalisation_and_scores():
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert squad_exact("The Paris.", "paris") == 1.0 and squad_exact("Paris, France", "paris") == 0.0
    # pred words {cat, sat, on, mat}, gold {cat, on, mat}: P 3/4, R 1 -> F1 6/7
    assert squad_f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    assert squad_f1("dog", "cat") == 0.0
    # Best over the gold answers, mean over questions, in percent: EM (1 + 0 + 0) / 3, F1 (1 + 2/3 + 0) / 3.
    res = score_answers(["Paris", "in 1889", "x"], [["Paris, France", "paris"], ["1889"], ["y"]])
    assert res["exact_match"] == pytest.approx(100 / 3) and res["f1"] == pytest.approx(500 / 9)
    # No gold answer: right only when the prediction is empty too.
    assert score_answers(["", "x"], [[], []]) == {"exact_match": 50.0, "f1": 50.0}
    assert score_answers([], []) == {"exact_match": 0.0, "f1": 0.0}


# ------------------------------------------------------------------ CMRC 2018 scoring


def test_cmrc_segmentation_and_scores():
    assert cmrc_segments("2018年CMRC比赛，第1名！") == ["2018", "年", "cmrc", "比", "赛", "第", "1", "名"]
    assert cmrc_segments("比赛，第1名！", remove_punc=False) == ["比", "赛", "，", "第", "1", "名", "！"]
    assert cmrc_segments("长3.5米 (约11英尺)") == ["长", "3.5", "米", "(", "约", "11", "英", "尺", ")"]
    assert cmrc_f1("北京大学", "北京") == pytest.approx(2 / 3)  # LCS 2: P 2/4, R 2/2
    # The overlap is the longest common *substring*: 北x京 vs 北京 shares runs of 1 -> P 1/3, R 1/2, F1 0.4.
    assert cmrc_f1("北x京", "北京") == pytest.approx(0.4)
    # English runs are split into words: [iphone, 12, pro, 发, 布] vs [iphone, 12] -> P 2/5, R 1 -> 4/7.
    assert cmrc_f1("iPhone 12 Pro发布", "iphone 12") == pytest.approx(4 / 7)
    assert cmrc_f1("", "北京") == 0.0
    assert cmrc_exact("《北京》", "北京") == 1.0 and cmrc_exact("北京市", "北京") == 0.0
    res = score_answers(["北京大学", "上海"], [["北京", "北京大学"], ["北京"]], scorer="cmrc")
    assert res == {"exact_match": 50.0, "f1": 50.0}


# ------------------------------------------------------------------ reading


def test_misaligned_training_answers_are_counted_and_skipped(tmp_path):
    qas = [("q1", "When was it built?", [("1889", 30)]),
           ("q2", "Who built it?", [("Gustave Eiffel", 38)]),
           ("q3", "Where is it?", [("Paris", 3)]),                      # not at 3: skipped in training
           ("q4", "What was built?", [("Eiffel Towr", 4), ("Eiffel Tower", 4)]),  # the second is at 4
           ("q5", "Built by whom?", [("   ", 0)])]                      # whitespace only: nothing to point at
    f = squad_json(tmp_path / "d.json", qas)
    t = get_task("squad", TaskOptions(train=str(f), dev=str(f)))
    splits = t.load(None)
    train, dev = splits["train"], splits["dev"]
    assert [e.id for e in train] == ["q1", "q2", "q4"] and t.skipped == {str(f): 2}
    assert [e.span for e in train] == [(30, 34), (38, 52), (4, 16)]
    assert PASSAGE[30:34] == "1889" and PASSAGE[4:16] == "Eiffel Tower"
    # Evaluation keeps every question and every gold answer as written.
    assert [e.id for e in dev] == ["q1", "q2", "q3", "q4", "q5"]
    assert dev[3].answers == ["Eiffel Towr", "Eiffel Tower"] and dev[2].span is None and dev[2].answers == ["Paris"]
    assert t.main_metric == "f1" and t.objective == "qa" and t.scorer == "squad"


def test_files_from_data_dir_and_test_split(tmp_path):
    squad_json(tmp_path / "train-v1.1.json", [("a", "When?", [("1889", 30)])])
    squad_json(tmp_path / "dev-v1.1.json", [("b", "Who?", [("Gustave Eiffel", 38)])])
    test = tmp_path / "test.json"
    test.write_text(json.dumps({"data": [{"paragraphs": [{"context": PASSAGE, "qas": [{"id": "c", "question": "Where?"}]}]}]}))
    t = get_task("squad", TaskOptions(test=str(test)))
    splits = t.load(str(tmp_path))
    assert {k: [e.id for e in v] for k, v in splits.items()} == {"train": ["a"], "dev": ["b"], "test": ["c"]}
    assert splits["test"][0].answers == [] and splits["test"][0].span is None
    # --train/--dev/--test override the folder's files one by one.
    other = squad_json(tmp_path / "other.json", [("o", "Who?", [("Gustave Eiffel", 38)])])
    splits = get_task("squad", TaskOptions(dev=str(other))).load(str(tmp_path))
    assert [e.id for e in splits["train"]] == ["a"] and [e.id for e in splits["dev"]] == ["o"]


def test_cmrc2018_folder(tmp_path):
    # CMRC 2018's names; its trial file is the test split.
    for name in ("train", "dev"):
        squad_json(tmp_path / f"cmrc2018_{name}.json", [(name, "首都？", [("北京", 0)])], context="北京是中国的首都。")
    squad_json(tmp_path / "cmrc2018_trial.json", [("t", "首都？", [])], context="北京是中国的首都。")
    c = get_task("cmrc2018").load(str(tmp_path))
    assert {k: [e.id for e in v] for k, v in c.items()} == {"train": ["train"], "dev": ["dev"], "test": ["t"]}
    assert c["train"][0].span == (0, 2) and get_task("cmrc2018").scorer == "cmrc"


def test_bad_input(tmp_path):
    good = squad_json(tmp_path / "good.json", [("a", "When?", [("1889", 30)])])

    def load(**files):
        return get_task("squad", TaskOptions(**{k: str(v) for k, v in files.items()})).load(None)

    with pytest.raises(PlmError, match="squad needs a dev file"):
        load(train=good)
    with pytest.raises(PlmError, match="missing.json not found"):
        load(train=good, dev=tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlmError, match="is not JSON"):
        load(train=good, dev=tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(PlmError, match="no top-level 'data' list"):
        load(train=good, dev=tmp_path / "list.json")
    (tmp_path / "noq.json").write_text(json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "1"}]}]}]}))
    with pytest.raises(PlmError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\] has no 'question'"):
        load(train=good, dev=tmp_path / "noq.json")
    dup = squad_json(tmp_path / "dup.json", [("a", "When?", [("1889", 30)]), ("a", "Who?", [("Gustave Eiffel", 38)])])
    with pytest.raises(PlmError, match="question id 'a' appears twice"):
        load(train=good, dev=dup)
    doc = json.loads(good.read_text())
    doc["data"][0]["paragraphs"][0]["qas"][0]["is_impossible"] = True
    (tmp_path / "v2.json").write_text(json.dumps(doc))
    with pytest.raises(PlmError, match="is_impossible"):
        load(train=good, dev=tmp_path / "v2.json")
    wrong = squad_json(tmp_path / "wrong.json", [("a", "When?", [("1890", 30)])])
    with pytest.raises(PlmError, match="has no answerable questions"):
        load(train=wrong, dev=good)
    with pytest.raises(PlmError, match="is not a directory"):
        get_task("squad").load(str(good))
    with pytest.raises(PlmError, match="squad needs a train and a dev file"):
        get_task("squad").load(str(tmp_path.parent))
    # Neither files nor a folder: the Hub, which the tests keep offline.
    with pytest.raises(PlmError, match="Hub is unreachable"):
        get_task("squad").load(None)


def test_cmrc2018_shared_files(shared_data):
    d = shared_data / "chinese" / "cmrc2018"
    t = get_task("cmrc2018", TaskOptions(train=str(d / "cmrc2018_dev.json"), dev=str(d / "cmrc2018_trial.json")))
    splits = t.load(None)
    # dev: 3,219 questions, 3 of which have no answer at its answer_start; trial: 1,002, all kept for scoring.
    assert len(splits["train"]) == 3216 and t.skipped == {str(d / "cmrc2018_dev.json"): 3}
    assert len(splits["dev"]) == 1002
    first = splits["dev"][0]
    assert first.id == "TRIAL_800_QUERY_0" and first.answers == ["踢爆"] and first.context[slice(*first.span)] == "踢爆"
    # TRIAL_210's offsets count the astral character 𫚭 twice (UTF-16), so its answers do not align.
    assert sum(e.span is None for e in splits["dev"]) == 5
    with pytest.raises(PlmError, match="cmrc2018 needs a train file.*--train cmrc2018_dev.json --dev cmrc2018_trial.json"):
        get_task("cmrc2018").load(str(d))
