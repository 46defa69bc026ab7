"""`plm probe`: per-layer hidden states read by hooks, word vectors, the linear probe, the command end to end."""

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from families import tiny_model
from objectives.test_tagging import _slice, make_tokenizer, tiny_bert_run
from plmcli.analysis.hidden import families_with_layers, hidden_states
from plmcli.analysis.probe import encode_rows, load_data, probe, row_layout, word_vectors
from plmcli.cli import app
from plmcli.errors import PlmError
from plmcli.models.registry import model_class

pytestmark = pytest.mark.usefixtures("one_thread")

DEEP = ("model.n_layer=3", "model.vocab_size=60")  # over each family's tiny size
VARIANTS = {  # beside every family with layers: name -> (family, more overrides)
    "roberta": ("bert", ("model.type_vocab_size=1", "model.position_offset=2", "model.max_positions=34",
                         "model.nsp_head=false")),
    "albert-ffn-shared": ("albert", ("model.share=ffn",)),
    "gpt1": ("gpt", ("model.norm_position=post", "model.final_norm=false")),
}


def build(name):
    family, extra = VARIANTS.get(name, (name, ()))
    return tiny_model(family, (*DEEP, *extra))


@pytest.mark.parametrize("name", families_with_layers() + list(VARIANTS))
def test_hook_states_are_what_the_model_computes(name):
    model = build(name)
    x = torch.randint(5, 60, (2, 7))
    mask = torch.ones_like(x)
    mask[1, 5:] = 0  # right padding in the second row
    causal = not type(model).traits.bidirectional
    states = hidden_states(model, x, None if causal else mask)
    assert len(states) == model.cfg.n_layer + 1 and all(s.shape == (2, 7, model.cfg.d_model) for s in states)
    with torch.no_grad():
        if causal:
            final = model.hidden(x)
            last = model.ln_f(states[-1])  # the last block's output is the residual stream before GPT-2's final LN
        else:
            final, last = model.encode(x, None, mask)[0], states[-1]
    torch.testing.assert_close(last, final, atol=1e-5, rtol=1e-5)
    # Each layer really is a different state (no hook fired twice on the same tensor).
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(states, states[1:]))


