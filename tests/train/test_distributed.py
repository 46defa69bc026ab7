"""Multi-process training: 2 CPU processes (gloo, launched by `accelerate launch` and by torchrun)
against 1 process with accumulation 2, resume, bad input, and the shipped accelerate configs."""

import io
import json
import os
import shutil
from dataclasses import replace
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, load_model, save_model

from helpers import TINY_RECIPE, free_port, tiny_corpus
from plmcli import api
from plmcli.config import TrainConfig, load_recipe, shipped_recipes
from plmcli.errors import PlmError
from plmcli.models.registry import build_model
from plmcli.train import distributed
from plmcli.train.checkpoint import LoopState
from plmcli.train.loop import _resumable

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
# Dropout stays on (the tiny recipe's 0.1): every random draw of a micro-batch is keyed by its global index,
# so 2 processes and 1 process with accumulation 2 take the same steps. The same micro batch on both sides,
# so that train.eval_batches (batches of the micro batch) scores the same samples.
SPLIT = ["--set", "train.micro_batch_size=2"]
TIMEOUT_S = 180  # per launch; each takes ~10 s on 2 busy cores


def _launch(launcher: str, args: list, root: Path, check: bool = True, cache: str = "cache") -> subprocess.CompletedProcess:
    """`plm pretrain ARGS` on 2 CPU processes."""
    port = str(free_port())
    if launcher == "accelerate":  # the shipped ddp.yaml; on a machine without a GPU plm trains over gloo
        head = ["-m", "accelerate.commands.launch", "--config_file", str(api.accelerate_configs()["ddp"]),
                "--num_processes", "2", "--main_process_port", port]
    else:
        head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", port]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLM_RUNS": str(root / "runs"), "PLM_CACHE": str(root / cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, *head, "-m", "plmcli", "pretrain", *map(str, args)], cwd=root, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    if check:
        assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ref: 1 process, micro batch 2 × accumulation 2. two: 2 processes (accelerate launch). half: 2
    processes (torchrun) stopped after step 3 (a copy kept as half-at-3), then resumed on 2."""
    root = tmp_path_factory.mktemp("ddp")
    (root / "tiny.yaml").write_text(TINY_RECIPE, encoding="utf-8")
    corpus = tiny_corpus(root / "corpus.txt")
    base = ["--recipe", root / "tiny.yaml", "--data", corpus, *SPLIT]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:  # module scope: conftest's per-test env is not set up yet
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))  # tokenized once here, read by the launches
        api.pretrain(str(root / "tiny.yaml"), [str(corpus)], str(root / "ref"),
                     overrides=["train.micro_batch_size=2"])
    torch.set_num_threads(threads)
    # its own cache: the main process tokenizes while the other waits at the barrier
    two = _launch("accelerate", [*base, "--out", root / "two"], root, cache="cache-two")
    latest = os.path.realpath(root / "runs" / "latest")
    _launch("torchrun", [*base, "--out", root / "half", "--stop-after", 3], root)
    shutil.copytree(root / "half", root / "half-at-3")
    _launch("torchrun", ["--resume", "--out", root / "half"], root)
    return {"root": root, "ref": root / "ref", "two": root / "two", "half": root / "half",
            "half_at_3": root / "half-at-3", "two_stdout": two.stdout, "two_latest": latest, "base": base}


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _assert_same_trajectory(a: Path, b: Path, rel: float = 1e-6) -> None:
    ra, rb = _rows(a), _rows(b)
    assert [(r["step"], "loss" in r) for r in ra] == [(r["step"], "loss" in r) for r in rb]
    for x, y in zip(ra, rb):
        for k in ("loss", "val_loss", "grad_norm", "lr", "tokens"):
            if k in x:
                assert y[k] == pytest.approx(x[k], rel=rel, abs=1e-7), (x["step"], k)
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=rel, atol=1e-7)


@pytest.mark.distributed
def test_two_processes_take_the_steps_of_one_with_accumulation(runs):
    # Tolerance 1e-6 (relative), and in practice none: rank r's micro-batch k is global micro-batch
    # 2k + r (data/batching.py), the very samples 1 process reads as micro-batches 2k, 2k+1; both scale
    # each loss by 1/2 (a power of two: exact) and add the two gradients once (gloo's sum of two values
    # is the accumulation's addition); the dropout masks of global micro-batch j are drawn from (seed, j) on
    # either side. Measured on torch 2.13 CPU: every loss, grad norm, val loss and weight bitwise equal.
    _assert_same_trajectory(runs["ref"], runs["two"])
    assert [r["step"] for r in _rows(runs["two"]) if "val_loss" in r] == [3, 6]


@pytest.mark.distributed
def test_each_file_is_written_once(runs):
    two = runs["two"]
    rows = _rows(two)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]  # one row per step, not one per process
    assert [r["tokens"] for r in rows if "loss" in r] == [64 * s for s in range(1, 7)]  # 4 × 16 tokens per step
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["step-3", "step-6"]
    for step in (3, 6):
        ck = two / "checkpoints" / f"step-{step}"
        assert json.loads((ck / "loop_state.json").read_text())["world_size"] == 2
        assert sorted(p.name for p in ck.glob("random_states_*")) == ["random_states_0.pkl", "random_states_1.pkl"]
        assert len(list(ck.glob("pytorch_model*"))) == 1 and len(list(ck.glob("optimizer*"))) == 1
    assert len(list((two / "tb").glob("events.out.tfevents.*"))) == 1
    assert json.loads((two / "summary.json").read_text())["steps"] == 6
    load_file(str(two / "model.safetensors"))
    assert not [p for p in two.rglob("*") if p.name.startswith(".")]  # no temp file left behind
    assert runs["two_latest"] == os.path.realpath(two)
    cache = runs["root"] / "cache-two"
    assert len(list(cache.rglob("meta.json"))) == 1 and not list(cache.rglob(".*"))  # one corpus, built once
    assert runs["two_stdout"].count("6 steps") == 1  # the summary line, printed by the main process only


@pytest.mark.distributed
def test_resume_on_two_processes_matches_an_uninterrupted_run(runs):
    at3 = runs["half_at_3"]
    assert sorted(p.name for p in (at3 / "checkpoints").iterdir()) == ["step-3"]
    assert [r["step"] for r in _rows(at3) if "loss" in r] == [1, 2, 3]
    # Same data position, same RNG per process (random_states_<rank>): the same steps as `two`.
    _assert_same_trajectory(runs["two"], runs["half"])


@pytest.mark.distributed
def test_resume_on_another_process_count_continues_the_data(runs, tmp_path):
    """A 2-process checkpoint resumed by 1 process (micro batch 2, accumulation 2) reads on from the
    next sample, so it finishes exactly as the 1-process run did."""
    one = tmp_path / "one"
    shutil.copytree(runs["half_at_3"], one)
    out = io.StringIO()
    from rich.console import Console

    api.pretrain(out=str(one), resume=True, overrides=["train.micro_batch_size=2"], console=Console(file=out, width=200))
    assert ("resuming a 2-process checkpoint with 1 process: the data continues at sample 12, where it stopped; the same "
            "steps as if it never stopped") in out.getvalue()
    _assert_same_trajectory(runs["ref"], one)

    other = tmp_path / "other"
    shutil.copytree(runs["half_at_3"], other)
    with pytest.raises(PlmError, match="trained with global batch 4, this run has 8"):
        api.pretrain(out=str(other), resume=True, overrides=["train.global_batch_size=8"])


def test_deepspeed_checkpoint_refuses_another_process_count_and_fsdp_reshards():
    from accelerate.utils import DistributedType

    loop = LoopState(step=3, micro_batches=3, world_size=2, global_batch_size=4)
    ds = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED)
    with pytest.raises(PlmError, match="DeepSpeed state partitioned over 2 processes.*resume with 2 processes"):
        _resumable(replace(loop), Path("ck"), ds, world=4, micro=1, global_batch=4)
    assert _resumable(replace(loop), Path("ck"), ds, world=2, micro=2, global_batch=4) is None
    fsdp = SimpleNamespace(distributed_type=DistributedType.FSDP)
    assert _resumable(replace(loop), Path("ck"), fsdp, world=1, micro=1, global_batch=4).startswith("resuming a 2-process")


@pytest.mark.distributed
def test_a_batch_that_does_not_split_is_one_line_per_process(runs):
    base = runs["base"]
    res = _launch("torchrun", [*base, "--out", runs["root"] / "bad", "--set", "train.global_batch_size=3",
                                   "--set", "train.micro_batch_size=0"], runs["root"],
                  check=False)
    assert res.returncode != 0
    lines = sorted(line for line in res.stderr.splitlines() if line.startswith("error"))
    why = ("train.global_batch_size 3 cannot be split evenly over 2 processes — pick a multiple of the process "
           "count, e.g. --set train.global_batch_size=4")
    assert lines == [f"error (process 0 of 2): {why}", f"error (process 1 of 2): {why}"]
    assert f"{os.sep}plmcli{os.sep}" not in res.stderr  # no traceback through plm (torchrun reports the exit codes)
    assert not (runs["root"] / "bad").exists()  # refused before anything was tokenized or written


@pytest.mark.distributed
def test_deepspeed_config_without_deepspeed_is_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from helpers import tiny_recipe
    from plmcli.cli import app

    real = distributed.importlib.util.find_spec
    monkeypatch.setattr(distributed.importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets for a DeepSpeed config
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(tiny_recipe(tmp_path / "tiny.yaml")),
                                   "--data", str(tiny_corpus(tmp_path / "c.txt")), "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == ("error: the accelerate config asks for DeepSpeed, which is not installed — pip install "
                                  "deepspeed (or launch with plm's ddp.yaml or fsdp.yaml: plm recipes accelerate)")
    assert not (tmp_path / "run").exists()


def test_dist_timeout_reaches_the_process_group(tmp_path, monkeypatch):
    import accelerate

    seen = []

    class Spy(accelerate.PartialState):  # the same shared state: only watches what plm asks for
        def __init__(self, cpu=False, **kwargs):
            seen.append((cpu, kwargs))
            super().__init__(cpu, **kwargs)

    monkeypatch.setattr(accelerate, "PartialState", Spy)
    (tmp_path / "tiny.yaml").write_text(TINY_RECIPE)
    api.pretrain(str(tmp_path / "tiny.yaml"), [str(tiny_corpus(tmp_path / "c.txt"))], str(tmp_path / "run"),
                 overrides=["train.dist_timeout=1234", "train.max_steps=1", "train.eval_every=0"])
    assert seen and all(s == (distributed.use_cpu(), {"timeout": timedelta(seconds=1234)}) for s in seen)
    assert TrainConfig().dist_timeout == distributed.DIST_TIMEOUT == 1800  # a dead node: 30 minutes, not hours


def test_processes_that_accelerate_did_not_join_are_refused(monkeypatch):
    # The old failure: N processes launched, each with a process group of its own (no cpu=True on a
    # machine without a GPU), all writing one run directory. This process is one; the launcher says 2.
    distributed.process_state()  # this process's group (of one), before the launcher's word changes
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PlmError, match="2 processes were launched but accelerate joined 1"):
        distributed.process_state()


# ---------------------------------------------------------------- the shipped accelerate configs

KINDS = {"ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed-zero2": "DEEPSPEED", "deepspeed-zero3": "DEEPSPEED"}


def _launch_env(name: str) -> dict:
    """The environment `accelerate launch --config_file NAME --num_processes 2` gives each process."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = str(api.accelerate_configs()[name])
    args = launch_command_parser().parse_args(["--config_file", path, "--num_processes", "2", "-m", "plmcli", "pretrain"])
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:  # as launch_command does before it calls the DeepSpeed launcher
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        env = prepare_deepspeed_cmd_env(args)[1]
    else:
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_shipped_accelerate_config_is_what_accelerate_expects(name, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(api.accelerate_configs()[name]))  # accelerate's reader: unknown keys are refused
    assert cfg.distributed_type.value == KINDS[name] and cfg.compute_environment.value == "LOCAL_MACHINE"
    env = _launch_env(name)
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"  # plm takes the precision from the recipe
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    micro, accum = 4, 8
    # fp32 under DeepSpeed applies a non-finite step inside backward: accepted only when the run stops at the first one
    train = TrainConfig(global_batch_size=64, grad_clip=0.5, max_nonfinite_steps=1)
    if name == "fsdp":
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()  # from the environment, as accelerate builds it
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True  # FULL_SHARD
        names = plugin.transformer_cls_names_to_wrap
        models = {n for m in _model_modules() for n, obj in vars(m).items() if isinstance(obj, type)}
        assert set(names) <= models, set(names) - models
        model = build_model("gpt", load_recipe("gpt-mini", ["model.vocab_size=50", "model.n_layer=2"]).model)
        fake = SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=plugin))
        distributed.configure_backend(fake, model, train, "adamw", micro, accum)
        assert plugin.transformer_cls_names_to_wrap == ["Block"]  # the names this model has, for accelerate
        with pytest.raises(PlmError, match="optim.name=lamb"):
            distributed.configure_backend(fake, model, train, "lamb", micro, accum)
    if name.startswith("deepspeed"):
        from accelerate.utils import DeepSpeedPlugin, DistributedType

        plugin = DeepSpeedPlugin()
        stage = int(name[-1])
        assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
        fake = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, state=SimpleNamespace(deepspeed_plugin=plugin))
        distributed.configure_backend(fake, torch.nn.Linear(2, 2), train, "adamw", micro, accum)
        ds = plugin.deepspeed_config
        assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"],
                ds["gradient_clipping"]) == (micro, accum, 64, 0.5)
        if stage == 3:  # model.safetensors needs the full weights gathered at the end
            assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def _model_modules():
    import importlib
    import pkgutil

    import plmcli.models

    return [importlib.import_module(f"plmcli.models.{m.name}") for m in pkgutil.iter_modules(plmcli.models.__path__)]


