"""ERNIE 2.0's sentence reordering and sentence distance (objective ernie2, data/sentence_tasks.py, BERT's
sentence heads): permutation classes by hand, instances checked against their source positions, the loss
against a hand computation, and the recipe end to end (pretrain, finetune, export)."""

from plmcli.config import override_layers
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import assert_clean_error, dirs_under, finetune, run
from plmcli.data import sentence_tasks as st
from plmcli.models.bert import Bert, BertConfig
from plmcli.objectives.ernie2 import Ernie2, Ernie2Config

SPECIAL = {"pad": 0, "cls": 1, "sep": 2, "mask": 3, "unk": 4}
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=64",
        "tokenizer.vocab_size=3000", "tokenizer.min_frequency=1", "data.val_fraction=0.1", "train.seq_len=64",
        "train.global_batch_size=8", "train.eval_every=10", "train.eval_batches=2", "train.save_every=0",
        "train.log_every=5", "objective.dupe_factor=1"]


# ---------------------------------------------------------------- permutation classes


def test_permutation_classes_by_hand():
    assert st.permutations(1) == [(0,)]
    assert st.permutations(2) == [(0,), (0, 1), (1, 0)]
    assert st.permutations(3) == [(0,), (0, 1), (1, 0), (0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]
    assert [st.num_classes(m) for m in (1, 2, 3, 4, 5)] == [1, 3, 9, 33, 153]  # Σ n!
    assert st.permutation_class((0,)) == 0 and st.permutation_class((1, 0)) == 2
    assert st.permutation_class((1, 2, 0)) == 6 and st.permutation_class((2, 1, 0)) == 8
    assert st.permutation_class((0, 1, 2, 3)) == 9 and st.permutation_class((3, 2, 1, 0)) == 32
    for m in (3, 4):
        assert [st.permutation_class(p) for p in st.permutations(m)] == list(range(st.num_classes(m)))


# ---------------------------------------------------------------- instances


def toy_split(sentences_per_doc=(5, 1, 3, 8, 2), seed=0):
    """Documents of sentences 3..8 tokens long; token t of sentence s is 1000·s + t, so every token names
    its sentence; every other token starts a word."""
    rng = np.random.default_rng(seed)
    rows, s = [], 0
    for n in sentences_per_doc:
        ids, starts = [], []
        for _ in range(n):
            starts.append(len(ids))
            ids += [1000 * s + t for t in range(int(rng.integers(3, 9)))]
            s += 1
        rows.append((ids, starts, [i % 2 == 0 for i in range(len(ids))]))
    return st.flatten(rows)


CFG = dict(reorder_prob=0.5, reorder_segments=3, max_seq_len=24, short_seq_prob=0.1)


def where(split, start):
    """(document, sentence) of the token at `start`."""
    sent = int(np.searchsorted(split.sent, start, side="right")) - 1
    return int(np.searchsorted(split.doc, sent, side="right")) - 1, sent


def test_flatten_keeps_sentences_and_documents_and_drops_empty_ones():
    split = st.flatten([([5, 6, 7], [0, 2, 2], [1, 1, 1]), ([], [], []), ([8, 9], [0], [1, 0])])
    assert split.tokens.tolist() == [5, 6, 7, 8, 9] and split.ws.tolist() == [1, 1, 1, 1, 0]
    assert split.sent.tolist() == [0, 2, 3, 5] and split.doc.tolist() == [0, 2, 3] and split.n_docs == 2


def test_distance_labels_hold_by_construction():
    split = toy_split()
    labels = []
    for seed in range(20):
        for inst in st.instances(split, np.random.default_rng(seed), {**CFG, "reorder_prob": 0.0}):
            (a_s, a_e), (b_s, b_e) = inst.segments
            assert inst.reorder_label == -1 and 0 < a_e - a_s and 0 < b_e - b_s and a_e - a_s + b_e - b_s <= 21
            (da, sa), (db, sb) = where(split, a_s), where(split, b_s)
            assert a_s == split.sent[sa] and b_s == split.sent[sb]  # whole sentences from their start
            expect = 2 if da != db else 0 if sb == sa + 1 else 1
            assert inst.distance_label == expect and sb != sa and (da != db or sb != sa - 1)
            labels.append(expect)
    assert set(labels) == {0, 1, 2}
    # uniform over the classes each sentence allows (short documents allow fewer): the expected shares by hand
    expect = np.zeros(3)
    for d in range(split.n_docs):
        s0, s1 = split.doc[d], split.doc[d + 1]
        for i in range(s0, s1):
            allowed = [c for c, ok in enumerate((i + 1 < s1, i - s0 >= 2 or s1 - i >= 3, True)) if ok]
            expect[allowed] += 1 / len(allowed)
    assert np.abs(np.bincount(labels) / len(labels) - expect / expect.sum()).max() < 0.05


def test_reorder_segments_are_the_paragraph_shuffled_and_the_label_decodes_them():
    split = toy_split()
    perms = st.permutations(3)
    seen = set()
    for seed in range(20):
        for inst in st.instances(split, np.random.default_rng(seed), {**CFG, "reorder_prob": 1.0}):
            assert inst.distance_label == -1
            perm = perms[inst.reorder_label]
            assert len(perm) == len(inst.segments)
            original = [None] * len(perm)
            for shown, p in zip(inst.segments, perm):  # shown segment k is original segment perm[k]
                original[p] = shown
            assert all(a[1] == b[0] for a, b in zip(original, original[1:]))  # contiguous again, in order
            start, end = original[0][0], original[-1][1]
            d, s = where(split, start)
            assert start == split.sent[s] and where(split, end - 1)[0] == d  # a paragraph of one document
            assert 0 < end - start <= CFG["max_seq_len"] - 1 - 3
            assert all(e > b for b, e in inst.segments)
            seen.add(inst.reorder_label)
    assert seen == set(range(9))
    # one document's sentences are covered in order, each paragraph once, per pass
    insts = st.instances(split, np.random.default_rng(0), {**CFG, "reorder_prob": 1.0, "max_seq_len": 500})
    spans = sorted((min(s for s, _ in x.segments), max(e for _, e in x.segments)) for x in insts)
    assert spans == [(int(split.sent[split.doc[d]]), int(split.sent[split.doc[d + 1]])) for d in range(split.n_docs)]


def test_rows_show_the_segments_with_alternating_segment_ids_and_mask_like_bert():
    split = toy_split()
    insts = st.instances(split, np.random.default_rng(1), CFG)
    cfg = {**CFG, "masking": "wwm", "special_ids": SPECIAL, "vocab_size": 9000, "mask_prob": 0.15,
           "max_predictions": 3, "random_ids": np.arange(5, 9000)}
    tables = list(st.masked_tables(split, insts, np.random.default_rng(2), cfg))
    rows = [r for t in tables for r in t.to_pylist()]
    assert len(rows) == len(insts)
    for row, inst in zip(rows, insts):
        ids = np.array(row["input_ids"])
        assert len(row["masked_lm_positions"]) <= 3  # whole words within the budget (none when it is below a word)
        ids[row["masked_lm_positions"]] = row["masked_lm_labels"]
        want, types = [SPECIAL["cls"]], [0]
        for k, (s, e) in enumerate(inst.segments):
            want += split.tokens[s:e].tolist() + [SPECIAL["sep"]]
            types += [k % 2] * (e - s + 1)
        assert ids.tolist() == want and row["token_type_ids"] == types
        assert row["reorder_label"] == inst.reorder_label and row["distance_label"] == inst.distance_label
        assert not set(row["masked_lm_positions"]) & {0, *np.flatnonzero(ids == SPECIAL["sep"]).tolist()}
    assert sum(len(r["masked_lm_positions"]) for r in rows) > len(rows)


# ---------------------------------------------------------------- model and loss


def tiny_bert(**kw):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, max_positions=16, n_layer=1, n_head=2, d_model=16, d_ff=32, dropout=0.0,
                     attn_dropout=0.0, nsp_head=False, **kw)
    return Bert(cfg).eval()


