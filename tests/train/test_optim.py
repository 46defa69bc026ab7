"""LAMB against a hand computation of You et al.'s Algorithm 2, and build_optimizer's groups."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from plmcli.errors import PlmError
from plmcli.train.optim import OPTIMIZERS, Lamb, build_optimizer


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)).double()
    with torch.no_grad():
        # LayerNorm starts at gain 1 / bias 0; move them so every tensor has a non-trivial step.
        model[1].weight.add_(torch.randn(4, dtype=torch.float64) * 0.1)
        model[1].bias.add_(torch.randn(4, dtype=torch.float64) * 0.1)
    return model


def _loss(model: nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    target = torch.randn(5, 4, generator=g, dtype=torch.float64)
    return ((model(x) - target) ** 2).mean()


def _reference_lamb(named, steps, lr, betas, eps, wd, decayed, max_trust, adapted=None):
    """Plain-torch LAMB: `named` maps name -> tensor; grads come from re-running the loss.

    Parameters in `decayed` get weight decay, those in `adapted` (all when None) the trust ratio.
    """
    b1, b2 = betas
    model = _tiny_model()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(named[n])
    m = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    v = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for t in range(1, steps + 1):
        model.zero_grad()
        _loss(model).backward()
        with torch.no_grad():
            for n, w in model.named_parameters():
                g = w.grad
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                m_hat = m[n] / (1 - b1**t)
                v_hat = v[n] / (1 - b2**t)
                r = m_hat / (v_hat.sqrt() + eps)
                if n in decayed:
                    r = r + wd * w
                w_norm, r_norm = w.norm().item(), r.norm().item()
                trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
                if max_trust is not None:
                    trust = min(trust, max_trust)
                if adapted is not None and n not in adapted:
                    trust = 1.0
                w -= lr * trust * r
    return dict(model.named_parameters())


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize("max_trust", [10.0, None])
def test_lamb_matches_hand_computation(steps, max_trust):
    model = _tiny_model()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr, betas, eps, wd = 0.05, (0.9, 0.99), 1e-6, 0.1
    opt = build_optimizer(model, "lamb", lr=lr, weight_decay=wd, betas=betas, eps=eps)
    for group in opt.param_groups:
        group["max_trust_ratio"] = max_trust
    for _ in range(steps):
        opt.zero_grad()
        _loss(model).backward()
        opt.step()

    # build_optimizer decays and layer-adapts only the Linear weight: bias and LayerNorm gain/bias
    # have ndim < 2 and take plain Adam steps, as in the LAMB authors' implementation.
    expected = _reference_lamb(start, steps, lr, betas, eps, wd, decayed={"0.weight"}, max_trust=max_trust,
                               adapted={"0.weight"})
    for n, p in model.named_parameters():
        assert not torch.equal(p, start[n]), n
        torch.testing.assert_close(p, expected[n], atol=1e-6, rtol=0)


def test_lamb_exempts_biases_and_norms_from_layer_adaptation():
    model = _tiny_model()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, "lamb", lr=0.05, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-6)
    assert {id(p): g["layer_adaptation"] for g in opt.param_groups for p in g["params"]} == {
        id(model[0].weight): True, id(model[0].bias): False, id(model[1].weight): False, id(model[1].bias): False}
    _loss(model).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    # First step: m̂ = g, v̂ = g², so r = g / (|g| + eps). Exempt tensors move by exactly lr · r ...
    for n in ("0.bias", "1.weight", "1.bias"):
        g = grads[n]
        torch.testing.assert_close(model.get_parameter(n).detach(), start[n] - 0.05 * g / (g.abs() + 1e-6),
                                   atol=1e-12, rtol=0)
    # ... and the matrix by lr · ‖w‖ in norm: the trust ratio rescales its whole update to its own norm.
    step = (model[0].weight - start["0.weight"]).norm().item()
    assert math.isclose(step, 0.05 * start["0.weight"].norm().item(), rel_tol=1e-9)


def test_lamb_trust_ratio_is_one_for_zero_weight():
    w = nn.Parameter(torch.zeros(6, dtype=torch.float64))
    g = torch.tensor([0.5, -1.0, 2.0, -0.25, 3.0, -4.0], dtype=torch.float64)
    opt = Lamb([w], lr=0.1, eps=1e-6, weight_decay=0.01)
    w.grad = g.clone()
    opt.step()
    # First step: m̂ = g, v̂ = g², so r = g / (|g| + eps); with ‖w‖ = 0 the trust ratio is 1.
    torch.testing.assert_close(w.detach(), -0.1 * g / (g.abs() + 1e-6), atol=1e-12, rtol=0)


def test_lamb_zero_update_leaves_weight_and_has_no_nan():
    w = nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = Lamb([w], lr=0.1, weight_decay=0.0)
    w.grad = torch.zeros(3, dtype=torch.float64)
    opt.step()
    assert torch.equal(w.detach(), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("max_trust, expected_trust", [(10.0, 10.0), (None, 100.0), (250.0, 100.0)])
def test_lamb_trust_ratio_clamp(max_trust, expected_trust):
    n = 10
    w0 = torch.full((n,), 100.0, dtype=torch.float64)
    g = torch.linspace(-1.0, 1.0, n, dtype=torch.float64) + 0.05  # no zero entries
    w = nn.Parameter(w0.clone())
    opt = Lamb([w], lr=0.01, eps=0.0, weight_decay=0.0, max_trust_ratio=max_trust)
    w.grad = g.clone()
    opt.step()
    # eps = 0: r = sign(g), ‖r‖ = √n, ‖w‖ = 100√n, so the raw trust ratio is exactly 100.
    r = g.sign()
    assert math.isclose(w0.norm().item() / r.norm().item(), 100.0)
    torch.testing.assert_close(w.detach(), w0 - 0.01 * expected_trust * r, atol=1e-12, rtol=0)


def test_lamb_without_bias_correction():
    w = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    g = torch.tensor([1.0, -2.0, 3.0, -4.0], dtype=torch.float64)
    opt = Lamb([w], lr=1.0, betas=(0.9, 0.999), eps=0.0, weight_decay=0.0, bias_correction=False)
    w.grad = g.clone()
    opt.step()
    # m = 0.1 g, v = 0.001 g²: r = 0.1 / √0.001 · sign(g)
    torch.testing.assert_close(w.detach(), -(0.1 / math.sqrt(0.001)) * g.sign(), atol=1e-12, rtol=0)


def test_lamb_state_dict_round_trip_gives_identical_next_step():
    model_a = _tiny_model()
    opt_a = build_optimizer(model_a, "lamb", lr=0.05, weight_decay=0.1)
    for _ in range(2):
        opt_a.zero_grad()
        _loss(model_a).backward()
        opt_a.step()

    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    model_b = copy.deepcopy(model_a)
    opt_b = build_optimizer(model_b, "lamb", lr=0.05, weight_decay=0.1)
    opt_b.load_state_dict(torch.load(buf, weights_only=True))

    for model, opt in ((model_a, opt_a), (model_b, opt_b)):
        opt.zero_grad()
        _loss(model).backward()
        opt.step()
    for (n, pa), pb in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(pa, pb), n
    assert opt_b.state[next(model_b.parameters())]["step"].item() == 3.0


def test_lamb_float32_runs_and_skips_params_without_grad():
    a = nn.Parameter(torch.randn(3, 3))
    b = nn.Parameter(torch.randn(3))
    opt = Lamb([a, b], lr=0.01)
    a.grad = torch.randn(3, 3)
    before = b.detach().clone()
    opt.step()
    assert torch.equal(b.detach(), before)
    assert b not in opt.state and torch.isfinite(a).all()


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_param_groups_split_weight_decay(name):
    model = _Tied()
    opt = build_optimizer(model, name, lr=1e-3, weight_decay=0.1, momentum=0.9)
    by_id = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert by_id[id(model.emb.weight)] == 0.1
    assert by_id[id(model.proj.weight)] == 0.1
    assert by_id[id(model.proj.bias)] == 0.0
    assert by_id[id(model.norm.weight)] == 0.0
    assert by_id[id(model.norm.bias)] == 0.0
    # tied weight counted once; frozen parameters left out
    assert len(by_id) == 5 == sum(len(g["params"]) for g in opt.param_groups)
    assert all(g["lr"] == 1e-3 for g in opt.param_groups)


def test_build_optimizer_kinds_and_options():
    model = _Tied()
    adamw = build_optimizer(model, "AdamW", lr=1e-3, betas=(0.9, 0.95), eps=1e-7)
    assert type(adamw) is torch.optim.AdamW
    g = adamw.param_groups[0]
    assert g["betas"] == (0.9, 0.95) and g["eps"] == 1e-7
    assert g["fused"] is True and not g["foreach"]  # CPU params: torch's fused kernel by default
    assert type(build_optimizer(model, "adam", lr=1e-3)) is torch.optim.Adam
    sgd = build_optimizer(model, "sgd", lr=0.1, momentum=0.9)
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9
    lamb = build_optimizer(model, "lamb", lr=1e-3, eps=1e-6)
    assert type(lamb) is Lamb and lamb.param_groups[0]["eps"] == 1e-6


def test_build_optimizer_errors():
    with pytest.raises(PlmError) as e:
        build_optimizer(_Tied(), "adafactor", lr=1e-3)
    for name in OPTIMIZERS:
        assert name in str(e.value)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(PlmError, match="no trainable"):
        build_optimizer(frozen, "adamw", lr=1e-3)
    with pytest.raises(PlmError):
        build_optimizer(nn.Linear(2, 2), "adamw", lr=-1.0)
