"""Length-grouped training order: a permutation per epoch, bands of similar lengths, random access, the same
samples at the same positions whatever the micro batch."""

import numpy as np
import pytest

from plmcli.data.batching import GROUP_SIZE, BatchStream, EpochOrder, LengthGroupedOrder


def skewed_lengths(n, seed=0):
    """Sentence-like lengths: most short, a long tail (SST-2's shape)."""
    return np.minimum(2 + np.random.default_rng(seed).lognormal(2.5, 0.8, n).astype(np.int64), 128)


def stream(n, B, lengths=None, seed=0, rank=0, world=1, shuffle=True):
    """A stream whose batches are the (epoch, index) pairs it picks."""
    return BatchStream(n, B, lambda epochs, idx: list(zip(epochs, idx)), seed, rank, world, shuffle, lengths=lengths)


def padding(lengths, batches) -> tuple[int, int]:
    """(real tokens, padded positions) of batches of sample indices, each padded to its longest."""
    real = sum(int(lengths[b].sum()) for b in batches)
    return real, sum(len(b) * int(lengths[b].max()) for b in batches)


@pytest.mark.parametrize("n,B,window", [(1000, 8, 5), (1003, 7, 4), (50, 8, 50), (5, 8, 2), (64, 1, 3)])
def test_every_sample_once_per_epoch(n, B, window):
    order = LengthGroupedOrder(skewed_lengths(n), seed=3, group=B, window=window)
    for epoch in range(4):
        picks = [order(p) for p in range(epoch * n, (epoch + 1) * n)]
        assert {e for e, _ in picks} == {epoch}
        assert sorted(i for _, i in picks) == list(range(n))


def test_batches_of_a_window_do_not_overlap_in_length_in_every_epoch():
    """Also in epochs that start mid-band (n % B != 0): each full band of the stream is one sorted slice of
    its window, so two bands of a window never interleave in length."""
    n, B, window = 1003, 8, 5
    lengths = np.random.default_rng(1).permutation(n) + 1  # distinct lengths: the check is exact
    order = LengthGroupedOrder(lengths, seed=0, group=B, window=window)
    for epoch in range(3):
        head = (-epoch * n) % B
        start = epoch * n + head  # the epoch's first band boundary
        for w in range(start, (epoch + 1) * n - B * window + 1, B * window):
            spans = sorted((lengths[[order(p)[1] for p in range(b, b + B)]].min(),
                            lengths[[order(p)[1] for p in range(b, b + B)]].max()) for b in range(w, w + B * window, B))
            assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:])), (epoch, w)
            # ... and the window's bands are not left in length order: they are shuffled
            firsts = [lengths[order(b)[1]] for b in range(w, w + B * window, B)]
            assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)


def test_padding_share_drops_on_skewed_lengths():
    n, B = 4096, 32
    lengths = skewed_lengths(n)
    batches = {}
    for name, lens in (("plain", None), ("grouped", lengths)):
        s = stream(n, B, lens, seed=7)
        batches[name] = [np.array([i for _, i in s[k]]) for k in range(n // B)]
    assert sorted(np.concatenate(batches["grouped"])) == list(range(n))
    plain_real, plain_total = padding(lengths, batches["plain"])
    real, total = padding(lengths, batches["grouped"])
    assert real == plain_real == int(lengths.sum())
    assert 1 - plain_real / plain_total == pytest.approx(0.736, abs=1e-3)  # random batches: mostly padding
    assert 1 - real / total == pytest.approx(0.062, abs=1e-3)  # sorted within windows of 50 bands of 64 (4096 // 50, a power of two)


def test_a_pure_function_of_seed_and_position():
    n, B, lengths = 500, 6, skewed_lengths(500)
    a, b = stream(n, B, lengths, seed=11), stream(n, B, lengths, seed=11)
    read = [a[k] for k in range(300)]  # five epochs, read in order
    assert b[250] == read[250] and b[7] == read[7] and b[120] == read[120]  # a fresh stream, any position: resume
    assert read != [stream(n, B, lengths, seed=12)[k] for k in range(300)]
    # Two processes read micro-batches 2k and 2k+1 of the one-process stream.
    ranks = [stream(n, B, lengths, seed=11, rank=r, world=2) for r in (0, 1)]
    assert [ranks[g % 2][g // 2] for g in range(300)] == read


def test_evaluation_reads_in_order_and_plain_streams_are_unchanged():
    n, lengths = 20, skewed_lengths(20)
    ev = stream(n, 8, lengths, shuffle=False)
    assert [i for k in range(3) for _, i in ev[k]] == list(range(n)) and ev[3] is None
    plain, order = stream(n, 8), EpochOrder(n, 0)
    assert plain[3] == [order(p) for p in range(24, 32)]
    with pytest.raises(ValueError, match="3 lengths for 20 samples"):
        stream(n, 8, lengths[:3])


@pytest.mark.parametrize("n", [1000, 40])
def test_an_optimizer_step_reads_the_same_samples_however_its_batch_is_split(n):
    """Global batch 32: one micro-batch of 32, four of 8, or two processes × two of 8 read the same samples in
    the same order at every step (the bands are GROUP_SIZE samples, not micro-batches)."""
    lengths = skewed_lengths(n)
    whole = stream(n, 32, lengths, seed=5)
    steps = [whole[s] for s in range(3 * n // 32)]  # three epochs
    quarters = stream(n, 8, lengths, seed=5)
    assert [sum((quarters[4 * s + j] for j in range(4)), []) for s in range(len(steps))] == steps
    ranks = [stream(n, 8, lengths, seed=5, rank=r, world=2) for r in (0, 1)]
    assert [ranks[0][2 * s] + ranks[1][2 * s] + ranks[0][2 * s + 1] + ranks[1][2 * s + 1] for s in range(len(steps))] == steps
    assert whole.order.group == {1000: 16, 40: 1}[n] and GROUP_SIZE == 256  # bands of a size the corpus sets
