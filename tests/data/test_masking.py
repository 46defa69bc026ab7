import numpy as np
import pytest

from plmcli.data.masking import STRATEGIES, chinese_word_starts, mask_batch, select_units, span_pmf
from plmcli.errors import PlmError

MASK, VOCAB = 3, 30_000


def batch(rng, B=4000, T=128, word_prob=0.6):
    """Random ids, [CLS] at 0, [SEP] at the end of a random length, padding after; random word starts."""
    lengths = rng.integers(T // 2, T + 1, size=B)
    col = np.arange(T)[None, :]
    special = (col == 0) | (col >= lengths[:, None] - 1)
    ids = rng.integers(10, VOCAB, size=(B, T))
    return ids, special, rng.random((B, T)) < word_prob


def budgets(special, mask_prob, max_predictions=0):
    n = (~special).sum(1)
    b = np.maximum(1, np.round(n * mask_prob)).astype(int)
    return np.minimum(b, max_predictions) if max_predictions else b


def words_of(special, ws):
    """Word id of every maskable token (-1 for special tokens), words broken by special tokens."""
    prev_special = np.ones_like(special)
    prev_special[:, 1:] = special[:, :-1]
    starts = ~special & (ws | prev_special)
    wid = np.cumsum(starts.ravel()).reshape(special.shape) - 1
    return np.where(special, -1, wid)


def test_token_fraction_exact_budget_and_cap():
    rng = np.random.default_rng(0)
    ids, special, _ = batch(rng)
    _, target = mask_batch(ids, special, None, rng, mask_id=MASK, vocab_size=VOCAB)
    assert abs(target.sum() / (~special).sum() - 0.15) < 0.005
    assert (target.sum(1) == budgets(special, 0.15)).all()  # BERT's num_to_predict, exactly
    _, target = mask_batch(ids, special, None, rng, mask_id=MASK, vocab_size=VOCAB, max_predictions=12)
    assert (target.sum(1) == budgets(special, 0.15, 12)).all() and target.sum(1).max() == 12


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replacement_80_10_10_and_never_special(strategy):
    rng = np.random.default_rng(1)
    ids, special, ws = batch(rng)
    pool = np.arange(100, 200)
    masked, target = mask_batch(ids, special, ws, rng, strategy=strategy, mask_id=MASK, vocab_size=VOCAB,
                                random_ids=pool, max_predictions=20)
    assert not (target & special).any()
    assert (masked[~target] == ids[~target]).all()
    assert (target.sum(1) <= budgets(special, 0.15, 20)).all()
    to_mask = masked[target] == MASK
    rand = (masked[target] != MASK) & (masked[target] != ids[target])
    assert abs(to_mask.mean() - 0.8) < 0.015
    assert abs(rand.mean() - 0.1) < 0.015
    assert abs(1 - to_mask.mean() - rand.mean() - 0.1) < 0.015
    assert np.isin(masked[target][rand], pool).all()


def test_wwm_never_splits_a_word_and_is_bert_greedy():
    rng = np.random.default_rng(2)
    ids, special, ws = batch(rng, word_prob=0.5)
    _, target = mask_batch(ids, special, ws, rng, strategy="wwm", mask_id=MASK, vocab_size=VOCAB)
    wid = words_of(special, ws)
    valid = wid >= 0
    per_word = np.bincount(wid[valid], weights=target[valid])
    sizes = np.bincount(wid[valid])
    assert ((per_word == 0) | (per_word == sizes)).all()  # every word all-target or no-target
    assert abs(target.sum() / (~special).sum() - 0.15) < 0.005
    # Greedy skip: a word left out did not fit in the room the row had left at the end.
    slack = budgets(special, 0.15) - target.sum(1)
    assert (slack >= 0).all()
    word_row = np.bincount(wid[valid], weights=np.nonzero(valid)[0]) / sizes
    unpicked = per_word == 0
    assert (sizes[unpicked] > slack[word_row[unpicked].astype(int)]).all()


def test_whole_words_break_at_special_tokens():
    special = np.array([[1, 0, 0, 1, 0, 0, 1]], dtype=bool)
    ws = np.array([[0, 1, 0, 0, 0, 0, 0]], dtype=bool)  # "word" 1-2 and 4-5: the [SEP] at 3 ends the first
    seen = set()
    for seed in range(50):
        u = select_units(special, ws, np.random.default_rng(seed), strategy="wwm", mask_prob=0.5)
        seen.update(zip(u.start.tolist(), u.length.tolist()))
    assert seen == {(1, 2), (4, 2)}


def runs(target):
    """Lengths of the runs of consecutive targets."""
    x = np.pad(target, ((0, 0), (1, 1))).astype(np.int8)
    d = np.diff(x, axis=1)
    return np.nonzero(d == -1)[1] - np.nonzero(d == 1)[1]


def test_ngram_lengths_40_30_20_10():
    rng = np.random.default_rng(3)
    special = np.zeros((1000, 512), dtype=bool)
    special[:, [0, -1]] = True
    # Multi-token words: a unit of n words has n word starts.
    ws = rng.random(special.shape) < 0.7
    units = select_units(special, ws, rng, strategy="ngram", mask_prob=0.15)
    share = np.bincount(units.words, minlength=5)[1:5] / len(units.words)
    assert np.abs(share - [0.4, 0.3, 0.2, 0.1]).max() < 0.03
    # Seen from outside: word-run lengths of the targets (units rarely touch at a 4% rate).
    special = np.zeros((2000, 1024), dtype=bool)
    special[:, [0, -1]] = True
    ids = rng.integers(10, VOCAB, size=special.shape)
    _, target = mask_batch(ids, special, None, rng, strategy="ngram", mask_prob=0.04, mask_id=MASK, vocab_size=VOCAB)
    lengths = runs(target)
    share = np.bincount(lengths, minlength=5)[1:5] / len(lengths)
    assert np.abs(share - [0.4, 0.3, 0.2, 0.1]).max() < 0.03


def test_span_lengths_match_truncated_geometric():
    rng = np.random.default_rng(4)
    special = np.zeros((2000, 1024), dtype=bool)
    special[:, [0, -1]] = True
    units = select_units(special, None, rng, strategy="span", mask_prob=0.15)
    hist = np.bincount(units.words, minlength=11)[1:] / len(units.words)
    pmf = span_pmf(0.2, 10)
    assert units.words.max() <= 10
    # Only the one span per row cut at the budget departs from the pmf: ~1 in 80 spans here.
    assert np.abs(hist - pmf).max() < 0.015
    assert abs(units.words.mean() - (np.arange(1, 11) * pmf).sum()) < 0.1
    assert (units.length.sum() == budgets(special, 0.15).sum())  # one-token words: cut exactly at the budget


def test_span_replacement_decided_per_span():
    ids, special, ws = batch(np.random.default_rng(5), B=500)
    masked, target = mask_batch(ids, special, ws, np.random.default_rng(9), strategy="span", mask_id=MASK,
                                vocab_size=VOCAB)
    units = select_units(special, ws, np.random.default_rng(9), strategy="span")  # the same units
    assert units.length.sum() == target.sum() and target[units.row, units.start].all()
    kind = np.where(masked == MASK, 0, np.where(masked != ids, 1, 2))  # [MASK] / random / unchanged
    for r, s, n in zip(units.row, units.start, units.length):
        assert len(set(kind[r, s: s + n].tolist())) == 1


def test_span_cut_keeps_whole_words():
    rng = np.random.default_rng(6)
    ids, special, ws = batch(rng, B=2000)
    _, target = mask_batch(ids, special, ws, rng, strategy="span", mask_id=MASK, vocab_size=VOCAB)
    wid = words_of(special, ws)
    valid = wid >= 0
    per_word = np.bincount(wid[valid], weights=target[valid])
    assert ((per_word == 0) | (per_word == np.bincount(wid[valid]))).all()
    assert (target.sum(1) <= budgets(special, 0.15)).all()


def test_deterministic_for_a_seed():
    ids, special, ws = batch(np.random.default_rng(7), B=64)
    for strategy in STRATEGIES:
        a = mask_batch(ids, special, ws, np.random.default_rng(11), strategy=strategy, mask_id=MASK, vocab_size=VOCAB)
        b = mask_batch(ids, special, ws, np.random.default_rng(11), strategy=strategy, mask_id=MASK, vocab_size=VOCAB)
        assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


def test_empty_and_all_special_rows():
    special = np.ones((3, 8), dtype=bool)
    special[1, 1] = False  # one maskable token: budget max(1, round(0.15)) = 1
    ids = np.arange(24).reshape(3, 8)
    for strategy in STRATEGIES:
        masked, target = mask_batch(ids, special, None, np.random.default_rng(0), strategy=strategy,
                                    mask_id=MASK, vocab_size=VOCAB)
        assert target.sum() == 1 and target[1, 1]


def test_bad_arguments():
    ids, special, ws = batch(np.random.default_rng(8), B=4)
    with pytest.raises(PlmError, match="unknown masking strategy"):
        mask_batch(ids, special, ws, np.random.default_rng(0), strategy="bogus", mask_id=MASK, vocab_size=VOCAB)
    with pytest.raises(PlmError, match="mask_prob"):
        mask_batch(ids, special, ws, np.random.default_rng(0), mask_prob=1.0, mask_id=MASK, vocab_size=VOCAB)


def test_chinese_word_starts_follow_jieba():
    import jieba

    tokens = list("我爱北京天安门")
    words = jieba.lcut("".join(tokens), HMM=False)
    assert words == ["我", "爱", "北京", "天安门"]
    assert chinese_word_starts(tokens).tolist() == [True, True, True, False, True, False, False]
    # "##" pieces continue a word; other non-Chinese tokens are words of their own.
    mixed = ["我们", "喜", "欢", "bert", "##s", "和", "数", "据", "!"]
    assert chinese_word_starts(mixed).tolist() == [True, True, False, True, False, True, True, False, True]


def test_greedy_matches_the_sequential_pass_past_the_head_columns():
    from plmcli.data.masking import _greedy

    rng = np.random.default_rng(5)
    # Long units and small budgets: many skips, so rows still have room after the first 2·budget+8 columns.
    lengths = np.where(rng.random((64, 120)) < 0.8, rng.integers(1, 9, (64, 120)), 0)
    budget = rng.integers(0, 12, 64)
    want = np.zeros(lengths.shape, dtype=bool)
    for r in range(64):
        left = budget[r]
        for c in range(120):
            if 0 < lengths[r, c] <= left:
                want[r, c], left = True, left - lengths[r, c]
    got = np.zeros(lengths.size, dtype=bool)
    got[_greedy(np.tile(np.arange(120), (64, 1)), lengths.ravel(), budget.copy())] = True
    assert (got.reshape(lengths.shape) == want).all() and want[:, 2 * budget.max() + 8:].any()


def test_token_targets_break_key_ties_within_the_budget():
    from plmcli.data.masking import _token_targets

    class Tied:  # every key equal: a cutoff compare alone would take the whole row
        def random(self, shape, dtype=float):
            return np.zeros(shape, dtype=dtype)

    special = np.zeros((3, 10), dtype=bool)
    special[:, 0] = True
    chosen = _token_targets(special, np.array([2, 0, 5]), Tied())
    assert chosen.sum(1).tolist() == [2, 0, 5] and not chosen[:, 0].any()
