"""`plm attention`: the recorded maps against a hand computation from the weights, the patterns against
loops, a head built to look one token back, and the command on tiny BERT and GPT runs."""

from plmcli.config import override_layers
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from families import tiny_model, tiny_overrides
from helpers import tiny_corpus, tiny_recipe
from plmcli.analysis.attention import PATTERNS, PatternSums, attention, attention_families
from plmcli.api import pretrain
from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.layers import MultiHeadAttention, record_attention
from plmcli.models.nezha import Nezha, RelativeAttention
from test_cli import assert_clean_error, run

pytestmark = pytest.mark.usefixtures("one_thread")

V = 40
SMALL = (f"model.vocab_size={V}", "model.d_model=16", "model.d_ff=32")  # over each family's tiny size
MORE = {  # name -> (family, overrides beside SMALL): a variant, or a family's shape that a check needs
    "roberta": ("bert", ("model.type_vocab_size=1", "model.position_offset=2", "model.nsp_head=false")),
    "albert": ("albert", ("model.n_layer=3",)),  # one shared layer, recorded once per use
    "electra": ("electra", ("model.generator_size=0.5",)),
}
NAMES = sorted({*attention_families(), *MORE})


def _model(name, seed=0, scale=20.0):
    """A tiny model with its weight matrices scaled up, so attention is far from uniform."""
    family, extra = MORE.get(name, (name, ()))
    m = tiny_model(family, (*SMALL, *extra), seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale if p.dim() == 2 else 1.0)
    return m


def _batch(T=9, lengths=(9, 6, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = (torch.arange(T)[None, :] >= 4).long() * mask
    return ids * mask, types, mask


def _run(model, ids, types, mask):
    if model.traits.causal:
        return model(ids)
    return model.encode(ids, types if model.cfg.type_vocab_size >= 2 else None, mask)[0]


# ---------------------------------------------------------------- the recording hook


def _hand(attn, args, causal, key_mask):
    """softmax(q·kᵀ/√d (+ NEZHA's q·a_ij), masked) from the layer's qkv weights, in float64."""
    x = args[0].double()
    B, T, C = x.shape
    H = attn.n_head
    D = C // H
    qkv = x @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, D).transpose(1, 2) for i in range(2))
    s = torch.einsum("bhid,bhjd->bhij", q, k)
    if isinstance(attn, RelativeAttention):
        table, index = args[1].double(), args[2]
        s = s + torch.einsum("bhid,ijd->bhij", q, table[index])  # a_ij looked up as a (T, T, D) tensor
    allowed = key_mask.bool()[:, None, None, :].expand(B, H, T, T)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax((s / math.sqrt(D)).masked_fill(~allowed, float("-inf")), -1)


@pytest.mark.parametrize("name", ["bert", "albert", "nezha", "gpt"])
def test_recorded_maps_equal_a_hand_computation(name):
    model = _model(name)
    causal = model.traits.causal
    ids, types, mask = _batch(lengths=(9, 9, 9) if causal else (9, 6, 3))
    inputs = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args)))
             for m in model.modules() if isinstance(m, MultiHeadAttention)]
    with torch.no_grad(), record_attention() as maps:
        _run(model, ids, types, mask)
    for h in hooks:
        h.remove()
    assert len(maps) == len(inputs) == model.cfg.n_layer  # ALBERT: its one shared layer, once per use
    for p, (attn, args) in zip(maps, inputs):
        assert p.shape == (3, 2, 9, 9)
        torch.testing.assert_close(p.double(), _hand(attn, args, causal, mask), atol=1e-6, rtol=0)
        torch.testing.assert_close(p.sum(-1), torch.ones(3, 2, 9))  # every row over its real keys
        assert (p * (1 - mask)[:, None, None, :]).abs().max() == 0  # nothing on padding
    assert p.max() > 0.5  # scaled weights: peaked heads, not a uniform average


