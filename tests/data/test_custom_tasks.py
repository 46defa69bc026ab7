"""Own data: `--task classification | regression | pair-classification` from TSV, CSV and JSONL files.

Reading (every format, headerless TSV, label discovery and order, errors) on hand-made files; then
`plm finetune` end to end on a tiny bag-of-words encoder (tests/test_finetune.py's toy family),
--eval-only, and the CLI; and a Chinese check on ChnSentiCorp and THUCNews titles (../shared) from a
tiny bert-wwm-chinese run.
"""

from plmcli.config import override_layers
import csv
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from plmcli.config_sections import TokenizerConfig
from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from helpers import finetune
from plmcli.runs import load_finetuned
from test_finetune import SPECIALS, ToyClsEncoder, ToyClsEncoderConfig, make_run

pytestmark = pytest.mark.usefixtures("one_thread")

# A 3-class "sentiment" a bag of words learns in a few steps: the class is told by one word.
WORDS = {"pos": "good", "neg": "bad", "neutral": "okay"}
FILLER = "the film was a story about some people in a town".split()


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = ("pos", "neg", "neutral")[i % 3]
        words = list(rng.choice(FILLER, 5)) + [WORDS[label]]
        rng.shuffle(words)
        out.append({"id": f"r{i}", "sentence": " ".join(words), "label": label})
    return out


def write(path: Path, records: list[dict], columns=None) -> Path:
    """`records` as TSV, CSV or JSONL (by extension); `columns` picks and orders the columns."""
    columns = columns or list(records[0])
    kind = path.suffix
    with open(path, "w", encoding="utf-8", newline="") as f:
        if kind == ".jsonl":
            f.writelines(json.dumps({c: r[c] for c in columns if c in r}, ensure_ascii=False) + "\n" for r in records)
        elif kind == ".csv":
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows([[r.get(c, "") for c in columns] for r in records])
        else:
            f.write("\n".join(["\t".join(columns)] + ["\t".join(str(r.get(c, "")) for c in columns) for r in records]) + "\n")
    return path


def task(name="classification", **options):
    return get_task(name, TaskOptions(**options))


# ------------------------------------------------------------------ reading


def test_every_format_reads_the_same_examples(tmp_path):
    recs = rows(6)
    recs[1]["sentence"] = 'a "quoted", comma\nand a newline'  # only CSV can hold these; TSV/JSONL get the rest
    got = {}
    for ext in (".tsv", ".csv", ".jsonl"):
        r = [dict(x) for x in recs]
        if ext == ".tsv":
            r[1]["sentence"] = 'a "quoted", comma and no newline'
        train, dev = write(tmp_path / f"train{ext}", r), write(tmp_path / f"dev{ext}", r[:3])
        t = task(train=str(train), dev=str(dev))
        splits = t.load(None)
        got[ext] = splits
        assert t.label_names == ("neg", "neutral", "pos") and t.num_labels == 3
        assert [e.label for e in splits["train"]] == [2, 0, 1, 2, 0, 1]
        assert [e.id for e in splits["dev"]] == ["r0", "r1", "r2"]  # the id column names the examples
    assert got[".csv"]["train"][1].text_a == 'a "quoted", comma\nand a newline'
    assert got[".tsv"]["train"][1].text_a == 'a "quoted", comma and no newline'
    assert [e.text_a for e in got[".jsonl"]["train"]] == [e.text_a for e in got[".csv"]["train"]]
    # The same folder as --data-dir: train.*, dev.* found by name (the first format in FORMATS order).
    t = task()
    assert len(t.load(str(tmp_path))["train"]) == 6 and t.label_names == ("neg", "neutral", "pos")


