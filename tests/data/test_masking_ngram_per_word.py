"""masking ngram_per_word: the word-by-word walk — a decision at each word, a 1..4-word span 40/30/20/10."""

import numpy as np
import pytest

from plmcli.data.masking import mask_batch, select_units, start_prob
from plmcli.errors import PlmError

MASK, VOCAB = 3, 30_000


def rows(B, T, seed=0, word_prob=0.7):
    """[CLS] … [SEP] rows of random length (padding after) with multi-token words."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(T // 2, T + 1, size=B)
    col = np.arange(T)[None, :]
    special = (col == 0) | (col >= lengths[:, None] - 1)
    return rng.integers(10, VOCAB, size=(B, T)), special, rng.random((B, T)) < word_prob


def word_boundaries(special, ws):
    """(B, T+1) True where a word begins or ends: a word start, a special token, the row's end."""
    prev_special = np.ones_like(special)
    prev_special[:, 1:] = special[:, :-1]
    starts = ~special & (ws | prev_special)
    return np.concatenate([starts | special, np.ones((len(special), 1), dtype=bool)], axis=1)


def test_walk_by_hand():
    """p = 1 (a span starts at every decision): the spans tile each run from its first word; a span that
    would cross [SEP] is drawn from the lengths that fit (here only 1)."""
    special = np.array([[1, 0, 0, 0, 1, 0, 0, 0, 0, 1]], dtype=bool)
    units = select_units(special, None, np.random.default_rng(0), strategy="ngram_per_word", mask_prob=0.99,
                         ngram_probs=[0, 1], ngram_start_prob=1.0)
    order = np.argsort(units.start)
    assert units.start[order].tolist() == [1, 3, 5, 7] and units.words[order].tolist() == [2, 1, 2, 2]
    # A budget of 3 tokens: 3-grams from the first word, then nothing fits.
    special = np.zeros((1, 20), dtype=bool)
    _, target = mask_batch(np.arange(20)[None] + 10, special, None, np.random.default_rng(0), strategy="ngram_per_word",
                           mask_prob=0.15, ngram_probs=[0, 0, 1], ngram_start_prob=1.0, mask_id=MASK, vocab_size=VOCAB)
    assert target[0].tolist() == [True] * 3 + [False] * 17


def test_start_probability_gives_mask_prob_in_expectation():
    p = start_prob(0.15, [0.4, 0.3, 0.2, 0.1])  # E[n] = 2
    assert p == pytest.approx(0.15 / (2 * 0.85 + 0.15))
    assert p * 2 / (p * 2 + 1 - p) == pytest.approx(0.15)


def test_span_lengths_40_30_20_10():
    rng = np.random.default_rng(3)
    special = np.zeros((600, 1024), dtype=bool)
    special[:, [0, -1]] = True
    ws = rng.random(special.shape) < 0.7
    units = select_units(special, ws, rng, strategy="ngram_per_word", mask_prob=0.15)
    share = np.bincount(units.words, minlength=5)[1:5] / len(units.words)
    # Only the span cut at the budget (about 1 of 50 per row here) departs from the draw.
    assert units.words.max() <= 4 and np.abs(share - [0.4, 0.3, 0.2, 0.1]).max() < 0.02, share
    other = select_units(special, ws, rng, strategy="ngram_per_word", mask_prob=0.15, ngram_probs=[0.7, 0, 0.3])
    share = np.bincount(other.words, minlength=4)[1:4] / len(other.words)
    assert np.abs(share - [0.7, 0, 0.3]).max() < 0.025, share  # a 3-gram cut at the budget may keep 2 words


def test_spans_are_whole_words_and_never_overlap():
    ids, special, ws = rows(500, 128, seed=1)
    B, T = special.shape
    units = select_units(special, ws, np.random.default_rng(2), strategy="ngram_per_word", mask_prob=0.15,
                         max_predictions=20)
    bound = word_boundaries(special, ws)
    assert bound[units.row, units.start].all() and bound[units.row, units.start + units.length].all()
    covered = np.zeros((B, T), dtype=np.int64)
    starts_inside = np.zeros(len(units.row), dtype=np.int64)
    for j, (r, s, n) in enumerate(zip(units.row, units.start, units.length)):
        covered[r, s:s + n] += 1
        starts_inside[j] = bound[r, s:s + n].sum()  # word starts inside the span = its words
    assert covered.max() == 1 and not (covered.astype(bool) & special).any()
    assert (starts_inside == units.words).all() and ((units.words >= 1) & (units.words <= 4)).all()


