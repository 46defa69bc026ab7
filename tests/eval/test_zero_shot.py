"""`plm zero-shot`: a tiny GPT run scores SST-2 (verbalised labels), RACE (options, sum and mean) and LAMBADA-style
last words with no finetuning, and every number equals a hand computation of the continuation's log-likelihood
from the model's full logits (`model(ids)` -> log-softmax -> the continuation's tokens)."""

import json
import math
from pathlib import Path

import pytest
import torch

from helpers import assert_clean_error, pretrained_on, run
from plmcli import api
from plmcli.eval.zero_shot import zero_shot_config
from race_data import ARTICLES, TEXTS as RACE_TEXTS, write_race_dir

GLUE_SAMPLE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"
SST = [("a fine and moving film", 1), ("dull and far too long", 0), ("great fun", 1), ("a waste of time", 0),
       ("the cast is wonderful", 1), ("a tired , silly plot", 0), ("it is a joy", 1), ("nothing works here", 0)]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """(run dir, its model, tokenizer, eos id): TINY_RECIPE (char tokenizer, trained on seq_len 16) with 64 positions."""
    texts = [t for t, _ in SST] + ["It was great.", "It was terrible."] + RACE_TEXTS
    run_dir = pretrained_on(tmp_path_factory.mktemp("zs"), "\n\n".join(texts * 2) + "\n")
    model, tok, cfg = api.load_run(str(run_dir))
    return run_dir, model, tok, cfg["tokenizer"]["special_token_ids"]["eos"]


