"""Span QA: windows over long passages, decoding synthetic logits across windows, the span head and loss,
and `plm finetune --task squad / cmrc2018` end to end on tiny BERT (and XLNet's cls_last layout)."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_model
from typer.testing import CliRunner

from plmcli.cli import app
from plmcli.config_sections import TokenizerConfig
from plmcli.config_sections import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tasks.squad import QAExample
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from plmcli.objectives.qa import (NEG, SpanQA, SpanQAConfig, answer_tokens, best_spans, make_windows, max_context_window,
                                  padded, window_spans)

SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
CLS, SEP = 2, 3

# ------------------------------------------------------------------ windows


def test_window_spans_and_max_context():
    assert window_spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]  # starts 3 apart, the last ends at the end
    assert window_spans(10, 4, 5) == [(0, 4), (4, 4), (8, 2)]  # a stride past the window skips nothing
    assert window_spans(3, 4, 3) == [(0, 3)] and window_spans(0, 4, 3) == [(0, 0)]
    # min(left, right) + 0.01·length per window; token 2 ties nowhere (w0: 1.04, w1: 0.04), token 3 goes to w1.
    spans = window_spans(10, 4, 2)
    assert spans == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert max_context_window(spans, 10).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    # An edge token of two windows (context 0 in both) goes to the longer window, then to the earlier one.
    assert max_context_window([(0, 5), (4, 3)], 7).tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert max_context_window([(0, 3), (2, 3)], 5).tolist() == [0, 0, 0, 1, 1]


def test_answer_tokens_by_character_overlap():
    off = np.array([[0, 3], [4, 8], [8, 9], [10, 15]])  # "The Café, opens"
    assert answer_tokens(off, (4, 8)) == (1, 1)
    assert answer_tokens(off, (5, 12)) == (1, 3)  # partial tokens at both ends are taken whole
    assert answer_tokens(off, (9, 10)) is None and answer_tokens(off, None) is None


def _layout_case(layout):
    """Question [11, 12]; a 10-token passage (token i covers characters 2i..2i+1); an empty passage."""
    doc = list(range(100, 110))
    offsets = np.array([[2 * i, 2 * i + 1] for i in range(10)])
    return make_windows([[11, 12], [13]], [doc, []], [offsets, np.zeros((0, 2))], [0, 1], [(4, 5), None],
                        CLS, SEP, max_seq_len=9, doc_stride=2, layout=layout)


def test_make_windows_cls_first():
    w = _layout_case("cls_first")
    assert w["question"].tolist() == [0, 0, 0, 0, 1] and w["offsets"].tolist() == [0, 9, 18, 27, 36, 40]
    row1 = w["ids"][9:18].tolist()
    assert row1 == [CLS, 11, 12, SEP, 102, 103, 104, 105, SEP]
    assert w["ids"][36:40].tolist() == [CLS, 13, SEP, SEP]  # an empty passage still gets its window
    assert w["type_start"].tolist() == [4, 4, 4, 4, 3]
    # The answer (passage tokens 4-5) lies whole in windows 1 and 2; elsewhere [CLS] (0) is the target.
    assert w["start_positions"].tolist() == [0, 6, 4, 0, 0] and w["end_positions"].tolist() == [0, 7, 5, 0, 0]
    assert w["char_start"][9:18].tolist() == [-1, -1, -1, -1, 4, 6, 8, 10, -1]
    assert w["char_end"][9:18].tolist() == [-1, -1, -1, -1, 5, 7, 9, 11, -1]
    assert w["max_context"][9:18].tolist() == [False] * 5 + [True, True, False, False]


def test_make_windows_cls_last():
    w = _layout_case("cls_last")
    assert w["ids"][9:18].tolist() == [11, 12, SEP, 102, 103, 104, 105, SEP, CLS]
    assert w["type_start"].tolist() == [3, 3, 3, 3, 2]
    # [CLS] is the last token: the no-answer target is position 8 (3 in the empty passage's window).
    assert w["start_positions"].tolist() == [8, 5, 3, 8, 3] and w["end_positions"].tolist() == [8, 6, 4, 8, 3]
    assert w["char_start"][9:18].tolist() == [-1, -1, -1, 4, 6, 8, 10, -1, -1]


# ------------------------------------------------------------------ decoding

CONTEXT = "a b c d e f g h i j"  # passage token i is the letter at character 2i


def _decode(setter, n_best=20, max_answer_len=30):
    """Decode logits of the 4 windows of _layout_case (background -100) after `setter(logits, pos)` where
    pos(w, t) is the row position of passage token t in window w."""
    w = _layout_case("cls_first")
    width = 9
    logits = np.full((5, width, 2), -100.0)
    starts = [s for s, _ in window_spans(10, 4, 2)]
    setter(logits, lambda win, t: 4 + t - starts[win])
    cs, ce, mc = (padded(w[k], w["offsets"], width, fill) for k, fill in
                  (("char_start", -1), ("char_end", -1), ("max_context", False)))
    spans = best_spans(logits, cs, ce, mc, w["question"], 2, n_best, max_answer_len)
    return [CONTEXT[s:e] if s is not None else None for s, e in (sp or (None, None) for sp in spans)]


def test_decoding_an_answer_in_the_overlap_of_two_windows():
    def both(logits, pos):  # tokens 4-5 sit in windows 1 and 2
        for win in (1, 2):
            logits[win, pos(win, 4), 0] = logits[win, pos(win, 5), 1] = 5.0
    assert _decode(both) == ["e f", None]

    # Window 2 scores e..h higher, but its start token e has its maximum context in window 1: window 1's
    # "e f" wins (without the rule the answer would be "e f g h").
    def max_context(logits, pos):
        logits[1, pos(1, 4), 0] = logits[1, pos(1, 5), 1] = 3.0
        logits[2, pos(2, 4), 0] = logits[2, pos(2, 7), 1] = 8.0
    assert _decode(max_context) == ["e f", None]


def test_decoding_an_answer_only_one_window_holds():
    def last(logits, pos):  # tokens 8-9 only in window 3; a weaker candidate in window 0
        logits[3, pos(3, 8), 0] = logits[3, pos(3, 9), 1] = 6.0
        logits[0, pos(0, 1), 0] = logits[0, pos(0, 2), 1] = 5.0
    assert _decode(last) == ["i j", None]


def test_decoding_rejects_invalid_pairs():
    def invalid(logits, pos):
        logits[:, 1, 0] = logits[:, 2, 1] = 50.0  # question tokens
        logits[:, 0, :] = 40.0                    # [CLS]
        logits[2, pos(2, 6), 0] = logits[2, pos(2, 5), 1] = 30.0  # end before start
        logits[0, pos(0, 0), 0] = logits[0, pos(0, 3), 1] = 20.0  # 4 tokens: too long for max_answer_len 3
        logits[1, pos(1, 3), 0] = logits[1, pos(1, 5), 1] = 1.0   # the valid one
    assert _decode(invalid, max_answer_len=3) == ["d e f", None]
    assert _decode(invalid, max_answer_len=4) == ["a b c d", None]
    # With n_best 1 every window's best start is a question token: no answer at all.
    assert _decode(invalid, n_best=1) == [None, None]


# ------------------------------------------------------------------ real tokenizer, objective, model

PASSAGES = [
    "The Eiffel Tower was built in 1889 by Gustave Eiffel for the World Fair in Paris. It is made of iron "
    "and was the tallest structure in the world until 1930, when the Chrysler Building in New York was finished.",
    "Mount Everest is the highest mountain on Earth, at 8849 metres, on the border of Nepal and China in the Himalaya.",
    "Python was created by Guido van Rossum and first released in 1991. Its name comes from Monty Python.",
]
QUESTIONS = [  # (passage, question, answer)
    (0, "When was the Eiffel Tower built?", "1889"), (0, "Who built the Eiffel Tower?", "Gustave Eiffel"),
    (0, "Where is the Eiffel Tower?", "Paris"), (0, "What is the tower made of?", "iron"),
    (0, "Until when was it the tallest structure?", "1930"), (0, "What was finished in New York?", "the Chrysler Building"),
    (1, "What is the highest mountain?", "Mount Everest"), (1, "How high is Everest?", "8849 metres"),
    (1, "Where is Everest?", "the Himalaya"), (2, "Who created Python?", "Guido van Rossum"),
    (2, "When was Python released?", "1991"), (2, "Where does the name come from?", "Monty Python"),
]


def squad_doc(questions=QUESTIONS, passages=PASSAGES, bad=()):
    """SQuAD v1.1 JSON; question ids in `bad` get an answer_start one character off."""
    paragraphs = []
    for p, context in enumerate(passages):
        qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a) + (f"q{i}" in bad)}]}
               for i, (k, q, a) in enumerate(questions) if k == p]
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def make_tokenizer(texts):
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=400, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


@pytest.fixture(scope="module")
def english():
    return make_tokenizer(PASSAGES + [q for _, q, _ in QUESTIONS])


def _examples():
    return [QAExample(f"q{i}", q, PASSAGES[p], [a], (PASSAGES[p].index(a), PASSAGES[p].index(a) + len(a)))
            for i, (p, q, a) in enumerate(QUESTIONS)]


@pytest.mark.parametrize("layout", ["cls_first", "cls_last"])
def test_offsets_map_answers_to_tokens_and_back(english, layout):
    tok, meta = english
    task = get_task("squad", TaskOptions(max_query_len=6, doc_stride=5))
    obj = SpanQA(SpanQAConfig(), tok, meta["special_token_ids"], 20, task=task, layout=layout)
    w, table = obj.encode(_examples())
    n = len(w["question"])
    # 5 questions are longer than 6 tokens (e.g. "until when was it the tallest structure ?": 8).
    assert n > 2 * len(QUESTIONS) and table["truncated"] == 5 and table["unmapped"] == []
    assert int(np.bincount(w["question"]).max()) >= 5  # the long passage needs many windows
    lens = np.diff(w["offsets"])
    assert lens.max() == 20 and len(table["contexts"]) == 3
    cls_pos = np.where(layout == "cls_last", lens - 1, 0)
    labelled = w["start_positions"] != cls_pos
    cs, ce = padded(w["char_start"], w["offsets"], 20, -1), padded(w["char_end"], w["offsets"], 20, -1)
    # Each window holding the whole answer points at exactly the answer's characters.
    for k in np.nonzero(labelled)[0]:
        q = w["question"][k]
        context = table["contexts"][table["context_of"][q]]
        assert context[cs[k, w["start_positions"][k]]:ce[k, w["end_positions"][k]]] == QUESTIONS[q][2]
    assert set(w["question"][labelled]) == set(range(len(QUESTIONS)))
    # Logits that point at those tokens decode to the gold answers through the objective's own path.
    logits = np.zeros((n, 20, 2))
    rows = np.nonzero(labelled)[0]
    logits[rows, w["start_positions"][rows], 0] = logits[rows, w["end_positions"][rows], 1] = 10.0

    class Stream:
        windows, questions, padded = w, table, None  # padded: built by _answers on first use, as eval_stream leaves it
    seen, texts = obj._answers(Stream, logits, np.arange(n))
    assert seen == list(range(len(QUESTIONS))) and texts == [a for _, _, a in QUESTIONS]
    assert task.score(texts, table["answers"]) == {"exact_match": 100.0, "f1": 100.0}


def test_answers_no_token_covers_leave_training(english, tmp_path):
    tok, meta = english
    task = get_task("squad", TaskOptions(max_query_len=6))
    obj = SpanQA(SpanQAConfig(), tok, meta["special_token_ids"], 64, task=task)
    context = "Paris \x07 is in France."  # the tokenizer drops the control character \x07
    bell = QAExample("b", "What rings?", context, ["\x07"], (6, 7))
    good = QAExample("g", "Where is Paris?", context, ["France"], (15, 21))
    meta_out = obj.encode_splits({"train": [bell, good], "dev": [bell, good]}, tmp_path)
    assert meta_out["counts"]["train"]["questions"] == 1 and meta_out["counts"]["validation"]["questions"] == 2
    assert task.skipped == {"train: answer covered by no token": 1}
    train = np.load(tmp_path / "train.npz")
    assert train["question"].tolist() == [1] and train["offsets"].tolist() == [0, len(train["ids"])]
    table = json.loads((tmp_path / "validation.questions.json").read_text())
    assert table["ids"] == ["b", "g"] and table["answers"] == [["\x07"], ["France"]] and table["unmapped"] == [0]


def test_span_head_loss_and_frozen_heads(english):
    from plmcli.models.bert import Bert, BertConfig

    tok, meta = english
    torch.manual_seed(0)
    bert = Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=32, n_layer=1, n_head=2, d_model=16))
    obj = SpanQA(SpanQAConfig(), tok, meta["special_token_ids"], 32, task=get_task("squad", TaskOptions(max_query_len=8)))
    model = obj.build_model(bert)
    assert model.frozen and all(n.startswith("encoder.") for n in model.frozen)
    assert not any(n.startswith(("encoder.wte", "encoder.blocks", "head")) for n in model.frozen)
    x = torch.tensor([[CLS, 20, SEP, 30, 31, 32, SEP], [CLS, 21, SEP, 33, SEP, 0, 0]])
    mask = (torch.arange(7) < torch.tensor([[7], [5]])).long()
    types = (torch.arange(7) >= 3).long().expand(2, 7) * mask
    batch = {"input_ids": x, "token_type_ids": types, "attention_mask": mask,
             "start_positions": torch.tensor([4, 0]), "end_positions": torch.tensor([5, 0])}
    model.eval()
    logits = model(x, types, mask)
    assert logits.shape == (2, 7, 2) and (logits[1, 5:] == NEG).all() and (logits[0] > NEG).all()
    out = obj.step(model, batch)
    lsm = logits.log_softmax(1)
    want = -(lsm[0, 4, 0] + lsm[0, 5, 1] + lsm[1, 0, 0] + lsm[1, 0, 1]) / 4
    torch.testing.assert_close(out.loss, want)
    assert out.count.item() == 2.0 and out.metrics["loss"].item() == pytest.approx(2 * want.item())


def test_bad_window_settings(english):
    tok, meta = english
    with pytest.raises(PlmError, match="--max-query-len 64 leaves no room for the passage in windows of --max-seq-len 32"):
        SpanQA(SpanQAConfig(), tok, meta["special_token_ids"], 32, task=get_task("squad"))
    with pytest.raises(PlmError, match="--doc-stride 0 must be a positive number"):
        SpanQA(SpanQAConfig(), tok, meta["special_token_ids"], 32, task=get_task("squad", TaskOptions(doc_stride=0, max_query_len=8)))


# ------------------------------------------------------------------ end to end

runner = CliRunner()


def make_run(path: Path, family: str, model, tok, tok_meta: dict) -> Path:
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    save_model(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"family": family, "model": asdict(model.cfg), "objective": "mlm",
                                                  "tokenizer": tok_meta}))
    return path


def tiny_bert(path, tok, meta, max_positions=32):
    from plmcli.models.bert import Bert, BertConfig

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), max_positions=max_positions, n_layer=2, n_head=2, d_model=32,
                     dropout=0.0, attn_dropout=0.0)
    return make_run(path, "bert", Bert(cfg), tok, meta)


def test_cli_squad_end_to_end(tmp_path, english):
    tok, meta = english
    run = tiny_bert(tmp_path / "bert", tok, meta)
    train = tmp_path / "train.json"
    train.write_text(json.dumps(squad_doc(bad={"q3"})))  # q3's answer_start is off by one: skipped
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(squad_doc()))
    out = tmp_path / "ft"
    args = ["finetune", "--task", "squad", "--from", run, "--train", train, "--dev", dev, "--out", out, "--epochs", "40",
            "--lr", "3e-3", "--batch-size", "8", "--max-query-len", "8", "--doc-stride", "8", "--seed", "0", "--json"]
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    result = json.loads((out / "metrics.json").read_text())
    assert result["main_metric"] == "f1" and set(result["dev"]) == {"loss", "exact_match", "f1"}
    assert result["skipped_rows"] == {str(train): 1}
    assert result["settings"]["max_seq_len"] == 32 and result["examples"]["validation"] > len(QUESTIONS)  # windows
    assert result["test_predictions"] == {"validation": "predictions.json"}
    preds = json.loads((out / "predictions.json").read_text())
    assert sorted(preds) == sorted(f"q{i}" for i in range(len(QUESTIONS)))
    assert all(p in PASSAGES[QUESTIONS[int(k[1:])][0]] for k, p in preds.items())  # passage substrings
    # The kept weights learned the (training = dev) answers; the file scores as reported.
    assert result["dev"]["f1"] > 60
    rescored = get_task("squad").score([preds[f"q{i}"] for i in range(len(QUESTIONS))], [[a] for _, _, a in QUESTIONS])
    assert rescored["f1"] == pytest.approx(result["dev"]["f1"])
    # --eval-only scores the finetuned run again and writes the same predictions.
    again = tmp_path / "again"
    res = runner.invoke(app, [str(a) for a in ["finetune", "--task", "squad", "--from", out, "--train", train, "--dev", dev,
                                               "--out", again, "--eval-only", "--json"]])
    assert res.exit_code == 0, res.output
    assert json.loads((again / "metrics.json").read_text())["dev"]["f1"] == pytest.approx(result["dev"]["f1"])
    assert json.loads((again / "predictions.json").read_text()) == preds
    # Bad settings end cleanly before OUT is written.
    bad = tmp_path / "bad"
    res = runner.invoke(app, [str(a) for a in ["finetune", "--task", "squad", "--from", run, "--train", train,
                                               "--dev", dev, "--out", bad]])
    assert res.exit_code == 2 and "--max-query-len 64 leaves no room" in res.stderr and not bad.exists()


def test_causal_run_is_refused(tmp_path, english):
    from helpers import finetune
    from plmcli.models.gpt import GPT, GPTConfig

    tok, meta = english
    run = make_run(tmp_path / "gpt", "gpt", GPT(GPTConfig(vocab_size=tok.get_vocab_size(), max_positions=32, n_layer=1,
                                                           n_head=2, d_model=16)), tok, meta)
    f = tmp_path / "d.json"
    f.write_text(json.dumps(squad_doc()))
    with pytest.raises(PlmError, match=r"is a causal LM \(gpt\); finetuning on squad needs an encoder run"):
        finetune("squad", from_run=str(run), out=str(tmp_path / "o"), options=TaskOptions(train=str(f), dev=str(f)))
    assert not (tmp_path / "o").exists()


def test_xlnet_cls_last(tmp_path, english):
    from helpers import finetune
    from plmcli.models.xlnet import XLNet, XLNetConfig

    tok, meta = english
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(vocab_size=tok.get_vocab_size(), n_layer=1, n_head=2, d_model=16, d_ff=32, max_positions=32))
    run = make_run(tmp_path / "xlnet", "xlnet", model, tok, meta)
    f = tmp_path / "d.json"
    f.write_text(json.dumps(squad_doc()))
    res = finetune("squad", from_run=str(run), train__max_steps=2, train__batch_size=8, out=str(tmp_path / "o"),
                   options=TaskOptions(train=str(f), dev=str(f), max_query_len=8, doc_stride=8))
    assert res["steps"] == 2 and 0 <= res["dev"]["f1"] <= 100
    w = np.load(tmp_path / "o" / "data" / "train.npz")
    lens = np.diff(w["offsets"])
    ends = w["offsets"][1:] - 1
    assert (w["ids"][ends] == meta["special_token_ids"]["cls"]).all()  # [CLS] closes every window
    no_answer = w["start_positions"] == lens - 1
    assert no_answer.any() and (w["end_positions"][no_answer] == lens[no_answer] - 1).all()


def test_cmrc2018_slice_end_to_end(tmp_path, shared_data):
    from helpers import finetune

    d = shared_data / "chinese" / "cmrc2018"

    def head(name, n):  # the first n questions of a file, whole paragraphs
        doc, out, count = json.loads((d / name).read_text(encoding="utf-8")), [], 0
        for article in doc["data"]:
            for para in article["paragraphs"]:
                if count < n:
                    out.append(para)
                    count += len(para["qas"])
        return {"data": [{"paragraphs": out}]}, [p["context"] for p in out] + [q["question"] for p in out for q in p["qas"]]

    train, texts = head("cmrc2018_dev.json", 40)
    dev, more = head("cmrc2018_trial.json", 20)
    (tmp_path / "train.json").write_text(json.dumps(train, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "dev.json").write_text(json.dumps(dev, ensure_ascii=False), encoding="utf-8")
    tok, meta = make_tokenizer(texts + more)
    run = tiny_bert(tmp_path / "bert", tok, meta, max_positions=64)
    out = tmp_path / "ft"
    res = finetune("cmrc2018", from_run=str(run), train__max_steps=6, train__batch_size=16, optim__lr=1e-3, out=str(out),
                   options=TaskOptions(train=str(tmp_path / "train.json"), dev=str(tmp_path / "dev.json"),
                                       max_query_len=16, doc_stride=24))
    n_dev = sum(len(p["qas"]) for p in dev["data"][0]["paragraphs"])
    preds = json.loads((out / "predictions.json").read_text(encoding="utf-8"))
    assert len(preds) == n_dev >= 20 and res["examples"]["validation"] > n_dev  # passages of ~500 characters: windows
    assert all(np.isfinite(res["dev"][k]) and 0 <= res["dev"][k] <= 100 for k in ("exact_match", "f1"))
    contexts = {q["id"]: p["context"] for p in dev["data"][0]["paragraphs"] for q in p["qas"]}
    assert all(a in contexts[k] for k, a in preds.items())