@pytest.mark.parametrize("name", NAMES)
def test_recording_leaves_the_outputs_unchanged(name, monkeypatch):
    ids, types, mask = _batch(lengths=(9, 9, 9) if name == "gpt" else (9, 6, 3))
    # float64 with peaked heads: the explicit path is SDPA's formula; float32 at the init: as close as 1e-6
    sharp = _model(name).double()
    with torch.no_grad(), record_attention():
        recorded = _run(sharp, ids, types, mask)
    torch.testing.assert_close(recorded, _run(sharp, ids, types, mask), atol=1e-10, rtol=0)
    model = _model(name, scale=1.0)
    with torch.no_grad():
        plain = _run(model, ids, types, mask)
        with record_attention() as maps:
            recorded = _run(model, ids, types, mask)
    torch.testing.assert_close(recorded, plain, atol=1e-6, rtol=1e-6)
    assert len(maps) == model.cfg.n_layer  # ELECTRA's encode: the discriminator alone
    # Outside the context nothing is kept and SDPA runs, not the explicit path (NEZHA's attention is its own).
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    with torch.no_grad():
        assert torch.equal(_run(model, ids, types, mask), plain)
    assert len(maps) == model.cfg.n_layer and len(calls) == (0 if isinstance(model, Nezha) else model.cfg.n_layer)


# ---------------------------------------------------------------- the patterns


def _brute(maps, real, cls_keys, sep_keys, causal, ids=None, special=None, segments=None, punct_keys=None):
    """Each pattern by loops over layer, head, example and position."""
    L, (B, H, T, _) = len(maps), maps[0].shape
    rows = []
    for layer in range(L):
        for h in range(H):
            acc = {p: [] for p in PATTERNS}
            uniform = []
            for b in range(B):
                n = int(real[b].sum())
                for i in range(n):
                    a = maps[layer][b, h, i].double()
                    acc["entropy"].append(-sum(float(x * math.log(x)) for x in a if x > 0))
                    uniform.append(math.log(i + 1 if causal else n))
                    acc["self"].append(float(a[i]))
                    if i > 0:
                        acc["previous"].append(float(a[i - 1]))
                    if i + 1 < n and not causal:
                        acc["next"].append(float(a[i + 1]))
                    acc["cls"].append(float(sum(a[j] for j in range(T) if cls_keys[b, j])))
                    if sep_keys is not None:
                        acc["sep"].append(float(sum(a[j] for j in range(T) if sep_keys[b, j])))
                    if punct_keys is not None:
                        acc["punct"].append(float(sum(a[j] for j in range(T) if punct_keys[b, j])))
                    if ids is None or special[b, i]:
                        continue
                    twins = [j for j in range(i if causal else n) if j != i and ids[b, j] == ids[b, i] and not special[b, j]]
                    if twins:
                        acc["same_token"].append(float(sum(a[j] for j in twins)))
                    other = [j for j in twins if segments is not None and segments[b, j] != segments[b, i]]
                    if other:
                        acc["same_token_other"].append(float(sum(a[j] for j in other)))
            row = {p: sum(v) / len(v) if v else None for p, v in acc.items()}
            row["breadth"] = row["entropy"] / (sum(uniform) / len(uniform)) if sum(uniform) else None
            rows.append({"layer": layer + 1, "head": h + 1, **row})
    return rows


def _random_maps(causal, B=3, H=2, T=7, lengths=(7, 5, 2), seed=0):
    """Two layers of peaked random attention over a right-padded batch, and ids from a 5-token vocabulary
    (so tokens recur) with [CLS] = 2 first and [SEP] = 3 inside rows 0 and 1."""
    g = torch.Generator().manual_seed(seed)
    real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    allowed = real[:, None, None, :] & (torch.ones(T, T, dtype=torch.bool).tril() if causal else True)
    maps = [torch.softmax((torch.randn(B, H, T, T, generator=g) * 3).masked_fill(~allowed, float("-inf")), -1)
            for _ in range(2)]
    ids = torch.randint(4, 9, (B, T), generator=g)
    ids[:, 0], ids[0, 3], ids[1, 4] = 2, 3, 3
    return maps, real, ids