def test_budget_is_respected_and_spent():
    ids, special, ws = rows(2000, 128, seed=4)
    n = (~special).sum(1)
    for cap in (0, 20):
        _, target = mask_batch(ids, special, ws, np.random.default_rng(5), strategy="ngram_per_word", mask_prob=0.15,
                               max_predictions=cap, mask_id=MASK, vocab_size=VOCAB)
        budget = np.maximum(1, np.round(n * 0.15)).astype(int)
        budget = np.minimum(budget, cap) if cap else budget
        got = target.sum(1)
        assert (got <= budget).all()
        assert got.sum() >= 0.97 * budget.sum()  # the rest: multi-token words that no longer fit
    # One-token words always fit: the budget is spent exactly.
    _, target = mask_batch(ids, special, None, np.random.default_rng(6), strategy="ngram_per_word", mask_prob=0.15,
                           mask_id=MASK, vocab_size=VOCAB)
    assert (target.sum(1) == np.maximum(1, np.round(n * 0.15))).all()


def test_replacement_is_decided_per_token():
    ids, special, ws = rows(3000, 128, seed=7)
    masked, target = mask_batch(ids, special, ws, np.random.default_rng(8), strategy="ngram_per_word",
                                mask_id=MASK, vocab_size=VOCAB)
    is_mask = masked[target] == MASK
    assert abs(is_mask.mean() - 0.8) < 0.015
    # Per token, not per span: a span of several tokens is often partly [MASK], partly not.
    units = select_units(special, ws, np.random.default_rng(8), strategy="ngram_per_word")
    long = [(r, s, n) for r, s, n in zip(units.row, units.start, units.length) if n >= 3]
    mixed = sum(0 < (masked[r, s:s + n] == MASK).sum() < n for r, s, n in long)
    assert mixed > 0.3 * len(long)


def test_seeded_determinism():
    ids, special, ws = rows(64, 128, seed=9)
    a = mask_batch(ids, special, ws, np.random.default_rng(11), strategy="ngram_per_word", mask_id=MASK, vocab_size=VOCAB)
    b = mask_batch(ids, special, ws, np.random.default_rng(11), strategy="ngram_per_word", mask_id=MASK, vocab_size=VOCAB)
    c = mask_batch(ids, special, ws, np.random.default_rng(12), strategy="ngram_per_word", mask_id=MASK, vocab_size=VOCAB)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert not (a[1] == c[1]).all()


def test_bad_settings():
    special = np.zeros((1, 8), dtype=bool)
    with pytest.raises(PlmError, match="summing to 1"):
        select_units(special, None, np.random.default_rng(0), strategy="ngram_per_word", ngram_probs=[0.5, 0.3])
    with pytest.raises(PlmError, match="ngram_start_prob"):
        select_units(special, None, np.random.default_rng(0), strategy="ngram_per_word", ngram_start_prob=1.5)


def test_recipe_and_the_objective_setting():
    from plmcli.config import load_recipe

    r = load_recipe("bert-mini-ngram")
    assert r.objective.masking == "ngram_per_word" and list(r.objective.ngram_probs) == [0.4, 0.3, 0.2, 0.1]
    with pytest.raises(PlmError, match="ngram_per_word"):
        load_recipe("bert-mini", ["objective.masking=ngram_per_ward"])


TINY_BERT_NGRAM = """\
extends: bert-mini-ngram
model: {n_layer: 1, n_head: 2, d_model: 16, max_positions: 32}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 32, global_batch_size: 4, max_steps: 2, eval_every: 0, eval_batches: 0, save_every: 0, log_every: 1}
"""


@pytest.mark.parametrize("dynamic", [False, True])
def test_pretrain_with_ngram_per_word_static_and_dynamic(tmp_path, dynamic):
    import json

    from helpers import tiny_corpus
    from plmcli import api

    extra = "objective: {dynamic: true, pairs: none, max_predictions: 0}\n" if dynamic else "objective: {dupe_factor: 1}\n"
    (tmp_path / "r.yaml").write_text(TINY_BERT_NGRAM + extra)
    s = api.pretrain(str(tmp_path / "r.yaml"), [str(tiny_corpus(tmp_path / "c.txt", 40))], str(tmp_path / "run"))
    assert s["steps"] == 2 and np.isfinite(s["train_loss"])
    if not dynamic:  # the static data records the walk and its n-gram law (they are part of its cache key)
        metas = [json.loads(p.read_text()) for p in (tmp_path / "cache").rglob("meta.json")]
        mlm = [m for m in metas if m.get("format") == "plm-mlm"]
        assert mlm and mlm[0]["masking"] == "ngram_per_word" and mlm[0]["ngram_probs"] == [0.4, 0.3, 0.2, 0.1]
