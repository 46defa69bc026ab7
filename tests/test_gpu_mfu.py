"""`python -m benchmarks gpu-mfu` on a machine without a GPU: its skip and its refusals, and what its numbers
are computed from (FLOPs counted against torch's FlopCounterMode, tokens/s from metrics.jsonl rows, the
runs' recipes trained for a few steps at tiny width on the CPU)."""

from plmcli.config import override_layers
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, where benchmarks/ lives

from benchmarks import common  # noqa: E402
from benchmarks.gpu import gpu_mfu  # noqa: E402
from helpers import counted_flops  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from plmcli import api  # noqa: E402
from plmcli.config import load_recipe  # noqa: E402
from plmcli.models.bert import Bert, BertConfig  # noqa: E402
from plmcli.models.gpt import GPT, GPTConfig  # noqa: E402
from plmcli.models.registry import build_model  # noqa: E402

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]


def _bench_md():
    return common.BENCHMARKS_MD.read_text() if common.BENCHMARKS_MD.is_file() else None


def test_gpu_mfu_skips_without_cuda(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "write_section", lambda name, body, path=None: (tmp_path / "written").write_text(body))
    before = _bench_md()
    t0 = time.perf_counter()
    rc = main(["gpu-mfu"])
    elapsed = time.perf_counter() - t0
    assert rc == 0
    assert capsys.readouterr().out.strip() == (
        "gpu-mfu: skipped: no CUDA device (torch.cuda.is_available() is False); BENCHMARKS.md left alone")
    assert not (tmp_path / "written").exists() and _bench_md() == before
    assert elapsed < 2.0, f"skip mode took {elapsed:.2f} s"


def test_gpu_mfu_refuses_a_cuda_machine_that_would_train_on_the_cpu(monkeypatch, capsys, tmp_path):
    # CUDA reported, but accelerate would train on the CPU (here: no accelerator at all; on a GPU machine:
    # ACCELERATE_USE_CPU=1): one line and a failing exit instead of minutes of CPU training reported as GPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    monkeypatch.setattr(common, "write_section", lambda name, body, path=None: (tmp_path / "written").write_text(body))
    with pytest.raises(SystemExit) as e:
        main(["gpu-mfu"])
    assert str(e.value).startswith("gpu-mfu: CUDA is available but plm would train on the CPU (ACCELERATE_USE_CPU is '1'")
    assert capsys.readouterr().out == "" and not (tmp_path / "written").exists()


def test_gpu_mfu_rejects_a_bad_batch_before_touching_the_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_mfu, "preflight", lambda: pytest.fail("preflight ran"))
    with pytest.raises(SystemExit, match=r"--batch 'gpt2=16' must be MODEL=N"):
        main(["gpu-mfu", "--batch", "gpt2=16"])
    with pytest.raises(SystemExit, match="a logged window must end the warmup"):
        main(["gpu-mfu", "--warmup", "10", "--log-every", "50"])
    assert gpu_mfu.batches(SimpleNamespace(batch=["gpt2-small=16"])) == {"bert-base": 256, "gpt2-small": 16}


def test_matmul_flops_equal_torch_flop_counter_on_a_gpt_training_step():
    torch.manual_seed(0)
    L, d, d_ff, T, V, B = 2, 16, 40, 12, 97, 3
    m = GPT(GPTConfig(vocab_size=V, max_positions=T, n_layer=L, n_head=2, d_model=d, d_ff=d_ff, dropout=0.0, attn_dropout=0.0))
    x = torch.randint(0, V, (B, T))
    counted = counted_flops(lambda: m(x, labels=x).backward())  # GPT's fused head: logits and both gradients
    assert counted == gpu_mfu.matmul_flops_per_token(L, d, d_ff, T, V) * B * T


def test_matmul_flops_equal_torch_flop_counter_on_a_bert_training_step():
    torch.manual_seed(0)
    L, d, d_ff, T, V, B = 2, 16, 48, 16, 97, 3
    m = Bert(BertConfig(vocab_size=V, max_positions=T, n_layer=L, n_head=2, d_model=d, d_ff=d_ff, dropout=0.0,
                        attn_dropout=0.0))
    x = torch.randint(0, V, (B, T))
    positions = torch.tensor([1, 5, 17, 40, 41])  # the MLM head runs at 5 of the 48 tokens

    def step():
        out = m(x, mlm_positions=positions)
        (out.mlm_logits.sum() + out.nsp_logits.sum()).backward()

    expect = gpu_mfu.matmul_flops_per_token(L, d, d_ff, T, V, head_share=5 / (B * T), head_transform=True,
                                            pooled_classes=2) * B * T
    assert counted_flops(step) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("name, fpt", [("bert-base", 545_419_080.0), ("gpt2-small", 854_438_400.0)])