def test_columns_guessed_given_and_headerless(tmp_path):
    recs = [{"qid": str(10 + i), "text_a": r["sentence"], "label": r["label"]} for i, r in enumerate(rows(4))]
    t = task(train=str(write(tmp_path / "a.tsv", recs)), dev=str(write(tmp_path / "b.tsv", recs)))
    splits = t.load(None)
    assert splits["train"][0].text_a == recs[0]["text_a"] and [e.id for e in splits["dev"]] == ["10", "11", "12", "13"]
    # No header (THUCNews titles: `title<TAB>label id`): columns as 0-based numbers; ids are row numbers.
    (tmp_path / "h.txt").write_text("".join(f"{r['text_a']}\t{i % 3}\n" for i, r in enumerate(recs)), encoding="utf-8")
    t = task(train=str(tmp_path / "h.txt"), dev=str(tmp_path / "h.txt"), test=str(tmp_path / "h.txt"), text_col="0", label_col="1")
    splits = t.load(None)
    assert t.label_names == ("0", "1", "2") and [e.label for e in splits["train"]] == [0, 1, 2, 0]
    assert [e.id for e in splits["test"]] == ["0", "1", "2", "3"] and splits["test"][0].label is None
    # JSON values that are not strings are read as their JSON text.
    (tmp_path / "n.jsonl").write_text('{"text": 12, "label": 1}\n{"text": "x", "label": 0}\n', encoding="utf-8")
    t = task(train=str(tmp_path / "n.jsonl"), dev=str(tmp_path / "n.jsonl"))
    assert [(e.text_a, e.label) for e in t.load(None)["train"]] == [("12", 1), ("x", 0)]


def test_labels_sort_numerically_and_restore(tmp_path):
    recs = [{"text": f"w{i}", "label": lab} for i, lab in enumerate(["10", "2", "-1", "2", "10"])]
    t = task(train=str(write(tmp_path / "t.tsv", recs)), dev=str(write(tmp_path / "d.tsv", recs[:2])))
    splits = t.load(None)
    assert t.label_names == ("-1", "2", "10") and [e.label for e in splits["train"]] == [2, 1, 0, 1, 2]
    state = t.state()
    assert state == {"label_names": ["-1", "2", "10"]}
    # Restored (eval-only, load_finetuned): the saved set stays, whatever the files hold; no --train needed.
    again = task(dev=str(write(tmp_path / "d2.tsv", recs[:1])))
    again.restore(json.loads(json.dumps(state)))
    assert again.num_labels == 3 and again.load(None)["dev"][0].label == 2 and again.label_names == ("-1", "2", "10")
    bad = task(dev=str(write(tmp_path / "d3.tsv", [{"text": "x", "label": "10"}, {"text": "y", "label": "7"}])))
    bad.restore(state)
    with pytest.raises(PlmError, match=r"d3.tsv line 3: label '7' is not one of the finetuned run's 3 labels"):
        bad.load(None)
    # Strings sort as strings.
    recs = [{"text": "a", "label": "b"}, {"text": "b", "label": "B"}, {"text": "c", "label": "a"}]
    t = task(train=str(write(tmp_path / "s.tsv", recs)), dev=str(write(tmp_path / "s2.tsv", recs)))
    t.load(None)
    assert t.label_names == ("B", "a", "b")


def test_regression_and_pairs_read(tmp_path):
    recs = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": s} for i, s in enumerate(["0.5", "4", "-2.25e1"])]
    t = task("regression", train=str(write(tmp_path / "r.csv", recs)), dev=str(write(tmp_path / "d.csv", recs)),
             text_pair_col="sentence2")
    splits = t.load(None)
    assert t.num_labels == 1 and t.label_names == ("score",) and t.main_metric == "pearson"
    assert [(e.text_a, e.text_b, e.label) for e in splits["train"]] == [("a0", "b0", 0.5), ("a1", "b1", 4.0), ("a2", "b2", -22.5)]
    t = task("pair-classification", train=str(write(tmp_path / "p.jsonl", [{**r, "label": str(i % 2)} for i, r in enumerate(recs)])),
             dev=str(tmp_path / "p.jsonl"))
    splits = t.load(None)
    assert [(e.text_a, e.text_b, e.label) for e in splits["dev"]] == [("a0", "b0", 0), ("a1", "b1", 1), ("a2", "b2", 0)]