def test_fsdp_wraps_a_block_of_every_transformer_family():
    import yaml
    from accelerate.utils import DistributedType

    from families import tiny_overrides

    names = yaml.safe_load(api.accelerate_configs()["fsdp"].read_text())["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"]
    no_blocks = {"ngram", "seq2seq", "nnlm", "rnn", "elmo", "word2vec"}  # RNNs, counts, word vectors: sharded whole
    for recipe in shipped_recipes():
        r = load_recipe(recipe, tiny_overrides(load_recipe(recipe).family))
        if r.family in no_blocks:
            continue
        plugin = SimpleNamespace(transformer_cls_names_to_wrap=names.split(","))
        fake = SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=plugin))
        distributed.configure_backend(fake, build_model(r.family, r.model), r.train, "adamw", 1, 1)
        assert plugin.transformer_cls_names_to_wrap, recipe


def test_plm_recipes_accelerate_prints_the_paths():
    from typer.testing import CliRunner

    from plmcli.cli import app

    res = CliRunner().invoke(app, ["recipes", "accelerate"])
    assert res.exit_code == 0
    assert [line.split()[0] for line in res.stdout.splitlines()] == ["ddp", "deepspeed-zero2", "deepspeed-zero3", "fsdp"]
    res = CliRunner().invoke(app, ["recipes", "accelerate", "fsdp"])
    assert res.stdout.strip() == str(api.accelerate_configs()["fsdp"]) and Path(res.stdout.strip()).is_file()
    res = CliRunner().invoke(app, ["recipes", "accelerate", "zero"])
    assert res.exit_code == 2 and res.stderr.startswith("error: no shipped accelerate config 'zero'")


