"""CoNLL-2003 task: reading, IOB1 -> IOB2, the tag set, bad files, scoring and the predictions file."""

from pathlib import Path

import numpy as np
import pytest

from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.conll import Conll2003, iob1_to_iob2, read_conll
from plmcli.data.tasks.registry import get_task
from plmcli.errors import PlmError

# IOB1, as the original eng.* files: entities start with I-, B- only between two adjacent entities of one type.
TRAIN = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER
Paul NNP I-NP B-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP I-NP I-LOC
1996-08-22 CD I-NP O
"""
DEV = """-DOCSTART- -X- -X- O

Japan NNP I-NP I-LOC
beat VBD I-VP O
Syria NNP I-NP I-LOC
"""


def write(tmp_path: Path, **files) -> Path:
    for name, text in files.items():
        (tmp_path / name.replace("_", ".")).write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("iob1, iob2, n", [
    (["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"], 1),
    (["I-PER", "B-PER", "I-PER"], ["B-PER", "B-PER", "I-PER"], 1),  # two adjacent persons
    (["O", "I-LOC", "I-ORG", "I-ORG"], ["O", "B-LOC", "B-ORG", "I-ORG"], 2),  # a type change starts an entity
    (["B-MISC", "I-MISC", "O", "I-MISC"], ["B-MISC", "I-MISC", "O", "B-MISC"], 1),
    (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"], 0),  # IOB2 already: unchanged
    (["O", "O"], ["O", "O"], 0),
])
def test_iob1_to_iob2(iob1, iob2, n):
    assert iob1_to_iob2(iob1) == (iob2, n)
    assert iob1_to_iob2(iob2) == (iob2, 0)  # idempotent


def test_load_eng_layout_converts_and_discovers_the_tag_set(tmp_path):
    d = write(tmp_path, eng_train=TRAIN, eng_testa=DEV)
    task = get_task("CoNLL-2003")
    splits = task.load(str(d))
    assert set(splits) == {"train", "dev"}  # no eng.testb: nothing to predict
    assert task.label_names == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER")  # sorted, "O" first
    assert task.num_labels == 6 and task.state() == {"tags": list(task.label_names)}
    train = splits["train"]
    assert [s.words for s in train] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn", "Paul"],
                                        ["BRUSSELS", "1996-08-22"]]
    names = [[task.label_names[i] for i in s.tags] for s in train]
    assert names == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER", "B-PER"], ["B-LOC", "O"]]
    assert [s.converted for s in train] == [2, 1, 1] and [s.id for s in train] == ["train-0", "train-1", "train-2"]
    assert [task.label_names[i] for i in splits["dev"][0].tags] == ["B-LOC", "O", "B-LOC"]


def test_iob2_layout_and_explicit_files(tmp_path):
    iob2 = TRAIN.replace("I-ORG", "B-ORG").replace("I-MISC", "B-MISC").replace("I-LOC", "B-LOC")
    iob2 = iob2.replace("Peter NNP I-NP I-PER", "Peter NNP I-NP B-PER")
    d = write(tmp_path, train_txt=iob2, valid_txt=DEV, test_txt="Japan\nwins\n\nHi\n")
    task = get_task("conll2003")
    splits = task.load(str(d))
    assert sum(s.converted for s in splits["train"]) == 0
    assert [s.tags for s in splits["test"]] == [None, None]  # one column: unlabeled
    # --train/--dev/--test override the folder's files one by one
    (tmp_path / "dev.conll").write_text("Syria x I-LOC\n")
    task = get_task("conll2003", TaskOptions(dev=str(tmp_path / "dev.conll")))
    splits = task.load(str(d))
    assert [s.words for s in splits["dev"]] == [["Syria"]] and len(splits["test"]) == 2
    task = get_task("conll2003", TaskOptions(train=str(d / "train.txt"), dev=str(d / "valid.txt")))
    assert set(task.load(None)) == {"train", "dev"}


def test_restored_tag_set_is_kept_and_train_is_optional(tmp_path):
    d = write(tmp_path, eng_testa=DEV)
    task = get_task("conll2003")
    task.restore({"tags": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]})
    splits = task.load(str(d))
    assert set(splits) == {"dev"} and task.num_labels == 5
    assert splits["dev"][0].tags == [1, 0, 1]
    task = get_task("conll2003")
    task.restore({"tags": ["O", "B-PER", "I-PER"]})
    with pytest.raises(PlmError, match=r"eng.testa:3: tag 'I-LOC' \(B-LOC in IOB2\) is not among the finetuned run's tags \(O, B-PER, I-PER\)"):
        task.load(str(d))


def test_bad_inputs(tmp_path):
    def load(**files):
        d = tmp_path / f"d{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        return get_task("conll2003").load(str(write(d, **files)))

    with pytest.raises(PlmError, match=r"eng.testa:4: tag 'I-PER' \(B-PER in IOB2\) is not among the tags of the training file \(O, B-LOC\)"):
        load(eng_train="a x B-LOC\nb x O\n", eng_testa="a x B-LOC\n\nb x O\nPeter x I-PER\n")
    with pytest.raises(PlmError, match=r"eng.testb:1: tag 'B-MISC' is not among"):
        load(eng_train="a x B-LOC\n", eng_testa="a x B-LOC\n", eng_testb="a x B-MISC\n")
    with pytest.raises(PlmError, match=r"eng.train:5: 3 columns where the file's first word line \(3\) has 4"):
        load(eng_train="-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\n\nEU NNP I-ORG\n", eng_testa=DEV)
    with pytest.raises(PlmError, match=r"eng.train:2: 2 columns where the file's first word line \(1\) has 4"):
        load(eng_train="EU NNP I-NP I-ORG\nrejects O\n", eng_testa=DEV)
    with pytest.raises(PlmError, match=r"eng.train:1: tag 'S-PER' is not an IOB tag"):
        load(eng_train="Peter S-PER\n", eng_testa=DEV)
    with pytest.raises(PlmError, match=r"eng.testa:1: one column, so no tags"):
        load(eng_train=TRAIN, eng_testa="Japan\n")
    with pytest.raises(PlmError, match=r"eng.train holds no sentences"):
        load(eng_train="-DOCSTART- -X- -X- O\n\n\n", eng_testa=DEV)
    with pytest.raises(PlmError, match=r"conll2003 has no dev file"):
        load(eng_train=TRAIN)
    with pytest.raises(PlmError, match=r"has neither eng.train/eng.testa nor train.txt/valid.txt"):
        load(other_txt=TRAIN)
    with pytest.raises(PlmError, match=r"no --data-dir and no --train/--dev"):
        get_task("conll2003").load(None)
    with pytest.raises(PlmError, match=r"--dev .* is not a file"):
        get_task("conll2003", TaskOptions(train=str(tmp_path / "d0" / "eng.train"), dev=str(tmp_path / "nope"))).load(None)
    (tmp_path / "latin1").write_bytes("Café x O\n".encode("latin-1"))
    with pytest.raises(PlmError, match="is not UTF-8"):
        read_conll(tmp_path / "latin1", labeled=True)


def test_score_is_seqeval_conlleval(tmp_path):
    from seqeval.metrics import classification_report, f1_score

    task = Conll2003()
    task.restore({"tags": ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]})
    ix = {t: i for i, t in enumerate(task.label_names)}
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-LOC", "O", "O"]]  # one entity right; one missed; one cut short
    s = task.score([[ix[t] for t in p] for p in pred], [[ix[t] for t in g] for g in gold])
    # gold entities: PER, LOC, LOC(2 words); predicted: PER, LOC(1 word) -> tp 1: P 1/2, R 1/3
    assert s["precision"] == pytest.approx(0.5) and s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(0.4) and s["accuracy"] == pytest.approx(5 / 7)
    # conlleval semantics: an I- after O starts an entity (what an unconstrained argmax may output)
    pred2 = [["I-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "O"]]
    assert task.score([[ix[t] for t in p] for p in pred2], [[ix[t] for t in g] for g in gold])["f1"] == 1.0
    # random sequences: equal to seqeval's own numbers
    rng = np.random.default_rng(0)
    for _ in range(5):
        g = [rng.integers(0, 5, rng.integers(1, 9)).tolist() for _ in range(20)]
        p = [rng.integers(0, 5, len(x)).tolist() for x in g]
        names = lambda seqs: [[task.label_names[i] for i in x] for x in seqs]  # noqa: E731
        assert task.score(p, g)["f1"] == pytest.approx(f1_score(names(g), names(p)))
    assert "LOC" in classification_report(gold, pred)
    # nothing predicted: 0, not NaN
    assert task.score([[0, 0, 0, 0]], [[2, 4, 0, 1]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 0.25}


def test_write_predictions_in_conlleval_format(tmp_path):
    d = write(tmp_path, eng_train=TRAIN, eng_testa=DEV, eng_testb=DEV)
    task = get_task("conll2003")
    splits = task.load(str(d))
    ix = {t: i for i, t in enumerate(task.label_names)}
    ids = [s.id for s in splits["test"]]
    task.write_predictions(tmp_path / "p.txt", ids, [np.array([ix["B-LOC"], ix["O"], ix["O"]])])
    assert (tmp_path / "p.txt").read_text() == "Japan B-LOC B-LOC\nbeat O O\nSyria B-LOC O\n\n"


def test_real_conll2003_iob1_files_convert_to_the_iob2_copy(shared_data):
    """The original IOB1 eng.* files, converted, equal their IOB2 copies (HF / BERT-NER) tag for tag."""
    root = shared_data / "conll2003"
    eng, iob2 = get_task("conll2003"), get_task("conll2003")
    a, b = eng.load(str(root)), iob2.load(str(root / "iob2"))
    assert {k: len(v) for k, v in a.items()} == {"train": 14041, "dev": 3250, "test": 3453}
    assert eng.label_names == iob2.label_names == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC",
                                                   "I-ORG", "I-PER")
    for split in a:
        assert [s.words for s in a[split]] == [s.words for s in b[split]]
        assert [s.tags for s in a[split]] == [s.tags for s in b[split]]
        assert sum(s.converted for s in b[split]) == 0
    assert [sum(s.converted for s in a[k]) for k in ("train", "dev", "test")] == [23427, 5938, 5628]
