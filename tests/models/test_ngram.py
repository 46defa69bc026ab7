"""n-gram LMs: hand-computed add-λ and Kneser-Ney values, normalisation, ARPA round trip, the run end to end."""

import json
import math

import numpy as np
import pytest
from safetensors.torch import save_model

from helpers import ToyEncoder, ToyEncoderConfig, tiny_corpus
from plmcli import api
from plmcli.config import load_recipe
from plmcli.errors import PlmError
from plmcli.interop.export import export
from plmcli.models.ngram import NGramConfig, NGramLM


def fit(sentences, **cfg) -> NGramLM:
    return NGramLM(NGramConfig(**cfg)).fit_sentences([s.split() for s in sentences])


def ids(m: NGramLM, words: str) -> list[int]:
    return [m.word_id(w) for w in words.split()]


# Bigram counts of this corpus, each line padded as <s> … </s> (one <s> for N = 2):
#   c(<s> a) = 4  c(<s> b) = 2  c(<s> c) = 1     c(<s>) = 7
#   c(a b) = 3    c(a c) = 1                     c(a) = 4
#   c(b </s>) = 3 c(b c) = 2                     c(b) = 5
#   c(c </s>) = 4                                c(c) = 4
# V = {a, b, c, </s>, <unk>}: |V| = 5.
TOY = ["a b"] * 3 + ["a c", "b c", "b c", "c"]


def test_add_lambda_equals_hand_computation():
    m = fit(TOY, order=2, smoothing="add-k", k=0.5)
    assert m.vocab_size == 5
    lv = 0.5 * 5
    assert m.prob(ids(m, "a"), m.word_id("b")) == pytest.approx((3 + 0.5) / (4 + lv))
    assert m.prob(ids(m, "a"), m.word_id("a")) == pytest.approx(0.5 / (4 + lv))  # unseen bigram, seen history
    assert m.prob([], m.word_id("a")) == pytest.approx((4 + 0.5) / (7 + lv))  # [] = sentence start
    assert m.prob(ids(m, "b"), m.word_id("</s>")) == pytest.approx((3 + 0.5) / (5 + lv))
    assert m.prob(ids(m, "c"), m.word_id("<unk>")) == pytest.approx(0.5 / (4 + lv))
    assert m.prob(ids(m, "<unk>"), m.word_id("a")) == pytest.approx(1 / 5)  # unseen history: c(h) = 0
    # One sentence scored by hand: P(b|<s>) P(c|b) P(</s>|c), 3 predicted tokens.
    nll, n, oov = m.score(np.array(ids(m, "b c")), np.array([2]))
    assert (n, oov) == (3, 0)
    assert nll == pytest.approx(-math.log((2.5 / 9.5) * (2.5 / 7.5) * (4.5 / 6.5)))


def test_kneser_ney_discounts_and_probability_by_hand():
    m = fit(TOY, order=2)
    # Top order (raw bigram counts above): n1 = n2 = n3 = n4 = 2, so Y = n1/(n1+2n2) = 1/3 and
    # D1 = 1-2Y·n2/n1 = 1/3, D2 = 2-3Y·n3/n2 = 1, D3+ = 3-4Y·n4/n3 = 5/3 (Chen & Goodman 1998, eq. 26).
    np.testing.assert_allclose(m.discount[2, 1:], [1 / 3, 1, 5 / 3])
    # Unigram continuation counts N1+(•w): a {<s>} 1, b {<s>, a} 2, c {<s>, a, b} 3, </s> {b, c} 2 -> n4 = 0,
    # so D is undefined there and falls back to (0.5, 1, 1.5), as KenLM's --discount_fallback.
    np.testing.assert_allclose(m.discount[1, 1:], [0.5, 1.0, 1.5])
    assert m.fallback == [1]
    # P1(c) = (3 - 1.5)/8 + γ·1/|V| with γ = (0.5 + 1 + 1.5 + 1)/8 = 0.5; <unk> is an unseen history, so P(c|<unk>) = P1(c).
    p1_c = 1.5 / 8 + 0.5 / 5
    assert m.prob(ids(m, "<unk>"), m.word_id("c")) == pytest.approx(p1_c)
    # P(c|a) = (c(a c) - D1)/c(a) + γ(a)·P1(c), γ(a) = (D1·N1(a•) + D3+·N3+(a•))/c(a) = (1/3 + 5/3)/4.
    assert m.prob(ids(m, "a"), m.word_id("c")) == pytest.approx((1 - 1 / 3) / 4 + 0.5 * p1_c)


