"""RoBERTa's FULL-SENTENCES / DOC-SENTENCES rows with dynamic masking (objective.packing), from a tokenized
corpus and from streamed text: rows against a hand-written greedy packing, masks per epoch, exact resume."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_clean_error, run
from plmcli import api
from plmcli.config import load_recipe
from plmcli.config_schema import build_section
from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.batching import TokenBudgetStream
from plmcli.data.corpus import token_stream, tokenize_corpus
from plmcli.data.packing import sentence_rows
from plmcli.errors import PlmError
from plmcli.objectives.mlm import MaskedLM, MLMConfig

pytestmark = pytest.mark.usefixtures("one_thread")
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
WORDS = "the cat sat on a mat while dogs ran far away from home and back again".split()


def corpus(path: Path, n_docs: int = 24, seed: int = 0) -> Path:
    """Documents of 1-5 sentences (lines) of 2-12 words, blank lines between them; one sentence of 45 words,
    longer than any row below, so it must be cut."""
    rng = random.Random(seed)
    docs = [["".join(rng.choice(WORDS) + " " for _ in range(rng.randint(2, 12))).strip()
             for _ in range(rng.randint(1, 5))] for _ in range(n_docs)]
    docs[3].insert(1, " ".join(WORDS[i % len(WORDS)] for i in range(45)))
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=SPECIALS)
    meta = tokenize_corpus([str(corpus(d / "c.txt"))], d / "tok", cfg, val_fraction=0.1)
    return d / "tok", meta["tokenizer"]["special_token_ids"]


def documents(corpus_dir: Path, split: str = "train"):
    from datasets import load_from_disk

    ds = load_from_disk(str(corpus_dir / "dataset" / split))
    return [(row["input_ids"], row["sentence_starts"]) for row in ds]


def reference_rows(docs, cap: int, cross: bool) -> list[tuple[int, int]]:
    """The packing by hand: sentences (cut into cap-token pieces) in order, each joining the open row if the
    row, from its start to this sentence's end in the token stream, stays within cap (and, without `cross`,
    within one document); else it starts the next row."""
    rows, cur, at = [], None, 0
    for d, (ids, starts) in enumerate(docs):
        bounds = list(starts) + [len(ids)]
        for a, b in zip(bounds, bounds[1:]):
            for p in range(a, b, cap):
                s, e = at + p, at + min(p + cap, b)
                if cur is not None and e - cur[0] <= cap and (cross or cur[2] == d):
                    cur[1] = e
                else:
                    if cur is not None:
                        rows.append((cur[0], cur[1] - cur[0]))
                    cur = [s, e, d]
        at += len(ids) + 1  # the separator after each document
    rows.append((cur[0], cur[1] - cur[0]))
    return rows


@pytest.mark.parametrize("cap", [6, 14, 30])
@pytest.mark.parametrize("cross", [True, False])
def test_rows_are_the_greedy_sentence_packing(tok, cap, cross):
    d, ids = tok
    docs = documents(d)
    rows = sentence_rows(d, "train", ids["sep"], cap, cross)
    assert [tuple(r) for r in rows.tolist()] == reference_rows(docs, cap, cross)
    stream = token_stream(d, "train", ids["sep"])
    sentence_at, doc_end = set(), set()
    at = 0
    for doc, starts in docs:
        sentence_at |= {at + s for s in starts}
        at += len(doc)
        doc_end.add(at)
        at += 1
    assert (rows[:, 1] <= cap).all() and (rows[:, 1] > 0).all()
    cuts = 0
    for s, n in rows.tolist():
        row = stream[s : s + n].tolist()
        if s not in sentence_at:  # only the rest of a sentence longer than the row
            cuts += 1
            assert stream[s - 1] != ids["sep"] and n <= cap
        assert row[0] != ids["sep"] and row[-1] != ids["sep"]
        if not cross:
            assert ids["sep"] not in row
    lens = [b - a for doc, starts in docs for a, b in zip(starts, [*starts[1:], len(doc)])]
    assert 45 in lens and cuts == sum((n - 1) // cap for n in lens if n)  # a sentence of n: ⌈n/cap⌉ rows
    crossing = sum(ids["sep"] in stream[s : s + n].tolist() for s, n in rows.tolist())
    assert (crossing > 0) == cross
    # Nothing dropped: the rows cover every token of the stream but the separators at row edges.
    covered = np.zeros(len(stream), dtype=bool)
    for s, n in rows.tolist():
        covered[s : s + n] = True
    assert (covered | (stream == ids["sep"])).all()


def _obj(ids, packing, T=16, **kw):
    return MaskedLM(MLMConfig(dynamic=True, pairs="none", packing=packing, max_predictions=0, **kw), None, ids, T)


def test_batches_decode_to_rows_and_mask_afresh_each_epoch(tok):
    d, ids = tok
    obj = _obj(ids, "full_sentences")
    rows = sentence_rows(d, "train", ids["sep"], 14, True)
    stream = token_stream(d, "train", ids["sep"])
    s = obj.stream(d, "train", 1, 7, 0, 1, shuffle=True)  # one row per batch: batch k is sample k
    per_epoch = s.batches_per_epoch()
    assert per_epoch == len(rows)
    seen = {}
    for k in range(2 * per_epoch):
        b = s[k]
        x, att = b["input_ids"], b.get("attention_mask", torch.ones_like(b["input_ids"]))
        orig = x.flatten().index_put((b["mlm_positions"],), b["mlm_labels"]).view_as(x)
        assert b["num_tokens"] == int(att.sum()) and ((x == ids["pad"]) == (att == 0)).all()
        for r in range(len(x)):
            n = int(att[r].sum())
            assert orig[r, 0] == ids["cls"] and orig[r, n - 1] == ids["sep"] and x.shape[1] <= 16
            body = tuple(orig[r, 1 : n - 1].tolist())
            which = [i for i, (a, m) in enumerate(rows.tolist()) if tuple(stream[a : a + m].tolist()) == body]
            assert which, body  # every row is one of the packed rows
            targets = tuple((b["mlm_positions"][b["mlm_positions"] // x.shape[1] == r] % x.shape[1]).tolist())
            assert all(0 < t < n - 1 for t in targets)  # never [CLS], [SEP] or padding
            seen.setdefault(body, []).append(targets)
    bodies = [tuple(stream[a : a + m].tolist()) for a, m in rows.tolist()]
    assert all(len(v) == 2 * bodies.count(k) for k, v in seen.items()) and len(seen) == len(set(bodies))
    assert sum(v[0] != v[1] for v in seen.values()) > 0.8 * len(seen)  # fresh masks in epoch 1
    again = obj.stream(d, "train", 1, 7, 0, 1, shuffle=True)[per_epoch + 1]
    assert all(torch.equal(again[k], s[per_epoch + 1][k]) for k in ("input_ids", "mlm_positions", "mlm_labels"))
    # a row's masks are a function of (seed, epoch, row), not of the batch it is read in
    four = obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)
    where = {s.order(k): k for k in range(2 * per_epoch)}
    for j, p in enumerate(four.positions(5)):
        alone = s[where[four.order(p)]]["input_ids"][0]
        row = four[5]["input_ids"][j]
        assert torch.equal(row[row != ids["pad"]], alone[alone != ids["pad"]])


def test_doc_sentences_raise_the_rows_per_batch_to_full_sentences_tokens(tok):
    d, ids = tok
    full = _obj(ids, "full_sentences", T=32).stream(d, "train", 4, 3, 0, 1, shuffle=True)
    doc = _obj(ids, "doc_sentences", T=32).stream(d, "train", 4, 3, 0, 1, shuffle=True)
    assert isinstance(doc, TokenBudgetStream)
    n = doc.batches_per_epoch()
    batches = [doc[k] for k in range(2 * n)]
    rows = [len(b["input_ids"]) for b in batches]
    tokens = [b["num_tokens"] for b in batches]
    full_tokens = [full[k]["num_tokens"] for k in range(full.batches_per_epoch() - 1)]  # the last may be short
    assert max(rows) > 4 and np.mean(rows) > 4  # more rows than the micro-batch of 4
    assert all(t <= 4 * 32 + 32 for t in tokens)
    assert abs(np.mean(tokens) - np.mean(full_tokens)) < 0.2 * np.mean(full_tokens)
    assert sum(tokens[:n]) == sum(tokens[n:]) == int(doc.lengths.sum())  # every row once per epoch
    assert [doc[k]["num_tokens"] for k in range(n)] == tokens[:n]  # a pure function of the position
    for b in batches:
        x = b["input_ids"]
        assert ((x == ids["sep"]).sum(1) == 1).all()  # one [SEP] per row: no document crossed


def test_budget_stream_batches_are_a_partition():
    lengths = np.random.default_rng(0).integers(3, 30, size=101)
    got = []
    s = TokenBudgetStream(lengths, 64, lambda e, i: (e, i), seed=5)
    assert s.nb == round(int(lengths.sum()) / 64)
    for k in range(3 * s.nb):
        e, idx = s[k]
        assert idx and set(e) == {k // s.nb}
        got.append(sorted(idx))
    for ep in range(3):
        assert sorted(i for b in got[ep * s.nb : (ep + 1) * s.nb] for i in b) == list(range(101))
    assert got[: s.nb] != got[s.nb : 2 * s.nb]  # composed afresh each epoch
    ev = TokenBudgetStream(lengths, 64, lambda e, i: i, shuffle=False, rank=1, world=2)
    assert ev[ev.batches_per_epoch()] is None
    assert TokenBudgetStream([5] * 3, 1000, lambda e, i: i).nb == 1
    assert TokenBudgetStream([40] * 3, 1, lambda e, i: i).nb == 3  # never more batches than rows


ZH_WORDS = ["中国", "人民", "我们", "喜欢", "学习", "语言", "模型", "今天", "天气"]  # jieba words
ZH_PHRASES = ["北京天安门", "深度学习模型", "上海外滩"]  # lexicon entries jieba cuts into words


@pytest.mark.parametrize("masking", ["chinese-wwm", "knowledge"])
def test_word_units_stay_whole_in_sentence_rows(tmp_path, masking):
    """Chinese words (jieba) and lexicon phrases (ERNIE) are masked whole in FULL-SENTENCES rows: the unit
    streams line up with the rows as with windows."""
    from plmcli.data.tokenizers import load_tokenizer

    rng = random.Random(0)
    pick = lambda: rng.choice(ZH_PHRASES) if rng.random() < 0.3 else rng.choice(ZH_WORDS)  # noqa: E731
    docs = ["\n".join("，".join(pick() for _ in range(rng.randint(2, 5))) + "。" for _ in range(4)) for _ in range(30)]
    (tmp_path / "zh.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    (tmp_path / "lex.txt").write_text("\n".join(ZH_PHRASES) + "\n", encoding="utf-8")
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, special_tokens=SPECIALS)
    meta = tokenize_corpus([str(tmp_path / "zh.txt")], tmp_path / "tok", cfg, val_fraction=0.0)
    ids = meta["tokenizer"]["special_token_ids"]
    lexicon = str(tmp_path / "lex.txt") if masking == "knowledge" else None
    obj = _obj(ids, "full_sentences", T=48, masking=masking, lexicon=lexicon)
    tok = load_tokenizer(tmp_path / "tok" / "tokenizer.json")
    bounds = {tok.token_to_id(t) for t in ("，", "。", "[CLS]", "[SEP]")}
    units = {tuple(tok.encode(w, add_special_tokens=False).ids) for w in (ZH_PHRASES if lexicon else ZH_WORDS)}
    s = obj.stream(tmp_path / "tok", "train", 4, 0, 0, 1, shuffle=True)
    whole = split = 0
    for k in range(s.batches_per_epoch()):
        b = s[k]
        x = b["input_ids"].flatten().index_put((b["mlm_positions"],), b["mlm_labels"]).view_as(b["input_ids"])
        t = torch.zeros(x.numel(), dtype=torch.bool).index_fill(0, b["mlm_positions"], True).view_as(x)
        for r in range(len(x)):
            at = [i for i, v in enumerate(x[r].tolist()) if v in bounds]
            for a, e in zip(at[:-1], at[1:]):
                if tuple(x[r, a + 1 : e].tolist()) in units:
                    whole += bool(t[r, a + 1 : e].all())
                    split += bool(t[r, a + 1 : e].any() and not t[r, a + 1 : e].all())
    assert whole > 5 and split == 0


TINY = """\
extends: roberta-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64, max_positions: 34, dropout: 0.0, attn_dropout: 0.0}
tokenizer: {vocab_size: 300, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 32, global_batch_size: 4, micro_batch_size: 2, max_steps: 6, eval_every: 6, eval_batches: 2, save_every: 3, log_every: 1}
"""


def _recording(monkeypatch):
    batches = []
    step = MaskedLM.step

    def recording(self, model, batch, state=None):
        if model.training:
            batches.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
        return step(self, model, batch, state)

    monkeypatch.setattr(MaskedLM, "step", recording)
    return batches


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("packing", ["full_sentences", "doc_sentences"])
def test_pretrain_resumes_bitwise(tmp_path, monkeypatch, packing, streaming):
    batches = _recording(monkeypatch)
    (tmp_path / "r.yaml").write_text(TINY)
    data = [str(corpus(tmp_path / "c.txt", 40))]
    over = [f"objective.packing={packing}"]
    kw = dict(overrides=over, streaming=streaming)
    api.pretrain(str(tmp_path / "r.yaml"), data, str(tmp_path / "full"), **kw)
    full = list(batches)
    batches.clear()
    api.pretrain(str(tmp_path / "r.yaml"), data, str(tmp_path / "half"), stop_after=3, **kw)
    api.pretrain(out=str(tmp_path / "half"), resume=True, streaming=streaming)
    assert len(full) == len(batches) == 12
    for a, b in zip(full, batches):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in ("full", "half"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    cfg = json.loads((tmp_path / "full" / "config.json").read_text())
    sep = json.loads((Path(cfg["corpus"]) / "meta.json").read_text())["tokenizer"]["special_token_ids"]["sep"]
    for b in full:
        x = b["input_ids"]
        att = b.get("attention_mask", torch.ones_like(x))
        seps = ((x == sep) & (att == 1)).sum(1)
        assert (seps >= 1).all() and (packing == "full_sentences" or (seps == 1).all())
    if packing == "doc_sentences":
        assert max(len(b["input_ids"]) for b in full) > 2  # rows raised above the micro-batch
    else:
        assert any(((b["input_ids"] == sep).sum(1) > 1).any() for b in full)  # rows cross documents


def test_streamed_rows_are_the_tokenized_packing(tmp_path):
    """One lane reads the whole text: its sentence rows are the rows packed from the same text tokenized."""
    from tokenizers import Tokenizer

    from plmcli.data.streaming import Lane, lane_pieces, prepare_stream_corpus

    files = [str(corpus(tmp_path / "c.txt"))]
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens=SPECIALS)
    d = prepare_stream_corpus(files, cfg, DataConfig(val_fraction=0.0), cache_root=tmp_path / "cache")
    ref = tmp_path / "tok"
    tokenize_corpus(files, ref, TokenizerConfig(path=str(d / "tokenizer.json"), special_tokens=SPECIALS), val_fraction=0.0)
    sep = json.loads((d / "meta.json").read_text())["tokenizer"]["special_token_ids"]["sep"]
    stream = token_stream(ref, "train", sep)
    s = json.loads((d / "meta.json").read_text())["streaming"]
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    for cross in (True, False):
        want = [stream[a : a + n].tolist() for a, n in sentence_rows(ref, "train", sep, 14, cross).tolist()]
        lane = Lane(lane_pieces(s["files"], s["sizes"], s["train_end"], 1)[0], tok, sep, None, "lane 0")
        got = []
        while len(got) < len(want):
            got += lane.rows(14, cross, budget=0 if cross else 16 * 3)
        assert got[: len(want)] == want
        if len(got) == len(want):  # the lane starts over: the next epoch's first row
            assert lane.rows(14, cross)[0] == want[0] and lane.position()[0] == 1


def test_bad_combinations_refused_in_one_line(tok, tmp_path):
    data = str(corpus(tmp_path / "c.txt"))
    for over, *needles in [
        (["objective.pairs=nsp", "objective.dynamic=false"],
         "objective.packing full_sentences packs single segments, and objective.pairs is nsp"),
        (["objective.dynamic=false", "objective.cross_documents=false"],
         "objective.cross_documents false (the older name of objective.packing doc_sentences) contradicts "
         "objective.packing full_sentences", "drop objective.cross_documents"),
        (["objective.cross_documents=maybe"], "objective.cross_documents 'maybe' is not false or true"),
        (["objective.packing=sentences"], "objective.packing 'sentences' is not one of window, full_sentences"),
    ]:
        args = [a for o in over for a in ("--set", o)]
        assert_clean_error(run("pretrain", "--recipe", "roberta-mini", "--data", data, "--out", tmp_path / "x", *args),
                           *needles)
    with pytest.raises(PlmError, match="contradicts objective.packing full_sentences"):
        build_section(MLMConfig, {"pairs": "none", "packing": "full_sentences", "cross_documents": False}, "objective")
    with pytest.raises(PlmError, match="no room for a sentence"):
        _obj(tok[1], "full_sentences", T=2).stream(tok[0], "train", 2, 0, 0, 1, True)


def test_cross_documents_false_still_loads_as_doc_sentences():
    """The older key objective.cross_documents: false is packing doc_sentences (dynamic too), true leaves packing
    as set; a saved config.json, which writes packing window beside it, loads as doc_sentences."""
    for over, packing in [(["objective.packing=doc_sentences", "objective.cross_documents=false"], "doc_sentences"),
                          (["objective.packing=window", "objective.cross_documents=false"], "doc_sentences"),
                          (["objective.cross_documents=true"], "full_sentences"),  # roberta-mini's
                          (["objective.packing=window", "objective.cross_documents=true"], "window")]:
        cfg = load_recipe("roberta-mini", over).objective
        assert cfg.packing == packing and cfg.dynamic and "cross_documents" not in vars(cfg)
    assert build_section(MLMConfig, {"pairs": "none", "packing": "window", "cross_documents": False},
                         "objective").packing == "doc_sentences"
    assert build_section(MLMConfig, {"pairs": "none", "cross_documents": False}, "objective").packing == "doc_sentences"


def test_static_doc_sentences_is_packing_too(tok, tmp_path, monkeypatch):
    """make-mlm-data's DOC-SENTENCES is chosen by either name (objective.packing doc_sentences, or the older
    objective.cross_documents false): the same settings, so the same cached instances."""
    d, ids = tok
    calls = []
    import plmcli.data.mlm_data as mlm_data

    monkeypatch.setattr(mlm_data, "make_mlm_data", lambda c, out, **kw: calls.append(kw) or out.mkdir(parents=True, exist_ok=True))
    a = MaskedLM(MLMConfig(pairs="none", packing="doc_sentences"), None, ids, 16).prepare(d, tmp_path / "c")
    old = build_section(MLMConfig, {"pairs": "none", "cross_documents": False}, "objective")
    b = MaskedLM(old, None, ids, 16).prepare(d, tmp_path / "c")
    assert a == b and calls[0] == calls[1] and calls[0]["packing"] == "doc_sentences"


def test_roberta_mini_pretrains_on_the_shipped_sample(tmp_path):
    res = run("pretrain", "--recipe", "roberta-mini", "--max-steps", "2", "--out", tmp_path / "m",
              "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4", "--set", "train.seq_len=64",
              "--set", "train.eval_every=2", "--set", "train.eval_batches=1")
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in rows) and all(np.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_rows_are_computed_once_and_cached_next_to_the_tokens(tok, monkeypatch):
    from plmcli.data import packing

    d, ids = tok
    rows = sentence_rows(d, "train", ids["sep"], 22, True)
    assert (d / f"train.{ids['sep']}.full-22.rows.npy").is_file()
    monkeypatch.setattr(packing, "_pack", lambda *a: pytest.fail("packed again"))
    assert np.array_equal(sentence_rows(d, "train", ids["sep"], 22, True), rows)
    assert not list(d.glob("*.tmp*")) and not list(d.glob(".*rows*"))  # written to a temp path and renamed