def test_scores():
    t = task()
    t.label_names, t.num_labels = ("a", "b", "c"), 3
    s = t.score(np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2]))
    assert s["accuracy"] == 0.75 and s["macro_f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    r = task("regression").score(np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 3.0]))
    assert r["spearman"] == pytest.approx(1.0) and r["pearson"] == pytest.approx(0.9819805)


@pytest.mark.parametrize("case, needles", [
    ("missing_column", ["train.tsv has no column 'txt' (--text-col); its columns: id, sentence, label"]),
    ("no_guess", ["no label column found", "its columns: id, sentence, cls", "--label-col"]),
    ("unknown_dev_label", ["dev.tsv line 3: label 'meh' never occurs in the training file", "neg, neutral, pos"]),
    ("regression_text", ["train.tsv line 4: regression label 'pos' is not a finite number"]),
    ("regression_nan", ["train.tsv line 2: regression label 'nan' is not a finite number"]),
    ("no_dev", ["--task classification needs --dev"]),
    ("extension", ["unknown file type '.xlsx'"]),
    ("mixed_columns", ["not a mix"]),
    ("headerless_guess", ["--label-col is missing", "0-based column number"]),
    ("header_by_number", ["line 1 looks like a header ('label')"]),
    ("one_class", ["every training example has the label 'pos'"]),
    ("bad_json", ["train.jsonl line 2: not JSON"]),
    ("json_list", ["train.jsonl line 1: a JSON list, not an object"]),
    ("short_row", ["train.tsv line 3 has 2 of the header's 3 fields, none for 'label'"]),
    ("empty_label", ["train.tsv line 2: the label is empty"]),
    ("empty", ["train.tsv is empty"]),
    ("header_only", ["train.tsv has no examples"]),
    ("loose_pair", ["second-text column 'sentence2'", "--text-pair-col sentence2"]),
    ("pair_missing", ["no pair column found (looked for text_b, sentence2"]),
    ("missing_file", ["--train", "nope.tsv not found"]),
])
def test_bad_input(tmp_path, case, needles):
    recs = rows(6)
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    write(train, recs), write(dev, recs[:3])
    name, opts = "classification", {"train": str(train), "dev": str(dev)}
    if case == "missing_column":
        opts["text_col"] = "txt"
    elif case == "no_guess":
        write(train, [{"id": "1", "sentence": "x", "cls": "a"}])
    elif case == "unknown_dev_label":
        write(dev, recs[:1] + [{**recs[1], "label": "meh"}])
    elif case in ("regression_text", "regression_nan"):
        name = "regression"
        write(train, [{"sentence": "x", "label": "1.5"}] * 2 + [{"sentence": "y", "label": "pos"}] if case == "regression_text"
              else [{"sentence": "x", "label": "nan"}])
    elif case == "no_dev":
        del opts["dev"]
    elif case == "extension":
        (tmp_path / "train.xlsx").write_text("x")
        opts["train"] = str(tmp_path / "train.xlsx")
    elif case == "mixed_columns":
        opts.update(text_col="0", label_col="label")
    elif case == "headerless_guess":
        opts["text_col"] = "1"
    elif case == "header_by_number":
        opts.update(text_col="1", label_col="2")
    elif case == "one_class":
        write(train, [r for r in recs if r["label"] == "pos"])
    elif case in ("bad_json", "json_list"):
        (tmp_path / "train.jsonl").write_text('{"sentence": "a", "label": "x"}\n{oops\n' if case == "bad_json" else "[1, 2]\n")
        opts["train"] = str(tmp_path / "train.jsonl")
    elif case == "short_row":
        train.write_text("id\tsentence\tlabel\n1\ta b\tpos\n2\tc d\n")
    elif case == "empty_label":
        train.write_text("sentence\tlabel\na b\t \n")
    elif case == "empty":
        train.write_text("\n\n")
    elif case == "header_only":
        train.write_text("sentence\tlabel\n")
    elif case == "loose_pair":
        write(train, [{"sentence1": "a", "sentence2": "b", "label": "x"}])
    elif case == "pair_missing":
        name = "pair-classification"
    elif case == "missing_file":
        opts["train"] = str(tmp_path / "nope.tsv")
    with pytest.raises(PlmError) as e:
        task(name, **opts).load(None)
    for n in needles:
        assert n in str(e.value), str(e.value)


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def tokenizer():
    texts = [r["sentence"] for r in rows(60)] + ["a b c x y"]
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "kind": "wordpiece", "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


@pytest.fixture
def toy_run(tmp_path, tokenizer, families):
    tok, meta = tokenizer
    torch.manual_seed(0)
    return make_run(tmp_path / "pre", "toycls", ToyClsEncoder(ToyClsEncoderConfig(vocab_size=tok.get_vocab_size())), tok, meta)


@pytest.fixture
def families(monkeypatch):
    from plmcli.models import registry

    monkeypatch.setitem(registry.FAMILIES, "toycls", "test_finetune:ToyClsEncoder")


def test_classification_end_to_end_and_eval_only(toy_run, tmp_path):
    recs = rows(90)
    train, dev = write(tmp_path / "train.tsv", recs[:60]), write(tmp_path / "dev.tsv", recs[60:])
    test = write(tmp_path / "test.tsv", [{"id": r["id"], "sentence": r["sentence"]} for r in recs[60:72]])  # no labels
    out = tmp_path / "ft"
    opts = dict(train=str(train), dev=str(dev), test=str(test), text_col="sentence", label_col="label")
    res = finetune("classification", from_run=str(toy_run), train__epochs=8, optim__lr=1e-1, train__batch_size=10, out=str(out), options=TaskOptions(**opts))
    assert res["main_metric"] == "accuracy" and set(res["dev"]) == {"loss", "accuracy", "macro_f1"}
    assert res["examples"] == {"train": 60, "validation": 30, "test": 12}
    assert res["dev"]["accuracy"] >= 0.9 and res["dev"]["macro_f1"] >= 0.9  # one word tells the class
    cfg = json.loads((out / "config.json").read_text())["finetune"]
    assert cfg["num_labels"] == 3 and cfg["label_names"] == ["neg", "neutral", "pos"]
    assert cfg["task_state"] == {"label_names": ["neg", "neutral", "pos"]}
    lines = (out / "predictions.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id\tprediction" and [x.split("\t")[0] for x in lines[1:]] == [r["id"] for r in recs[60:72]]
    preds = [x.split("\t")[1] for x in lines[1:]]
    assert sum(p == r["label"] for p, r in zip(preds, recs[60:72])) >= 11
    # load_finetuned rebuilds the 3-way head from the saved labels
    model, _, _ = load_finetuned(str(out))
    assert model.head.out_features == 3
    # --eval-only: the same dev score and predictions, from the restored labels; no --train needed.
    again = finetune("classification", from_run=str(out), eval_only=True, out=str(tmp_path / "again"), options=TaskOptions(**{**opts, "train": None}))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"]) and again["examples"]["train"] == 0
    assert (tmp_path / "again" / "predictions.tsv").read_text() == (out / "predictions.tsv").read_text()
    # A dev file with only two of the classes is scored against the run's three, not rediscovered ones.
    two = write(tmp_path / "two.csv", [r for r in recs[60:] if r["label"] != "neg"])
    part = finetune("classification", from_run=str(out), eval_only=True, out=str(tmp_path / "part"), options=TaskOptions(dev=str(two)))
    assert part["examples"]["validation"] == 20 and part["dev"]["accuracy"] >= 0.9
    bad = write(tmp_path / "bad.jsonl", [{"sentence": "good", "label": "pos"}, {"sentence": "x", "label": "great"}])
    with pytest.raises(PlmError, match="bad.jsonl line 2: label 'great' is not one of the finetuned run's 3 labels"):
        finetune("classification", from_run=str(out), eval_only=True, out=str(tmp_path / "no"), options=TaskOptions(dev=str(bad)))
    assert not (tmp_path / "no").exists()


def test_regression_and_pair_classification_end_to_end(toy_run, tmp_path):
    recs = rows(60, seed=1)
    value = {"pos": 1.0, "neutral": 0.0, "neg": -1.0}
    reg = [{"text": r["sentence"], "other": "a b c", "score": value[r["label"]]} for r in recs]
    res = finetune("regression", from_run=str(toy_run), train__epochs=8, optim__lr=1e-1, train__batch_size=10, out=str(tmp_path / "reg"),
                   options=TaskOptions(train=str(write(tmp_path / "r.jsonl", reg[:45])), dev=str(write(tmp_path / "r2.jsonl", reg[45:])),
                                       test=str(write(tmp_path / "r3.jsonl", reg[45:50])), text_pair_col="other"))
    assert res["main_metric"] == "pearson" and set(res["dev"]) == {"loss", "pearson", "spearman"}
    assert res["dev"]["pearson"] > 0.8 and math.isfinite(res["dev"]["spearman"])
    lines = (tmp_path / "reg" / "predictions.tsv").read_text().splitlines()
    assert [x.split("\t")[0] for x in lines[1:]] == ["0", "1", "2", "3", "4"]  # no id column: row numbers
    assert all(math.isfinite(float(x.split("\t")[1])) for x in lines[1:])
    # pair-classification: is the second text's class word the same as the first's?
    pairs = [{"sentence1": a["sentence"], "sentence2": b["sentence"], "label": "same" if a["label"] == b["label"] else "different"}
             for a, b in zip(recs, [recs[(i + (3 if i % 2 else 1)) % 60] for i in range(60)])]
    res = finetune("pair-classification", from_run=str(toy_run), train__max_steps=3, train__batch_size=10,
                   out=str(tmp_path / "pair"),
                   options=TaskOptions(train=str(write(tmp_path / "p.csv", pairs)), dev=str(write(tmp_path / "p2.csv", pairs[:10]))))
    assert res["steps"] == 3 and 0 <= res["dev"]["accuracy"] <= 1
    assert json.loads((tmp_path / "pair" / "config.json").read_text())["finetune"]["label_names"] == ["different", "same"]


def test_cli(toy_run, tmp_path):
    from plmcli.cli import app

    recs = rows(30)
    a, b = write(tmp_path / "a.tsv", recs[:20]), write(tmp_path / "b.tsv", recs[20:])
    runner = CliRunner()
    res = runner.invoke(app, ["finetune", "--task", "classification", "--train", str(a), "--dev", str(b), "--text-col", "sentence",
                              "--label-col", "label", "--from", str(toy_run), "--out", str(tmp_path / "o"), "--max-steps", "2",
                              "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["task"] == "classification" and got["steps"] == 2 and got["examples"]["validation"] == 10
    res = runner.invoke(app, ["finetune", "--task", "classification", "--train", str(a), "--dev", str(b), "--text-col", "text",
                              "--from", str(toy_run), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0 and "Traceback" not in res.output
    assert "a.tsv has no column 'text' (--text-col); its columns: id, sentence, label" in res.stderr
    assert not (tmp_path / "o2").exists()


# ------------------------------------------------------------------ Chinese, on real data


BERT_WWM_TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=64",
                 "tokenizer.vocab_size=3000", "tokenizer.min_frequency=1", "data.val_fraction=0.1", "train.seq_len=64",
                 "train.global_batch_size=8", "train.micro_batch_size=0", "train.eval_every=0", "train.eval_batches=2",
                 "train.save_every=0", "objective.max_predictions=10", "objective.dupe_factor=1", "optim.warmup_steps=1"]


def test_chinese_classification_from_a_tiny_bert_wwm(shared_data, tmp_path):
    """bert-wwm-chinese (whole-word masking over jieba words, both phases) at tiny size on 400 THUCNews
    titles, then `--task classification` on ChnSentiCorp (TSV with header, unlabeled test with qid)
    and on THUCNews titles (no header: --text-col 0 --label-col 1)."""
    from plmcli import api

    thuc = shared_data / "chinese" / "THUCNews-titles"
    titles = (thuc / "dev.txt").read_text(encoding="utf-8").splitlines()
    corpus = tmp_path / "zh.txt"  # documents of 5 titles each, for NSP pairs
    corpus.write_text("\n\n".join("\n".join(t.split("\t")[0] for t in titles[i:i + 5]) for i in range(0, 400, 5)) + "\n",
                      encoding="utf-8")
    s = api.pretrain("bert-wwm-chinese", [str(corpus)], str(tmp_path / "bert"), overrides=override_layers(BERT_WWM_TINY, {"train.max_steps": 3}))
    assert s["steps"] == 3 and math.isfinite(s["train_loss"])
    assert all((tmp_path / "bert" / "phases" / p / "summary.json").is_file() for p in ("seq128", "seq512"))

    senti = shared_data / "chinese" / "ChnSentiCorp"
    cut = {}
    for name, n in (("train", 160), ("dev", 80), ("test", 20)):
        lines = (senti / f"{name}.tsv").read_text(encoding="utf-8").splitlines()
        cut[name] = tmp_path / f"senti-{name}.tsv"
        cut[name].write_text("\n".join(lines[:n + 1]) + "\n", encoding="utf-8")  # header + n rows
    res = finetune("classification", from_run=str(tmp_path / "bert"), train__epochs=1, optim__lr=1e-3,
                   train__batch_size=16, task__max_seq_len=48, out=str(tmp_path / "senti"),
                   options=TaskOptions(train=str(cut["train"]), dev=str(cut["dev"]), test=str(cut["test"])))
    assert res["examples"] == {"train": 160, "validation": 80, "test": 20}
    assert all(math.isfinite(v) for v in res["dev"].values()) and 0 <= res["dev"]["accuracy"] <= 1
    assert json.loads((tmp_path / "senti" / "config.json").read_text())["finetune"]["label_names"] == ["0", "1"]
    lines = (tmp_path / "senti" / "predictions.tsv").read_text().splitlines()
    assert [x.split("\t")[0] for x in lines[1:]] == [str(i) for i in range(20)]  # test.tsv's qid
    assert {x.split("\t")[1] for x in lines[1:]} <= {"0", "1"}

    test_lines = (thuc / "test.txt").read_text(encoding="utf-8").splitlines()
    # test.txt is grouped by class: every 100th line covers all ten
    for name, part in (("train", titles[400:700]), ("dev", test_lines[::100]), ("test", test_lines[50::500])):
        (tmp_path / f"thuc-{name}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
    opts = TaskOptions(train=str(tmp_path / "thuc-train.txt"), dev=str(tmp_path / "thuc-dev.txt"),
                       test=str(tmp_path / "thuc-test.txt"), text_col="0", label_col="1")
    res = finetune("classification", from_run=str(tmp_path / "bert"), train__epochs=1, optim__lr=1e-3,
                   train__batch_size=16, task__max_seq_len=32, out=str(tmp_path / "thuc"), options=opts)
    assert all(math.isfinite(v) for v in res["dev"].values()) and set(res["dev"]) == {"loss", "accuracy", "macro_f1"}
    names = [str(i) for i in range(10)]
    assert json.loads((tmp_path / "thuc" / "config.json").read_text())["finetune"]["label_names"] == names
    model, _, cfg = load_finetuned(str(tmp_path / "thuc"))
    assert model.head.out_features == 10 and cfg["family"] == "bert"
    again = finetune("classification", from_run=str(tmp_path / "thuc"), eval_only=True,
                     out=str(tmp_path / "thuc-again"),
                     options=TaskOptions(dev=opts.dev, test=opts.test, text_col="0", label_col="1"))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])
    preds = [x.split("\t") for x in (tmp_path / "thuc" / "predictions.tsv").read_text().splitlines()[1:]]
    assert [i for i, _ in preds] == [str(i) for i in range(20)] and {p for _, p in preds} <= set(names)
    assert (tmp_path / "thuc-again" / "predictions.tsv").read_text() == (tmp_path / "thuc" / "predictions.tsv").read_text()