def test_script_flops_at_full_size_agree_with_the_models_estimates(name, fpt):
    recipe = load_recipe(name, [f"model.vocab_size={load_recipe(name).tokenizer.vocab_size}"])
    ours = gpu_mfu.script_flops_per_token(name, recipe)
    assert ours == pytest.approx(fpt, rel=1e-12)
    with torch.device("meta"):
        model = build_model(recipe.family, recipe.model)
    # The models' 6N counts biases and LayerNorm gains as well: 0.09% (GPT-2) and 0.13% (BERT) more.
    assert 1.0 < model.flops_per_token(recipe.train.seq_len) / ours < 1.002


def test_throughput_uses_cumulative_tokens_and_clock_after_the_warmup():
    rows = [{"step": 10, "tokens": 1000, "elapsed_s": 5.0, "loss": 9.0, "tok_per_s": 200.0, "mfu": 0.1},
            {"step": 20, "tokens": 2000, "elapsed_s": 6.0, "loss": 8.0, "tok_per_s": 1100.0, "mfu": 0.5},
            {"step": 20, "tokens": 2000, "val_loss": 7.5},  # an evaluation row is not a window
            {"step": 30, "tokens": 3000, "elapsed_s": 7.5, "loss": 7.0, "tok_per_s": 700.0, "mfu": 0.3},
            {"step": 35, "tokens": 3500, "elapsed_s": 8.0, "loss": 6.5, "tok_per_s": 1000.0, "mfu": 0.4}]
    t = gpu_mfu.throughput(rows, warmup=10)
    assert t["tok_per_s"] == pytest.approx(2500 / 3.0)
    assert (t["timed_steps"], t["tokens"], t["seconds"]) == (25, 2500, 3.0)
    assert t["window_tok_per_s"] == 1000.0 and t["loop_mfu"] == 0.4  # medians of the three timed windows
    assert (t["loss_first"], t["loss_last"]) == (9.0, 6.5)
    assert gpu_mfu.throughput(rows, warmup=25)["tokens"] == 1500  # from the last row at or before the warmup
    with pytest.raises(ValueError, match="no logged window after the 35-step warmup"):
        gpu_mfu.throughput(rows, warmup=35)


TINY = {"bert-base": ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64"],
        "gpt2-small": ["model.n_layer=1", "model.d_model=16", "model.n_head=2"]}


@pytest.mark.parametrize("name, batch", [("bert-base", 8), ("gpt2-small", 1)])
def test_the_runs_recipes_train_at_full_vocabulary_on_the_shipped_corpus(name, batch, tmp_path):
    # What the GPU runs do, at tiny width on the CPU: the recipe without its phases, the script's overrides
    # (bf16, the recipe's vocabulary over the smaller tokenizer), the shipped corpus at the full seq_len.
    args = SimpleNamespace(bert_data="dynamic", log_every=1, num_workers=0, compile=False, overrides=TINY[name])
    path = gpu_mfu.phaseless_recipe(name, tmp_path)
    shipped = load_recipe(name).to_dict()
    shipped.pop("phases", None)
    assert load_recipe(str(path)).to_dict() == shipped  # the same recipe, the seq-512 phase of BERT-base dropped
    over = gpu_mfu.run_overrides(name, batch, args)
    summary = api.pretrain(str(path), None, str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 3}))
    run = tmp_path / "run"
    cfg = json.loads((run / "config.json").read_text())
    recipe = load_recipe(str(path), over)
    vocab = load_recipe(name).tokenizer.vocab_size
    assert cfg["model"]["vocab_size"] == vocab and cfg["tokenizer"]["vocab_size"] < vocab // 4
    assert summary["steps"] == 3 and not (run / "phases").exists()
    assert recipe.train.mixed_precision == "bf16" and recipe.train.global_batch_size == batch
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    t = gpu_mfu.throughput(rows, warmup=1)
    assert t["tokens"] == 2 * batch * recipe.train.seq_len
    # At init every one of the V outputs is about equally likely: the loss starts near ln V, padded rows included.
    assert t["loss_first"] == pytest.approx(math.log(vocab), abs=0.1)


