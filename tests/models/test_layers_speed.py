"""The CPU speed paths of plmcli.models.layers compute what the plain torch ops do."""

import pytest
import torch

from plmcli.kernels import Dropout, dropout
from plmcli.models.layers import MultiHeadAttention, attend


def test_dropout_rate_scale_gradient_and_seeding():
    x = torch.randn(1000, 1000, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 2e-3  # ~1e6 draws: the rate to ~5 standard errors
    torch.testing.assert_close(y[kept], x[kept] / 0.9)  # torch's scaling of the kept elements
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, kept.float() / 0.9)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1), y)  # torch.manual_seed fixes the mask
    assert not torch.equal(dropout(x, 0.1), y)  # and each call draws a new one
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert Dropout(0.5).eval()(x) is x and dropout(x, 1.0).abs().max().item() == 0.0
    half = dropout(torch.ones(7, 3, dtype=torch.bfloat16), 0.5)  # odd sizes, dtypes other than fp32
    assert half.dtype == torch.bfloat16 and set(half.unique().tolist()) <= {0.0, 2.0}
    for dtype in (torch.bfloat16, torch.float16, torch.float64):  # kept values scaled as torch scales them
        z = torch.randn(300, 300, dtype=dtype, requires_grad=True)
        out = dropout(z, 0.1)
        k = out != 0
        assert out.dtype == dtype and torch.equal(out[k], (z * (1 / 0.9))[k])
        out.backward(torch.ones_like(out))
        assert torch.equal(z.grad, k.to(dtype) * (1 / 0.9)), dtype


@pytest.mark.parametrize("causal", [True, False])
def test_training_attention_composite_equals_sdpa(causal):
    """Without dropout the training path (the explicit composite on a CPU) gives SDPA's output and gradients."""
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4)
    x = torch.randn(3, 10, 32, requires_grad=True)
    mask = None if causal else torch.tensor([[1] * 10, [1] * 7 + [0] * 3, [1] * 4 + [0] * 6]).bool()[:, None, None, :]
    m.attn_dropout = 1e-30  # > 0 takes the training composite, and drops nothing
    m.train()
    got = m(x, causal=causal, attn_mask=mask)
    g1 = torch.autograd.grad(got.sum(), [x, m.qkv.weight])
    m.attn_dropout = 0.0
    ref = m(x, causal=causal, attn_mask=mask)
    g2 = torch.autograd.grad(ref.sum(), [x, m.qkv.weight])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_causal_tail_is_the_tail_of_the_full_output():
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        torch.testing.assert_close(m.causal_tail(x, 5), m(x, causal=True)[:, 5:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", ["causal", "bool", "float"])
def test_attend_with_dropout_on_a_cpu_is_sdpa_with_plm_masks(mask):
    """XLNet's and Transformer-XL's relative-position biases (float masks, their own scale), BERT's padding
    (boolean) and GPT's causal mask: the CPU training composite computes what SDPA does."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attn_mask = {"causal": None, "bool": torch.rand(2, 1, 1, 5, generator=g) > 0.3,
                 "float": torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)}[mask]
    if mask == "bool":
        attn_mask[..., 0] = True
    scale = 0.3 if mask == "float" else None
    got = attend(q, k, v, attn_mask, 1e-30, causal=mask == "causal", scale=scale)  # > 0: the composite, drops nothing
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=mask == "causal",
                                                           scale=scale)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