def by_hand(gpt, prompt: str, continuation: str, window: int) -> tuple[float, int, bool]:
    """(log P(continuation | eos + prompt), its tokens, every token the argmax) from the full logits of the last
    window + 1 tokens' inputs."""
    _, model, tok, eos = gpt
    a = [eos] + tok.encode(prompt, add_special_tokens=False).ids
    b = tok.encode(continuation, add_special_tokens=False).ids
    seq = (a + b)[-(window + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([seq[:-1]]))[0].double()  # (T, V)
    logp = torch.log_softmax(logits, -1)
    first = len(seq) - 1 - len(b)  # the position that predicts b[0]
    ll = sum(logp[first + i, t].item() for i, t in enumerate(b))
    greedy = all(int(logits[first + i].argmax()) == t for i, t in enumerate(b))
    return ll, len(b), greedy


def sst_dir(root: Path) -> Path:
    folder = root / "SST-2"
    folder.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (folder / name).write_text("sentence\tlabel\n" + "".join(f"{t} \t{y}\n" for t, y in SST))
    return root


def test_sst2_zero_shot_equals_the_hand_computation(gpt, tmp_path):
    preds_file = tmp_path / "new" / "folder" / "preds.jsonl"  # made (was: "cannot read" a temp file, after scoring)
    res = run("zero-shot", gpt[0], "--task", "sst2", "--data-dir", sst_dir(tmp_path / "glue"), "--max-length", "64",
              "--json", "--predictions", preds_file)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    # the shipped config (plmcli/recipes/zero-shot/sst2.yaml): the review, then the likelier verbaliser
    assert out["prompt"] == "{text}" and out["score"] == "sum" and out["window"] == 64
    assert out["verbalizers"] == {"negative": " It was terrible.", "positive": " It was great."}
    rows = [json.loads(x) for x in preds_file.read_text().splitlines()]
    assert len(rows) == out["examples"] == len(SST)
    correct = 0
    for (text, label), row in zip(SST, rows):
        hand = [by_hand(gpt, text, v, 64) for v in (" It was terrible.", " It was great.")]
        assert row["loglik"] == pytest.approx([h[0] for h in hand], rel=1e-4, abs=1e-4)
        assert row["tokens"] == [h[1] for h in hand] == [17, 14]
        pred = max(range(2), key=lambda j: hand[j][0])
        assert row["label"] == label and row["prediction"] == pred
        correct += pred == label
    assert out["accuracy"] == pytest.approx(correct / len(SST)) and out["accuracy_sum"] == out["accuracy"]
    mean_preds = [max(range(2), key=lambda j: r["loglik"][j] / r["tokens"][j]) for r in rows]
    assert out["accuracy_mean"] == pytest.approx(sum(p == y for p, (_, y) in zip(mean_preds, SST)) / len(SST))
    res = run("zero-shot", gpt[0], "--task", "sst2", "--data-dir", tmp_path / "glue", "--max-length", "64")
    assert res.exit_code == 0 and res.stdout.startswith(f"zero-shot sst2 dev: accuracy {out['accuracy']:.4f}")


def test_long_reviews_lose_their_start_in_the_training_window(gpt):
    res = api.zero_shot(str(gpt[0]), task="sst2", data_dir=str(GLUE_SAMPLE), max_examples=5,
                        verbalizers={"0": " bad", "positive": " good"})
    assert res["window"] == 16 and "training seq_len" in res["window_from"] and res["examples"] == 5
    dev = (GLUE_SAMPLE / "SST-2" / "dev.tsv").read_text().splitlines()[1:6]
    for line, row in zip(dev, res["predictions"]):
        text = line.split("\t")[0].strip()
        hand = [by_hand(gpt, text, v, 16) for v in (" bad", " good")]
        assert row["loglik"] == pytest.approx([h[0] for h in hand], rel=1e-4, abs=1e-4)


def test_race_options_by_mean_and_by_sum(gpt, tmp_path):
    data = write_race_dir(tmp_path / "RACE", ("train", "dev"))
    res = api.zero_shot(str(gpt[0]), task="race", data_dir=str(data), max_length=64)
    # the shipped race.yaml: the passage and question, then each option; the mean per token picks by default
    assert res["score"] == "mean" and res["prompt"] == "{context}\nQuestion: {question}\nAnswer:"
    assert res["kind"] == "choice" and res["examples"] == 4
    questions = [(a["article"], q, opts, "ABCD".index(ans)) for a in ARTICLES
                 for q, opts, ans in zip(a["questions"], a["options"], a["answers"])]
    by_sum, by_mean = 0, 0
    for (article, question, options, label), row in zip(questions, res["predictions"]):
        hand = [by_hand(gpt, f"{article}\nQuestion: {question}\nAnswer:", f" {o}", 64) for o in options]
        assert row["loglik"] == pytest.approx([h[0] for h in hand], rel=1e-4, abs=1e-4)
        assert row["tokens"] == [len(o) + 1 for o in options]  # characters, and the space before
        means = [h[0] / h[1] for h in hand]
        assert row["prediction"] == means.index(max(means)) and row["label"] == label
        by_mean += row["prediction"] == label
        by_sum += max(range(4), key=lambda j: hand[j][0]) == label
    assert res["accuracy"] == res["accuracy_mean"] == pytest.approx(by_mean / 4)
    assert res["accuracy_sum"] == pytest.approx(by_sum / 4)
    summed = api.zero_shot(str(gpt[0]), task="race", data_dir=str(data), max_length=64, score="sum")
    assert summed["score"] == "sum" and summed["accuracy"] == pytest.approx(by_sum / 4)


def test_lambada_last_words(gpt, tmp_path):
    text = tmp_path / "lambada.txt"
    text.write_text("the cat sat on a mat\n\ndogs ran far away from home\nIt was great\n")
    res = api.zero_shot(str(gpt[0]), task="lambada", data=str(text), max_length=64)
    hand = [by_hand(gpt, c, " " + w, 64) for c, w in (("the cat sat on a", "mat"), ("dogs ran far away from", "home"),
                                                      ("It was", "great"))]
    assert res["examples"] == 3 and [p["line"] for p in res["predictions"]] == [1, 3, 4]
    assert [p["word"] for p in res["predictions"]] == ["mat", "home", "great"]
    assert [p["loglik"] for p in res["predictions"]] == pytest.approx([h[0] for h in hand], rel=1e-4, abs=1e-4)
    assert [p["correct"] for p in res["predictions"]] == [h[2] for h in hand]
    assert res["accuracy"] == pytest.approx(sum(h[2] for h in hand) / 3)
    assert res["ppl"] == pytest.approx(math.exp(-sum(h[0] for h in hand) / 3), rel=1e-4)
    res = run("zero-shot", gpt[0], "--task", "lambada", "--data", text, "--max-length", "64")
    assert res.exit_code == 0 and res.stdout.startswith("zero-shot lambada: last-word accuracy")


def test_config_file_over_the_shipped_one(tmp_path):
    cfg = tmp_path / "zs.yaml"
    cfg.write_text("task: sst2\nprompt: \"Review: {text}\\nSentiment:\"\nverbalizers: {0: ' negative', 1: ' positive'}\n")
    c = zero_shot_config(str(cfg), {"score": "mean", "split": None})
    assert c.prompt == "Review: {text}\nSentiment:" and c.verbalizers == {0: " negative", 1: " positive"}
    assert c.score == "mean" and c.split == "dev" and c.option == " {option}"
    assert zero_shot_config(None, {"task": "race"}).score == "mean"
    assert zero_shot_config(None, {"task": "mnli"}).verbalizers == {}  # no shipped config: the label names


def test_predictions_where_nothing_can_be_written_fail_before_scoring(gpt, tmp_path):
    (tmp_path / "file").write_text("x")
    res = run("zero-shot", gpt[0], "--task", "sst2", "--data-dir", sst_dir(tmp_path / "glue"),
              "--predictions", tmp_path / "file" / "preds.jsonl")
    assert_clean_error(res, "is a file, not a directory", "choose a writable --predictions")


@pytest.mark.parametrize("args, needles", [
    (["--verbalizer", "positive= Great"], ["no verbaliser for label negative of sst2"]),
    (["--verbalizer", "happy= Great", "--verbalizer", "positive= x"], ["verbaliser for 'happy', which is no label"]),
    (["--verbalizer", "nothing"], ["--verbalizer 'nothing' is not LABEL=TEXT"]),
    (["--prompt", "{review} then"], ["names {review}", "use {text}, {text_b}"]),
    (["--prompt", "Review:"], ["prompt 'Review:' has no {text}", "--prompt 'Review: {text}'"]),
    (["--score", "max"], ["zero-shot.score 'max' is not one of sum, mean", "e.g. --score=sum"]),
    (["--split", "test"], ["sst2 has no test split here", "--split train or dev"]),
    (["--data", "x.txt"], ["--data is lambada's text file"]),
])
def test_bad_requests_are_one_line(gpt, tmp_path, args, needles):
    res = run("zero-shot", gpt[0], "--task", "sst2", "--data-dir", sst_dir(tmp_path / "glue"), *args)
    assert_clean_error(res, *needles)


def test_what_cannot_be_scored_zero_shot(gpt, tmp_path):
    assert_clean_error(run("zero-shot", gpt[0], "--task", "stsb", "--data-dir", tmp_path),
                       "zero-shot scores labels or options, and stsb is a regression task")
    assert_clean_error(run("zero-shot", gpt[0], "--task", "lambada"), "lambada needs its text file")
    (tmp_path / "one.txt").write_text("hello\n")
    assert_clean_error(run("zero-shot", gpt[0], "--task", "lambada", "--data", tmp_path / "one.txt"),
                       "line 1: a single word")
    assert_clean_error(run("zero-shot", gpt[0], "--task", "sst2", "--data-dir", sst_dir(tmp_path / "g"),
                           "--verbalizer", "negative=" + "x" * 40, "--verbalizer", "positive=y"),
                       "a continuation of 40 tokens does not fit the window of 16")


def test_an_encoder_run_is_refused(tmp_path):
    from dataclasses import asdict

    from safetensors.torch import save_model

    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.tokenizers import train_tokenizer
    from plmcli.models.bert import Bert, BertConfig

    tok = train_tokenizer(RACE_TEXTS, TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1,
                                                      special_tokens={"pad": "[PAD]", "unk": "[UNK]"}))
    bert = tmp_path / "bert"
    bert.mkdir()
    tok.save(str(bert / "tokenizer.json"))
    model = Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=16, n_layer=1, n_head=2, d_model=16))
    save_model(model, str(bert / "model.safetensors"))
    (bert / "config.json").write_text(json.dumps({"family": "bert", "model": asdict(model.cfg), "objective": "mlm",
                                                  "tokenizer": {"kind": "wordpiece", "special_token_ids": {}}}))
    assert_clean_error(run("zero-shot", bert, "--task", "sst2"),
                       "zero-shot scoring needs a causal LM that reads whole sequences", "is a bert model")
