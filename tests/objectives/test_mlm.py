import importlib
from plmcli.config import override_layers
import importlib.util
import json
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli.config_schema import build_section
from plmcli.config_sections import TokenizerConfig
from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.gpt import GPT, GPTConfig
from plmcli.objectives.mlm import MaskedLM, MLMConfig

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


def _stand_in_mask_batch(input_ids, special, word_starts, rng, *, mask_prob, max_predictions, strategy, mask_id,
                         vocab_size, replace_probs=(0.8, 0.1, 0.1), random_ids=None):
    """Token masking as BERT does it, used only until plmcli.data.masking exists."""
    masked, target = input_ids.copy(), np.zeros(input_ids.shape, dtype=bool)
    for b in range(input_ids.shape[0]):
        cand = np.flatnonzero(~special[b])
        k = max(1, int(round(len(cand) * mask_prob)))
        k = min(k, max_predictions) if max_predictions else k
        pick = rng.permutation(cand)[:k]
        target[b, pick] = True
        u = rng.random(k)
        masked[b, pick[u < replace_probs[0]]] = mask_id
        rand = pick[(u >= replace_probs[0]) & (u < replace_probs[0] + replace_probs[1])]
        masked[b, rand] = rng.choice(random_ids if random_ids is not None else vocab_size, len(rand))
    return masked, target


@pytest.fixture
def masking(monkeypatch):
    """plmcli.data.masking, or a stand-in while the real module is not written yet."""
    try:
        return importlib.import_module("plmcli.data.masking")
    except ImportError:
        mod = types.ModuleType("plmcli.data.masking")
        mod.mask_batch = _stand_in_mask_batch
        monkeypatch.setitem(sys.modules, "plmcli.data.masking", mod)
        return mod


def _write_mlm_dir(path, rows, val_rows=None):
    """A hand-made make-mlm-data output directory."""
    from datasets import Dataset, DatasetDict

    cols = lambda rs: {k: [r[k] for r in rs] for k in rs[0]}  # noqa: E731
    DatasetDict(train=Dataset.from_dict(cols(rows)),
                validation=Dataset.from_dict(cols(val_rows or rows))).save_to_disk(str(path / "dataset"))
    (path / "meta.json").write_text(json.dumps({"format": "plm-mlm", "max_seq_len": 16,
                                                "counts": {"train": {"documents": len(rows)}, "validation": {"documents": 1}}}))
    return path


def _row(ids, types, positions, labels, nsp):
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids),
            "masked_lm_positions": positions, "masked_lm_labels": labels, "next_sentence_label": nsp}


ROWS = [  # [CLS]=2 [SEP]=3 [MASK]=4; labels are the tokens before masking
    _row([2, 10, 4, 12, 3, 20, 4, 3], [0, 0, 0, 0, 0, 1, 1, 1], [2, 6], [11, 21], 0),
    _row([2, 30, 31, 3, 40, 3], [0, 0, 0, 0, 1, 1], [1], [99], 1),  # position 1 replaced by a random token
    _row([2, 4, 51, 52, 53, 3, 60, 61, 4, 3], [0, 0, 0, 0, 0, 0, 1, 1, 1, 1], [1, 8, 7], [50, 62, 61], 0),
]


def test_static_collate_pads_and_flattens_positions(tmp_path):
    d = _write_mlm_dir(tmp_path, ROWS)
    obj = MaskedLM(MLMConfig(), None, SPECIAL, 16)
    assert obj.prepare(d) == d  # already make-mlm-data output
    b = obj.stream(d, "train", 3, 0, 0, 1, shuffle=False)[0]
    assert b["input_ids"].tolist() == [[2, 10, 4, 12, 3, 20, 4, 3, 0, 0],
                                       [2, 30, 31, 3, 40, 3, 0, 0, 0, 0],
                                       [2, 4, 51, 52, 53, 3, 60, 61, 4, 3]]
    assert b["attention_mask"].tolist() == [[1] * 8 + [0] * 2, [1] * 6 + [0] * 4, [1] * 10]
    assert b["token_type_ids"][0].tolist() == [0] * 5 + [1] * 3 + [0] * 2
    assert b["mlm_positions"].tolist() == [2, 6, 10 + 1, 20 + 1, 20 + 8, 20 + 7]
    assert b["mlm_labels"].tolist() == [11, 21, 99, 50, 62, 61]
    assert b["input_ids"].flatten()[b["mlm_positions"]].tolist() == [4, 4, 30, 4, 4, 61]
    assert b["nsp_labels"].tolist() == [0, 1, 0] and b["num_tokens"] == 24
    assert obj.tokens_in(b) == 24


