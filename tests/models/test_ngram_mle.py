"""The unsmoothed maximum-likelihood n-gram (model.k 0): P(w|h) = c(h,w)/c(h), unseen events reported, not smoothed."""

import json
import math

import numpy as np
import pytest

from helpers import run
from plmcli import api
from plmcli.config import load_recipe
from plmcli.errors import PlmError
from plmcli.generate import generate
from plmcli.models.ngram import NGramConfig, NGramLM

# Three sentences, each <s> … </s>. Bigram counts:
#   c(<s> a) = 2  c(<s> b) = 1                 c(<s>) = 3
#   c(a b) = 1    c(a c) = 1   c(a </s>) = 1   c(a) = 3
#   c(b </s>) = 1 c(b a) = 1                   c(b) = 2
#   c(c </s>) = 1                              c(c) = 1
# V = {<unk>, </s>, a, b, c}; 9 predicted tokens: a 3, b 2, c 1, </s> 3.
CORPUS = ["a b", "a c", "b a"]


def fit(order=2, sentences=CORPUS) -> NGramLM:
    return NGramLM(NGramConfig(order=order, smoothing="add-k", k=0)).fit_sentences([s.split() for s in sentences])


def ids(m, words):
    return [m.word_id(w) for w in words.split()]


def test_bigram_is_the_relative_frequency():
    m = fit()
    p = lambda h, w: m.prob(ids(m, h), m.word_id(w))  # noqa: E731
    assert (p("", "a"), p("", "b"), p("", "c")) == pytest.approx((2 / 3, 1 / 3, 0))
    assert (p("a", "b"), p("a", "c"), p("a", "</s>"), p("a", "a")) == pytest.approx((1 / 3, 1 / 3, 1 / 3, 0))
    assert (p("b", "</s>"), p("b", "a"), p("c", "</s>")) == pytest.approx((1 / 2, 1 / 2, 1))
    assert p("<unk>", "a") == 0  # a history never seen: 0/0, no estimate, every word 0 (not 1/|V|)
    for h in ("", "a", "b", "c"):  # a seen history: a distribution over V
        assert np.exp(m.logprobs(ids(m, h))).sum() == pytest.approx(1.0)
    assert np.exp(m.logprobs(ids(m, "<unk>"))).sum() == 0


def test_unigram_and_trigram():
    uni = fit(order=1)
    assert [uni.prob([], uni.word_id(w)) for w in ("a", "b", "c", "</s>", "<unk>")] == pytest.approx([3 / 9, 2 / 9, 1 / 9, 3 / 9, 0])
    tri = fit(order=3)
    assert tri.prob([], tri.word_id("a")) == pytest.approx(2 / 3)  # <s> <s> reads as one <s>
    assert tri.prob(ids(tri, "a"), tri.word_id("b")) == pytest.approx(1 / 2)  # c(<s> a b) / c(<s> a)
    assert tri.prob(ids(tri, "a b"), tri.word_id("</s>")) == pytest.approx(1.0)
    assert tri.prob(ids(tri, "b c"), tri.word_id("</s>")) == 0  # history b c never seen


def test_score_counts_zero_probability_tokens():
    m = fit()
    # "a b": 2/3 · 1/3 · 1/2.   "c a": P(c|<s>) = 0, P(a|c) = 0, P(</s>|a) = 1/3.
    words, lengths = np.array(ids(m, "a b") + ids(m, "c a")), np.array([2, 2])
    nll, n, oov, zero = m.score_parts(words, lengths)
    assert (n, oov, zero) == (6, 0, 2)
    assert nll == pytest.approx(-math.log(2 / 3 * 1 / 3 * 1 / 2 * 1 / 3))
    assert m.score(words, lengths)[0] == math.inf
    assert m.score(words[:2], lengths[:1])[0] == pytest.approx(-math.log(1 / 9))  # no zero: finite as before


@pytest.fixture
def mle_run(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("".join(s + "\n" for s in CORPUS), encoding="utf-8")
    summary = api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                           overrides=["data.val_fraction=0", "model.k=0"])
    assert summary["stop_reason"] == "fit"
    return tmp_path / "run"