def test_heads_are_optional_and_leave_bert_as_it_was():
    plain = tiny_bert()
    assert plain.pooler is None and not any(k.startswith(("reorder", "distance")) for k in plain.state_dict())
    out = plain(torch.ones(2, 5, dtype=torch.long))
    assert out.pooled is None and out.reorder_logits is None and out.distance_logits is None
    assert plain.hf_export_notes() == []
    heads = tiny_bert(reorder_classes=9, distance_classes=3)
    out = heads(torch.ones(2, 5, dtype=torch.long))
    assert out.reorder_logits.shape == (2, 9) and out.distance_logits.shape == (2, 3)
    hf, sd = heads.to_hf({})
    assert hf["architectures"] == ["BertForMaskedLM"] and not any("pooler" in k or "reorder" in k for k in sd)
    assert any("ERNIE 2.0" in n and "pooler" in n for n in heads.hf_export_notes())


def test_loss_is_mlm_plus_the_weighted_sentence_losses_by_hand():
    model = tiny_bert(reorder_classes=9, distance_classes=3)
    obj = Ernie2(Ernie2Config(reorder_weight=0.7, distance_weight=1.9), None, SPECIAL, 16)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(5, 50, (4, 8), generator=g), "mlm_positions": torch.tensor([1, 9, 20, 30]),
             "mlm_labels": torch.tensor([7, 8, 9, 10]), "reorder_labels": torch.tensor([4, -1, 0, -1]),
             "distance_labels": torch.tensor([-1, 2, -1, 1])}
    res = obj.step(model, batch)
    out = model(batch["input_ids"], mlm_positions=batch["mlm_positions"])

    def ce(logits, labels):  # mean of −log softmax at the labels, by hand
        logp = logits - logits.exp().sum(-1, keepdim=True).log()
        return -torch.stack([logp[i, y] for i, y in enumerate(labels)]).mean()

    mlm = ce(out.mlm_logits, [7, 8, 9, 10])
    reorder = ce(out.reorder_logits[[0, 2]], [4, 0])
    distance = ce(out.distance_logits[[1, 3]], [2, 1])
    torch.testing.assert_close(res.loss, mlm + 0.7 * reorder + 1.9 * distance)
    assert res.count == 4
    torch.testing.assert_close(res.metrics["reorder_loss"], 4 * reorder.detach())
    torch.testing.assert_close(res.metrics["distance_loss"], 4 * distance.detach())
    acc = (out.distance_logits[[1, 3]].argmax(-1) == torch.tensor([2, 1])).float().mean()
    torch.testing.assert_close(res.metrics["distance_acc"], 4 * acc)
    # a micro-batch without a task's rows: that loss is 0 and its head still in the graph (DDP)
    res = obj.step(model, {**batch, "reorder_labels": torch.full((4,), -1)})
    assert res.metrics["reorder_loss"] == 0
    res.loss.backward()
    assert model.reorder.weight.grad is not None and model.reorder.weight.grad.abs().sum() == 0