def test_each_bert_layer_is_one_block_applied_to_the_previous():
    from plmcli.models.layers import padding_mask

    model = build("bert")
    x = torch.randint(5, 60, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    states = hidden_states(model, x, mask)
    with torch.no_grad():
        emb = model.ln_emb(model.wte(x) + model.wpe(torch.arange(6)) + model.wtt.weight[0])
        torch.testing.assert_close(states[0], emb, atol=1e-6, rtol=1e-6)
        for i, block in enumerate(model.blocks):
            torch.testing.assert_close(states[i + 1], block(states[i], causal=False, attn_mask=padding_mask(mask)))


def test_albert_shared_layer_yields_one_state_per_application():
    model = build("albert")
    assert len(model.attention) == len(model.ffn) == 1  # one set of weights, run n_layer times
    x = torch.randint(5, 60, (1, 5))
    states = hidden_states(model, x)
    with torch.no_grad():
        emb = model.emb_proj(model.ln_emb(model.wte(x) + model.wpe(torch.arange(5)) + model.wtt.weight[0]))
        torch.testing.assert_close(states[0], emb)
        for i in range(model.cfg.n_layer):
            torch.testing.assert_close(states[i + 1], model.ffn[0](model.attention[0](states[i], False, None)))


def test_families_with_layers():
    """Those declaring probe_layers, the shipped ones among them (a registered subclass inherits its parent's)."""
    assert {"albert", "bert", "electra", "gpt", "nezha", "spanbert", "xlnet"} <= set(families_with_layers())
    assert all(model_class(f).probe_layers is not None for f in families_with_layers())


# ------------------------------------------------------------------ word vectors


def test_word_vectors_are_first_sub_tokens_in_context_whatever_the_batch(tmp_path):
    run = tiny_bert_run(tmp_path, ["the smith met paris today in london and said"])
    from plmcli.api import load_run

    model, tok, cfg = load_run(str(run))
    ids = cfg["tokenizer"]["special_token_ids"]
    sentences = [["Smithsonian", "met", "Paris"], ["the", "Londoners", "said", "today", "in", "London"], ["in"]]
    prefix, suffix = row_layout(type(model), ids)
    assert (prefix, suffix) == ([ids["cls"]], [ids["sep"]])
    rows, firsts = encode_rows(tok, ids, sentences, prefix, suffix, 48)
    vecs = word_vectors(model, rows, firsts, ids["pad"], batch_size=2)
    assert len(vecs) == 2 and vecs[0].shape == (10, 32)
    k = 0
    for words in sentences:  # brute force: each sentence alone, unpadded, its words' first pieces located by hand
        pieces = [tok.encode(w.lower(), add_special_tokens=False).ids for w in words]
        row = [ids["cls"]] + [t for p in pieces for t in p] + [ids["sep"]]
        at = 1 + np.cumsum([0] + [len(p) for p in pieces[:-1]])
        states = hidden_states(model, torch.tensor([row]))
        for layer, h in enumerate(states):
            np.testing.assert_allclose(vecs[layer][k:k + len(words)], h[0, at].numpy(), atol=1e-5)
        k += len(words)
    assert len(tok.encode("smithsonian", add_special_tokens=False).ids) > 1  # really a first-of-several piece


def test_causal_vectors_see_left_context_only(tmp_path):
    run = tiny_bert_run(tmp_path, ["the smith met paris today in london and said"], family="gpt")
    from plmcli.api import load_run

    model, tok, cfg = load_run(str(run))
    ids = cfg["tokenizer"]["special_token_ids"]
    prefix, suffix = row_layout(type(model), ids)
    assert (prefix, suffix) == ([], [])  # this tokenizer has neither bos nor eos
    full = word_vectors(model, *encode_rows(tok, ids, [["smith", "met", "paris", "today"]], prefix, suffix, 48), 0)
    head = word_vectors(model, *encode_rows(tok, ids, [["smith", "met"]], prefix, suffix, 48), 0)
    for a, b in zip(full, head):
        np.testing.assert_allclose(a[:2], b, atol=1e-5)
        assert np.abs(a[1] - a[2]).max() > 1e-3


# ------------------------------------------------------------------ synthetic data: the tag is the word

WORD_TAGS = {"the": "DT", "a": "DT", "cat": "NN", "dog": "NN", "mat": "NN", "home": "NN", "sat": "VBD",
             "ran": "VBD", "on": "IN", "from": "IN", "far": "RB", "away": "RB"}


def word_tag_conll(path: Path, n: int, seed: int) -> Path:
    """Sentences of random words; POS = a function of the word; chunk IOB1 (I-NP etc.); NER: home is a place."""
    rng, words = random.Random(seed), list(WORD_TAGS)
    chunk = {"DT": "I-NP", "NN": "I-NP", "VBD": "I-VP", "IN": "I-PP", "RB": "I-ADVP"}
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        for w in rng.choices(words, weights=[7, 1, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1], k=rng.randint(3, 8)):
            lines.append(f"{w} {WORD_TAGS[w]} {chunk[WORD_TAGS[w]]} {'I-LOC' if w == 'home' else 'O'}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def conll_dir(root: Path) -> Path:
    root.mkdir()
    word_tag_conll(root / "eng.train", 150, 0)
    word_tag_conll(root / "eng.testa", 50, 1)
    return root


def column(path: Path, k: int) -> list[str]:
    return [line.split()[k] for line in path.read_text().splitlines() if line and not line.startswith("-DOCSTART-")]


@pytest.mark.parametrize("family", ["bert", "gpt", "xlnet"])
def test_layer_zero_reads_the_word_and_beats_the_majority(tmp_path, family):
    data = conll_dir(tmp_path / "conll")
    run = tiny_bert_run(tmp_path, [" ".join(WORD_TAGS)], family=family)
    res = probe(str(run), "pos", str(tmp_path / "out"), data_dir=str(data))
    train, dev = column(data / "eng.train", 1), column(data / "eng.testa", 1)
    top = Counter(train).most_common(1)[0][0]
    assert res["train"]["words"] == len(train) and res["dev"]["words"] == len(dev)
    assert res["train"]["sentences"] == 150 and res["dev"]["sentences"] == 50
    assert res["majority"]["tag"] == top == "DT"
    assert res["majority"]["accuracy"] == pytest.approx(dev.count(top) / len(dev)) and res["majority"]["accuracy"] < 0.5
    assert [r["layer"] for r in res["layers"]] == [0, 1]
    assert res["layers"][0]["accuracy"] >= 0.99 and res["layers"][0]["macro_f1"] >= 0.98
    assert res["tags"] == sorted(set(WORD_TAGS.values()))
    assert res["context"].startswith("left context only") is (family == "gpt")


def test_a_finetuned_run_is_probed_through_its_encoder(tmp_path):
    from helpers import finetune

    data = conll_dir(tmp_path / "conll")
    run = tiny_bert_run(tmp_path, [" ".join(WORD_TAGS)])
    finetune("conll2003", from_run=str(run), data_dir=str(data), train__max_steps=4, train__batch_size=16, optim__lr=1e-2, out=str(tmp_path / "ft"))
    pre = probe(str(run), "ner", str(tmp_path / "p1"), data_dir=str(data))
    ft = probe(str(tmp_path / "ft"), "ner", str(tmp_path / "p2"), data_dir=str(data))
    assert ft["family"] == "bert" and ft["tags"] == ["B-LOC", "I-LOC", "O"] and len(ft["layers"]) == 2
    assert ft["majority"] == pre["majority"]
    # The finetuned weights are the ones read (the backbone part of its model.safetensors): other vectors, other probes.
    assert ft["layers"] != pre["layers"]


def test_sampling_is_seeded_and_keeps_file_order(tmp_path):
    data = conll_dir(tmp_path / "conll")
    full = load_data("pos", str(data), max_sentences=None, max_dev_sentences=None)
    a = load_data("pos", str(data), max_sentences=40, max_dev_sentences=10, seed=3)
    b = load_data("pos", str(data), max_sentences=40, max_dev_sentences=10, seed=3)
    c = load_data("pos", str(data), max_sentences=40, max_dev_sentences=10, seed=4)
    assert len(a["train"]["sentences"]) == 40 and len(a["dev"]["sentences"]) == 10 and a["train"]["total"] == 150
    assert a == b and a["train"]["sentences"] != c["train"]["sentences"]
    rest = iter(full["train"]["sentences"])
    assert all(any(s == t for t in rest) for s in a["train"]["sentences"])  # a subsequence: file order kept


def test_progress_through_sentences_and_layers(tmp_path, monkeypatch):
    """On a terminal a bar over the vectors' rows and the layers' probes; in a log a line per stage (and at most
    every PROGRESS_LOG_S while one runs, here every time)."""
    import io

    from rich.console import Console

    import plmcli.analysis.probe as probe_module

    data = conll_dir(tmp_path / "conll")
    run = tiny_bert_run(tmp_path, [" ".join(WORD_TAGS)])
    tty = Console(file=io.StringIO(), force_terminal=True, width=120)
    probe(str(run), "pos", str(tmp_path / "a"), data_dir=str(data), batch_size=64, console=tty)
    shown = tty.file.getvalue()
    assert all(s in shown for s in ("train vectors", "dev vectors", "probing layers", "/150", "/50", "/2"))
    monkeypatch.setattr(probe_module, "PROGRESS_LOG_S", 0.0)
    log = Console(file=io.StringIO(), force_terminal=False, width=200)
    probe(str(run), "pos", str(tmp_path / "b"), data_dir=str(data), batch_size=64, console=log)
    lines = log.file.getvalue().splitlines()  # each line after a stage's first with its time, e.g. " (0.1s)"
    assert [line.split(" (")[0] for line in lines] == [
        "train vectors: 0/150", "train vectors: 64/150", "train vectors: 128/150", "train vectors: 150/150",
        "dev vectors: 0/50", "dev vectors: 50/50", "probing layers: 0/2", "probing layers: 1/2", "probing layers: 2/2"]


# ------------------------------------------------------------------ the command

runner = CliRunner()


def run_cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny BERT really pretrained (plm pretrain, 3 steps) on the tiny corpus, which holds the synthetic words."""
    from test_cli import BERT_TINY

    from helpers import tiny_corpus
    from plmcli.api import pretrain

    root = tmp_path_factory.mktemp("pretrained")
    recipe = root / "bert-tiny.yaml"
    recipe.write_text(BERT_TINY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        pretrain(str(recipe), [str(tiny_corpus(root / "c.txt", n_docs=40))], str(root / "bert"), overrides={"train.max_steps": 3})
    return root / "bert"


def test_cli_pos_and_chunk_end_to_end(pretrained, tmp_path):
    import matplotlib.image

    data = conll_dir(tmp_path / "conll")
    out = tmp_path / "probe"
    res = run_cli("probe", pretrained, "--task", "pos", "--data-dir", data, "--out", out)
    assert res.exit_code == 0, res.output
    assert "majority (DT)" in res.stdout and "0 (embeddings)" in res.stdout and "both sides" in res.stdout
    saved = json.loads((out / "probe.json").read_text())
    assert saved["task"] == "pos" and len(saved["layers"]) == 2  # BERT_TINY: 1 layer, + the embeddings
    rows = [line.split("\t") for line in (out / "probe.tsv").read_text().splitlines()]
    assert rows[0] == ["layer", "accuracy", "macro_f1"]
    assert [[int(r[0]), float(r[1]), float(r[2])] for r in rows[1:]] == \
        [[r["layer"], pytest.approx(r["accuracy"], abs=1e-6), pytest.approx(r["macro_f1"], abs=1e-6)] for r in saved["layers"]]
    image = matplotlib.image.imread(out / "probe_pos.png")
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert saved["files"]["png"] == str(out / "probe_pos.png")
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp files left

    res = run_cli("probe", pretrained, "--task", "chunk", "--train", data / "eng.train", "--dev", data / "eng.testa",
                  "--out", out, "--max-sentences", 100, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got == json.loads((out / "probe.json").read_text())
    assert got["train"]["sentences"] == 100 and got["train"]["of"] == 150 and got["dev"]["sentences"] == 50
    iob2 = {t for s in load_data("chunk", str(data), max_sentences=None)["train"]["sentences"] for t in s[1]}
    assert set(got["tags"]) == iob2 and "B-NP" in iob2 and "I-NP" in iob2  # IOB1 I-NP starts became B-NP
    assert (out / "probe_chunk.png").is_file()
    assert got["layers"][0]["accuracy"] > got["majority"]["accuracy"]


def test_cli_help_has_an_example():
    res = run_cli("probe", "--help")
    assert res.exit_code == 0 and "Example" in res.output


def assert_clean_error(res, *needles):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in res.output, err
    for n in needles:
        assert n in err, err


def test_bad_input(tmp_path, monkeypatch):
    from test_finetune import make_run

    from helpers import ToyEncoder, ToyEncoderConfig
    from plmcli.models import registry

    data = conll_dir(tmp_path / "conll")
    run = tiny_bert_run(tmp_path, [" ".join(WORD_TAGS)])
    out = tmp_path / "out"
    assert_clean_error(run_cli("probe", run, "--task", "pos", "--out", out), "needs its data", "--data-dir")
    assert_clean_error(run_cli("probe", run, "--task", "pos", "--data-dir", tmp_path / "nope", "--out", out), "not a directory")
    assert_clean_error(run_cli("probe", run, "--task", "srl", "--data-dir", data, "--out", out), "unknown probe task 'srl'",
                       "pos, chunk, ner")
    two = tmp_path / "two.txt"
    two.write_text("Paris I-LOC\nis O\n")
    assert_clean_error(run_cli("probe", run, "--task", "pos", "--train", two, "--dev", two, "--out", out),
                       "2 columns", "word POS chunk NER")
    one = tmp_path / "one.txt"
    one.write_text("Paris NNP I-NP I-LOC\n\ncats NNP I-NP O\n")
    assert_clean_error(run_cli("probe", run, "--task", "pos", "--train", one, "--dev", one, "--out", out),
                       "one pos tag only (NNP)")
    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    tok, meta = make_tokenizer(["the cat"])
    toy = make_run(tmp_path / "toy", "toyenc", ToyEncoder(ToyEncoderConfig(vocab_size=tok.get_vocab_size())), tok, meta)
    assert_clean_error(run_cli("probe", toy, "--task", "pos", "--data-dir", data, "--out", out),
                       "toyenc model", "albert, bert, electra, gpt, nezha, spanbert, xlnet")
    assert_clean_error(run_cli("probe", tmp_path / "conll", "--task", "pos", "--data-dir", data, "--out", out),
                       "not a plm run directory")
    assert not out.exists()  # nothing written on any of these
    with pytest.raises(PlmError, match="--max-sentences 0 must be ≥ 1"):
        load_data("pos", str(data), max_sentences=0)


# ------------------------------------------------------------------ real data


def test_real_conll2003_sample(tmp_path, shared_data):
    src, data = shared_data / "conll2003", tmp_path / "conll"
    data.mkdir()
    _slice(src / "eng.train", data / "eng.train", 300)
    _slice(src / "eng.testa", data / "eng.testa", 100)
    words = column(data / "eng.train", 0)
    run = tiny_bert_run(tmp_path, [" ".join(words)])
    res = probe(str(run), "pos", str(tmp_path / "pos"), data_dir=str(data))
    train, dev = column(data / "eng.train", 1), column(data / "eng.testa", 1)
    top = Counter(train).most_common(1)[0][0]
    assert res["train"]["sentences"] == 300 and res["train"]["words"] == len(train) and res["dev"]["words"] == len(dev)
    assert res["majority"]["tag"] == top and res["majority"]["accuracy"] == pytest.approx(dev.count(top) / len(dev))
    assert res["tags"] == sorted(set(train)) and res["dev_tags_unseen_in_train"] == sorted(set(dev) - set(train))
    # Word identity alone (random embeddings) tells much of a word's POS: far above the majority tag.
    assert res["layers"][0]["accuracy"] > res["majority"]["accuracy"] + 0.15
    ner = probe(str(run), "ner", str(tmp_path / "ner"), data_dir=str(data), max_sentences=200, max_dev_sentences=50)
    assert ner["majority"]["tag"] == "O" and ner["train"]["sentences"] == 200 and ner["dev"]["sentences"] == 50
    raw = set(column(data / "eng.train", 3))
    assert "B-PER" not in raw and "B-PER" in ner["tags"]  # IOB1 -> IOB2: every entity now starts with B-
    assert set(ner["tags"]) <= {"O"} | {f"{p}-{t}" for p in "BI" for t in ("PER", "ORG", "LOC", "MISC")}
