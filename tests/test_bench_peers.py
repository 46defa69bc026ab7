"""The pieces of the peer benchmarks (nanogpt-char, lstm-step) that decide their numbers.

The benchmarks themselves train for minutes; these pin what they parse, copy and compare.
"""

import math

import numpy as np
import pytest
import torch

from benchmarks.speed.lstm_step import build, paired_ratios
from benchmarks.speed.nanogpt_char import DEFAULT_NANOGPT, nanogpt_argv, parse_nanogpt_log, prepare_nanogpt
from plmcli.config import load_recipe

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]

LOG = """tokens per iteration will be: 768
found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)
Initializing a new model from scratch
number of parameters: 0.80M
step 0: train loss 4.1783, val loss 4.1750
iter 0: loss 4.1839, time 912.51ms, mfu -100.00%
iter 1: loss 3.9701, time 58.20ms, mfu -100.00%
iter 2: loss 3.7412, time 61.00ms, mfu -100.00%
step 3: train loss 3.5012, val loss 3.5230
saving checkpoint to out-shakespeare-char
iter 3: loss 3.4001, time 640.10ms, mfu 0.51%
"""


def test_parse_nanogpt_log_reads_every_eval_and_iteration_time():
    log = parse_nanogpt_log(LOG)
    assert log["evals"] == [(0, 4.1783, 4.1750), (3, 3.5012, 3.5230)]
    assert (log["val_loss"], log["train_loss"], log["last_eval_step"]) == (3.5230, 3.5012, 3)
    assert log["iters"] == 4 and log["iter_ms"] == [912.51, 58.20, 61.00, 640.10]
    with pytest.raises(ValueError):
        parse_nanogpt_log("iter 0: loss 4.1, time 1.0ms, mfu 0%\n")


def test_nanogpt_argv_runs_the_shipped_config_at_the_recipe_shape():
    argv = nanogpt_argv(2000)
    assert argv[:2] == ["train.py", "config/train_shakespeare_char.py"]
    opts = dict(a[2:].split("=") for a in argv[2:])
    recipe = load_recipe("gpt-char-shakespeare")
    t, m = recipe.train, recipe.model
    assert opts["device"] == "cpu" and opts["compile"] == "False" and float(opts["dropout"]) == m.dropout == 0.0
    assert (int(opts["block_size"]), int(opts["batch_size"])) == (t.seq_len, t.global_batch_size)
    assert (int(opts["n_layer"]), int(opts["n_head"]), int(opts["n_embd"])) == (m.n_layer, m.n_head, m.d_model)
    assert int(opts["max_iters"]) == int(opts["lr_decay_iters"]) == t.max_steps
    assert "warmup_iters" not in opts  # the shipped config's 100, as plm's recipe
    assert recipe.optim.warmup_steps == 100
    assert nanogpt_argv(40)[-1] == "--warmup_iters=20"  # a smoke test shorter than the warmup still runs


def test_prepare_nanogpt_copies_the_tree_and_makes_its_data_offline(tmp_path):
    if not (DEFAULT_NANOGPT / "train.py").is_file():
        pytest.skip("../shared/peers/nanoGPT is not present")
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20
    src = tmp_path / "input.txt"
    src.write_text(text)
    before = sorted(p.name for p in DEFAULT_NANOGPT.rglob("*"))
    root = prepare_nanogpt(DEFAULT_NANOGPT, src, tmp_path / "work")
    prep = root / "data" / "shakespeare_char"
    assert (root / "train.py").read_bytes() == (DEFAULT_NANOGPT / "train.py").read_bytes()
    assert (prep / "input.txt").read_text() == text
    train, val = (np.fromfile(prep / f"{s}.bin", dtype=np.uint16) for s in ("train", "val"))
    n = len(text)
    assert (len(train), len(val)) == (int(n * 0.9), n - int(n * 0.9))  # prepare.py's character split
    chars = sorted(set(text))
    assert "".join(chars[i] for i in train[:40]) == text[:40]
    assert sorted(p.name for p in DEFAULT_NANOGPT.rglob("*")) == before  # the shared tree stays untouched


def _tiny(length):
    recipe = load_recipe("lstm-ptb-small", ["model.d_embed=12", "model.d_hidden=12", "train.seq_len=5",
                                            "train.global_batch_size=3"])
    return build(recipe, vocab=40, seed=3, length=length)


def test_plain_lstm_loop_matches_plm_step_at_the_same_weights():
    # 16 tokens a stream = 3 segments of 5: six steps cross an epoch boundary (state reset) once
    plm, plain = _tiny(16)
    assert plain.data.shape == (16, 3) and plm.stream.data.shape == (3, 16)
    assert torch.equal(plain.data.T, torch.from_numpy(np.asarray(plm.stream.data)))
    losses = [(plm.step(), plain.step()) for _ in range(6)]
    assert abs(losses[0][0] - math.log(40)) < 0.1  # init ±0.1: nearly uniform predictions at first
    for a, b in losses:
        assert a == pytest.approx(b, rel=1e-5)
    for (name, p), q in zip(plm.model.named_parameters(), plain.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert plm.k == plain.k == 6 and plain.segments == plm.stream.num_segments == 3


def test_paired_ratios_divide_each_round_by_its_own_partner():
    assert paired_ratios([10.0, 30.0, 8.0], [5.0, 20.0, 8.0]) == [2.0, 1.5, 1.0]


def test_nanogpt_table_sets_each_sides_median_step_against_the_fp32_probe():
    from benchmarks.speed.nanogpt_char import table

    def side(wall, step_ms):
        return {"wall": wall, "val_loss": 1.9, "loop": wall - 2, "step_ms": step_ms, "steps": 2000, "evals": 2}

    sides = {"nanoGPT": [side(100.0, 50.0), side(102.0, 40.0)], "plm": [side(90.0, 40.0), side(94.0, 50.0)]}
    # a step of 4 GFLOP at a median of 45 ms: 88.9 GFLOP/s, 44% of a 200 GFLOP/s probe, 35% of a 250 one;
    # bf16's probe is left out (both sides run fp32)
    tab, verdict = table(sides, 2, step_gflop=4.0, peaks={"fp32": 200.0, "fp32-onednn": 250.0, "bf16": 400.0})
    assert tab.splitlines()[0].endswith("| GFLOP/s (median step) | % of fp32 GEMM | % of fp32-onednn GEMM |")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in tab.splitlines()[2:]}
    assert rows["plm"][-3:] == ["88.9", "44%", "36%"] and rows["nanoGPT"][-3:] == ["88.9", "44%", "36%"]
    assert verdict["ratio"] == pytest.approx(92.0 / 101.0) and not verdict["met_time"]
    assert all(len(r) == len(rows["plm"]) for r in rows.values())  # every row fills every column


def test_plm_run_flops_match_gpt_flops_per_token(tmp_path):
    import json

    from benchmarks.speed.nanogpt_char import run_flops_per_token
    from plmcli.models.gpt import GPT, GPTConfig

    model = {"vocab_size": 65, "max_positions": 64, "n_layer": 2, "n_head": 2, "d_model": 32}
    (tmp_path / "config.json").write_text(json.dumps({"family": "gpt", "model": model, "seq_len": 64}))
    n = 2 * 12 * 32 * 32 + 65 * 32  # blocks' weights (4·C² + 8·C²) and the tied token table, biases, LayerNorms aside
    fpt = run_flops_per_token(tmp_path)
    assert fpt == GPT(GPTConfig(**model)).flops_per_token(64)
    assert 6 * n + 12 * 2 * 64 * 32 < fpt < 6 * n * 1.05 + 12 * 2 * 64 * 32