def test_chen_goodman_discounts_on_a_real_count_of_counts():
    from plmcli.models.ngram import kn_discounts

    counts = np.array([1] * 10 + [2] * 4 + [3] * 3 + [4] * 2 + [9])
    y = 10 / (10 + 2 * 4)
    d, fell_back = kn_discounts(counts)
    assert not fell_back
    np.testing.assert_allclose(d, [1 - 2 * y * 4 / 10, 2 - 3 * y * 3 / 4, 3 - 4 * y * 2 / 3])


def _random_corpus(seed=0, n=120):
    rng = np.random.default_rng(seed)
    words = "the cat dog sat ran on a mat far away home".split()
    # Zipf-ish, so counts of counts 1..4 exist at every order
    p = 1 / np.arange(1, len(words) + 1)
    return [" ".join(rng.choice(words, size=rng.integers(1, 9), p=p / p.sum())) for _ in range(n)]


@pytest.mark.parametrize("smoothing", ["add-k", "kneser-ney"])
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_probabilities_sum_to_one_over_v(order, smoothing):
    m = fit(_random_corpus(), order=order, smoothing=smoothing, k=0.1)
    seen = ids(m, "the cat sat on")
    histories = [
        [],  # sentence start: N-1 <s>
        seen,  # seen in training
        ids(m, "mat mat mat mat"),  # unseen
        ids(m, "zebra cat sat on"),  # <unk> first, seen suffix
        ids(m, "the zebra"),  # unseen word right before the prediction, padded with <s>
        [m.bos, m.bos, m.bos] + ids(m, "the"),  # explicit padding
    ]
    for h in histories:
        p = np.exp(m.logprobs(h))
        assert p.shape == (m.vocab_size,) and (p > 0).all()
        assert p.sum() == pytest.approx(1.0, abs=1e-9), h


def test_padding_is_one_sentence_start():
    """Histories that start with several <s> read as one <s> (SRILM/KenLM): P_5(w | <s> <s> <s> x) = P_3(w | <s> x)."""
    m = fit(_random_corpus(), order=5)
    V, bos, x = m.vocab_size, m.bos, m.word_id("the")
    for history in ([], [x]):
        short = np.array([[bos, *history, w] for w in range(V)])
        np.testing.assert_allclose(m.logprobs(history), np.log(m._prob(short)))
    assert not np.allclose(m.logprobs([x]), m.logprobs([m.word_id("cat"), x]))


def test_min_count_maps_rare_words_to_unk():
    m = fit(["a b", "a b", "a c"], order=2, min_count=2)
    assert m.words[:-1] == ["<unk>", "</s>", "a", "b"] and m.word_id("c") == m.word_id("<unk>")
    assert m.prob(ids(m, "a"), m.word_id("<unk>")) > m.prob(ids(m, "b"), m.word_id("<unk>"))


# ------------------------------------------------------------------ ARPA


def read_arpa(path):
    """{n-gram tuple: (log10 p, log10 backoff)}, the order, and the header counts."""
    lm, order, header = {}, 0, {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("ngram "):
            n, c = line[6:].split("=")
            header[int(n)] = int(c)
        elif line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1 : line.index("-")])
        elif line and not line.startswith("\\") and order:
            parts = line.split("\t")
            lm[tuple(parts[1].split(" "))] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return lm, order, header