def test_eval_ppl_is_infinite_and_counts_the_zeros(mle_run, tmp_path):
    test = tmp_path / "test.txt"
    test.write_text("a b\nc a\nb d\n", encoding="utf-8")
    res = api.eval_ppl([str(test)], str(mle_run))
    # a b: 2/3, 1/3, 1/2.  c a: 0, 0, 1/3.  b d: P(b|<s>) = 1/3, P(<unk>|b) = 0, P(</s>|<unk>) = 0 (unseen history).
    finite = [2 / 3, 1 / 3, 1 / 2, 1 / 3, 1 / 3]
    assert (res["tokens"], res["zero_prob_tokens"], res["sentences"], res["words"]) == (9, 4, 3, 6)
    assert res["ppl"] == math.inf and res["nll"] == math.inf and res["bpb"] == math.inf and res["word_ppl"] == math.inf
    assert res["ppl_excluding_zero_prob"] == pytest.approx(math.exp(-sum(map(math.log, finite)) / 5))
    assert res["oov_rate"] == pytest.approx(1 / 6)
    assert res["files"][0]["zero_prob_tokens"] == 4
    seen = tmp_path / "seen.txt"
    seen.write_text("a b\nb a\n", encoding="utf-8")
    res = api.eval_ppl([str(seen)], str(mle_run))
    logp = sum(map(math.log, [2 / 3, 1 / 3, 1 / 2, 1 / 3, 1 / 2, 1 / 3]))
    assert res["zero_prob_tokens"] == 0 and res["ppl"] == pytest.approx(math.exp(-logp / 6))
    assert res["ppl_excluding_zero_prob"] == pytest.approx(res["ppl"])


def test_eval_ppl_cli_says_it(mle_run, tmp_path):
    test = tmp_path / "test.txt"
    test.write_text("a b\nc a\n", encoding="utf-8")
    out = run("eval-ppl", test, "--model", mle_run)
    assert out.exit_code == 0, out.output
    assert "ppl inf" in out.stdout and "zero-probability tokens 2" in out.stdout
    res = json.loads(run("eval-ppl", test, "--model", mle_run, "--json").stdout)
    assert res["ppl"] is None and res["zero_prob_tokens"] == 2  # strict JSON: inf is null (tests/test_strict_json.py)


def test_validation_summary_reports_zeros(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("a b\na c\nb a\n" * 5 + "c c d\n", encoding="utf-8")
    s = api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                     overrides=["model.k=0", "data.val_fraction=0.3"])
    assert "val_zero_prob_tokens" in s
    assert (s["val_ppl"] == math.inf) == (s["val_zero_prob_tokens"] > 0)


def test_generation(tmp_path):
    """Decoding the MLE bigram of "a b c d" ×3 and "b a": P(b|a) = 3/4, P(c|b) = 3/4, P(d|c) = P(</s>|d) = 1."""
    train = tmp_path / "train.txt"
    train.write_text("a b c d\n" * 3 + "b a\n", encoding="utf-8")
    api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                 overrides=["data.val_fraction=0", "model.k=0"])
    run_dir = str(tmp_path / "run")
    assert generate(run_dir, ["a", "c", ""]) == ["b c d", "d", "a b c d"]
    # After a only b and </s> have mass: the other two beams score -inf, and their unseen contexts do no harm.
    assert generate(run_dir, ["a"], strategy="beam", num_beams=4) == ["b c d"]
    # Sampling draws only what was seen: after b, c (3/4) or a (1/4).
    assert set(generate(run_dir, ["b"] * 50, strategy="sample", max_new_tokens=1, seed=0)) == {"c", "a"}
    with pytest.raises(PlmError, match="never saw the context '<unk>'"):
        generate(run_dir, ["a zz"])


def read_arpa(path):
    lm, order = {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1: line.index("-")])
        elif line and not line.startswith(("\\", "ngram ")) and order:
            parts = line.split("\t")
            lm[tuple(parts[1].split(" "))] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return lm


def arpa_log10(lm, order, context, w):
    ctx, bo = tuple(context)[-(order - 1):] if order > 1 else (), 0.0
    while True:
        if ctx + (w,) in lm:
            return bo + lm[ctx + (w,)][0]
        bo += lm.get(ctx, (0.0, 0.0))[1]
        ctx = ctx[1:]


@pytest.mark.parametrize("order", [1, 2, 3])
def test_arpa_writes_log_zero_as_minus_99(tmp_path, order):
    m = fit(order=order)
    lm = read_arpa(m.write_arpa(tmp_path / "lm.arpa"))
    text = (tmp_path / "lm.arpa").read_text(encoding="utf-8")
    assert "inf" not in text and "nan" not in text and lm[("<s>",)][0] == -99
    assert lm[("<unk>",)][0] == -99  # never seen
    for sentence in CORPUS + ["c a", "a zz", "b b a"]:
        words = [m.words[i] for i in ids(m, sentence)] + ["</s>"]
        for i, w in enumerate(words):
            p = m.prob([m.word_id(x) for x in words[:i]], m.word_id(w))
            got = arpa_log10(lm, order, ["<s>"] + words[:i], w)
            if p > 0:
                assert got == pytest.approx(math.log10(p), abs=1e-6), (sentence, w)
            else:
                assert got <= -99, (sentence, w)


def test_k_zero_loads_and_negative_k_is_refused():
    assert load_recipe("ngram-bigram-addk", ["model.k=0"]).model.k == 0
    with pytest.raises(PlmError, match="must be ≥ 0"):
        load_recipe("ngram-bigram-addk", ["model.k=-0.5"])
