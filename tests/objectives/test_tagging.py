"""Objective `tagging`: first-sub-token labels, windows, the token classifier, and `plm finetune --task
conll2003` end to end (with and without --crf) on a tiny BERT."""

import json
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_model

from plmcli.config_sections import TokenizerConfig
from plmcli.config_sections import TaskOptions
from plmcli.data.tasks.conll import Sentence
from plmcli.data.tasks.registry import get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from helpers import finetune
from plmcli.runs import load_finetuned
from plmcli.objectives.tagging import IGNORE, Tagging, TaggingConfig, TokenClassifier, plan_windows

SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
TAGS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
FIRST = "john mary paul anna".split()
LAST = "smith jones brown".split()
CITIES = ["paris", "london", "new york", "rio de janeiro"]
FILLER = "the a met in and visited said today from to with".split()


def make_tokenizer(texts, vocab_size=120):
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=vocab_size, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


def synthetic_conll(path: Path, n: int, seed: int) -> Path:
    """Sentences of filler words, persons (1-2 words) and cities (1-3 words), in IOB1 like eng.train."""
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        for _ in range(rng.randint(1, 3)):
            lines += [f"{w} x x O" for w in rng.sample(FILLER, rng.randint(1, 3))]
            if rng.random() < 0.5:
                person = [rng.choice(FIRST)] + ([rng.choice(LAST)] if rng.random() < 0.6 else [])
                lines += [f"{w.capitalize()} x x I-PER" for w in person]
            else:
                lines += [f"{w.capitalize()} x x I-LOC" for w in rng.choice(CITIES).split()]
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer([" ".join(FIRST + LAST + CITIES + FILLER)] * 3)


def objective(tokenizer, seq_len=32, layout="cls_first", crf=False) -> Tagging:
    tok, meta = tokenizer
    task = get_task("conll2003", TaskOptions(crf=crf))
    task.restore({"tags": TAGS})
    return Tagging(TaggingConfig(num_labels=len(TAGS)), tok, meta["special_token_ids"], seq_len, task=task, layout=layout)


def test_labels_on_first_sub_tokens(tokenizer):
    tok, meta = tokenizer
    ids = meta["special_token_ids"]
    obj = objective(tokenizer)
    words = ["Smithsonian", "met", "Mary", "\x07"]  # a control character the normalizer drops -> [UNK]
    arrays, counts = obj.encode_sentences([Sentence(words, [1, 0, 2, 0], "s-0")])
    pieces = [tok.encode(w, add_special_tokens=False).ids for w in words[:3]]
    assert len(pieces[0]) > 1  # really split into sub-tokens
    assert arrays["ids"].tolist() == [ids["cls"], *pieces[0], *pieces[1], *pieces[2], ids["unk"], ids["sep"]]
    n0 = len(pieces[0])
    first_pos = [1, 1 + n0, 2 + n0, 3 + n0]
    assert np.flatnonzero(arrays["first"]).tolist() == first_pos
    want = np.full(len(arrays["ids"]), IGNORE)
    want[first_pos] = [1, 0, 2, 0]
    assert arrays["labels"].tolist() == want.tolist()
    assert counts == {"documents": 1, "sentences": 1, "words": 4, "tokens": len(want), "truncated": 0, "windowed": 0,
                      "iob1_converted": 0}
    # XLNet's layout: tokens [SEP] [CLS]; an unlabeled sentence: first flags, no labels
    last = objective(tokenizer, layout="cls_last")
    arrays, _ = last.encode_sentences([Sentence(words, None, "s-0")])
    assert arrays["ids"].tolist()[-2:] == [ids["sep"], ids["cls"]]
    assert np.flatnonzero(arrays["first"]).tolist() == [p - 1 for p in first_pos]
    assert (arrays["labels"] == IGNORE).all() and arrays["word_tags"].tolist() == [-1] * 4


def test_byte_level_words_keep_their_in_sentence_pieces():
    """Byte-level BPE marks a word start with Ġ: words are tokenized inside the sentence, as pretrained."""
    cfg = TokenizerConfig(kind="bytelevel-bpe", vocab_size=300, min_frequency=1, special_tokens={"pad": "<pad>",
                          "cls": "<s>", "sep": "</s>", "unk": "<unk>"})
    tok = train_tokenizer(["the cat sat on the mat with the hat"] * 5, cfg)
    ids = special_token_ids(tok, resolve_special_tokens(cfg, add_unk=False))
    task = get_task("conll2003")
    task.restore({"tags": TAGS})
    obj = Tagging(TaggingConfig(num_labels=5), tok, ids, 16, task=task)
    arrays, _ = obj.encode_sentences([Sentence(["the", "cat", "sat"], [0, 1, 0], "x")])
    assert arrays["ids"][1:-1].tolist() == tok.encode("the cat sat", add_special_tokens=False).ids
    assert arrays["first"].sum() == 3


