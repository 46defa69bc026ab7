"""Weighted data mixing (plmcli/data/mixing.py): shares by weight, a deterministic order, bitwise resume (tokenized
and --streaming), the recipe key data.mix, and one-line refusals of bad weights."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import run, tiny_recipe
from plmcli import api
from plmcli.data import mixing
from plmcli.data.mixing import Blend, BlendedStream, Source, parse_inputs
from plmcli.errors import PlmError

pytestmark = pytest.mark.usefixtures("one_thread")

A_WORDS = "alpha beta gamma delta epsilon zeta".split()
B_WORDS = "ONE TWO THREE FOUR FIVE SIX".split()


def corpus_text(words, n: int) -> str:
    """n documents of lines of `words` (two disjoint alphabets: every token of a window tells its source)."""
    return "".join(" ".join(words[(i + j) % len(words)] for j in range(8)) + "\n" + ("\n" if i % 3 == 2 else "")
                   for i in range(n))


@pytest.fixture
def sources(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(corpus_text(A_WORDS, 120), encoding="utf-8")
    b.write_text(corpus_text(B_WORDS, 40), encoding="utf-8")  # the small source: it cycles (epochs) before a does
    return tiny_recipe(tmp_path / "tiny.yaml"), a, b


def _counts(src: np.ndarray, k: int) -> np.ndarray:
    """(N, k): how many of the first N samples each source had, N = 1..len(src)."""
    return np.cumsum(np.eye(k, dtype=np.int64)[src], axis=0)


@pytest.mark.parametrize("weights", [[0.75, 0.25], [0.5, 0.3, 0.2], [0.7, 0.2, 0.05, 0.05], [1 / 3] * 3, [0.999, 0.001]])
def test_every_prefix_holds_each_share_within_one(weights):
    src, nth = Blend(weights).take(np.arange(5000))
    got = _counts(src, len(weights))
    want = np.arange(1, 5001)[:, None] * np.array(weights)[None, :]
    assert np.abs(got - want).max() < 1
    for k in range(len(weights)):  # each source's samples are its own 0, 1, 2, ... in turn
        assert (nth[src == k] == np.arange((src == k).sum())).all()


@pytest.mark.parametrize("weights", [[0.6, 0.4], [0.37, 0.41, 0.22], [0.123456789, 0.876543211]])
def test_order_is_the_greedy_rule_deterministic_and_random_access(monkeypatch, weights):
    from fractions import Fraction

    monkeypatch.setattr(Blend, "CHUNK", 64)  # many chunks: positions far apart and out of order
    w = [Fraction(x) for x in mixing.integer_weights(weights)]
    w = [x / sum(w) for x in w]
    counts, greedy = [0] * len(w), []  # the rule itself, sample after sample, in exact arithmetic
    for i in range(3000):
        k = max(range(len(w)), key=lambda k: w[k] * (i + 1) - counts[k])
        greedy.append((k, counts[k]))
        counts[k] += 1
    seq_src, seq_nth = Blend(weights).take(np.arange(3000))
    assert list(zip(seq_src.tolist(), seq_nth.tolist())) == greedy  # across periods too (0.6, 0.4: 5 samples)
    positions = np.array([900, 3, 640, 64, 63, 2999, 1, 700])
    src, nth = Blend(weights).take(positions)  # a fresh one (a resumed run): straight to the positions
    assert (src == seq_src[positions]).all() and (nth == seq_nth[positions]).all()
    assert [Blend(weights).at(int(p)) for p in positions] == seq_src[positions].tolist()
    assert abs(float(w[0]) - weights[0] / sum(weights)) < 1e-6  # the weights as integers: their shares kept


def test_blended_stream_shares_and_determinism():
    sizes, weights = [50, 7, 20], [0.5, 0.25, 0.25]

    def fetch(k, epochs, indices):  # a row says (source, epoch, index)
        return {"x": torch.tensor([[k, e, i] for e, i in zip(epochs, indices)])}

    def rows(seed):
        s = BlendedStream(sizes, weights, 4, fetch, seed=seed)
        return torch.cat([s[k]["x"] for k in range(100)])

    a = rows(0)
    assert torch.equal(a, rows(0)) and not torch.equal(a, rows(1))
    counts = np.bincount(a[:, 0].numpy(), minlength=3)
    assert (np.abs(counts - 400 * np.array(weights)) < 1).all()
    small = a[a[:, 0] == 1]  # the 7-sample source cycles: each epoch a permutation of its samples
    assert sorted(small[:7, 2].tolist()) == list(range(7)) and small[7:, 1].min() >= 1
    # two processes read the one process's micro-batches, interleaved
    two = [BlendedStream(sizes, weights, 4, fetch, seed=0, rank=r, world=2) for r in (0, 1)]
    assert torch.equal(torch.cat([two[k % 2][k // 2]["x"] for k in range(100)]), a)
    # evaluation: every sample once, in order, in batches of one source each (tagged with it), the sources'
    # batches interleaved by their numbers (any first batches are pooled fairly)
    ev = BlendedStream(sizes, weights, 8, fetch, shuffle=False)
    batches = [ev[k] for k in range(ev.batches_per_epoch())]
    assert ev[ev.batches_per_epoch()] is None and len(batches) == 7 + 1 + 3
    assert all((b["x"][:, 0] == b[mixing.SOURCE]).all() for b in batches)
    seen = torch.cat([b["x"] for b in batches])
    assert (seen[:, 1] == 0).all()
    for k, n in enumerate(sizes):
        assert seen[seen[:, 0] == k, 2].tolist() == list(range(n))
    order = [b[mixing.SOURCE] for b in batches]  # one batch of each source first, then by their numbers
    rest = _counts(np.array(order[3:]), 3)
    assert order[:3] == [0, 1, 2] and (np.abs(rest - np.arange(1, 9)[:, None] * np.array([6, 0, 2]) / 8) < 1).all()
    two = [BlendedStream(sizes, weights, 8, fetch, shuffle=False, rank=r, world=2) for r in (0, 1)]
    assert [two[k % 2][k // 2][mixing.SOURCE] for k in range(11)] == [b[mixing.SOURCE] for b in batches]


def test_parse_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("x\n")
    Path("b.txt").write_text("y\n")
    Path("odd:0.5").write_text("z\n")  # exists as given: a path, whatever its colon says
    assert parse_inputs(["a.txt", "b.txt"]) is None and parse_inputs(["odd:0.5"]) is None
    assert mixing.shares(parse_inputs(["a.txt:3", "b.txt:1"])) == [0.75, 0.25]
    assert parse_inputs(["a.txt:1", "b.txt"]) == [Source("a.txt", 1.0), Source("b.txt", 1.0)]  # no weight: 1
    assert parse_inputs(["a.txt:0.5", "odd:0.5:0.5"]) == [Source("a.txt", 0.5), Source("odd:0.5", 0.5)]
    # a Windows drive and a Hub name's config are names, not weights
    assert parse_inputs([r"C:\corpus\a.txt", "a.txt:1"])[0].path == r"C:\corpus\a.txt"
    assert parse_inputs(["wikitext:wikitext-2-raw-v1", "a.txt:1"])[0].path == "wikitext:wikitext-2-raw-v1"
    assert mixing.shares(mixing.from_config({"a.txt": 1, "b.txt": 3})) == [0.25, 0.75]
    assert mixing.spec(Source("a.txt", 0.25)) == f"{tmp_path / 'a.txt'}:0.25"
    for bad, says in ((["a.txt:-1", "b.txt:1"], "finite number ≥ 0"), (["a.txt:0", "b.txt:0"], "sum to 0"),
                      (["a.txt:abc", "b.txt:1"], "is not a number"), (["a.txt:nan", "b.txt:1"], "finite number"),
                      (["a.txt:1", "a.txt:2"], "named twice")):
        with pytest.raises(PlmError, match=says):
            parse_inputs(bad)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source_of(rows: torch.Tensor, run_dir: Path) -> list[int]:
    """1 for a row of source b's letters, 0 for source a's (a row never mixes them; spaces and <eos> are both's)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    a_ids, b_ids = ({tok.token_to_id(c) for c in "".join(words)} for words in (A_WORDS, B_WORDS))
    out = []
    for row in rows.tolist():
        in_a, in_b = bool(a_ids & set(row)), bool(b_ids & set(row))
        assert in_a != in_b, row
        out.append(int(in_b))
    return out


def _check_shares(rows: torch.Tensor, run_dir: Path, weight_b: float = 0.25) -> None:
    from_b = _source_of(rows, run_dir)
    assert abs(sum(from_b) - len(from_b) * weight_b) < 1, (sum(from_b), len(from_b))


@pytest.mark.parametrize("streaming", [False, True], ids=["tokenized", "streaming"])
def test_interrupted_mix_resumes_to_the_same_weights(sources, tmp_path, fed, streaming):
    recipe, a, b = sources
    data = [f"{a}:0.75", f"{b}:0.25"]
    full = api.pretrain(str(recipe), data, str(tmp_path / "full"), streaming=streaming)
    assert full["steps"] == 6 and full["val_loss"] > 0
    assert min(full["val_loss/a"], full["val_loss/b"]) <= full["val_loss"] <= max(full["val_loss/a"], full["val_loss/b"])
    rows = torch.cat(fed)
    for lane in range(4) if streaming else [None]:  # streamed, every lane holds the shares within 1
        _check_shares(rows if lane is None else rows[lane::4], tmp_path / "full")
    first = [x.clone() for x in fed]
    fed.clear()
    api.pretrain(str(recipe), data, str(tmp_path / "half"), streaming=streaming, stop_after=3)
    if streaming:  # every lane: its windows taken, then its position in each source (5 numbers each)
        state = json.loads((tmp_path / "half" / "checkpoints" / "step-3" / "loop_state.json").read_text())
        lanes = state["data_position"]["ranks"][0]["positions"][0]
        assert [len(p) for p in lanes] == [11] * 4 and [p[0] for p in lanes] == [3] * 4
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert all(torch.equal(x, y) for x, y in zip(fed, first)) and len(fed) == len(first)
    x, y = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(tmp_path / "half" / "model.safetensors"))
    assert all(torch.equal(x[k], y[k]) for k in x)
    inputs = json.loads((tmp_path / "half" / "config.json").read_text())["inputs"]
    assert inputs == [f"{a.resolve()}:0.75", f"{b.resolve()}:0.25"]