def test_configure_model_sets_the_heads_from_the_settings():
    cfg = BertConfig()
    Ernie2(Ernie2Config(reorder_segments=2), None, SPECIAL, 16).configure_model(cfg, 50)
    assert (cfg.vocab_size, cfg.reorder_classes, cfg.distance_classes) == (50, 3, 3)
    Ernie2(Ernie2Config(reorder_prob=1.0), None, SPECIAL, 16).configure_model(cfg, 50)
    assert (cfg.reorder_classes, cfg.distance_classes) == (9, 0)
    Ernie2(Ernie2Config(reorder_prob=0.0), None, SPECIAL, 16).configure_model(cfg, 50)
    assert (cfg.reorder_classes, cfg.distance_classes) == (0, 3)


# ---------------------------------------------------------------- the recipe end to end


@pytest.fixture(scope="module")
def ernie2_run(tmp_path_factory):
    """The recipe for 10 steps at a tiny size on the first 40 documents of its Chinese sample."""
    from plmcli import api

    root = tmp_path_factory.mktemp("ernie2")
    sample = Path(api.default_corpus("chinese-sample.txt")).read_text(encoding="utf-8").split("\n\n")[:40]
    (root / "zh.txt").write_text("\n\n".join(sample) + "\n", encoding="utf-8")
    with dirs_under(root):
        summary = api.pretrain("ernie2-chinese-mini", [str(root / "zh.txt")], str(root / "run"), overrides=override_layers(TINY, {"train.max_steps": 10}))
        yield root, summary


