"""Schedules by hand at chosen steps, nanoGPT's get_lr step for step, and checkpointing."""

from __future__ import annotations

import io
import math
import pickle

import pytest
import torch

from plmcli.errors import PlmError
from plmcli.train.schedule import SCHEDULES, build_scheduler


def _opt(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(name: str, warmup: int, total: int, n: int, **kw) -> list[float]:
    """lr used by optimizer steps 0..n-1, stepping the scheduler after each, as a loop does."""
    opt = _opt()
    sched = build_scheduler(opt, name, warmup, total, **kw)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


# warmup 4, total 12, decaying phase has 8 steps: progress at step s ≥ 4 is (s - 4) / 8.
@pytest.mark.parametrize(
    "name, kw, expected",
    [
        ("linear", {}, {0: 1 / 5, 3: 4 / 5, 4: 1.0, 6: 0.75, 8: 0.5, 12: 0.0, 20: 0.0}),
        ("linear", {"min_lr_ratio": 0.2}, {0: 0.2, 4: 1.0, 8: 0.6, 12: 0.2, 30: 0.2}),
        ("cosine", {}, {1: 2 / 5, 4: 1.0, 6: 0.5 * (1 + math.cos(math.pi / 4)), 8: 0.5, 12: 0.0, 13: 0.0}),
        ("cosine", {"min_lr_ratio": 0.1}, {4: 1.0, 8: 0.1 + 0.5 * 0.9, 12: 0.1, 99: 0.1}),
        ("constant", {}, {0: 1 / 5, 3: 4 / 5, 4: 1.0, 12: 1.0, 100: 1.0}),
        ("polynomial", {"power": 2.0}, {2: 3 / 5, 4: 1.0, 6: 0.75**2, 8: 0.25, 12: 0.0, 40: 0.0}),
        ("polynomial", {"power": 0.5, "min_lr_ratio": 0.5}, {8: 0.5 + 0.5 * math.sqrt(0.5), 12: 0.5}),
        ("polynomial", {}, {6: 0.75, 10: 0.25}),  # power 1 is linear
        # inverse-sqrt ignores total: √(4 / step) after warmup
        ("inverse-sqrt", {}, {0: 1 / 5, 3: 4 / 5, 4: 1.0, 16: 0.5, 64: 0.25, 400: 0.1}),
        ("inverse-sqrt", {"min_lr_ratio": 0.3}, {16: 0.5, 400: 0.3}),
    ],
)
def test_schedule_values_by_hand(name, kw, expected):
    lrs = _lrs(name, 4, 12, max(expected) + 1, **kw)
    for step, value in expected.items():
        assert math.isclose(lrs[step], value, rel_tol=1e-12, abs_tol=1e-15), (step, lrs[step], value)


def test_no_warmup_starts_at_full_lr():
    assert _lrs("linear", 0, 4, 5) == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert _lrs("inverse-sqrt", 0, 0, 5) == pytest.approx([1.0, 1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5])
    # warmup == total: the decay is already over when warmup ends
    assert _lrs("cosine", 3, 3, 5, min_lr_ratio=0.1) == pytest.approx([0.25, 0.5, 0.75, 0.1, 0.1])


def test_cosine_equals_nanogpt_get_lr():
    learning_rate, min_lr, warmup_iters, lr_decay_iters = 1e-3, 1e-4, 100, 2000

    def get_lr(it):  # nanoGPT train.py
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        assert 0 <= decay_ratio <= 1
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    opt = _opt(learning_rate)
    sched = build_scheduler(opt, "cosine", warmup_iters, lr_decay_iters, min_lr_ratio=min_lr / learning_rate)
    for it in range(2200):
        lr = opt.param_groups[0]["lr"]
        # same formula, factored as base·factor: equal up to float rounding
        assert math.isclose(lr, get_lr(it), rel_tol=1e-13), (it, lr, get_lr(it))
        assert math.isclose(sched.get_last_lr()[0], lr)
        opt.step()
        sched.step()


def test_state_dict_round_trip_resumes_the_curve():
    opt = _opt(0.5)
    sched = build_scheduler(opt, "cosine", 10, 50, min_lr_ratio=0.1)
    for _ in range(17):
        opt.step()
        sched.step()
    buf = io.BytesIO()
    torch.save(sched.state_dict(), buf)
    buf.seek(0)

    # A fresh process builds the scheduler from the recipe, then loads the saved state.
    opt2 = _opt(0.5)
    sched2 = build_scheduler(opt2, "cosine", 10, 50, min_lr_ratio=0.1)
    sched2.load_state_dict(torch.load(buf, weights_only=False))
    opt2.param_groups[0]["lr"] = sched2.get_last_lr()[0]  # what accelerate/optimizer state restores
    assert sched2.last_epoch == 17
    for _ in range(40):
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        for o, s in ((opt, sched), (opt2, sched2)):
            o.step()
            s.step()


def test_state_dict_carries_the_schedule_fields():
    sched = build_scheduler(_opt(), "polynomial", 3, 30, min_lr_ratio=0.05, power=2.0)
    (fields,) = sched.state_dict()["lr_lambdas"]
    assert fields == {"name": "polynomial", "warmup_steps": 3, "total_steps": 30, "min_lr_ratio": 0.05, "power": 2.0,
                      "decay_factor": 0.5, "decay_every": 1000, "decay_start": 0}


def test_step_schedule_is_zarembas_epoch_decay():
    # Zaremba et al. small: lr 1 for epochs 0-3, then lr · 0.5^(epoch + 1 - 4); here an "epoch" is 3 steps.
    E = 3
    lrs = _lrs("step", 0, 0, 13 * E, decay_factor=0.5, decay_every=E, decay_start=4 * E)
    for step, lr in enumerate(lrs):
        epoch = step // E
        assert lr == 0.5 ** max(epoch + 1 - 4, 0), (step, lr)


def test_step_schedule_with_warmup_floor_and_state():
    lrs = _lrs("step", 2, 0, 12, decay_factor=0.1, decay_every=2, decay_start=4, min_lr_ratio=0.005)
    assert lrs == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.005, 0.005, 0.005, 0.005])
    sched = build_scheduler(_opt(), "step", 0, 0, decay_factor=0.8, decay_every=7, decay_start=42)
    (fields,) = sched.state_dict()["lr_lambdas"]
    assert (fields["decay_factor"], fields["decay_every"], fields["decay_start"]) == (0.8, 7, 42)
    for bad in ({"decay_factor": 0.0}, {"decay_factor": 1.5}, {"decay_every": 0}, {"decay_start": -1}):
        with pytest.raises(PlmError):
            build_scheduler(_opt(), "step", 0, 0, **bad)