def test_static_collate_omits_what_carries_nothing(tmp_path):
    rows = [_row([2, 5, 4, 3], [0] * 4, [2], [6], -1), _row([2, 4, 7, 3], [0] * 4, [1], [8], -1)]
    d = _write_mlm_dir(tmp_path, rows)
    b = MaskedLM(MLMConfig(pairs="none"), None, SPECIAL, 16).stream(d, "train", 2, 0, 0, 1, shuffle=False)[0]
    assert set(b) == {"input_ids", "mlm_positions", "mlm_labels", "num_tokens"}  # no padding, one segment, no NSP
    assert b["mlm_positions"].tolist() == [2, 4 + 1]


def _tokenized(tmp_path, n_docs=40):
    from plmcli.data.corpus import tokenize_corpus

    tmp_path.mkdir(parents=True, exist_ok=True)
    tok = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, lowercase=True,
                          special_tokens={"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"})
    meta = tokenize_corpus([str(tiny_corpus(tmp_path / "c.txt", n_docs))], tmp_path / "tok", tok, val_fraction=0.1)
    return tmp_path / "tok", meta


def test_dynamic_masking_is_a_function_of_seed_epoch_and_sample(tmp_path, masking):
    d, meta = _tokenized(tmp_path)
    ids = meta["tokenizer"]["special_token_ids"]
    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", max_predictions=0), None, ids, 16)
    assert obj.prepare(d) == d  # dynamic reads the tokenized corpus itself
    s = obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)
    a, again = s[3], obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)[3]
    for k in a:
        assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(again[k])), k  # a resumed run masks identically
    assert not torch.equal(s[0]["input_ids"], obj.stream(d, "train", 4, 8, 0, 1, shuffle=True)[0]["input_ids"])

    # Independent of how samples are batched: 2 ranks × 2 = 1 rank × 4 at the same global batch.
    r0, r1 = (obj.stream(d, "train", 2, 7, r, 2, shuffle=True)[3] for r in (0, 1))
    assert torch.equal(torch.cat([r0["input_ids"], r1["input_ids"]]), a["input_ids"])
    assert torch.equal(torch.cat([r0["mlm_labels"], r1["mlm_labels"]]), a["mlm_labels"])

    x = a["input_ids"]
    assert (x[:, 0] == ids["cls"]).all() and (x[:, -1] == ids["sep"]).all() and x.shape == (4, 16)
    # Every target's label is the original token; untargeted tokens are unchanged.
    first = obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)
    n_targets = n_tokens = 0
    for k in range(first.batches_per_epoch() * 2):
        b = first[k]
        pos = b["mlm_positions"]
        assert ((pos % 16 != 0) & (pos % 16 != 15)).all()  # [CLS] / [SEP] are never targets
        n_targets += len(pos)
        n_tokens += int((b["input_ids"] != ids["sep"]).sum() - b["input_ids"].shape[0])
    assert 0.12 < n_targets / n_tokens < 0.2


def test_dynamic_masks_differ_between_epochs(tmp_path, masking):
    d, meta = _tokenized(tmp_path)
    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", max_predictions=0), None, meta["tokenizer"]["special_token_ids"], 16)
    s = obj.stream(d, "validation", 2, 7, 0, 1, shuffle=False)
    # The validation pass reads the same windows in the same order and masks them the same way every time.
    assert torch.equal(s[0]["input_ids"], obj.stream(d, "validation", 2, 7, 0, 1, shuffle=False)[0]["input_ids"])
    tr = obj.stream(d, "train", 1, 7, 0, 1, shuffle=True)
    n = tr.order.n
    picks = {tr.order(p): tr[p]["mlm_positions"].tolist() for p in range(3 * n)}  # three epochs, batch size 1
    for i in range(n):
        masks = [picks[(e, i)] for e in range(3)]
        assert masks[0] != masks[1] or masks[1] != masks[2]  # fresh masks each epoch (and a fresh window offset)