def test_recipe_pretrains_and_logs_both_tasks(ernie2_run):
    root, summary = ernie2_run
    assert summary["steps"] == 10 and np.isfinite(summary["val_mlm_loss"])
    logged = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in logged if "mlm_loss" in m]
    assert [m["step"] for m in train] == [5, 10]
    for m in train:
        for k in ("reorder_loss", "reorder_acc", "distance_loss", "distance_acc"):
            assert np.isfinite(m[k]), (k, m)
        assert 0 <= m["reorder_acc"] <= 1 and m["reorder_loss"] > 0
    val = [m for m in logged if "val_reorder_loss" in m][-1]
    assert np.isfinite(val["val_distance_loss"]) and np.isfinite(val["val_reorder_acc"])
    cfg = json.loads((root / "run" / "config.json").read_text())
    assert cfg["objective"] == "ernie2" and (cfg["model"]["reorder_classes"], cfg["model"]["distance_classes"]) == (9, 3)
    metas = [json.loads(p.read_text()) for p in (root / "cache" / "ernie2").glob("*/meta.json")]
    assert len(metas) == 1 and metas[0]["format"] == st.FORMAT and metas[0]["reorder_segments"] == 3
    counts = metas[0]["counts"]["train"]
    assert counts["reordering"] > 0 and counts["distance"] > 0


def test_finetune_and_export_from_the_run(ernie2_run, tmp_path):
    from plmcli import api

    root, _ = ernie2_run
    glue = Path(api.default_corpus("glue-sample"))
    with dirs_under(root):
        res = finetune("sst2", from_run=str(root / "run"), data_dir=str(glue), train__max_steps=2, train__batch_size=8,
                       task__max_seq_len=16, out=str(tmp_path / "ft"))
        assert res["steps"] == 2 and 0 <= res["dev"]["accuracy"] <= 1
        rep = api.export(str(root / "run"), "hf", str(tmp_path / "hf"))
    assert rep["architecture"] == "BertForMaskedLM" and any("ERNIE 2.0" in n for n in rep["notes"])


def test_the_cache_key_covers_the_sentence_task_settings(ernie2_run):
    from plmcli.data.corpus import default_cache_dir

    root, _ = ernie2_run
    corpus = json.loads((root / "run" / "config.json").read_text())["corpus"]
    with dirs_under(root):
        cache = default_cache_dir()
        base = Ernie2(Ernie2Config(dupe_factor=1), None, SPECIAL, 64).prepare(corpus, cache)
        again = Ernie2(Ernie2Config(dupe_factor=1), None, SPECIAL, 64).prepare(corpus, cache)
        other = Ernie2(Ernie2Config(dupe_factor=1, reorder_prob=0.3), None, SPECIAL, 64).prepare(corpus, cache)
        fewer = Ernie2(Ernie2Config(dupe_factor=1, reorder_segments=2), None, SPECIAL, 64).prepare(corpus, cache)
    assert base == again and len({base, other, fewer}) == 3