def arpa_log10(lm, order, context, w):
    """Standard back-off semantics: the longest listed n-gram, times the back-offs of the longer contexts."""
    ctx, bo = tuple(context)[-(order - 1) :] if order > 1 else (), 0.0
    while True:
        if ctx + (w,) in lm:
            return bo + lm[ctx + (w,)][0]
        bo += lm.get(ctx, (0.0, 0.0))[1]
        ctx = ctx[1:]


@pytest.mark.parametrize("smoothing,order", [("kneser-ney", 1), ("kneser-ney", 3), ("kneser-ney", 4), ("add-k", 1),
                                             ("add-k", 2), ("add-k", 3)])
def test_arpa_round_trip(tmp_path, smoothing, order):
    corpus = _random_corpus()
    m = fit(corpus, order=order, smoothing=smoothing, k=0.1)
    lm, top, header = read_arpa(m.write_arpa(tmp_path / "lm.arpa"))
    assert top == order and header == {n: sum(len(g) == n for g in lm) for n in range(1, order + 1)}
    assert lm[("<s>",)][0] == -99 and ("<unk>",) in lm and ("</s>",) in lm
    # Whole sentences as a KenLM-style reader scores them (one <s> of context): seen, novel, with OOV words.
    for sentence in corpus[:20] + ["the zebra sat far far away", "mat", "zebra", "on the on the cat dog"]:
        words = [m.words[i] for i in ids(m, sentence)] + ["</s>"]
        arpa = sum(arpa_log10(lm, top, ["<s>"] + words[:i], w) for i, w in enumerate(words))
        nll, _, _ = m.score(np.array(ids(m, sentence)), np.array([len(words) - 1]))
        assert arpa == pytest.approx(-nll / math.log(10), abs=1e-5 * len(words)), sentence


# ------------------------------------------------------------------ through the api


def _toy_run(tmp_path, recipe="ngram-bigram-addk", *overrides):
    train = tmp_path / "train.txt"
    train.write_text("a b\na c\nb a\n", encoding="utf-8")
    return api.pretrain(recipe, data=[str(train)], out=str(tmp_path / "run"),
                        overrides=["data.val_fraction=0", *overrides])


def test_pretrain_and_eval_ppl_end_to_end(tmp_path):
    summary = _toy_run(tmp_path, "ngram-bigram-addk", "model.k=0.5")
    assert summary["stop_reason"] == "fit" and summary["steps"] == 0 and summary["tokens"] == 9
    test = tmp_path / "test.txt"
    test.write_text("a b\n\nc d\n", encoding="utf-8")
    res = api.eval_ppl([str(test)], str(tmp_path / "run"))
    # V = {a, b, c, </s>, <unk>}, λ|V| = 2.5; c(<s>) = 3, c(a) = 3, c(b) = 2, c(c) = 1 (see the train text).
    # a b:  P(a|<s>) = 2.5/5.5, P(b|a) = 1.5/5.5, P(</s>|b) = 1.5/4.5
    # c d:  P(c|<s>) = 0.5/5.5, P(<unk>|c) = 0.5/3.5, P(</s>|<unk>) = 1/5 (unseen history)
    logp = sum(map(math.log, [2.5 / 5.5, 1.5 / 5.5, 1.5 / 4.5, 0.5 / 5.5, 0.5 / 3.5, 1 / 5]))
    assert res["tokens"] == 6 and res["sentences"] == 2 and res["words"] == 4
    assert res["ppl"] == pytest.approx(math.exp(-logp / 6))
    assert res["oov_rate"] == pytest.approx(1 / 4)  # d of the 4 words a b c d; the scored </s> are no words
    assert res["stride"] == res["max_length"] == 2
    assert {"nll", "bpb", "word_ppl", "first_token", "files"} <= set(res)
    assert (tmp_path / "run" / "model.npz").is_file()