def _tiny_bert(**kw):
    torch.manual_seed(0)
    return Bert(BertConfig(**(dict(vocab_size=100, max_positions=16, n_layer=1, n_head=2, d_model=16, dropout=0.0,
                                    attn_dropout=0.0) | kw))).eval()


def test_loss_equals_hand_computation(tmp_path):
    d = _write_mlm_dir(tmp_path, ROWS)
    obj = MaskedLM(MLMConfig(nsp_weight=0.5), None, SPECIAL, 16)
    b = obj.stream(d, "train", 3, 0, 0, 1, shuffle=False)[0]
    model = _tiny_bert()
    with torch.no_grad():
        out = obj.step(model, b)
        full = model(b["input_ids"], b["token_type_ids"], b["attention_mask"])  # (3, 10, V) at every position
    targets = [(0, 2, 11), (0, 6, 21), (1, 1, 99), (2, 1, 50), (2, 8, 62), (2, 7, 61)]  # (row, position, label)
    logp = full.mlm_logits.log_softmax(-1)
    mlm = -sum(logp[r, t, v] for r, t, v in targets) / len(targets)
    nsp_labels = torch.tensor([0, 1, 0])
    nsp = -full.nsp_logits.log_softmax(-1)[torch.arange(3), nsp_labels].mean()
    torch.testing.assert_close(out.loss, mlm + 0.5 * nsp)
    assert out.count.item() == 6
    torch.testing.assert_close(out.metrics["mlm_loss"], mlm * 6)
    torch.testing.assert_close(out.metrics["nsp_loss"], nsp * 6)
    torch.testing.assert_close(out.metrics["loss"], (mlm + 0.5 * nsp) * 6)
    acc = (full.nsp_logits.argmax(-1) == nsp_labels).float().mean()
    torch.testing.assert_close(out.metrics["nsp_acc"], acc * 6)


def test_loss_without_nsp_keeps_the_head_in_the_graph():
    obj = MaskedLM(MLMConfig(pairs="none"), None, SPECIAL, 16)
    model = _tiny_bert()
    b = {"input_ids": torch.tensor([[2, 4, 9, 3]]), "mlm_positions": torch.tensor([1]), "mlm_labels": torch.tensor([7])}
    out = obj.step(model, b)
    expect = F.cross_entropy(model(b["input_ids"]).mlm_logits[0, 1:2], b["mlm_labels"])
    torch.testing.assert_close(out.loss, expect)
    assert set(out.metrics) == {"loss", "mlm_loss"}
    out.loss.backward()
    assert model.nsp.weight.grad is not None and model.nsp.weight.grad.abs().sum() == 0
    none = obj.step(model, {**b, "mlm_positions": torch.tensor([], dtype=torch.long), "mlm_labels": torch.tensor([], dtype=torch.long)})
    assert none.count.item() == 0 and none.loss.item() == 0.0