@pytest.mark.parametrize("causal", [False, True])
def test_patterns_equal_loops_over_a_padded_batch(causal):
    maps, real, ids = _random_maps(causal)
    T = real.shape[1]
    cls_keys, sep_keys = (ids == 2) & real, None if causal else (ids == 3) & real
    extra = {"ids": ids, "special": (ids == 2) | (ids == 3), "punct_keys": (ids == 5) & real,
             "segments": None if causal else (torch.arange(T)[None, :] >= torch.tensor([[4], [5], [2]])).long()}
    for kw in ({}, extra):  # without ids and punctuation keys those patterns are n/a
        sums = PatternSums()
        sums.add(maps, real, cls_keys, sep_keys, causal, **kw)
        rows = sums.rows()
        expect = _brute(maps, real, cls_keys, sep_keys, causal, **kw)
        for r, e in zip(rows, expect):
            for p in PATTERNS:
                assert (r[p] is None) == (e[p] is None), p
                if e[p] is not None:
                    assert r[p] == pytest.approx(e[p], abs=1e-6), (r, e)
        assert (rows[0]["next"] is None) == causal and (rows[0]["sep"] is None) == causal
        assert (rows[0]["same_token"] is None) == (not kw) and (rows[0]["same_token_other"] is None) == (causal or not kw)
    halves = PatternSums()  # the same rows in two batches, each padded to its own length: token-weighted sums
    for sl in (slice(0, 1), slice(1, 3)):
        t = int(real[sl].sum(1).max())
        halves.add([m[sl, :, :t, :t] for m in maps], real[sl, :t], cls_keys[sl, :t],
                   None if sep_keys is None else sep_keys[sl, :t], causal,
                   **{k: None if v is None else v[sl, :t] for k, v in extra.items()})
    for r, e in zip(halves.rows(), rows):
        assert all(r[p] == pytest.approx(e[p], abs=1e-9) for p in PATTERNS if e[p] is not None)


