"""FSDP2 on CPU processes (gloo), launched as a user launches it (`accelerate launch` with plm's fsdp.yaml): sharded
checkpoints, resumes on another process count (torch.distributed.checkpoint reshards on load), a two-phase recipe
whose second phase continues the sharded model, the steps of one process without FSDP, and weights that load into a
plain model. Then the one-line refusals around sharded backends, which need no launch."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from safetensors.torch import load_file, load_model

from helpers import TINY_RECIPE, dirs_under, free_port, tiny_corpus
from plmcli import api
from plmcli.config import TrainConfig, load_recipe
from plmcli.errors import PlmError
from plmcli.models.registry import build_model
from plmcli.train import checkpoint as ckpt
from plmcli.train import distributed

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
PHASED = TINY_RECIPE + """\
phases:
  - {name: short, max_steps: 4, set: {train.seq_len: 8, optim.lr: 5.0e-3}}
  - {name: long, max_steps: 3, set: {train.seq_len: 16, train.global_batch_size: 2}}
"""
# Micro batch 1 everywhere: every launch (2 processes, 1 process) splits each global batch into the same micro-batches,
# so each one's dropout draws (keyed by its global index) are the same, and the steps are comparable.
SPLIT = ["--set", "train.micro_batch_size=1"]
TIMEOUT_S = 180  # per launch; each takes ~15 s on 2 busy cores


def _launch(root: Path, processes: int, *args) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file <plm's fsdp.yaml> --num_processes N -m plmcli pretrain ARGS`."""
    head = ["-m", "accelerate.commands.launch", "--config_file", str(api.accelerate_configs()["fsdp"]),
            "--num_processes", str(processes), "--main_process_port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLM_RUNS": str(root / "runs"), "PLM_CACHE": str(root / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, *head, "-m", "plmcli", "pretrain", *map(str, args)], cwd=root, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ref: one process, no FSDP. cut: 2 FSDP processes stopped at step 2 of phase `short` (kept as at-2), resumed on 1
    process to step 3 (kept as at-3), then resumed on 2 to the end of both phases."""
    root = tmp_path_factory.mktemp("fsdp")
    recipe = root / "phased.yaml"
    recipe.write_text(PHASED, encoding="utf-8")
    corpus = tiny_corpus(root / "corpus.txt")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with dirs_under(root):  # tokenized once here, read by the launches
        api.pretrain(str(recipe), [str(corpus)], str(root / "ref"), overrides=["train.micro_batch_size=1"])
    torch.set_num_threads(threads)
    cut = root / "cut"
    _launch(root, 2, "--recipe", recipe, "--data", corpus, "--out", cut, *SPLIT, "--stop-after", 2)
    shutil.copytree(cut, root / "at-2")
    one = _launch(root, 1, "--resume", "--out", cut, "--stop-after", 3)
    shutil.copytree(cut, root / "at-3")
    _launch(root, 2, "--resume", "--out", cut)
    return {"root": root, "ref": root / "ref", "cut": cut, "at2": root / "at-2", "at3": root / "at-3", "one": one}


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _shards(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.distributed
def test_checkpoints_are_sharded_and_reshard_on_another_process_count(runs):
    """What accelerate writes for FSDP's SHARDED_STATE_DICT: a torch.distributed.checkpoint directory for the weights
    and one for the optimizer, a .metadata and one file per process that wrote it."""
    two = runs["at2"] / "phases" / "short" / "checkpoints" / "step-2"
    assert ckpt.checkpoint_backend(two) == "fsdp" and not (two / "pytorch_model.bin").exists()
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert _shards(two / part) == [".metadata", "__0_0.distcp", "__1_0.distcp"], part
    assert sorted(p.name for p in two.glob("random_states_*")) == ["random_states_0.pkl", "random_states_1.pkl"]
    assert json.loads((two / "loop_state.json").read_text())["world_size"] == 2
    # Resumed on one process: the two shards were read into one, and it saved one.
    one = runs["at3"] / "phases" / "short" / "checkpoints" / "step-3"
    assert _shards(one / "pytorch_model_fsdp_0") == [".metadata", "__0_0.distcp"]
    assert json.loads((one / "loop_state.json").read_text())["world_size"] == 1
    assert "resuming a 2-process checkpoint with 1 process" in runs["one"].stderr
    # ... and that one back onto two, which went on into the second phase.
    last = runs["cut"] / "phases" / "long" / "checkpoints" / "step-3"
    assert _shards(last / "pytorch_model_fsdp_0") == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not [p for p in runs["cut"].rglob("*") if p.name.startswith(".") and p.name != ".metadata"]  # no temp files


@pytest.mark.distributed
def test_the_steps_are_those_of_one_process_without_fsdp(runs):
    """Both phases, across resumes on 2 → 1 → 2 processes: every logged loss, gradient norm, learning rate and
    validation loss is the unsharded single process's, to float tolerance (FSDP sums the gradients in another
    order; measured: equal to 2.4e-7). The stops add evaluations of their own (steps 2 and 3)."""
    for phase, steps in (("short", 4), ("long", 3)):
        ref, got = _rows(runs["ref"] / "phases" / phase), _rows(runs["cut"] / "phases" / phase)
        assert [r["step"] for r in got if "loss" in r] == list(range(1, steps + 1))
        by_step = {(r["step"], "loss" in r): r for r in got}
        for x in ref:
            y = by_step[(x["step"], "loss" in x)]
            for k in ("loss", "val_loss", "grad_norm", "lr", "tokens"):
                if k in x:
                    assert y[k] == pytest.approx(x[k], rel=1e-5, abs=1e-6), (phase, x["step"], k)


@pytest.mark.distributed
def test_final_weights_load_into_a_plain_model(runs):
    cut, ref = runs["cut"], runs["ref"]
    r = load_recipe(str(cut / "recipe.yaml"))
    model = build_model(r.family, r.model)
    load_model(model, str(cut / "model.safetensors"))  # strict: every weight, gathered whole, lm_head tied to wte
    assert model.lm_head.weight is model.wte.weight
    got, want = load_file(str(cut / "model.safetensors")), load_file(str(ref / "model.safetensors"))
    assert got.keys() == want.keys()
    for k in want:  # Adam's step divides by the root of the gradient's square: near-zero gradients' rounding grows
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=2e-5)  # measured 7e-6 (weights of size ~1)
    last = load_file(str(cut / "phases" / "long" / "model.safetensors"))
    assert all(torch.equal(got[k], last[k]) for k in got)


# ---------------------------------------------------------------- refusals, without a launch

def _fake(kind: DistributedType, **state) -> SimpleNamespace:
    return SimpleNamespace(distributed_type=kind, mixed_precision="no",
                           state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None, **state))


def test_another_process_count_is_refused_for_deepspeed_only(tmp_path):
    for kind in (DistributedType.FSDP, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.NO):
        distributed.check_resume_world(_fake(kind), tmp_path, was_world=2, world=1)
    distributed.check_resume_world(_fake(DistributedType.DEEPSPEED), tmp_path, was_world=2, world=2)
    with pytest.raises(PlmError, match="DeepSpeed state partitioned over 2 processes, and 4 were launched") as e:
        distributed.check_resume_world(_fake(DistributedType.DEEPSPEED), tmp_path, was_world=2, world=4)
    assert e.value.hint == "resume with 2 processes"


@pytest.mark.distributed
def test_a_checkpoint_of_another_backend_is_one_line(tmp_path):
    whole, shards = tmp_path / "whole", tmp_path / "shards"
    whole.mkdir()
    (whole / "pytorch_model.bin").write_bytes(b"")
    (shards / "pytorch_model_fsdp_0").mkdir(parents=True)
    assert (ckpt.checkpoint_backend(whole), ckpt.checkpoint_backend(shards)) == ("ddp", "fsdp")
    with pytest.raises(PlmError, match=r"holds whole \(one process or DDP\) state, and this launch runs FSDP-sharded") as e:
        ckpt.load_checkpoint(_fake(DistributedType.FSDP), whole)
    assert e.value.hint == "resume it under the launch that wrote it (torchrun, or plm's ddp.yaml)"
    with pytest.raises(PlmError, match="holds FSDP-sharded state, and this launch runs whole") as e:
        ckpt.load_checkpoint(_fake(DistributedType.MULTI_CPU), shards)
    assert "plm recipes accelerate fsdp" in e.value.hint


@pytest.mark.distributed
def test_the_next_accelerator_of_a_process_decides_fsdp_afresh():
    """accelerate leaves FSDP in the process's state after an FSDP run; the next phase's Accelerator would read it
    back without its plugin. process_state puts back the type the launch had, from which accelerate decides."""
    for device, launched in (("cuda", DistributedType.MULTI_GPU), ("cpu", DistributedType.MULTI_CPU),
                             ("xpu", DistributedType.MULTI_XPU)):
        state = SimpleNamespace(distributed_type=DistributedType.FSDP, device=torch.device(device))
        distributed._relaunch_fsdp(state)
        assert state.distributed_type == launched
    state = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, device=torch.device("cuda"))
    distributed._relaunch_fsdp(state)  # DeepSpeed's process state is its own, and says so again each time
    assert state.distributed_type == DistributedType.DEEPSPEED


def test_fsdp2_on_a_torch_without_it_is_one_line(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    with pytest.raises(PlmError, match=r"asks for FSDP2, which needs torch>=2.6 \(this is 2.5.1\+cu124\)"):
        distributed.check_backend_installed()
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    distributed.check_backend_installed()


def test_a_gradient_norm_stays_a_plain_tensor():
    norm = torch.tensor(2.5)
    assert distributed.full_norm(norm) is norm  # a DTensor (FSDP2 under accelerate 1.13-1.15) needs a process group


def test_fsdp1_on_cpu_processes_is_one_line(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(PlmError, match="FSDP version 1 .* does not run on CPU processes; FSDP2 does"):
        distributed.configure_backend(_fake(DistributedType.MULTI_CPU), torch.nn.Linear(2, 2), TrainConfig(), "adamw", 1, 1)


@pytest.mark.parametrize("stage, precision, version, guard", [
    (2, "fp16", "", {}), (3, "fp16", "0.9.0", {}),  # DeepSpeed's loss scaler skips an overflowing step on every stage
    (2, "bf16", "0.17.1", {"bf16": {"check_grad_overflow": True}}), (2, "bf16", "0.19.6", {"bf16": {"check_grad_overflow": True}}),
    (2, "bf16", "0.17.0", None), (2, "bf16", "", None),  # the key is unknown there (DeepSpeed refuses unknown keys)
    (3, "bf16", "0.19.6", None), (1, "bf16", "0.19.6", None), (2, "fp32", "0.19.6", None), (3, "fp32", "0.19.6", None),
])
def test_which_deepspeed_runs_skip_nonfinite_steps(stage, precision, version, guard):
    assert distributed.deepspeed_skips_nonfinite(stage, precision, version) == guard


def _deepspeed(stage: int, precision: str) -> SimpleNamespace:
    config = {"zero_optimization": {"stage": stage}, "fp16": {"enabled": precision == "fp16"},
              "bf16": {"enabled": precision == "bf16"}}
    return SimpleNamespace(distributed_type=DistributedType.DEEPSPEED,
                           state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config)))


def test_deepspeed_that_would_apply_a_nonfinite_step_is_refused_in_one_line(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.19.6")
    model = torch.nn.Linear(2, 2)
    fake = _deepspeed(3, "bf16")
    with pytest.raises(PlmError) as e:
        distributed.configure_backend(fake, model, TrainConfig(), "adamw", 1, 1)
    assert str(e.value).count("\n") == 0 and e.value.message.startswith("DeepSpeed ZeRO-3 in bf16 applies a step whose "
                                                                         "gradients are not finite")
    assert "train.mixed_precision=fp16" in e.value.hint and "--set train.max_nonfinite_steps=1" in e.value.hint
    # Stopping at the first one keeps the promise that matters: nothing is saved after it.
    distributed.configure_backend(fake, model, TrainConfig(max_nonfinite_steps=1), "adamw", 1, 1)
    # ZeRO-2 in bf16 is told to check; fp16's scaler needs nothing.
    fake = _deepspeed(2, "bf16")
    distributed.configure_backend(fake, model, TrainConfig(), "adamw", 1, 1)
    assert fake.state.deepspeed_plugin.deepspeed_config["bf16"] == {"enabled": True, "check_grad_overflow": True}
    fake = _deepspeed(3, "fp16")
    distributed.configure_backend(fake, model, TrainConfig(), "adamw", 1, 1)
    assert fake.state.deepspeed_plugin.deepspeed_config["bf16"] == {"enabled": False}


def test_the_gpu_check_skips_in_one_line_without_a_gpu(capsys):
    from benchmarks.gpu import gpu_fsdp

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: python -m benchmarks.gpu.gpu_fsdp runs the check itself")
    gpu_fsdp.main([])
    assert capsys.readouterr().out == "gpu_fsdp: skipped: no CUDA device (--cpu runs it on 2 CPU processes)\n"