def test_check_model_and_bad_config():
    obj = MaskedLM(MLMConfig(), None, {}, 16)
    obj.check_model(_tiny_bert())
    with pytest.raises(PlmError, match="not an encoder") as e:
        obj.check_model(GPT(GPTConfig(vocab_size=50, max_positions=16, n_layer=1, n_head=2, d_model=16)))
    assert "bert" in e.value.hint
    with pytest.raises(PlmError, match="exceeds"):
        MaskedLM(MLMConfig(), None, {}, 32).check_model(_tiny_bert())
    with pytest.raises(PlmError, match="pairs=none"):
        MaskedLM(MLMConfig(dynamic=True), None, {}, 16)
    with pytest.raises(PlmError, match="masking"):
        MaskedLM(MLMConfig(masking="words"), None, {}, 16)
    with pytest.raises(PlmError, match="packing doc_sentences packs single segments"):
        MaskedLM(MLMConfig(packing="doc_sentences"), None, {}, 16)  # pairs nsp
    with pytest.raises(PlmError, match="packing doc_sentences packs single segments"):  # by its older name
        build_section(MLMConfig, {"cross_documents": False}, "objective")
    from plmcli.objectives.ernie2 import Ernie2, Ernie2Config
    with pytest.raises(PlmError, match="not to ernie2"):  # packing (cross_documents false) is objective mlm's
        Ernie2(build_section(Ernie2Config, {"cross_documents": False}, "objective"), None, {}, 16)
    with pytest.raises(PlmError, match="objective.ngram_probs .* summing to 1"):
        MaskedLM(MLMConfig(masking="ngram", ngram_probs=[0.5, 0.2]), None, {}, 16)
    from plmcli.models.electra import Electra, ElectraConfig  # an encoder, but its forward is not BERT's
    with pytest.raises(PlmError, match="masked-LM head"):
        obj.check_model(Electra(ElectraConfig(vocab_size=50, n_layer=1, n_head=4, d_model=32, d_ff=64, embedding_size=16,
                                              max_positions=16)))
    cfg = BertConfig()
    MaskedLM(MLMConfig(), None, {}, 16).configure_model(cfg, 321)
    assert cfg.vocab_size == 321


def test_dynamic_needs_mask_and_rejects_premasked_data(tmp_path):
    d = _write_mlm_dir(tmp_path, ROWS)
    with pytest.raises(PlmError, match="pre-masked"):
        MaskedLM(MLMConfig(dynamic=True, pairs="none"), None, SPECIAL, 16).prepare(d)
    with pytest.raises(PlmError, match="up to 16 tokens"):
        MaskedLM(MLMConfig(), None, SPECIAL, 8).prepare(d)
    tok, meta = _tokenized(tmp_path / "t")
    with pytest.raises(PlmError, match="'mask' special token"):
        MaskedLM(MLMConfig(dynamic=True, pairs="none"), None, {"cls": 2, "sep": 3}, 16).stream(tok, "train", 2, 0, 0, 1, True)


def test_static_prepare_builds_into_a_settings_keyed_cache(tmp_path, monkeypatch):
    tok, meta = _tokenized(tmp_path)
    calls = []

    def fake_make_mlm_data(corpus_dir, out_dir, **kw):
        calls.append((corpus_dir, out_dir, kw))
        out_dir.mkdir(parents=True)
        _write_mlm_dir(out_dir, ROWS)

    mod = types.ModuleType("plmcli.data.mlm_data")
    mod.make_mlm_data = fake_make_mlm_data
    monkeypatch.setitem(sys.modules, "plmcli.data.mlm_data", mod)
    obj = MaskedLM(MLMConfig(max_predictions=20, masking="wwm"), None, meta["tokenizer"]["special_token_ids"], 16)
    out = obj.prepare(tok, tmp_path / "cache")
    assert out.parent == tmp_path / "cache" / "mlm"
    assert calls[0][2] == dict(max_seq_len=16, short_seq_prob=0.1, dupe_factor=5, mask_prob=0.15, max_predictions=20,
                               pairs="nsp", masking="wwm", mask_count="reference", num_proc=1)
    assert obj.prepare(tok, tmp_path / "cache") == out and len(calls) == 1  # cached
    other = MaskedLM(MLMConfig(max_predictions=80), None, meta["tokenizer"]["special_token_ids"], 16)
    assert other.prepare(tok, tmp_path / "cache") != out  # a phase with other settings gets its own data
    doc = MaskedLM(MLMConfig(pairs="none", packing="doc_sentences"), None, meta["tokenizer"]["special_token_ids"], 16)
    assert doc.prepare(tok, tmp_path / "cache") != out and calls[-1][2]["packing"] == "doc_sentences"
    full = MaskedLM(MLMConfig(pairs="none", packing="full_sentences"), None, meta["tokenizer"]["special_token_ids"], 16)
    full.prepare(tok, tmp_path / "cache")
    assert "packing" not in calls[-1][2]  # full_sentences, the default: its cache key as before packing had a name