def test_windows(tokenizer):
    assert plan_windows([1, 2, 3, 1, 1], 4) == [(0, 2), (2, 4), (4, 5)]
    assert plan_windows([9, 1], 4) == [(0, 1), (1, 2)]  # a word longer than the window: alone (and cut)
    assert plan_windows([1, 1], 4) == [(0, 2)]
    obj = objective(tokenizer, seq_len=8)  # 6 sub-tokens per window
    words = ["met", "Paul", "Smith", "in", "Rio", "de", "Janeiro", "today", "and", "London"]
    tags = [0, 2, 4, 0, 1, 3, 3, 0, 0, 1]
    arrays, counts = obj.encode_sentences([Sentence(words, tags, "s-0"), Sentence(["Smithsonian"] * 2, [1, 1], "s-1")])
    assert counts["sentences"] == 2 and counts["documents"] == len(arrays["window_sentence"]) > 2
    assert counts["windowed"] == 2 and counts["words"] == 12
    assert arrays["window_sentence"].tolist()[0] == 0 and arrays["window_word_start"][0] == 0
    # every word labeled once; a window opening inside an entity reads I-X there as B-X
    starts = arrays["window_word_start"][arrays["window_sentence"] == 0].tolist()
    labels = arrays["labels"][arrays["labels"] != IGNORE][:10].tolist()
    want = [(1 if t == 3 else 2 if t == 4 else t) if w in starts and w > 0 else t for w, t in enumerate(tags)]
    assert labels == want and any(tags[w] in (3, 4) for w in starts)
    assert arrays["word_tags"].tolist() == tags + [1, 1]  # the gold kept for scoring is the original
    lens = np.diff(arrays["offsets"])
    assert (lens <= 8).all()


def test_window_predictions_join_back_into_sentences(tokenizer):
    obj = objective(tokenizer, seq_len=6)  # 4 sub-tokens per window
    sents = [Sentence(["met", "Paul", "Smith", "in", "Rio", "de", "Janeiro"], [0, 2, 4, 0, 1, 3, 3], "a"),
             Sentence(["London"], [1], "b"), Sentence(["Smithsonian", "said", "today"], [0, 0, 0], "c")]
    arrays, counts = obj.encode_sentences(sents)
    n_win = counts["documents"]
    assert n_win > 4 and counts["windowed"] == 2
    words = np.array([arrays["first"][a:b].sum() for a, b in zip(arrays["offsets"][:-1], arrays["offsets"][1:])])
    # each window "predicts" 10 × its sentence + the word's position in the sentence; windows arrive shuffled
    preds = np.full((n_win, 6), -1)
    for w in range(n_win):
        s, a = arrays["window_sentence"][w], arrays["window_word_start"][w]
        preds[w, :words[w]] = 10 * s + a + np.arange(words[w])
    order = np.random.default_rng(0).permutation(n_win)
    got = {k: torch.from_numpy(v) for k, v in (("index", order), ("preds", preds[order]), ("words", words[order]))}
    numbers, joined = Tagging._sentences(arrays, got)
    assert numbers.tolist() == [0, 1, 2]
    assert [j.tolist() for j in joined] == [list(range(7)), [10], [20, 21, 22]]


def test_several_eval_sets_concatenate(tokenizer):
    from plmcli.objectives.tagging import _concat

    obj = objective(tokenizer, seq_len=6)
    a, _ = obj.encode_sentences([Sentence(["met", "Paul", "Smith", "in", "Rio"], [0, 2, 4, 0, 1], "a0")], group=0)
    b, _ = obj.encode_sentences([Sentence(["London"], [1], "b0"), Sentence(["Paris", "said"], [1, 0], "b1")], group=1)
    both = _concat([a, b])
    assert both["example_id"].tolist() == ["a0", "b0", "b1"] and both["group"].tolist() == [0, 1, 1]
    assert both["word_tags"][both["word_offsets"][2]:both["word_offsets"][3]].tolist() == [1, 0]
    n = len(a["window_sentence"])
    assert both["window_sentence"].tolist() == a["window_sentence"].tolist() + [1, 2]
    assert both["ids"][both["offsets"][n]:both["offsets"][n + 1]].tolist() == b["ids"][:b["offsets"][1]].tolist()
    assert len(both["offsets"]) == n + 3 and both["offsets"][-1] == len(both["ids"])


