"""word2vec: one SGD step of skip-gram and CBOW against the update written out by hand, subsampling and the
noise table by hand, the windows, training that learns, and the run end to end (fit, export, eval-vectors)."""

import math

import numpy as np
import pytest
import torch

from helpers import assert_clean_error, run, tiny_corpus
from plmcli.interop.word2vec import read_word2vec
from plmcli.models.word2vec import NoiseTable, Word2Vec, Word2VecConfig

pytestmark = pytest.mark.usefixtures("one_thread")

V0 = [[0.1, 0.2], [0.3, -0.1], [-0.2, 0.4]]
U0 = [[0.5, 0.0], [0.0, 0.5], [0.25, 0.25]]


def model(**cfg) -> Word2Vec:
    m = Word2Vec(Word2VecConfig(**{"vocab_size": 3, "dim": 2, **cfg}))
    m.input_vectors.data.copy_(torch.tensor(V0))
    m.output_vectors.data.copy_(torch.tensor(U0))
    return m


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_skip_gram_step_is_mikolovs_update_by_hand():
    m = model()
    # centre 0 predicts context 1; noise words 2 and 1 (= the target: skipped, as word2vec.c does); α = 0.1
    loss = m._sg_step(torch.tensor([0]), torch.tensor([1]), torch.tensor([[2, 1]]), 0.1)
    h = np.array(V0[0])
    s1, s2 = 0.0 * 0.1 + 0.5 * 0.2, 0.25 * 0.1 + 0.25 * 0.2  # v'_1·h = 0.1, v'_2·h = 0.075
    g1, g2 = (1 - sigmoid(s1)) * 0.1, (0 - sigmoid(s2)) * 0.1
    np.testing.assert_allclose(m.input_vectors[0].numpy(), h + g1 * np.array(U0[1]) + g2 * np.array(U0[2]), rtol=1e-6)
    np.testing.assert_allclose(m.output_vectors[1].numpy(), np.array(U0[1]) + g1 * h, rtol=1e-6)
    np.testing.assert_allclose(m.output_vectors[2].numpy(), np.array(U0[2]) + g2 * h, rtol=1e-6)
    np.testing.assert_allclose(m.output_vectors[0].numpy(), U0[0])  # never drawn
    np.testing.assert_allclose(m.input_vectors[1:].numpy(), V0[1:])  # only the centre's input vector moves
    assert loss == pytest.approx(-math.log(sigmoid(s1)) - math.log(sigmoid(-s2)), rel=1e-6)


def test_cbow_step_uses_the_mean_and_gives_each_context_word_the_whole_error():
    m = model(arch="cbow", window=2)
    # context 0 and 1 (present slots of the (1, 2·window) row; the empty ones hold word 2) predict centre 2; one
    # noise word, 0; α = 0.05
    loss = m._cbow_step(torch.tensor([2]), torch.tensor([[2, 0, 1, 2]]), torch.tensor([[False, True, True, False]]),
                        torch.tensor([[0]]), 0.05)
    h = (np.array(V0[0]) + np.array(V0[1])) / 2  # (0.2, 0.05)
    s2, s0 = 0.25 * 0.2 + 0.25 * 0.05, 0.5 * 0.2 + 0.0 * 0.05
    g2, g0 = (1 - sigmoid(s2)) * 0.05, -sigmoid(s0) * 0.05
    err = g2 * np.array(U0[2]) + g0 * np.array(U0[0])
    np.testing.assert_allclose(m.input_vectors[0].numpy(), np.array(V0[0]) + err, rtol=1e-6)
    np.testing.assert_allclose(m.input_vectors[1].numpy(), np.array(V0[1]) + err, rtol=1e-6)
    np.testing.assert_allclose(m.input_vectors[2].numpy(), V0[2])
    np.testing.assert_allclose(m.output_vectors[2].numpy(), np.array(U0[2]) + g2 * h, rtol=1e-6)
    np.testing.assert_allclose(m.output_vectors[0].numpy(), np.array(U0[0]) + g0 * h, rtol=1e-6)
    assert loss == pytest.approx(-math.log(sigmoid(s2)) - math.log(sigmoid(-s0)), rel=1e-6)


