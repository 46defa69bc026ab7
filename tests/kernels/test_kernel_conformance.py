"""Every kernel of plmcli.kernels against the plain torch op it stands for: the same numbers (fp32, forward and
gradients, to the rounding of another summation order), the same dropout semantics, and the one switch that
turns every kernel off (then the plain op itself runs)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from plmcli import kernels
from plmcli.kernels import ACTIVATIONS, Dropout, Linear, attention, drop_probability, dropout, linear, switched


def _linear_inputs(seed: int, rows=(4, 33), d_in=48, d_out=80):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*rows, d_in, generator=g, requires_grad=True)
    w = (torch.randn(d_out, d_in, generator=g) / d_in**0.5).requires_grad_()
    b = torch.randn(d_out, generator=g, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
@pytest.mark.parametrize("seed", [0, 1])
def test_linear_conforms_to_f_linear_forward_and_gradients(activation, seed):
    x, w, b = _linear_inputs(seed)
    ref_in = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    g = torch.randn(4, 33, 80, generator=torch.Generator().manual_seed(seed + 10))
    got = linear(x, w, b, activation)
    ref = F.linear(*ref_in)
    ref = ref if activation is None else ACTIVATIONS[activation](ref)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    (got * g).sum().backward()
    (ref * g).sum().backward()
    for ours, theirs in zip((x, w, b), ref_in):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-4)
    with torch.no_grad():  # the fused no-gradient path, with and without packed weights
        fused = linear(x, torch.nn.Parameter(w.detach()), b, activation)
        with kernels.packed_weights():
            packed = linear(x, torch.nn.Parameter(w.detach()), b, activation)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, ref, rtol=1e-5, atol=1e-5)


def test_linear_module_is_nn_linear():
    torch.manual_seed(0)
    m = Linear(16, 8)
    x = torch.randn(5, 16)
    torch.testing.assert_close(m(x), torch.nn.functional.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    assert list(m.state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_conforms_to_f_dropout_statistics_and_scaling(p):
    x = torch.randn(400, 500, requires_grad=True)
    torch.manual_seed(0)
    ours = dropout(x, p)
    torch.manual_seed(0)
    theirs = F.dropout(x, p)
    n = x.numel()
    for y in (ours, theirs):  # the same keep probability: within 5 standard errors of 1 − p
        kept = y != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5
        torch.testing.assert_close(y[kept], x[kept] / (1 - p))  # kept elements scaled by 1/(1 − p), as torch
    kept = ours != 0
    ours.backward(torch.ones_like(ours))
    torch.testing.assert_close(x.grad, kept.float() / (1 - p))  # the gradient goes through the same mask
    assert abs(drop_probability(p) - p) <= 2**-17  # the documented rounding of p


def test_dropout_edge_cases_match_f_dropout():
    x = torch.randn(6, 7)
    for p, training in [(0.0, True), (0.3, False)]:
        assert torch.equal(dropout(x, p, training), F.dropout(x, p, training))
    assert torch.equal(dropout(x, 1.0), F.dropout(x, 1.0))  # everything dropped
    assert Dropout(0.5).eval()(x) is x


def test_dropout_seeding_follows_torch_manual_seed():
    x = torch.ones(64, 64)
    torch.manual_seed(7)
    a = dropout(x, 0.2)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.2), a)  # a resumed run (torch's RNG restored) draws the same mask
    assert not torch.equal(dropout(x, 0.2), a)  # and each call a new one


def _heads(seed: int, T=9, S=9):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, 8, generator=g, requires_grad=True) for n in (T, S, S)]


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_attention_conforms_to_sdpa_forward_and_gradients(mask):
    """The explicit path (taken with dropout on a CPU; here dropout 1e-30, which drops nothing) against SDPA."""
    q, k, v = _heads(0)
    ref_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    keep = torch.tensor([[1] * 9, [1] * 5 + [0] * 4]).bool()[:, None, None, :]
    attn_mask = {"none": None, "causal": None, "bool": keep,
                 "float": torch.randn(2, 1, 9, 9, generator=torch.Generator().manual_seed(1))}[mask]
    kw = dict(causal=mask == "causal", scale=None if mask == "none" else 0.3)
    got = attention(q, k, v, attn_mask, 1e-30, **kw)
    ref = F.scaled_dot_product_attention(*ref_in, attn_mask=attn_mask, is_causal=kw["causal"], scale=kw["scale"])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(ref)
    (got * g).sum().backward()
    (ref * g).sum().backward()
    for ours, theirs in zip((q, k, v), ref_in):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)


def test_attention_dropout_is_kernels_dropout_of_the_probabilities():
    q, k, v = (t.detach() for t in _heads(2))
    torch.manual_seed(5)
    got = attention(q, k, v, None, 0.25)
    torch.manual_seed(5)
    ref = dropout(torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1), 0.25) @ v
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    seen = []
    with torch.no_grad():  # probabilities: the caller sees them before dropout, on the explicit path
        out = attention(q, k, v, probabilities=lambda p: seen.append(p) or p)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
    assert len(seen) == 1 and seen[0].shape == (2, 3, 9, 9)


def _counting(monkeypatch, module, name: str) -> list:
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_the_switch_turns_every_kernel_off(monkeypatch):
    """Off: each kernel calls the plain torch op (counted), bitwise its numbers; on again after the block."""
    linear_calls = _counting(monkeypatch, F, "linear")
    dropout_calls = _counting(monkeypatch, F, "dropout")
    sdpa_calls = _counting(monkeypatch, F, "scaled_dot_product_attention")
    x, w, b = (t.detach() for t in _linear_inputs(3))
    cpu = torch.device("cpu")
    with switched(False):
        assert not kernels.enabled(cpu) and not kernels.switched_on() and not kernels.onednn_enabled()
        assert not kernels.takes_onednn(x, w, b)
        with torch.no_grad(), kernels.packed_weights():
            y = linear(x, w, b, "gelu")
        assert linear_calls == ["linear"] and torch.equal(y, F.gelu(F.linear(x, w, b)))  # bitwise: F.linear itself
        torch.manual_seed(1)
        d = dropout(x, 0.3)
        assert dropout_calls == ["dropout"]
        q, k, v = (t.detach() for t in _heads(4))
        torch.manual_seed(2)
        a = attention(q, k, v, None, 0.3)
        assert sdpa_calls == ["scaled_dot_product_attention"] and dropout_calls == ["dropout"]
    torch.manual_seed(1)
    assert torch.equal(d, torch.nn.functional.dropout(x, 0.3))
    torch.manual_seed(2)
    assert torch.equal(a, F.scaled_dot_product_attention(q, k, v, dropout_p=0.3))  # SDPA's own draw, bitwise
    assert kernels.enabled(cpu) == (os.environ.get(kernels.ENV, "1") != "0")  # restored after the block
    assert not kernels.enabled(torch.device("meta"))  # never off a CPU


def test_the_switch_is_per_thread():
    import threading

    seen = []
    with switched(False):
        t = threading.Thread(target=lambda: seen.append(kernels.switched_on()))
        t.start()
        t.join()
        assert not kernels.switched_on()
    assert seen == [os.environ.get(kernels.ENV, "1") != "0"]  # a new thread starts from the process's default


@pytest.mark.parametrize("value, on", [("0", False), ("1", True)])
def test_plm_cpu_kernels_env_is_the_one_switch(value, on):
    code = ("import torch; from plmcli import kernels; x = torch.randn(8, 8); "
            "print(kernels.enabled(x.device), kernels.takes_onednn(x, x) == (kernels.onednn_available() and "
            "kernels.enabled(x.device)))")
    env = os.environ | {"PLM_CPU_KERNELS": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(on), "True"]