def test_static_stream_groups_instances_of_different_lengths(tmp_path):
    """200 instances of 13 lengths, in bands of 4 (200 // 50): a batch of 2 holds neighbouring lengths."""
    lengths = [2 + (7 * i) % 13 for i in range(200)]
    rows = [dict(input_ids=[2] + [7] * n + [3], masked_lm_positions=[1], masked_lm_labels=[7], next_sentence_label=-1)
            for n in lengths]
    d = _write_mlm_dir(tmp_path, rows)
    obj = MaskedLM(MLMConfig(pairs="none"), None, SPECIAL, 16)
    stream = obj.stream(d, "train", 2, 0, 0, 1, True)
    real = [(stream[k]["input_ids"] != SPECIAL["pad"]).sum(1).tolist() for k in range(100)]
    assert sorted(n for pair in real for n in pair) == sorted(n + 2 for n in lengths)  # the epoch, once
    assert max(abs(a - b) for a, b in real) <= 1  # random pairs would differ by up to 12
    ordered = obj.stream(d, "train", 2, 0, 0, 1, False)  # evaluation: in order
    assert ordered[0]["input_ids"].shape[1] == 11  # rows 0 and 1 (2 and 9 tokens between [CLS] and [SEP]), in order


TINY_BERT = """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 16, max_positions: 32}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 32, global_batch_size: 4, max_steps: 4, eval_every: 2, eval_batches: 2, save_every: 0, log_every: 1}
"""


@pytest.mark.parametrize("dynamic", [False, True])
def test_pretrain_tiny_bert_end_to_end(tmp_path, dynamic):
    from plmcli import api

    if not dynamic and importlib.util.find_spec("plmcli.data.mlm_data") is None:
        pytest.xfail("plmcli.data.mlm_data (make-mlm-data) is not written yet")
    (tmp_path / "r.yaml").write_text(TINY_BERT + ("objective: {dynamic: true, pairs: none, max_predictions: 0}\n" if dynamic else ""))
    s = api.pretrain(str(tmp_path / "r.yaml"), [str(tiny_corpus(tmp_path / "c.txt", 40))], str(tmp_path / "run"))
    assert s["steps"] == 4 and np.isfinite(s["train_loss"]) and "val_mlm_loss" in s
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert len(train_rows) == 4 and all(np.isfinite(r["mlm_loss"]) for r in train_rows)
    assert dynamic or all("nsp_acc" in r for r in train_rows)
    assert [r["step"] for r in rows if "val_mlm_loss" in r] == [2, 4]


def test_dynamic_span_masking_follows_the_truncated_geometric(tmp_path, monkeypatch):
    """Dynamic masking passes span_p / span_max through: the spans it masks (re-drawn from the same random
    stream) have the truncated geometric length law, and they are exactly the targets."""
    import copy

    from plmcli.data import masking
    from plmcli.data.corpus import tokenize_corpus

    # Long documents: a separator ends a run of words, and a run's last span is cut to the words left.
    rng = np.random.default_rng(0)
    vocab = "the cat sat on a mat while dogs ran far away from home and back again".split()
    (tmp_path / "long.txt").write_text("\n\n".join(" ".join(rng.choice(vocab, 2000)) for _ in range(10)))
    tok = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=dict(SPECIAL_TOKENS))
    meta = tokenize_corpus([str(tmp_path / "long.txt")], tmp_path / "tok", tok, val_fraction=0.1)
    d, real, words = tmp_path / "tok", masking.mask_batch, []

    def spy(ids, special, ws, rng, **kw):
        assert (kw["strategy"], kw["span_p"], kw["span_max"]) == ("span", 0.3, 6)
        units = masking.select_units(special, ws, copy.deepcopy(rng), mask_prob=kw["mask_prob"], strategy="span",
                                     max_predictions=kw["max_predictions"], span_p=0.3, span_max=6, counted=kw["counted"])
        masked, target = real(ids, special, ws, rng, **kw)
        assert target.sum() == units.length.sum() and target[units.row, units.start].all()
        words.extend(units.words.tolist())
        return masked, target

    monkeypatch.setattr(masking, "mask_batch", spy)
    obj = MaskedLM(MLMConfig(dynamic=True, pairs="none", masking="span", span_p=0.3, span_max=6, max_predictions=0),
                   None, meta["tokenizer"]["special_token_ids"], 512)
    s = obj.stream(d, "train", 8, 3, 0, 1, shuffle=True)
    for k in range(8 * s.batches_per_epoch()):
        s[k]
    hist = np.bincount(words, minlength=7)[1:] / len(words)
    pmf = masking.span_pmf(0.3, 6)
    assert len(words) > 3000 and max(words) == 6
    # Only the span cut at each window's budget departs from the law (about 1 in 27 here).
    assert np.abs(hist - pmf).max() < 0.02
    assert abs(np.mean(words) - (np.arange(1, 7) * pmf).sum()) < 0.1


