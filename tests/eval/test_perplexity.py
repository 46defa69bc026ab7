import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plmcli.eval.perplexity import report, sequence_nll, windows
from plmcli.models.gpt import GPT, GPTConfig


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, max_positions=16, n_layer=2, n_head=2, d_model=16, dropout=0, attn_dropout=0)).eval()


def brute_force(model, seq, L):
    """Every target j predicted from the L tokens before it, one forward pass per token."""
    total = 0.0
    with torch.no_grad():
        for j in range(1, len(seq)):
            ctx = torch.tensor(seq[max(0, j - L) : j])[None]
            total -= F.log_softmax(model(ctx)[0, -1], -1)[seq[j]].item()
    return total


def non_overlapping(model, seq, L):
    """Inputs seq[kL:(k+1)L] predicting seq[kL+1:(k+1)L+1]: nanoGPT-style x/y blocks."""
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(seq) - 1, L):
            x = torch.tensor(seq[s : min(s + L, len(seq) - 1)])[None]
            y = torch.tensor(seq[s + 1 : s + 1 + x.shape[1]])
            total += F.cross_entropy(model(x)[0], y, reduction="sum").item()
    return total


@pytest.mark.parametrize("n", [2, 5, 16, 17, 40, 41])
def test_every_token_scored_once(n):
    for L in (1, 4, 16):
        for S in range(1, L + 1):
            scored = []
            for s, e, k in windows(n, L, S):
                assert e - s <= L and k <= e - s
                scored.extend(range(e - k + 1, e + 1))
            assert sorted(scored) == list(range(1, n)), (n, L, S)


@pytest.mark.parametrize("L", [4, 7, 16])
def test_stride_one_equals_brute_force(model, L):
    seq = np.random.default_rng(0).integers(0, 50, 45).tolist()
    nll, n = sequence_nll(model, np.array(seq), L, 1, batch_size=5)
    assert n == 44
    assert nll == pytest.approx(brute_force(model, seq, L), rel=1e-5)


@pytest.mark.parametrize("L", [4, 16])
def test_stride_L_equals_non_overlapping_windows(model, L):
    seq = np.random.default_rng(1).integers(0, 50, 50).tolist()
    nll, n = sequence_nll(model, np.array(seq), L, L, batch_size=3)
    assert n == 49
    assert nll == pytest.approx(non_overlapping(model, seq, L), rel=1e-5)


def test_batching_does_not_change_result(model):
    seq = np.random.default_rng(2).integers(0, 50, 61)
    a = sequence_nll(model, seq, 16, 5, batch_size=1)
    b = sequence_nll(model, seq, 16, 5, batch_size=8)
    assert a[1] == b[1] and a[0] == pytest.approx(b[0], rel=1e-6)


def test_report_units():
    r = report(nll=100.0, tokens=50, n_bytes=200, n_words=40, stride=8, max_length=16)
    assert r["ppl"] == pytest.approx(math.exp(2.0))
    assert r["bpb"] == pytest.approx(100 / (math.log(2) * 200))
    assert r["word_ppl"] == pytest.approx(math.exp(100 / 40))
    assert set(r) == {"ppl", "nll", "tokens", "bpb", "bytes", "words", "word_ppl", "stride", "max_length"}
    assert r["bytes"] == 200


@pytest.mark.parametrize("L,S", [(16, 5), (16, 16), (7, 1)])
def test_fused_head_equals_the_logits_path(model, L, S):
    """A GPT module scores through forward(labels=): the output layer only at scored positions."""
    from plmcli.eval.perplexity import scores_labels

    assert scores_labels(model) and not scores_labels(lambda x: model(x))
    seq = np.random.default_rng(3).integers(0, 50, 70)
    fused = sequence_nll(model, seq, L, S, batch_size=4)
    generic = sequence_nll(lambda x: model(x), seq, L, S, batch_size=4)
    assert fused[1] == generic[1] == 69
    assert fused[0] == pytest.approx(generic[0], rel=1e-6)
