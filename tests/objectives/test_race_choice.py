"""Objective `choice` on RACE (passage + question + option): the rows laid out exactly for GPT
(`<s> p $ q $ c <e>`) and for encoders (`[CLS] p [SEP] q c [SEP]`, XLNet's `p [SEP] q c [SEP] [CLS]`),
truncation that keeps the option, and `plm finetune --task race` end to end from a tiny GPT and a tiny BERT."""

import json

import numpy as np
import pytest
import torch

from helpers import finetune, pretrained_on
from plmcli.data.tasks.race import RaceExample
from plmcli.data.tasks.registry import get_task
from plmcli.objectives.choice import Choice, ChoiceConfig, encode_with_questions
from plmcli.objectives.classify import CAUSAL, CausalTransfer, SequenceClassifier
from plmcli.runs import load_finetuned
from test_choice import make_run
from test_gpt_transfer import enc, make_tok
from race_data import ARTICLES, TEXTS, write_race_dir


def rows_of(path):
    d = np.load(path)
    return int(d["rows"]), [d["ids"][d["offsets"][r]:d["offsets"][r + 1]].tolist() for r in range(len(d["offsets"]) - 1)], d


def test_gpt_rows_put_the_question_behind_its_own_delimiter(tmp_path):
    tok, ids = make_tok(specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>"}, texts=TEXTS)
    s, d, e = ids["bos"], ids["sep"], ids["eos"]
    task = get_task("race")
    splits = task.load(str(write_race_dir(tmp_path / "RACE", ("train", "dev"))))
    obj = Choice(ChoiceConfig(task="race", num_labels=4), tok, ids, 128, task=task, layout=CAUSAL)
    obj.encode_splits(splits, tmp_path / "data")
    k, rows, data = rows_of(tmp_path / "data" / "train.npz")
    assert k == 4 and len(rows) == 4 * len(splits["train"])
    for i, ex in enumerate(splits["train"]):
        P, Q = enc(tok, ex.context), enc(tok, ex.question)
        for j, option in enumerate(ex.endings):
            assert rows[i * 4 + j] == [s, *P, d, *Q, d, *enc(tok, option), e]
            assert data["type_start"][i * 4 + j] == len(P) + 2  # the question starts segment 1
    assert list(data["labels"]) == [1, 2, 2, 3]


@pytest.mark.parametrize("layout", ["cls_first", "cls_last"])
def test_encoder_rows(tmp_path, layout):
    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    tok, ids = make_tok("wordpiece", specials, TEXTS)
    cls, sep = ids["cls"], ids["sep"]
    task = get_task("race")
    splits = task.load(str(write_race_dir(tmp_path / "RACE", ("train", "dev"))))
    obj = Choice(ChoiceConfig(task="race", num_labels=4), tok, ids, 128, task=task, layout=layout)
    obj.encode_splits(splits, tmp_path / "data")
    _, rows, data = rows_of(tmp_path / "data" / "validation.npz")
    for i, ex in enumerate(splits["dev"]):
        P, Q = enc(tok, ex.context), enc(tok, ex.question)
        for j, option in enumerate(ex.endings):
            C = enc(tok, option)
            want = [*P, sep, *Q, *C, sep, cls] if layout == "cls_last" else [cls, *P, sep, *Q, *C, sep]
            assert rows[i * 4 + j] == want
            assert data["type_start"][i * 4 + j] == len(P) + (1 if layout == "cls_last" else 2)


def test_truncation_cuts_longest_first_and_keeps_the_option(tmp_path):
    tok, ids = make_tok(specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>"}, texts=TEXTS)
    frame = Choice(ChoiceConfig(task="race"), tok, ids, 16, task=get_task("race"), layout=CAUSAL).frame
    s, d, e = ids["bos"], ids["sep"], ids["eos"]
    budget = 16 - 3  # <s>, the frame's $ and <e>; the question's own $ counts as a token of the second text

    def expect(passage, question, option):
        P, second = enc(tok, passage), [*enc(tok, question), d, *enc(tok, option)]
        n_a = min(len(P), max(budget - len(second), -(-budget // 2)))  # longest first: BERT's _truncate_seq_pair
        n_b = min(len(second), budget - n_a)
        return [s, *P[:n_a], d, *second[len(second) - n_b:], e]

    long_text = ARTICLES[0]["article"]
    for passage, question in ((long_text, "What does Tom grow?"), (long_text, long_text)):  # a long question too
        out = encode_with_questions(tok, frame, [passage], [question], ["Tomatoes"], 16)
        row = out["ids"].tolist()
        assert row == expect(passage, question, "Tomatoes") and len(row) == 16 and bool(out["truncated"][0])
        assert row[-2 - len(enc(tok, "Tomatoes")):] == [d, *enc(tok, "Tomatoes"), e]  # the option whole, last
    # an empty question leaves its delimiter out: <s> p $ c <e>
    out = encode_with_questions(tok, frame, ["Tom"], [""], ["Corn"], 64)
    assert out["ids"].tolist() == [s, *enc(tok, "Tom"), d, *enc(tok, "Corn"), e] and not out["truncated"][0]


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A tiny GPT (tests/helpers.py TINY_RECIPE) pretrained a few steps on the RACE articles."""
    return pretrained_on(tmp_path_factory.mktemp("gpt"), "\n\n".join(TEXTS * 3) + "\n", max_positions=96)


def test_race_from_a_gpt_run(gpt_run, tmp_path):
    data = write_race_dir(tmp_path / "RACE")
    out = tmp_path / "ft"
    res = finetune("race", from_run=str(gpt_run), data_dir=str(data), train__epochs=2, train__batch_size=2, optim__lr=1e-3, task__max_seq_len=96, out=str(out))
    assert res["task"] == "race" and res["examples"] == {"train": 4, "validation": 4, "test": 4} and res["steps"] == 4
    assert set(res["dev"]) == {"loss", "accuracy"} and 0 <= res["dev"]["accuracy"] <= 1
    assert json.loads((out / "metrics.json").read_text())["dev"]["accuracy"] == res["dev"]["accuracy"]
    sub = (out / "RACE.tsv").read_text().splitlines()
    assert [r.split("\t")[0] for r in sub[1:]] == ["high1.txt-0", "high1.txt-1", "middle7.txt-0", "middle9.txt-0"]
    assert {r.split("\t")[1] for r in sub[1:]} <= {"A", "B", "C", "D"}
    model, tok, cfg = load_finetuned(str(out))
    assert isinstance(model, CausalTransfer) and model.head.out_features == 1
    ids = cfg["tokenizer"]["special_token_ids"]
    obj = Choice(ChoiceConfig(task="race"), tok, ids, 96, task=get_task("race"), layout=CAUSAL)
    _, preds = obj.predict(model, obj.stream(out / "data", "validation", 3, 0, 0, 1, shuffle=False))
    labels = np.load(out / "data" / "validation.npz")["labels"]
    assert (preds == labels).mean() == pytest.approx(res["dev"]["accuracy"])


def test_race_from_a_tiny_bert(tmp_path):
    from plmcli.models.bert import Bert, BertConfig

    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    tok, ids = make_tok("wordpiece", specials, TEXTS)
    meta = {"kind": "wordpiece", "special_tokens": specials, "special_token_ids": ids}
    torch.manual_seed(0)
    run = make_run(tmp_path / "bert", "bert", Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=64,
                                                              n_layer=1, n_head=2, d_model=16)), tok, meta)
    out = tmp_path / "ft"
    res = finetune("race", from_run=str(run), data_dir=str(write_race_dir(tmp_path / "RACE")), train__max_steps=3,
                   train__batch_size=2, optim__lr=1e-3, task__max_seq_len=64, out=str(out))
    assert res["steps"] == 3 and 0 <= res["dev"]["accuracy"] <= 1
    model, _, cfg = load_finetuned(str(out))
    assert isinstance(model, SequenceClassifier) and cfg["finetune"]["task_state"] == {"choices": 4}
    assert len((out / "RACE.tsv").read_text().splitlines()) == 5


def test_race_example_type_is_what_turns_the_question_on():
    ex = RaceExample("p", ["a", "b"], 0, "x", "q?")
    assert ex.endings == ["a", "b"] and ex.question == "q?"
