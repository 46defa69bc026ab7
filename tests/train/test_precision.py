"""Mixed precision (Micikevicius et al. 2018): fp16 compute with dynamic loss scaling, its skipped steps counted and
logged with the scale, a collapsing scale stopping the run; `auto` choosing bf16, else fp16 on a GPU, else
fp32; a skipped step decided on the device (the optimizer's found_inf), LAMB included.

accelerate runs fp16 only on a GPU, so the CPU tests give the run's Accelerator torch's CPU GradScaler and
fp16 autocast (both exist on the CPU): the loop's own mechanics are what runs."""

import json

import pytest
import torch

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.errors import PlmError
from plmcli.train import loop as loop_module
from plmcli.train.checkpoint import RunStopped
from plmcli.train.loop import resolve_precision
from plmcli.train.optim import Lamb, build_optimizer, skips_on_device

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def _cpu_fp16(monkeypatch, init_scale: float, growth_interval: int = 2000):
    """make_accelerator as on a GPU with fp16: a GradScaler (on the CPU) and fp16 autocast."""
    make = loop_module.make_accelerator

    def with_scaler(mixed_precision, *args, **kwargs):
        acc = make("no", *args, **kwargs)
        acc.state._mixed_precision = "fp16"  # accelerate's autocast() and clip_grad_norm_ read these three
        acc.native_amp = True
        acc.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
        return acc

    monkeypatch.setattr(loop_module, "make_accelerator", with_scaler)


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_auto_picks_bf16_then_fp16_on_a_gpu_and_fp32_on_a_cpu():
    assert resolve_precision("auto", cuda=True, bf16=True) == "bf16"
    assert resolve_precision("auto", cuda=True, bf16=False) == "fp16"  # V100, T4
    assert resolve_precision("auto", cuda=False, bf16=False) == "no"
    assert resolve_precision("bf16", cuda=False, bf16=False) == "bf16"
    with pytest.raises(PlmError, match="fp16 needs a GPU"):
        resolve_precision("fp16", cuda=False, bf16=False)


def test_fp16_overflows_are_skipped_counted_and_logged_with_the_scale(tiny, tmp_path, monkeypatch):
    """A scale of 2^30 makes the fp16 backward overflow: the scaler skips those steps and halves its scale
    each time, until the gradients fit; every row logs the scale and the skipped steps so far."""
    recipe, corpus = tiny
    _cpu_fp16(monkeypatch, init_scale=2.0 ** 30)
    run = tmp_path / "run"
    s = api.pretrain(str(recipe), [str(corpus)], str(run),
                     overrides=["train.max_steps=24", "train.max_nonfinite_steps=24", "train.eval_every=0",
                                "train.save_every=0"])
    rows = [r for r in _rows(run) if "loss_scale" in r]
    assert [r["step"] for r in rows] == list(range(1, 25))
    skipped = s["nonfinite_steps"]
    assert 3 <= skipped < 24 and rows[-1]["nonfinite_steps"] == skipped
    # the first `skipped` steps overflow, each halving the scale; then the scale holds (growth every 2000)
    assert [r["loss_scale"] for r in rows[:skipped + 1]] == [2.0 ** (29 - k) for k in range(skipped)] + [2.0 ** (30 - skipped)]
    assert {r["loss_scale"] for r in rows[skipped:]} == {2.0 ** (30 - skipped)}
    assert [r["nonfinite_steps"] for r in rows[:skipped]] == list(range(1, skipped + 1))
    assert all("loss" not in r for r in rows[:skipped]) and all("loss" in r for r in rows[skipped:])
    w = torch.load(sorted(run.glob("checkpoints/step-*"))[-1] / "pytorch_model.bin")
    assert all(torch.isfinite(v).all() for v in w.values())


def test_a_collapsing_scale_stops_the_run_with_one_line(tiny, tmp_path, monkeypatch):
    recipe, corpus = tiny
    _cpu_fp16(monkeypatch, init_scale=2.0 ** 30)
    run = tmp_path / "run"
    with pytest.raises(RunStopped) as e:
        api.pretrain(str(recipe), [str(corpus)], str(run),
                     overrides=["train.max_steps=24", "train.max_nonfinite_steps=24", "train.min_loss_scale=1.0e8"])
    assert e.value.message.startswith("fp16 loss scale collapsed to 6.71089e+07 at step 4 (below train.min_loss_scale 1e+08)")
    assert "train.mixed_precision=bf16" in e.value.hint and "no checkpoint was written yet" in e.value.hint
    assert not (run / "model.safetensors").exists()


def test_n_skips_in_a_row_stop_an_fp16_run(tiny, tmp_path, monkeypatch):
    recipe, corpus = tiny
    _cpu_fp16(monkeypatch, init_scale=2.0 ** 60)
    with pytest.raises(RunStopped, match=r"not finite at 3 optimizer steps in a row \(steps 1-3\)"):
        api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "run"), overrides=["train.max_nonfinite_steps=3"])


def _lamb_pair(found: float, scale: float | None = None):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = Lamb([w], lr=0.1, weight_decay=0.01)
    for k in range(2):  # a step taken normally first: moments and step count are not zero
        w.grad = torch.randn(4, 3)
        if k == 1:
            before = {"w": w.detach().clone(), **{n: t.clone() for n, t in opt.state[w].items()}}
            if scale is not None:
                w.grad = w.grad * scale
                opt.grad_scale = torch.tensor(scale)
            opt.found_inf = torch.tensor(found)
            if found:
                w.grad[0, 0] = float("nan")
        opt.step()
    return w, opt, before


def test_lamb_skips_a_step_on_the_device_when_found_inf():
    w, opt, before = _lamb_pair(found=1.0)
    assert torch.equal(w.detach(), before["w"])
    for name in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(opt.state[w][name], before[name]), name


def test_lamb_unscales_with_grad_scale_as_the_plain_step():
    scaled, _, _ = _lamb_pair(found=0.0, scale=1024.0)
    plain, _, _ = _lamb_pair(found=0.0)
    torch.testing.assert_close(scaled.detach(), plain.detach(), rtol=0, atol=1e-7)


def test_every_optimizer_skips_on_the_device_on_cpu_and_cuda():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    for name in ("adamw", "adam", "sgd", "lamb"):
        assert skips_on_device(build_optimizer(model, name, lr=0.1)), name
    assert not skips_on_device(build_optimizer(model, "adamw", lr=0.1, fused=False))