ERNIE_TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=32",
              "tokenizer.vocab_size=3000", "tokenizer.min_frequency=1", "data.val_fraction=0.1", "train.seq_len=32",
              "train.global_batch_size=4", "train.eval_every=0", "train.eval_batches=2", "train.save_every=0",
              "objective.dupe_factor=1"]


def test_ernie_three_stages_end_to_end(tmp_path, monkeypatch):
    """ernie-chinese-mini: basic -> phrase -> entity masking as phases, each on its own static data,
    on the recipe's Chinese default corpus (here cut to its first 40 documents); the phrase and entity
    units are found by jieba's tagger (data/knowledge.py), no lexicon."""
    from pathlib import Path

    from safetensors.torch import load_file

    from plmcli import api
    from plmcli.data.knowledge import units_key

    sample = (Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").split("\n\n"))[:40]
    (tmp_path / "zh.txt").write_text("\n\n".join(sample) + "\n", encoding="utf-8")
    asked = []
    from plmcli.pipelines import pretrain as pipeline

    monkeypatch.setattr(pipeline, "default_corpus", lambda name: asked.append(name) or str(tmp_path / "zh.txt"))
    s = api.pretrain("ernie-chinese-mini", None, str(tmp_path / "run"), overrides=override_layers(ERNIE_TINY, {"train.max_steps": 2}))
    assert asked == ["chinese-sample.txt"] and s["steps"] == 2 and np.isfinite(s["val_mlm_loss"])
    run = tmp_path / "run"
    for phase in ("basic", "phrase", "entity"):
        assert json.loads((run / "phases" / phase / "summary.json").read_text())["steps"] == 2
    final = load_file(str(run / "model.safetensors"))
    entity = load_file(str(run / "phases" / "entity" / "model.safetensors"))
    assert all(torch.equal(final[k], entity[k]) for k in final)
    metas = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "mlm").glob("*/meta.json")]
    built = sorted((m["masking"], m.get("units_key")) for m in metas)
    assert built == sorted([("token", None), ("knowledge", units_key("phrases")), ("knowledge", units_key("entities"))])


def test_flops_count_the_share_the_objective_predicts():
    # 40% of 16 tokens = 6.4 predictions, under max_predictions 20: the share is mask_prob
    m = _tiny_bert()
    MaskedLM(MLMConfig(mask_prob=0.4, max_predictions=20), None, {}, 16).check_model(m)
    assert m.mlm_fraction == 0.4
    # BERT's 15% of 16 capped at 2 predictions: 2/16 of the tokens reach the head
    MaskedLM(MLMConfig(mask_prob=0.15, max_predictions=2), None, {}, 16).check_model(m)
    assert m.mlm_fraction == 2 / 16
    head = m.cfg.d_model * m.cfg.d_model + m.cfg.d_model * m.cfg.vocab_size
    assert m.flops_per_token(16) - Bert(m.cfg).flops_per_token(16) == pytest.approx(6 * (2 / 16 - 0.15) * head)