def test_stream_packs_word_tags(tokenizer, tmp_path):
    obj = objective(tokenizer)
    sents = [Sentence(["Paul", "Smith", "met"], [2, 4, 0], "a"), Sentence(["London"], [1], "b")]
    arrays, _ = obj.encode_sentences(sents)
    np.savez(tmp_path / "train.npz", **arrays)
    batch = obj.stream(tmp_path, "train", 2, 0, 0, 1, shuffle=False)[0]
    assert batch["tags"].tolist() == [[2, 4, 0], [1, IGNORE, IGNORE]]
    assert batch["first"].sum(1).tolist() == [3, 1] and batch["input_ids"].shape[0] == 2


def test_token_classifier_reads_first_sub_tokens():
    from plmcli.models.bert import Bert, BertConfig

    torch.manual_seed(0)
    enc = Bert(BertConfig(vocab_size=50, max_positions=16, n_layer=1, n_head=2, d_model=8, dropout=0.0, attn_dropout=0.0))
    model = TokenClassifier(enc, 5, 0.0).eval()
    ids = torch.randint(5, 50, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    first = torch.tensor([[0, 1, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    scores, word_mask = model(ids, mask, first)
    hidden, _ = enc.encode(ids, None, mask)
    want = model.head(hidden)
    torch.testing.assert_close(scores[0], want[0, [1, 3, 4]])
    torch.testing.assert_close(scores[1, :2], want[1, [2, 3]])
    assert word_mask.tolist() == [[True] * 3, [True, True, False]]
    # BERT's pooler, NSP and MLM heads are never reached by tagging: frozen (the tied decoder weight is wte)
    assert model.freeze_unused(1, 2) == ["encoder.pooler.weight", "encoder.pooler.bias", "encoder.nsp.weight",
                                         "encoder.nsp.bias", "encoder.mlm.dense.weight", "encoder.mlm.dense.bias",
                                         "encoder.mlm.ln.weight", "encoder.mlm.ln.bias", "encoder.mlm.decoder.bias"]
    assert all(p.requires_grad for n, p in model.named_parameters() if not n.startswith(("encoder.pooler", "encoder.nsp",
                                                                                         "encoder.mlm")))


# ------------------------------------------------------------------ end to end


def tiny_bert_run(tmp_path: Path, texts, seed=0, family="bert") -> Path:
    from plmcli.models.registry import model_class

    tok, meta = make_tokenizer(texts, vocab_size=400)
    torch.manual_seed(seed)
    cls = model_class(family)
    model = cls(cls.Config(vocab_size=tok.get_vocab_size(), max_positions=48, n_layer=1, n_head=2, d_model=32,
                           dropout=0.0, attn_dropout=0.0))
    run = tmp_path / family
    run.mkdir()
    tok.save(str(run / "tokenizer.json"))
    save_model(model, str(run / "model.safetensors"))
    (run / "config.json").write_text(json.dumps({"family": family, "model": asdict(model.cfg), "objective": "mlm",
                                                 "tokenizer": meta}))
    return run


@pytest.mark.parametrize("crf", [False, True])
def test_synthetic_ner_is_learned(tmp_path, crf):
    data = tmp_path / "conll"
    data.mkdir()
    synthetic_conll(data / "eng.train", 300, 0)
    synthetic_conll(data / "eng.testa", 60, 1)
    synthetic_conll(data / "eng.testb", 20, 2)
    texts = [line.split()[0] for line in (data / "eng.train").read_text().splitlines() if line]
    run = tiny_bert_run(tmp_path, [" ".join(texts)])
    out = tmp_path / "ft"
    res = finetune("conll2003", from_run=str(run), data_dir=str(data), train__epochs=2, optim__lr=5e-3,
                   train__batch_size=16, train__seed=0, out=str(out), options=TaskOptions(crf=crf))
    assert res["main_metric"] == "f1" and {"loss", "precision", "recall", "f1", "accuracy"} == set(res["dev"])
    assert res["examples"] == {"train": 300, "validation": 60, "test": 20}
    assert res["dev"]["f1"] > 0.9 and res["dev"]["accuracy"] > 0.95
    cfg = json.loads((out / "config.json").read_text())["finetune"]
    assert cfg["task_state"]["tags"] == TAGS and cfg["options"]["crf"] is crf
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["counts"]["train"]["iob1_converted"] > 300  # every IOB1 entity start rewritten
    lines = (out / "test_predictions.txt").read_text().split("\n\n")
    assert len([s for s in lines if s.strip()]) == 20
    model, _, _ = load_finetuned(str(out))
    assert (model.crf is not None) is crf
    if crf:  # the transitions were trained and saved (the CRF is built first after finetune's seed)
        from plmcli.models.crf import LinearChainCRF

        torch.manual_seed(0)
        init = LinearChainCRF(len(TAGS)).transitions
        assert (model.crf.transitions - init).abs().max() > 1e-3
    again = finetune("conll2003", from_run=str(out), data_dir=str(data), eval_only=True, out=str(tmp_path / "again"))
    assert again["dev"] == pytest.approx(res["dev"])
    assert (tmp_path / "again" / "test_predictions.txt").read_text() == (out / "test_predictions.txt").read_text()


def _slice(src: Path, dst: Path, sentences: int) -> Path:
    """The first `sentences` sentences of a CoNLL file (with its -DOCSTART- lines)."""
    blocks = src.read_text(encoding="utf-8").split("\n\n")
    kept, n = [], 0
    for b in blocks:
        kept.append(b)
        n += not b.startswith("-DOCSTART-") and bool(b.strip())
        if n == sentences:
            break
    dst.write_text("\n\n".join(kept) + "\n", encoding="utf-8")
    return dst


def test_real_conll2003_slice_with_and_without_crf(tmp_path, shared_data):
    src, data = shared_data / "conll2003", tmp_path / "conll"
    data.mkdir()
    for name, n in (("eng.train", 100), ("eng.testa", 40), ("eng.testb", 30)):
        _slice(src / name, data / name, n)
    words = [line.split()[0] for line in (data / "eng.train").read_text().splitlines() if line]
    run = tiny_bert_run(tmp_path, [" ".join(words)])
    results = {}
    for crf in (False, True):
        out = tmp_path / f"ft-{crf}"
        res = finetune("conll2003", from_run=str(run), data_dir=str(data), train__max_steps=6, train__batch_size=16,
                       optim__lr=1e-3, task__max_seq_len=32, out=str(out), options=TaskOptions(crf=crf))
        results[crf] = res
        assert res["steps"] == 6 and res["examples"]["validation"] >= 40 and res["truncated"]["train"] == 0
        assert 0 <= res["dev"]["f1"] <= 1 and 0 < res["dev"]["accuracy"] <= 1 and np.isfinite(res["dev"]["loss"])
        meta = json.loads((out / "data" / "meta.json").read_text())
        assert meta["counts"]["train"]["sentences"] == 100 and meta["counts"]["validation"]["sentences"] == 40
        assert meta["tags"][0] == "O" and all(t == "O" or t[:2] in ("B-", "I-") for t in meta["tags"])
        # `word gold pred` for every word of the 30 test sentences, in file order
        rows = [r for r in (out / "test_predictions.txt").read_text().split("\n") if r]
        test_words = [line.split() for line in (data / "eng.testb").read_text().splitlines()
                      if line and not line.startswith("-DOCSTART-")]
        assert [r.split()[0] for r in rows] == [w[0] for w in test_words]
        assert all(len(r.split()) == 3 and r.split()[2] in meta["tags"] for r in rows)
        if crf:  # constrained Viterbi: never I-X after O or another type
            tags = [r.split()[2] if r else "O" for r in (out / "test_predictions.txt").read_text().split("\n")]
            assert all(not t.startswith("I-") or p[2:] == t[2:] for p, t in zip(["O"] + tags, tags))
        again = finetune("conll2003", from_run=str(out), data_dir=str(data), eval_only=True, out=str(tmp_path / f"eval-{crf}"))
        assert again["eval_only"] and again["dev"] == pytest.approx(res["dev"])
    # --eval-only with a dev file alone: the finetuned run's tag set needs no training file
    dev_only = finetune("conll2003", from_run=str(tmp_path / "ft-True"), eval_only=True, out=str(tmp_path / "e2"),
                        options=TaskOptions(dev=str(data / "eng.testa")))
    assert dev_only["dev"] == pytest.approx(results[True]["dev"])


def test_refusals(tmp_path):
    data = tmp_path / "conll"
    data.mkdir()
    synthetic_conll(data / "eng.train", 20, 0)
    (data / "eng.testa").write_text("Paris x x I-MISC\n")
    run = tiny_bert_run(tmp_path, ["john paris"])
    with pytest.raises(PlmError, match=r"eng.testa:1: tag 'I-MISC' \(B-MISC in IOB2\) is not among the tags of the training file"):
        finetune("conll2003", from_run=str(run), data_dir=str(data), out=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()
    (data / "eng.testa").write_text("Paris x x I-LOC\n")
    gpt = tiny_bert_run(tmp_path, ["john paris"], family="gpt")
    with pytest.raises(PlmError, match=r"is a causal LM \(gpt\); finetuning on conll2003 needs an encoder run"):
        finetune("conll2003", from_run=str(gpt), data_dir=str(data), out=str(tmp_path / "o"))
    with pytest.raises(PlmError, match="no cls / sep token"):
        Tagging(TaggingConfig(), object(), {"pad": 0}, 16)  # a tokenizer without [CLS] / [SEP]
    assert not (tmp_path / "o").exists()