@pytest.mark.parametrize("name", SCHEDULES)
def test_scheduler_pickles(name):
    opt = _opt()
    sched = build_scheduler(opt, name, 2, 10)
    for _ in range(5):
        opt.step()
        sched.step()
    clone = pickle.loads(pickle.dumps(sched))
    assert clone.last_epoch == 5
    assert [clone.lr_lambdas[0](s) for s in range(15)] == [sched.lr_lambdas[0](s) for s in range(15)]


def test_bad_arguments_raise_plm_error():
    with pytest.raises(PlmError) as e:
        build_scheduler(_opt(), "cosine-restarts", 10, 100)
    for name in SCHEDULES:
        assert name in str(e.value)
    for name in ("linear", "cosine", "polynomial"):
        with pytest.raises(PlmError, match="longer than total_steps"):
            build_scheduler(_opt(), name, 101, 100)
        with pytest.raises(PlmError, match="total_steps"):
            build_scheduler(_opt(), name, 0, 0)
    # schedules that do not decay do not care about total_steps
    build_scheduler(_opt(), "constant", 101, 100)
    build_scheduler(_opt(), "inverse-sqrt", 101, 0)
    with pytest.raises(PlmError, match="negative"):
        build_scheduler(_opt(), "constant", -1, 100)
    with pytest.raises(PlmError, match="min_lr_ratio"):
        build_scheduler(_opt(), "cosine", 1, 100, min_lr_ratio=1.5)
    with pytest.raises(PlmError, match="power"):
        build_scheduler(_opt(), "polynomial", 1, 100, power=0.0)