@pytest.mark.parametrize("setting, needles", [
    ("objective.pairs=nsp", ["no NSP", "pairs=none"]),
    ("objective.reorder_segments=6", ["reorder_segments"]),
    ("objective.dynamic=true", ["static instances"]),
    ("model.family=albert", ["family bert", "Albert"]),
    ("train.seq_len=5", ["train.seq_len 5"]),
])
def test_bad_settings_are_refused_in_one_line(setting, needles, tmp_path):
    (tmp_path / "zh.txt").write_text("一二三。\n四五六。\n\n七八九。\n十一二。\n", encoding="utf-8")
    res = run("pretrain", "--recipe", "ernie2-chinese-mini", "--data", tmp_path / "zh.txt", "--out", tmp_path / "r",
              *[x for s in TINY for x in ("--set", s)], "--set", setting)
    assert_clean_error(res, *needles)
    assert not (tmp_path / "r").exists()


def test_resume_is_bitwise(ernie2_run, tmp_path):
    """Stopped after 2 steps and resumed: the weights and the logged sentence-task metrics of an
    uninterrupted 4-step run (the instances are static, the batches a function of the step)."""
    from safetensors.torch import load_file

    from plmcli import api

    root, _ = ernie2_run
    over = [*TINY, "train.save_every=2", "train.log_every=1", "train.eval_every=0"]
    data = [str(root / "zh.txt")]
    with dirs_under(root):
        api.pretrain("ernie2-chinese-mini", data, str(tmp_path / "full"), overrides=override_layers(over, {"train.max_steps": 4}))
        api.pretrain("ernie2-chinese-mini", data, str(tmp_path / "half"), stop_after=2, overrides=override_layers(over, {"train.max_steps": 4}))
        api.pretrain(out=str(tmp_path / "half"), resume=True)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in ("full", "half"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in ("full", "half")]
    pick = lambda rs: [(r["step"], r["reorder_loss"], r["distance_acc"]) for r in rs if "reorder_loss" in r]  # noqa: E731
    assert len(pick(rows[0])) == 4 and pick(rows[0]) == pick(rows[1])


def test_a_corpus_without_validation_text_builds_and_streams(tmp_path):
    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.corpus import tokenize_corpus

    (tmp_path / "zh.txt").write_text("一二三。\n四五六。\n\n七八九。\n十一二。\n", encoding="utf-8")
    specials = {"cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "pad": "[PAD]", "unk": "[UNK]"}
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=100, min_frequency=1, special_tokens=specials)
    meta = tokenize_corpus([str(tmp_path / "zh.txt")], tmp_path / "tok", cfg, val_fraction=0.0)
    out = Ernie2(Ernie2Config(), None, meta["tokenizer"]["special_token_ids"], 16).prepare(tmp_path / "tok", tmp_path / "cache")
    built = json.loads((out / "meta.json").read_text())["counts"]
    assert built["validation"]["instances"] == 0 and built["train"]["instances"] > 0
    obj = Ernie2(Ernie2Config(), None, meta["tokenizer"]["special_token_ids"], 16)
    assert obj.stream(out, "validation", 4, 0, 0, 1, shuffle=False).batches_per_epoch() == 0
    batch = obj.stream(out, "train", 4, 0, 0, 1, shuffle=True)[0]
    assert batch["reorder_labels"].shape == batch["distance_labels"].shape == (4,)
    assert ((batch["reorder_labels"] >= 0) != (batch["distance_labels"] >= 0)).all()  # one task per row


def test_training_batches_mix_both_tasks(ernie2_run):
    """Not grouped by length (which would make each batch one task): most micro-batches carry both losses."""
    root, _ = ernie2_run
    (data,) = [d for d in (root / "cache" / "ernie2").glob("*/")
               if (lambda m: (m["reorder_prob"], m["reorder_segments"]) == (0.5, 3))(json.loads((d / "meta.json").read_text()))]
    s = Ernie2(Ernie2Config(dupe_factor=1), None, SPECIAL, 64).stream(data, "train", 16, 0, 0, 1, shuffle=True)
    both = [bool((b["reorder_labels"] >= 0).any() and (b["distance_labels"] >= 0).any()) for b in (s[k] for k in range(20))]
    assert sum(both) >= 18
