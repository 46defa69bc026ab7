"""The linear-chain CRF against brute force over every tag path of tiny inputs."""

import itertools
import math

import pytest
import torch

from plmcli.models.crf import NEG, LinearChainCRF, bio_constraints

TAGS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]


def valid_bio(path, tags=TAGS) -> bool:
    for i, j in enumerate(path):
        t = tags[j]
        if t.startswith("I-") and (i == 0 or tags[path[i - 1]] not in ("B-" + t[2:], "I-" + t[2:])):
            return False
    return True


def brute_scores(crf, em, length, constrained):
    """{path: score} of every path over the first `length` positions, in float64. A disallowed
    transition scores NEG (as the CRF trains), or (`constrained` = "drop") its paths are left out."""
    K = crf.num_tags
    start, trans, end = (p.detach().double().clone() for p in (crf.start_transitions, crf.transitions, crf.end_transitions))
    if constrained:
        start[~crf.start_allowed], trans[~crf.allowed] = NEG, NEG
    out = {}
    for path in itertools.product(range(K), repeat=length):
        if constrained == "drop" and not valid_bio(path):
            continue
        s = start[path[0]] + sum(em[t, path[t]].double() for t in range(length)) + end[path[-1]]
        out[path] = float(s + sum(trans[path[t - 1], path[t]] for t in range(1, length)))
    return out


def make(constrained: bool, seed: int = 0):
    torch.manual_seed(seed)
    crf = LinearChainCRF(len(TAGS), *bio_constraints(TAGS)) if constrained else LinearChainCRF(len(TAGS))
    with torch.no_grad():  # larger than the init, so the transitions matter as much as the emissions
        for p in crf.parameters():
            p.normal_(0, 1.0)
    return crf


def batch(seed: int, lengths=(1, 2, 3, 4)):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    em = torch.randn(len(lengths), T, len(TAGS), generator=g) * 2
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return em, mask, lengths


@pytest.mark.parametrize("constrained", [False, True])
def test_log_partition_and_path_score_equal_brute_force(constrained):
    crf = make(constrained)
    em, mask, lengths = batch(1)
    logz = crf.log_partition(em, mask)
    for b, n in enumerate(lengths):
        paths = brute_scores(crf, em[b], n, constrained)
        want = math.log(sum(math.exp(s) for s in paths.values()))
        assert logz[b].item() == pytest.approx(want, abs=1e-4)
        if constrained:  # the NEG-penalised paths add exp(-10^4) = nothing: Z is the sum over valid paths
            valid = brute_scores(crf, em[b], n, "drop")
            assert logz[b].item() == pytest.approx(math.log(sum(math.exp(s) for s in valid.values())), abs=1e-4)
    # path_score of a given path (padding positions hold junk that must be ignored), and the NLL
    g = torch.Generator().manual_seed(2)
    tags = torch.randint(0, len(TAGS), mask.shape, generator=g)
    scores, nll = crf.path_score(em, tags, mask), crf.nll(em, tags, mask)
    for b, n in enumerate(lengths):
        path = tuple(tags[b, :n].tolist())
        want = brute_scores(crf, em[b], n, constrained)[path]
        assert scores[b].item() == pytest.approx(want, rel=1e-5, abs=1e-3)
        assert nll[b].item() == pytest.approx(logz[b].item() - want, rel=1e-5, abs=1e-3)


def test_probabilities_of_all_paths_sum_to_one_and_gradients_are_finite():
    crf = make(True, seed=3)
    em, mask, lengths = batch(4, lengths=(3, 2))
    em.requires_grad_(True)
    total = 0.0
    for path in itertools.product(range(len(TAGS)), repeat=3):
        tags = torch.tensor([list(path), list(path[:2]) + [0]])
        total += torch.exp(-crf.nll(em, tags, mask))[0].item()
    assert total == pytest.approx(1.0, abs=1e-5)
    valid = torch.tensor([[1, 3, 0], [2, 4, 0]])  # B-LOC I-LOC O ; B-PER I-PER
    crf.nll(em, valid, mask).sum().backward()
    assert torch.isfinite(em.grad).all() and torch.isfinite(crf.transitions.grad).all()
    # A disallowed entry is a constant: no gradient reaches its parameter.
    assert crf.transitions.grad[0, 3] == 0 and crf.start_transitions.grad[3] == 0
    assert em.grad[1, 2].abs().sum() == 0  # padding


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_viterbi_equals_brute_force_argmax(seed):
    crf = make(False, seed)
    em, mask, lengths = batch(10 + seed)
    best = crf.decode(em, mask)
    for b, n in enumerate(lengths):
        paths = brute_scores(crf, em[b], n, False)
        assert tuple(best[b, :n].tolist()) == max(paths, key=paths.get)
        assert (best[b, n:] == -1).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_constrained_viterbi_is_the_best_valid_path(seed):
    crf = make(True, seed)
    # Emissions that favour I- tags everywhere: the unconstrained best path would be invalid.
    em, mask, lengths = batch(20 + seed)
    em[..., 3:] += 3.0
    best = crf.decode(em, mask)
    free = make(False, seed).decode(em, mask)
    assert any(not valid_bio(tuple(free[b, :n].tolist())) for b, n in enumerate(lengths))
    for b, n in enumerate(lengths):
        path = tuple(best[b, :n].tolist())
        assert valid_bio(path)
        valid = brute_scores(crf, em[b], n, "drop")
        assert path == max(valid, key=valid.get)


def test_constrained_viterbi_never_outputs_invalid_bio_on_long_random_inputs():
    crf = make(True, seed=5)
    g = torch.Generator().manual_seed(6)
    em = torch.randn(64, 30, len(TAGS), generator=g) * 4
    lengths = torch.randint(1, 31, (64,), generator=g)
    mask = torch.arange(30)[None, :] < lengths[:, None]
    for row, n in zip(crf.decode(em, mask), lengths.tolist()):
        assert valid_bio(tuple(row[:n].tolist())) and (row[n:] == -1).all()


def test_bio_constraints():
    allowed, start = bio_constraints(TAGS)
    assert start.tolist() == [True, True, True, False, False]
    # I-LOC only after B-LOC / I-LOC; I-PER only after B-PER / I-PER; O and B-* after anything.
    assert allowed[:, 3].tolist() == [False, True, False, True, False]
    assert allowed[:, 4].tolist() == [False, False, True, False, True]
    assert allowed[:, :3].all()


def test_fp32_under_autocast():
    """bf16 scores (an autocast forward) go through the CRF in fp32: the same numbers as fp32 scores."""
    crf = make(True, seed=7)
    em, mask, _ = batch(8)
    em16 = em.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logz, best = crf.log_partition(em16, mask), crf.decode(em16, mask)
    assert logz.dtype == torch.float32
    torch.testing.assert_close(logz, crf.log_partition(em16.float(), mask))
    assert torch.equal(best, crf.decode(em16.float(), mask))