def test_recipe_key_mixes_as_the_flags_do(sources, tmp_path):
    recipe, a, b = sources
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(recipe.read_text().replace("data: {val_fraction: 0.2}",
                                                f"data: {{val_fraction: 0.2, mix: {{'{a}': 3, '{b}': 1}}}}"))
    api.pretrain(str(mixed), None, str(tmp_path / "key"), stop_after=2)
    api.pretrain(str(recipe), [f"{a}:0.75", f"{b}:0.25"], str(tmp_path / "flags"), stop_after=2)
    assert _sha(tmp_path / "key" / "model.safetensors") == _sha(tmp_path / "flags" / "model.safetensors")


def test_bad_weights_are_one_line_errors(sources, tmp_path):
    recipe, a, b = sources
    for data, says in (([f"{a}:-0.5", f"{b}:1"], "must be a finite number ≥ 0"), ([f"{a}:0", f"{b}:0"], "sum to 0"),
                       ([f"{a}:lots", f"{b}:1"], "is not a number")):
        res = run("pretrain", "--recipe", recipe, *[x for d in data for x in ("--data", d)], "--out", tmp_path / "r")
        assert res.exit_code == 2 and says in res.stderr and "\n" not in res.stderr.strip(), res.output
        assert not (tmp_path / "r").exists()
    for mix, says in (("{a.txt: -1, b.txt: 1}", "data.mix"), ("{a.txt: 0}", "data.mix"), ("{a.txt: many}", "data.mix")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(recipe.read_text().replace("data: {val_fraction: 0.2}", f"data: {{mix: {mix}}}"))
        res = run("pretrain", "--recipe", bad, "--out", tmp_path / "r")
        assert res.exit_code == 2 and says in res.stderr and "\n" not in res.stderr.strip(), res.output
    for recipe_name, objective in (("txl-mini", "bptt"), ("xlnet-mini", "plm")):  # batches that continue streams
        res = run("pretrain", "--recipe", recipe_name, "--data", f"{a}:1", "--data", f"{b}:1", "--out", tmp_path / "m")
        assert res.exit_code == 2 and f"objective {objective} does not train on independent samples" in res.stderr
        assert "\n" not in res.stderr.strip() and not (tmp_path / "m").exists(), res.output


def test_tokenized_corpora_mix_when_they_share_a_tokenizer(sources, tmp_path):
    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.corpus import tokenize_corpus

    recipe, a, b = sources
    char = TokenizerConfig(kind="char", vocab_size=200, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})
    tokenize_corpus([str(a)], tmp_path / "tok_a", char, val_fraction=0.2)
    tokenize_corpus([str(b)], tmp_path / "tok_b", char, val_fraction=0.2)  # its own alphabet: another tokenizer
    s = api.pretrain(str(recipe), [f"{tmp_path / 'tok_a'}:3", f"{b}:1"], str(tmp_path / "ok"), stop_after=1)
    assert s["steps"] == 1  # b's text is tokenized with tok_a's tokenizer
    with pytest.raises(PlmError, match="is tokenized with another tokenizer"):
        api.pretrain(str(recipe), [f"{tmp_path / 'tok_a'}:3", f"{tmp_path / 'tok_b'}:1"], str(tmp_path / "no"))