def test_kn_recipe_fits_with_validation(tmp_path):
    corpus = tiny_corpus(tmp_path / "c.txt")
    summary = api.pretrain("ngram-kn5", data=[str(corpus)], out=str(tmp_path / "run"))
    assert math.isfinite(summary["val_ppl"]) and summary["val_oov_rate"] == 0
    assert len(summary["discounts"]) == 5
    res = api.eval_ppl([str(corpus)], str(tmp_path / "run"))
    assert res["ppl"] < 10 and res["oov_rate"] == 0


def test_export_arpa_of_a_run(tmp_path):
    _toy_run(tmp_path, "ngram-kn5")
    out = export(str(tmp_path / "run"), "arpa", str(tmp_path / "out" / "lm.arpa"))
    lm, order, _ = read_arpa(out)
    assert order == 5 and ("<s>", "a", "b") in lm


def test_all_oov_text_is_an_error(tmp_path):
    _toy_run(tmp_path)
    text = tmp_path / "oov.txt"
    text.write_text("x y z\n", encoding="utf-8")
    with pytest.raises(PlmError, match="every word .* is out of vocabulary"):
        api.eval_ppl([str(text)], str(tmp_path / "run"))


@pytest.mark.parametrize("override,needle", [
    ("model.order=0", "order 0 must be an integer ≥ 1"),
    ("model.k=-1", "must be ≥ 0"),  # k = 0 is allowed: the unsmoothed model (tests/models/test_ngram_mle.py)
    ("model.smoothing=witten-bell", "add-k, kneser-ney"),
    ("model.min_count=0", "≥ 1"),
])
def test_bad_settings_fail_at_recipe_load(override, needle):
    with pytest.raises(PlmError, match=needle):
        load_recipe("ngram-bigram-addk", [override])


def test_window_options_do_not_apply(tmp_path):
    _toy_run(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("a b\n", encoding="utf-8")
    with pytest.raises(PlmError, match="--max-length 8 does not apply"):
        api.eval_ppl([str(text)], str(tmp_path / "run"), max_length=8)


def test_export_rejects_unknown_format_and_non_ngram_runs(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models

    from plmcli.models import registry

    _toy_run(tmp_path)
    with pytest.raises(PlmError, match="unknown export format 'onnx'"):
        export(str(tmp_path / "run"), "onnx", str(tmp_path / "x"))
    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps({"family": "toyenc", "model": {"vocab_size": 5}, "tokenizer": {}}))
    save_model(ToyEncoder(ToyEncoderConfig(vocab_size=5)), str(enc / "model.safetensors"))
    Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).save(str(enc / "tokenizer.json"))
    with pytest.raises(PlmError, match="cannot be exported as arpa"):
        export(str(enc), "arpa", str(tmp_path / "x.arpa"))


def test_oov_rate_counts_words_only_as_kenlm(tmp_path):
    """OOV rate = <unk> words / words (kenlm's count): the </s> scored after each sentence is not in the
    denominator, in eval-ppl and in pretrain's validation summary alike."""
    train = tmp_path / "train.txt"
    train.write_text("a b\na c\nb a\n" * 10 + "x y z q\na zz\n", encoding="utf-8")
    summary = api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                           overrides=["data.val_fraction=0", "tokenizer.min_frequency=2"])
    test = tmp_path / "test.txt"
    test.write_text("a x b\n\nzz c q a b\n", encoding="utf-8")  # 8 words, 3 unseen (x, zz, q), 2 sentences
    res = api.eval_ppl([str(test)], str(tmp_path / "run"))
    assert (res["tokens"], res["sentences"], res["words"]) == (10, 2, 8)
    assert res["oov_rate"] == pytest.approx(3 / 8)
    assert res["files"][0]["oov_rate"] == pytest.approx(3 / 8)
    assert summary["stop_reason"] == "fit"