def test_a_cbow_batch_is_each_example_by_hand():
    """Several examples at once: each h is the mean of its own present context words, and each context word gets its
    example's error (words shared between examples add up), as the plain masked computation gives."""
    torch.manual_seed(0)
    m = Word2Vec(Word2VecConfig(vocab_size=9, dim=4, arch="cbow", window=2))
    m.output_vectors.data.normal_(0, 0.3)
    ctx = torch.randint(0, 9, (6, 4))
    mask = torch.rand(6, 4) < 0.6
    mask[:, 1] = True  # every example has a context word
    centre, negs = torch.randint(0, 9, (6,)), torch.randint(0, 9, (6, 3))
    v0, u0 = m.input_vectors.clone(), m.output_vectors.clone()
    loss = m._cbow_step(centre, ctx, mask, negs, 0.05)
    ref = Word2Vec(Word2VecConfig(vocab_size=9, dim=4, arch="cbow", window=2))
    ref.input_vectors.data.copy_(v0)
    ref.output_vectors.data.copy_(u0)
    w = mask.double().unsqueeze(2)
    h = (v0.double()[ctx] * w).sum(1) / w.sum(1)
    err, want = ref._update(h.float(), centre, negs, 0.05)
    expected = v0.double().index_add(0, ctx.view(-1), (err.double().unsqueeze(1) * w).view(-1, 4))
    np.testing.assert_allclose(m.input_vectors.numpy(), expected.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m.output_vectors.numpy(), ref.output_vectors.numpy(), rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(want, rel=1e-6)


def test_subsampling_noise_table_and_vocabulary_by_hand():
    m = Word2Vec(Word2VecConfig(vocab_size=5, dim=2, sample=0.01, min_count=2))
    ids = np.array([1] * 90 + [2] * 8 + [3] * 1 + [4] * 1)  # token 0 a special, never seen here
    counts = m.count_words(ids, skip={4})
    assert counts.tolist() == [0, 90, 8, 0, 0]  # 3: seen once < min_count 2; 4: a special
    p = m.keep_probability(counts)
    t_T = 0.01 * 98  # t · T, T = the 98 words that have a vector
    assert p[1] == pytest.approx((math.sqrt(90 / t_T) + 1) * t_T / 90)  # ≈ 0.115
    assert p[2] == pytest.approx(min(1.0, (math.sqrt(8 / t_T) + 1) * t_T / 8))  # ≈ 0.47
    assert p[0] == p[3] == p[4] == 0
    noise = m.noise_table(counts)
    w = np.array([0, 90 ** 0.75, 8 ** 0.75, 0, 0])
    np.testing.assert_allclose(noise.cum.numpy(), np.cumsum(w) / w.sum())
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = noise.draw(u)
    assert set(drawn.tolist()) == {1, 2}  # a word without a vector is never noise
    assert (drawn == 2).float().mean().item() == pytest.approx(w[2] / w.sum(), abs=0.02)


def test_noise_draws_are_the_binary_searchs_words_for_the_same_uniforms():
    """The guide table gives exactly torch.searchsorted(cum, u, right=True): a seed keeps its vectors. Counts with
    zero runs at both ends and inside (flat stretches of cum), a word of half the mass, many rare ones."""
    counts = np.zeros(3000, dtype=np.int64)
    counts[5:2990] = np.random.default_rng(0).zipf(1.5, 2985).clip(max=10**6)
    counts[100:140] = 0
    counts[7] = counts.sum()
    noise = Word2Vec(Word2VecConfig(vocab_size=len(counts))).noise_table(counts)
    assert noise.slices == 32768  # the power of two ≥ 8 slices a word
    cum = noise.cum
    u = torch.rand(200_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    # the uniforms at and right beside every word's cum and every slice edge, where a search turns
    edges = torch.cat([cum, torch.arange(noise.slices, dtype=torch.float64) / noise.slices])
    near = torch.cat([edges, torch.nextafter(edges, torch.tensor(0.0, dtype=torch.float64)),
                      torch.nextafter(edges, torch.tensor(1.0, dtype=torch.float64)), torch.tensor([0.0])])
    u = torch.cat([u, near[(near >= 0) & (near < 1)]])
    drawn = noise.draw(u.view(-1, 1)).view(-1)
    assert torch.equal(drawn, torch.searchsorted(cum, u, right=True).clamp_(max=len(cum) - 1))
    assert (torch.from_numpy(counts)[drawn] > 0).all()  # never a word without a vector
    assert noise.draw(u[:10].view(2, 5)).shape == (2, 5)
    # as a vocabulary far past GUIDE_MAX: most draws fall in a slice that must be searched
    assert torch.equal(NoiseTable(cum, slices=64).draw(u), drawn)


def test_windows_stay_inside_sentences_and_a_window_of_one_pairs_neighbours():
    m = Word2Vec(Word2VecConfig(vocab_size=10, dim=2, window=1))
    words, sentence = np.array([5, 6, 7, 8, 9]), np.array([0, 0, 0, 1, 1])
    centre, context = m._examples(words, sentence, 0, 5, np.random.default_rng(0))
    assert sorted(zip(centre.tolist(), context.tolist())) == [(5, 6), (6, 5), (6, 7), (7, 6), (8, 9), (9, 8)]
    m.cfg.window = 3
    centre, context = m._examples(np.arange(40), np.arange(40) // 8, 0, 40, np.random.default_rng(1))  # word = position
    assert (centre // 8 == context // 8).all()  # sentences of 8 words
    assert set((context - centre).abs().tolist()) == {1, 2, 3}  # every reach 1..window is drawn, none beyond
    m.cfg.arch, m.cfg.window = "cbow", 1
    c, ctx, mask = m._examples(words, sentence, 0, 5, np.random.default_rng(0))
    rows = {int(a): sorted(int(x) for x, ok in zip(r, k) if ok) for a, r, k in zip(c, ctx, mask)}
    assert rows == {5: [6], 6: [5, 7], 7: [6], 8: [9], 9: [8]}


def test_training_puts_words_of_the_same_contexts_together():
    # two topics that never share a sentence: after training, words of one topic are nearer each other
    rng = np.random.default_rng(0)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    sents = [rng.choice(a if i % 2 else b, 6) for i in range(400)]
    m = Word2Vec(Word2VecConfig(vocab_size=9, dim=8, window=2, min_count=1, sample=0, epochs=5, alpha=0.05, batch_size=64))
    torch.manual_seed(0)
    with torch.no_grad():
        s = m.train_ids(np.concatenate(sents), np.full(len(sents), 6), skip={0}, seed=0)
    assert s["vocab"] == 8 and s["epoch_loss"][-1] < s["epoch_loss"][0]
    v = m.input_vectors.numpy()
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    sim = v @ v.T
    within = np.mean([sim[i, j] for g in (a, b) for i in g for j in g if i != j])
    across = np.mean([sim[i, j] for i in a for j in b])
    assert within > across + 0.5
    words, vectors = m.word_vectors([f"w{i}" for i in range(9)])
    assert sorted(words) == [f"w{i}" for i in range(1, 9)] and vectors.shape == (8, 8) and vectors.dtype == np.float32


@pytest.mark.parametrize("recipe", ["word2vec-sg", "word2vec-cbow"])
def test_run_fits_exports_and_scores(recipe, tmp_path):
    corpus = tiny_corpus(tmp_path / "c.txt")
    res = run("pretrain", "--recipe", recipe, "--data", corpus, "--out", tmp_path / "w2v",
              "--set", "model.dim=16", "--set", "model.epochs=2")
    assert res.exit_code == 0, res.output
    out = tmp_path / "vectors.txt"
    res = run("export", tmp_path / "w2v", "--format", "word2vec", "--out", out)
    assert res.exit_code == 0, res.output
    words, vectors = read_word2vec(out)
    assert out.read_text().splitlines()[0] == f"{len(words)} 16" and "the" in words and vectors.shape == (len(words), 16)
    q = tmp_path / "q.txt"
    q.write_text(": toy\ncat mat dogs home\nthe cat a mat\nzebra cat dogs mat\n")
    ws = tmp_path / "ws.tsv"
    ws.write_text("# word1\tword2\tscore\ncat\tdogs\t7\ncat\tmat\t3\nhome\taway\t1\nzebra\tcat\t2\n")
    scored = [run("eval-vectors", src, "--analogies", q, "--similarity", ws, "--json") for src in (tmp_path / "w2v", out)]
    assert all(r.exit_code == 0 for r in scored), scored[0].output
    import json

    a, b = (json.loads(r.stdout) for r in scored)
    assert a["analogies"]["sections"] == b["analogies"]["sections"]  # the run and its export score the same
    assert a["analogies"]["oov"] == 1 and a["analogies"]["scored"] == 2 and a["similarity"]["oov"] == 1
    assert a["similarity"]["spearman"] == pytest.approx(b["similarity"]["spearman"])
    gensim = pytest.importorskip("gensim")
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(out))
    np.testing.assert_array_equal(kv.vectors, vectors)
    assert kv.index_to_key == words


def test_a_word2vec_run_refuses_perplexity_and_generation_in_one_line(tmp_path):
    res = run("pretrain", "--recipe", "word2vec-sg", "--data", tiny_corpus(tmp_path / "c.txt"), "--out", tmp_path / "w",
              "--set", "model.dim=4", "--set", "model.epochs=1")
    assert res.exit_code == 0, res.output
    assert_clean_error(run("eval-ppl", tmp_path / "c.txt", "--model", tmp_path / "w"), "no left-to-right perplexity")
    assert_clean_error(run("generate", tmp_path / "w", "--prompt", "the"), "cannot generate")
    assert_clean_error(run("export", tmp_path / "w", "--format", "arpa", "--out", tmp_path / "x.arpa"), "arpa")


def test_other_runs_have_no_word_vectors(tmp_path):
    res = run("pretrain", "--recipe", "ngram-bigram-addk", "--data", tiny_corpus(tmp_path / "c.txt"), "--out", tmp_path / "ng")
    assert res.exit_code == 0, res.output
    q = tmp_path / "q.txt"
    q.write_text(": s\na b c d\n")
    assert_clean_error(run("eval-vectors", tmp_path / "ng", "--analogies", q), "no static word vectors")
    assert_clean_error(run("export", tmp_path / "ng", "--format", "word2vec", "--out", tmp_path / "v.txt"),
                       "no static word vectors")


def test_settings_are_checked_at_load():
    from plmcli.config import load_recipe
    from plmcli.errors import PlmError

    with pytest.raises(PlmError, match="model.min_alpha 0.5 exceeds model.alpha 0.025"):
        load_recipe("word2vec-sg", ["model.min_alpha=0.5"])
    with pytest.raises(PlmError, match="model.arch 'glove' is not one of skip-gram, cbow"):
        load_recipe("word2vec-sg", ["model.arch=glove"])
