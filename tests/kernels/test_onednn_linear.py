"""plmcli.kernels.onednn: oneDNN's linears give F.linear's numbers (to rounding) and its gradients, and step
aside wherever they do not apply (tests/kernels/test_kernel_conformance.py holds every kernel to its torch op)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plmcli.kernels.onednn as onednn_module
from plmcli.kernels import (ACTIVATIONS, Linear, linear, onednn_available, onednn_enabled, packed_cache, packed_weights,
                            switched, takes_onednn)
from plmcli.models.lm_loss import linear_cross_entropy

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear")


def _inputs(seed=0, shape=(3, 5, 24), out=40):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out, shape[-1], generator=g) * 0.2
    b = torch.randn(out, generator=g)
    return x, w, b


@needs_onednn
@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
@pytest.mark.parametrize("with_bias", [True, False])
def test_no_grad_linear_equals_f_linear_with_the_activation_fused(activation, with_bias):
    x, w, b = _inputs()
    b = b if with_bias else None
    assert takes_onednn(x, w, b)
    with torch.no_grad():
        got = linear(x, w, b, activation)
    ref = F.linear(x, w, b)
    ref = ref if activation is None else ACTIVATIONS[activation](ref)
    assert got.shape == (3, 5, 40)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_strided_inputs_and_weight_slices():
    x, w, b = _inputs(1, shape=(2, 9, 16), out=48)
    with torch.no_grad():
        # causal_tail's query rows and the q / kv halves of a fused QKV weight
        torch.testing.assert_close(linear(x[:, 4:], w[:16], b[:16]), F.linear(x[:, 4:], w[:16], b[:16]))
        torch.testing.assert_close(linear(x.transpose(0, 1), w[16:], None), F.linear(x.transpose(0, 1), w[16:]))


@needs_onednn
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
@pytest.mark.parametrize("frozen", ["none", "weight", "input"])
def test_gradients_equal_f_linears(activation, frozen):
    x, w, b = _inputs(2)
    xs = [x.clone().requires_grad_(frozen != "input") for _ in range(2)]
    ws = [w.clone().requires_grad_(frozen != "weight") for _ in range(2)]
    bs = [b.clone().requires_grad_(frozen != "weight") for _ in range(2)]
    g = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(3))
    ours = linear(xs[0], ws[0], bs[0], activation)
    ref = F.linear(xs[1], ws[1], bs[1])
    ref = ref if activation is None else ACTIVATIONS[activation](ref)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    (ours * g).sum().backward()
    (ref * g).sum().backward()
    for a, r in [(xs[0], xs[1]), (ws[0], ws[1]), (bs[0], bs[1])]:
        assert (a.grad is None) == (r.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, r.grad, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_a_model_trains_the_same_on_onednn_and_on_f_linear():
    def run(on: bool) -> list[float]:
        torch.manual_seed(0)
        net = nn.Sequential(Linear(8, 32), nn.GELU(), Linear(32, 4))
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
        losses = []
        with switched(on):
            for _ in range(60):
                loss = F.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses

    on, off = run(True), run(False)
    assert on[-1] < 0.5 * on[0]
    assert on == pytest.approx(off, rel=1e-4)


def test_steps_aside_where_onednn_does_not_apply():
    x, w, b = _inputs(4)
    assert not takes_onednn(x.double(), w.double(), b.double())
    assert not takes_onednn(x.bfloat16(), w.bfloat16(), b.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not takes_onednn(x, w, b)
        got = linear(x, w, b, "relu")
        assert got.dtype == torch.bfloat16  # autocast's bf16 linear, as F.linear under autocast
    with switched(False):
        assert not takes_onednn(x, w, b)
        with torch.no_grad():
            assert torch.equal(linear(x, w, b, "gelu"), F.gelu(F.linear(x, w, b)))  # bitwise: F.linear itself
    assert takes_onednn(x, w, b) == onednn_available()  # restored after the block


@needs_onednn
def test_empty_rows_and_zero_features():
    w, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, requires_grad=True)
    x = torch.randn(2, 0, 16, requires_grad=True)  # no rows: a batch with nothing masked
    y = linear(x, w, b)
    y.sum().backward()
    assert y.shape == (2, 0, 8) and x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))
    x0, w0 = torch.randn(3, 0), torch.randn(4, 0)  # no features: F.linear's answer, the bias
    assert not takes_onednn(x0, w0)
    assert torch.equal(linear(x0, w0, b[:4]), b[:4].expand(3, 4))


def test_a_torch_without_the_op_takes_f_linear(monkeypatch):
    monkeypatch.setattr(onednn_module, "_onednn_linear", None)
    x, w, b = _inputs(5)
    with switched(True):  # the switch on cannot turn on what is missing
        assert not onednn_enabled()
        assert not takes_onednn(x, w, b)
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))


@needs_onednn
@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
def test_packed_weights_give_the_same_numbers(activation):
    x, w, b = _inputs(6, shape=(4, 7, 32), out=96)
    w = nn.Parameter(w)
    with torch.no_grad():
        plain = [linear(x, w, b, activation), linear(x[:, 3:], w[:32], b[:32]), linear(x, w[32:], None, activation)]
        with packed_weights():
            packed = [linear(x, w, b, activation), linear(x[:, 3:], w[:32], b[:32]), linear(x, w[32:], None, activation)]
            again = linear(x, w, b, activation)  # from the cache
    for got, ref in zip(packed + [again], plain + plain[:1]):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


@needs_onednn
def test_packed_weights_one_copy_per_weight_a_new_one_when_it_changes():
    x, w, b = _inputs(7)
    w = nn.Parameter(w)
    with torch.no_grad(), packed_weights():
        cache = packed_cache()
        linear(x, w, b)
        linear(x[:1], w, b)
        linear(x, w[:20], b[:20])  # another view of the same memory: its own copy
        assert len(cache) == 2
        computed = linear(x, w * 2, b)  # new memory every forward pass: never copied
        assert len(cache) == 2
        torch.testing.assert_close(computed, F.linear(x, w * 2, b), rtol=1e-5, atol=1e-5)
        w.mul_(-1)  # changed in place: the copy made before must not be used
        torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        with packed_weights():  # nested: the same cache
            assert packed_cache() is cache
        assert packed_cache() is cache
    assert packed_cache() is None  # the copies go with the outermost context


@needs_onednn
def test_packed_weights_leave_gradients_and_odd_inputs_alone(monkeypatch):
    x, w, b = _inputs(8)
    w = nn.Parameter(w)
    with packed_weights():
        linear(x, w, b).sum().backward()  # with a gradient: the plain weight, never a copy
        assert packed_cache() == {}
        torch.testing.assert_close(w.grad, torch.ones(3, 5, 40).reshape(15, 40).t() @ x.reshape(15, 24))
        with torch.no_grad():
            empty = linear(torch.randn(2, 0, 24), w, b)
            strided = linear(x, w.detach().t().contiguous().t(), b)  # a transposed weight stays as it is
            assert list(packed_cache()) == [(w.data_ptr(), (40, 24), w._version)]
            monkeypatch.setattr(onednn_module, "_onednn_reorder", None)  # a torch without the reorder
            without = linear(x, w, b)
    assert empty.shape == (2, 0, 40)
    torch.testing.assert_close(strided, F.linear(x, w.detach(), b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(without, F.linear(x, w.detach(), b), rtol=1e-5, atol=1e-5)


def test_linear_keeps_nn_linears_parameters_and_names():
    m = Linear(6, 3)
    assert isinstance(m, nn.Linear)
    assert list(m.state_dict()) == list(nn.Linear(6, 3).state_dict()) == ["weight", "bias"]


@needs_onednn
@pytest.mark.parametrize("vocab", [50, 700])
def test_scoring_head_on_onednn_equals_cross_entropy(vocab):
    g = torch.Generator().manual_seed(6)
    h, w = torch.randn(300, 16, generator=g), torch.randn(vocab, 16, generator=g)
    y = torch.randint(0, vocab, (300,), generator=g)
    y[::7] = -100
    ref = F.cross_entropy(F.linear(h, w), y, ignore_index=-100)
    with torch.no_grad():
        on = linear_cross_entropy(h, w, y, chunk=128)
        with switched(False):
            off = linear_cross_entropy(h, w, y, chunk=128)
    torch.testing.assert_close(on, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(off, ref, rtol=1e-5, atol=1e-6)


@needs_onednn
@pytest.mark.parametrize("value, on", [("0", False), ("1", True), (None, True)])
def test_plm_cpu_kernels_in_the_environment_turns_the_onednn_linears_off(value, on):
    # A CPU whose own GEMM is faster than oneDNN's keeps torch's F.linear, with no code change.
    env = {k: v for k, v in os.environ.items() if k != "PLM_CPU_KERNELS"} | ({} if value is None else {"PLM_CPU_KERNELS": value})
    code = ("import torch, torch.nn.functional as F; from plmcli import kernels; x, w = torch.randn(4, 8), torch.randn(3, 8); "
            "print(kernels.onednn_enabled(), kernels.takes_onednn(x, w), torch.equal(kernels.linear(x, w), F.linear(x, w)))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == [str(on), str(on)]
    assert on or out[2] == "True"  # off: F.linear itself, bitwise