def test_a_head_built_to_look_one_token_back():
    """Head 1 reads the one-hot position t from the embeddings; its query at i matches key i − 1 only."""
    torch.manual_seed(0)
    model = Bert(BertConfig(vocab_size=V, max_positions=16, n_layer=1, n_head=2, d_model=32, d_ff=32,
                            dropout=0.0, attn_dropout=0.0)).eval()
    D = 16
    with torch.no_grad():
        model.wte.weight.zero_()
        model.wtt.weight.zero_()
        model.wpe.weight.copy_(torch.eye(16, 32))  # position t -> e_t (LayerNorm keeps it a scaled one-hot)
        w = model.blocks[0].attn.qkv.weight
        w[:D].zero_()
        w[32:32 + D].zero_()
        w[torch.arange(D - 1), torch.arange(1, D)] = 2.0  # q_i = 2·e_{i−1}
        w[32 + torch.arange(D), torch.arange(D)] = 1.0  # k_j = e_j
        model.blocks[0].attn.qkv.bias.zero_()
    ids, types, mask = _batch(T=12, lengths=(12, 8, 5))
    with torch.no_grad(), record_attention() as maps:
        model.encode(ids, types, mask)
    sums = PatternSums()
    real = mask.bool()
    sums.add(maps, real, (ids == 2) & real, (ids == 3) & real, causal=False)
    head1, head2 = sums.rows()
    assert head1["previous"] > 0.999  # query 0 has none to look at: it spreads evenly, as self and next show
    assert head1["self"] < 0.05 and head1["next"] < 0.05
    assert head2["previous"] < 0.5


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny BERT (wordpiece, [CLS]/[SEP]) and a tiny GPT (characters, <eos>) run, trained 2 steps."""
    root = tmp_path_factory.mktemp("attention-runs")
    corpus = tiny_corpus(root / "c.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        pretrain("bert-mini", [str(corpus)], str(root / "bert"),
                 overrides=override_layers(tiny_overrides("bert") + ["model.vocab_size=0", "tokenizer.min_frequency=1", "train.seq_len=16",
                                           "train.global_batch_size=4", "objective.dupe_factor=1", "train.eval_every=0"], {"train.max_steps": 2}))
        pretrain(str(tiny_recipe(root / "tiny.yaml")), [str(corpus)], str(root / "gpt"), overrides={"train.max_steps": 2})
    return {"bert": root / "bert", "gpt": root / "gpt"}


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_command_writes_heatmaps_and_tables(runs, family, tmp_path):
    out = tmp_path / "att"
    pair = ["--text-pair", "the dogs ran far"] if family == "bert" else []  # "the" in both: same_token_other
    res = run("attention", runs[family], "the cat sat on a mat", *pair, "--out", out, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    saved = json.loads((out / "attention.json").read_text())
    assert got == {**saved, "out_dir": str(out)}
    assert got["figures"] == ["layer_1.png", "layer_2.png", "patterns.png"]
    assert all((h["same_token_other"] is None) == (family == "gpt") for h in got["heads"])  # "the" in both texts
    assert sorted(p.name for p in out.iterdir()) == sorted(["attention.json", "attention.tsv", *got["figures"]])
    for png in got["figures"]:
        w, h = _png_size(out / png)
        assert w > 300 and h > 200
    assert got["n_layer"] == 2 and got["n_head"] == 2 and len(got["heads"]) == 4
    tsv = [line.split("\t") for line in (out / "attention.tsv").read_text().splitlines()]
    assert tsv[0] == ["layer", "head", *PATTERNS]
    for row, head in zip(tsv[1:], got["heads"]):
        for p, cell in zip(PATTERNS, row[2:]):
            assert cell == "n/a" if head[p] is None else float(cell) == pytest.approx(head[p], abs=1e-6)
    T = len(got["tokens"])
    for head in got["heads"]:
        assert 0 < head["entropy"] <= math.log(T) + 1e-9
        assert all(0 <= head[p] <= 1 for p in PATTERNS[1:] if head[p] is not None)
    if family == "bert":
        assert got["tokens"][0] == "[CLS]" and got["tokens"].count("[SEP]") == 2 and got["tokens"][-1] == "[SEP]"
        assert got["targets"] == {"cls": "[CLS]", "sep": "[SEP]"} and got["heads"][0]["next"] is not None
    else:
        assert got["tokens"][:3] == ["t", "h", "e"] and got["targets"] == {"cls": "first token", "sep": "<eos>"}
        assert all(h["next"] is None and h["sep"] == 0 for h in got["heads"])  # the plain text has no <eos>
    res = run("attention", runs[family], "the cat sat on a mat", *pair, "--out", out)  # an earlier output is replaced
    assert res.exit_code == 0, res.output
    assert "entropy: broadest layer" in res.stdout and "previous token: layer" in res.stdout
    assert ("[SEP]: layer" in res.stdout and "→ [CLS]" in res.stdout) if family == "bert" \
        else ("next token: n/a" in res.stdout and "first token: layer" in res.stdout)


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_corpus_statistics_are_token_weighted_means_of_its_lines(runs, family, tmp_path):
    lines = [("the cat sat", "the dogs ran"), ("away", None), ("a mat while dogs ran on a mat", None)]
    if family == "gpt":
        lines = [(a, None) for a, _ in lines]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(a if b is None else f"{a}\t{b}" for a, b in lines) + "\n\n")
    whole = attention(str(runs[family]), corpus=str(corpus), out=str(tmp_path / "all"), batch_size=2)
    assert whole["examples"] == 3 and whole["text"] == lines[0][0] and whole["text_pair"] == lines[0][1]
    each = [attention(str(runs[family]), a, b, out=str(tmp_path / f"one{i}")) for i, (a, b) in enumerate(lines)]
    n = [e["query_tokens"] for e in each]
    assert whole["query_tokens"] == sum(n)
    for p in PATTERNS[:-1]:  # each pattern over its own queries: every token, or those with a neighbour / a twin
        weights = [e["queries"][p] for e in each]
        assert whole["queries"][p] == sum(weights)
        if p in ("next", "previous"):
            assert weights == ([0] * 3 if family == "gpt" and p == "next" else [x - 1 for x in n])
        elif not p.startswith("same_"):
            assert weights == n
    other = (whole["queries"]["same_token_other"], whole["queries"]["same_word_other"])  # "the" in both sentences of line 1
    assert all(c > 0 for c in other) if family == "bert" else other == (0, 0)
    assert whole["queries"]["same_token"] > 0  # "a mat" twice
    for k, head in enumerate(whole["heads"]):
        for p in PATTERNS[:-1]:
            weights = [e["queries"][p] for e in each]
            if head[p] is None:
                n_a = ("next", "same_token_other", "same_word_other") if family == "gpt" else ()
                assert p in (*n_a, "same_word_pieces") and sum(weights) == 0  # these words are single pieces
                continue
            expect = sum(w * e["heads"][k][p] for w, e in zip(weights, each) if w) / sum(weights)
            assert head[p] == pytest.approx(expect, abs=1e-6), (p, head)
        # breadth: the corpus' mean entropy over the corpus' uniform entropy, a token-weighted mean itself
        assert head["breadth"] == pytest.approx(head["entropy"] / whole["uniform_entropy"], abs=1e-9)
    assert whole["uniform_entropy"] == pytest.approx(sum(x * e["uniform_entropy"] for x, e in zip(n, each)) / sum(n))
    # the heatmaps are of the given text even with a corpus
    text = attention(str(runs[family]), "a mat", corpus=str(corpus), out=str(tmp_path / "t"), batch_size=2)
    assert text["heads"] == whole["heads"] and text["text"] == "a mat"


def test_bad_input(runs, tmp_path):
    out = tmp_path / "att"
    assert_clean_error(run("attention", runs["bert"], "   ", "--out", out), "text is empty")
    assert_clean_error(run("attention", runs["bert"], "--out", out), "no text given", "--corpus")
    assert_clean_error(run("attention", runs["gpt"], "a b", "--text-pair", "c d", "--out", out), "causal LM", "encoder run")
    assert_clean_error(run("attention", runs["bert"], "a b", "--max-seq-len", 2, "--out", out), "--max-seq-len")
    assert_clean_error(run("attention", runs["bert"], "a b", "--max-seq-len", 0, "--out", out), "--max-seq-len 0")
    (tmp_path / "empty.txt").write_text("\n  \n")
    assert_clean_error(run("attention", runs["bert"], "--corpus", tmp_path / "empty.txt", "--out", out), "no non-blank lines")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert_clean_error(run("attention", runs["bert"], "a b", "--out", other), "not a `plm attention` output")
    assert (other / "keep.txt").read_text() == "mine"
    xlnet = tmp_path / "xlnet"  # a run of a family with its own attention (two-stream, relative)
    shutil.copytree(runs["gpt"], xlnet)
    cfg = json.loads((xlnet / "config.json").read_text())
    (xlnet / "config.json").write_text(json.dumps({**cfg, "family": "xlnet", "model": {"vocab_size": 20}}))
    assert_clean_error(run("attention", xlnet, "a b", "--out", out), "xlnet", "bert, spanbert, albert, nezha, electra")
    assert not out.exists()


def test_attention_families():
    assert {"albert", "bert", "electra", "gpt", "nezha", "spanbert"} <= set(attention_families())
    with pytest.raises(PlmError, match="no output directory"):
        attention("x", "text")