def test_gathered_weights_are_saved_as_save_model_saves_them(tmp_path):
    """Under FSDP / DeepSpeed the weights come back gathered, tied ones as separate tensors; the file
    must still be the one save_model writes for the whole model (lm_head tied to wte kept once)."""
    from accelerate.utils import DistributedType

    model = build_model("gpt", load_recipe("gpt-mini", ["model.vocab_size=50", "model.n_layer=2"]).model)
    tied = distributed.tied_names(model)
    assert tied == {"wte.weight": "lm_head.weight"} or tied == {"lm_head.weight": "wte.weight"}
    fake = SimpleNamespace(distributed_type=DistributedType.FSDP, is_main_process=True, wait_for_everyone=lambda: None,
                           get_state_dict=lambda m: {k: v.clone() for k, v in m.state_dict().items()})
    distributed.save_weights(fake, model, tmp_path, tied)
    save_model(model, str(tmp_path / "ref.safetensors"))
    got, ref = load_file(str(tmp_path / "model.safetensors")), load_file(str(tmp_path / "ref.safetensors"))
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    fresh = build_model("gpt", load_recipe("gpt-mini", ["model.vocab_size=50", "model.n_layer=2"]).model)
    load_model(fresh, str(tmp_path / "model.safetensors"))  # strict: every weight found
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)


def test_resume_with_another_micro_batch_continues_the_data(tmp_path):
    """The data position is counted in samples (step × global batch), not in micro-batches: a resume
    that splits the global batch differently (here 4 → 2 × 2) reads on from the next sample. Tolerance
    1e-4: one batch of 4 and two of 2 round differently; re-read samples would move the loss by ~1e-2."""
    (tmp_path / "tiny.yaml").write_text(TINY_RECIPE)
    recipe, corpus = str(tmp_path / "tiny.yaml"), [str(tiny_corpus(tmp_path / "c.txt"))]
    over = ["model.dropout=0.0", "train.eval_every=0"]
    api.pretrain(recipe, corpus, str(tmp_path / "full"), overrides=over)
    api.pretrain(recipe, corpus, str(tmp_path / "half"), overrides=over, stop_after=3)
    api.pretrain(out=str(tmp_path / "half"), resume=True, overrides=["train.micro_batch_size=2"])
    full, half = ([r["loss"] for r in _rows(tmp_path / d) if "loss" in r] for d in ("full", "half"))
    assert half == pytest.approx(full, abs=1e-4)