@pytest.mark.parametrize("gpu_memory", [2**34, 0])
def test_a_whole_run_on_the_cpu_with_the_gpu_calls_stubbed(gpu_memory, monkeypatch, capsys, tmp_path):
    # The GPU-only code path end to end (runs, checks, table, JSON line) at tiny width; with no GPU memory
    # used, the check that the model reached the GPU must fail the run and leave BENCHMARKS.md alone.
    import contextlib

    import plmcli.train.loop as loop

    monkeypatch.setattr(gpu_mfu, "skip_reason", lambda: None)
    monkeypatch.setattr(gpu_mfu, "preflight", lambda: {"gpu": "Stub GPU", "cuda": "0.0", "peak": 1e12, "memory_gib": 1.0})
    monkeypatch.setattr(gpu_mfu, "attention_kernels", lambda flash_only: contextlib.nullcontext())
    monkeypatch.setattr(loop, "peak_flops", lambda device, precision: 1e12)
    for fn in ("reset_peak_memory_stats", "empty_cache", "synchronize"):
        monkeypatch.setattr(torch.cuda, fn, lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: gpu_memory)
    monkeypatch.setattr(common, "write_section", lambda name, body, path=None: (tmp_path / "written").write_text(body))
    tiny = ["--set", "model.n_layer=1", "--set", "model.d_model=32", "--set", "model.n_head=2", "--set", "model.d_ff=64"]
    models = ["bert-base", "gpt2-small"] if gpu_memory else ["bert-base"]
    rc = main(["gpu-mfu", "--models", *models, "--batch", "bert-base=8", "gpt2-small=1", "--warmup", "1", "--log-every", "1",
               "--steps", "2", "--num-workers", "0", "--threads", "1", "--keep", str(tmp_path / "keep"), *tiny])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["model"] for r in last["runs"]] == models and last["gpu"] == "Stub GPU" and last["peak_tflops"] == 1.0
    if not gpu_memory:
        assert rc == 1 and not (tmp_path / "written").exists() and not last["goal_met"]
        assert "the run was not on the GPU" in last["runs"][0]["error"]
        return
    assert rc == 0 and all(r["ok"] and r["error"] is None for r in last["runs"])
    for r in last["runs"]:
        rows = [json.loads(x) for x in (tmp_path / "keep" / f"{r['model']}-b{r['batch']}" / "metrics.jsonl").read_text().splitlines()]
        t = gpu_mfu.throughput(rows, warmup=1)
        assert r["tok_per_s"] == pytest.approx(t["tok_per_s"]) and r["loop_mfu"] == pytest.approx(t["loop_mfu"])
        assert r["script_mfu"] == pytest.approx(r["fpt_script"] * t["tok_per_s"] / 1e12)
        assert 1.0 < r["fpt_model"] / r["fpt_script"] < 1.01
    body = (tmp_path / "written").read_text()
    assert "## GPU MFU: BERT-base and GPT-2 small in bf16 on one GPU" in body and "| `gpt2-small` | 1 × 1024 |" in body


def test_pretrain_compile_flag_compiles_the_model_and_writes_loadable_weights(monkeypatch, tmp_path):
    # --compile is train.compile=true: the loop compiles its model (here with dynamo's eager backend: the
    # graph capture is real, inductor's code generation would take minutes on this CPU), and the weights it
    # writes keep the model's own names, without torch.compile's `_orig_mod.` wrapper prefix.
    from safetensors import safe_open
    from typer.testing import CliRunner

    from helpers import tiny_corpus, tiny_recipe
    from plmcli.cli import app

    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or real_compile(fn, backend="eager"))
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(tmp_path / "run"),
                                   "--max-steps", "2", "--compile", "--json"])
    assert res.exit_code == 0, res.output
    assert len(compiled) == 1 and json.loads(res.stdout)["steps"] == 2
    assert load_recipe(str(tmp_path / "run" / "recipe.yaml")).train.compile is True
    model, _, _ = api.load_run(str(tmp_path / "run"))  # strict load: every key where the model has it
    with safe_open(str(tmp_path / "run" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert keys <= set(model.state_dict()) and len(keys) == len(model.state_dict()) - 1  # wte = lm_head, written once
    res = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(tmp_path / "run2"),
                                   "--max-steps", "1"])
    assert res.exit_code == 0 and len(compiled) == 1  # without the flag: the recipe's compile: false
