"""What the step benchmarks' distance from the machine's limit is computed from, and the
pretrain-step batches both sides read: the models' FLOP formulas against a count of what a tiny training
step runs, the GEMM probe's arithmetic, the CPU flags, and transformers' XLNet / ELECTRA doing plm's step."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from benchmarks import common
from benchmarks.speed import pretrain_step
from helpers import counted_flops
from benchmarks.speed.gpt_train_step import train_step
from plmcli.config import load_recipe
from plmcli.models.bert import Bert, BertConfig
from plmcli.kernels import linear, onednn_enabled, switched
from plmcli.models.electra import Electra, ElectraConfig
from plmcli.models.gpt import GPT, GPTConfig
from plmcli.models.xlnet import XLNet, XLNetConfig

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]


def non_matmul_params(*modules) -> int:
    """Biases and LayerNorm parameters: the 6N estimates count them, a matmul count does not."""
    return sum(p.numel() for m in modules for p in m.parameters() if p.dim() < 2)


# ---------------------------------------------------------------- FLOP formulas vs a count


def test_gpt_formula_is_the_matmul_count_plus_its_norms_and_biases():
    L, C, F, T, V, B = 2, 16, 40, 12, 97, 3
    m = GPT(GPTConfig(vocab_size=V, max_positions=T, n_layer=L, n_head=2, d_model=C, d_ff=F, dropout=0.0, attn_dropout=0.0))
    x = torch.randint(0, V, (B, T))
    counted = counted_flops(lambda: m(x, labels=x).backward())
    hand = B * T * (6 * (L * (4 * C * C + 2 * C * F) + C * V) + 12 * L * T * C)  # weights ×6, QKᵀ and PV 12·T·C
    assert counted == hand
    assert m.flops_per_token(T) * B * T - hand == 6 * B * T * non_matmul_params(m.blocks, m.ln_f)


def test_bert_formula_counts_the_head_at_the_masked_share():
    L, C, F, T, V, B = 2, 16, 48, 16, 97, 3
    m = Bert(BertConfig(vocab_size=V, max_positions=T, n_layer=L, n_head=2, d_model=C, d_ff=F, dropout=0.0,
                        attn_dropout=0.0, nsp_head=False))
    x = torch.randint(0, V, (B, T))
    pos = torch.tensor([1, 5, 17, 40, 41])
    counted = counted_flops(lambda: m(x, mlm_positions=pos).mlm_logits.sum().backward())
    hand = B * T * (6 * L * (4 * C * C + 2 * C * F) + 12 * L * T * C) + 6 * len(pos) * (C * C + C * V)
    assert counted == hand
    m.mlm_fraction = len(pos) / (B * T)  # as bert-train-step sets it
    assert m.flops_per_token(T) * B * T - hand == pytest.approx(6 * B * T * non_matmul_params(m.blocks), rel=1e-12)


def test_electra_formula_counts_both_networks_and_the_generator_head_at_the_masked_share():
    cfg = ElectraConfig(vocab_size=97, max_positions=16, n_layer=2, n_head=4, d_model=32, d_ff=64, embedding_size=16,
                        generator_size=0.25, dropout=0.0, attn_dropout=0.0)
    m = Electra(cfg)
    B, T, (Cg, _, Fg) = 2, 16, cfg.generator_dims()
    C, F, E, V, L = 32, 64, 16, 97, 2  # E differs from both widths: both networks project
    x = torch.randint(0, V, (B, T))
    pos = torch.tensor([3, 7, 20])

    def step():
        gen = m(x, mlm_positions=pos).mlm_logits.sum()
        (gen + m(x, part="discriminator").rtd_logits.sum()).backward()

    per_token = 6 * (E * Cg + L * (4 * Cg * Cg + 2 * Cg * Fg) + E * C + L * (4 * C * C + 2 * C * F) + C * C + C)
    hand = B * T * (per_token + 12 * L * T * (C + Cg)) + 6 * len(pos) * (Cg * E + E * V)
    assert counted_flops(step) == hand
    m.mlm_fraction = len(pos) / (B * T)
    extra = non_matmul_params(m.generator, m.discriminator, m.rtd)
    assert m.flops_per_token(T) * B * T - hand == pytest.approx(6 * B * T * extra, rel=1e-12)


def test_xlnet_formula_against_a_count_of_both_streams_with_memory():
    C, L, F, V, T, M, B, P = 32, 2, 64, 53, 16, 8, 2, 4  # P query-stream rows per sequence
    m = XLNet(XLNetConfig(vocab_size=V, n_layer=L, n_head=4, d_model=C, d_ff=F, dropout=0.0, attn_dropout=0.0, mem_len=M))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (B, T), generator=g)
    perm = torch.rand(B, T, T, generator=g) > 0.5
    mapping = torch.zeros(B, P, T)
    mapping[:, torch.arange(P), torch.arange(P) * 3] = 1.0
    mems = [torch.randn(B, M, C, generator=g) for _ in range(L)]
    counted = counted_flops(lambda: m(x, None, perm, mapping, mems)[0].sum().backward())
    K, R = T + M, T + M + T  # keys (memory + segment) and relative distances
    keys = 2 * C * C * 2 * K  # k and v over [memory; segment]
    rows = 2 * C * C * 2 + 2 * 2 * C * F  # q, o and the feed-forward of one stream row
    per_row = 2 * C * (K + K + R)  # q·k, p·v, q·W_R R
    positions = 2 * C * C * R  # W_{k,R} over the distances, once per batch; no gradient for its input: 2×, not 3×
    # The query stream in every layer, the content stream's rows in all but the last (nothing reads its output).
    hand = 3 * B * (L * (keys + (rows + per_row) * P) + (L - 1) * (rows + per_row) * T + 2 * C * V * P) + 2 * L * positions
    assert counted == hand
    m.predict_fraction = P / T  # as the plm objective sets it
    # The formula counts the position keys once per sequence, as bi_data computes them (and with an input
    # gradient), so it is above the count by that much; everything else is counted matmul by matmul.
    assert m.flops_per_token(T) * B * T - hand == pytest.approx(L * (3 * B - 2) * positions, rel=1e-12)


# ---------------------------------------------------------------- the probe


def test_matmul_flops_is_two_per_multiply_add():
    m, k, n = 3, 5, 7
    madds = sum(1 for _ in range(m) for _ in range(n) for _ in range(k))
    assert common.matmul_flops(m, k, n) == 2 * madds
    counted = counted_flops(lambda: torch.randn(m, k) @ torch.randn(k, n))
    assert counted == common.matmul_flops(m, k, n)


def test_gemm_runner_reports_gflops_of_its_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(common, "timed", lambda fn, n: (calls.append(n), fn(), 0.5)[-1])
    run = common.gemm_runner("fp32", 64, 3)
    assert run() == pytest.approx(3 * 2 * 64**3 / 0.5 / 1e9) and calls == [3]
    assert common.gemm_runner("bf16", 8, 1)() == pytest.approx(2 * 8**3 / 0.5 / 1e9)
    assert common.gemm_runner("fp32", 8, 2, onednn=True)() == pytest.approx(2 * 2 * 8**3 / 0.5 / 1e9)


def test_gemm_runners_onednn_sample_is_the_same_product():
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    torch.testing.assert_close(linear(a, b.t().contiguous()), a @ b, rtol=1e-5, atol=1e-5)


def test_probe_runners_follow_the_bf16_flags():
    args = SimpleNamespace(gemm_size=8, gemm_calls=1)
    fp32 = ["gemm fp32"] + (["gemm fp32-onednn"] if onednn_enabled() else [])
    assert list(common.probe_runners(args, ["avx2", "avx512f"])) == fp32
    assert list(common.probe_runners(args, ["avx512f", "avx512_bf16"])) == fp32 + ["gemm bf16"]
    assert list(common.probe_runners(args, ["amx_tile", "amx_bf16"])) == fp32 + ["gemm bf16"]
    with switched(False):
        assert list(common.probe_runners(args, ["avx2"])) == ["gemm fp32"]


def test_cpu_flags_picks_the_peak_flags_in_order():
    text = "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse2 amx_bf16 avx512f avx2 avx512_bf16 amx_tile\n"
    assert common.cpu_flags(text) == ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    assert common.cpu_flags("model name: Y\n") == []
    line = common.machine_line({"cpu": "X", "flags": ["avx2"], "cores": 2, "threads": 1, "python": "3", "torch": "2",
                                "transformers": "5"})
    assert line.startswith("X (flags: avx2), 2 cores (1 torch threads)")


def test_achieved_share_is_flops_times_rate_over_the_probe():
    stats = {"plm": {"median": 2000.0}, "gemm fp32": {"median": 80.0}, "gemm bf16": {"median": 200.0}}
    sides, peaks = common.split_probes(stats)
    assert list(sides) == ["plm"] and peaks == {"fp32": 80.0, "bf16": 200.0}
    assert common.achieved_gflops(2000.0, 28e6) == pytest.approx(56.0)
    assert common.limit_columns(2000.0, 28e6, peaks) == ["56.0", "70%", "28%"]
    line = common.probe_line({"gemm fp32": {"median": 80.0, "min": 70.0, "max": 90.0}}, ["avx2"], 512)
    assert "fp32 80.0 GFLOP/s" in line and "bf16 none" in line


# ---------------------------------------------------------------- pretrain-step: one batch, the same step


def tiny_args():
    return SimpleNamespace(seed=0)


def test_xlnet_sides_read_one_batch_and_agree_at_equal_weights():
    recipe = load_recipe("xlnet-mini", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64",
                                        "model.mem_len=12", "objective.reuse_len=8", "objective.num_predict=4"])
    sides, plm, batch = pretrain_step.build_xlnet(tiny_args(), recipe, 2, 24, 50)
    x, mapping, labels = batch["input_ids"], batch["target_mapping"], batch["labels"]
    rows = mapping.sum(-1) > 0  # padding rows of target_mapping carry label -100
    assert torch.equal(labels[~rows], torch.full_like(labels[~rows], -100))
    assert torch.equal(labels[rows], x.gather(1, mapping.argmax(-1))[rows])  # each label is its target's token
    target = mapping.argmax(-1)
    assert batch["perm_mask"].gather(1, target[..., None].expand(-1, -1, 24)).gather(2, target[..., None])[rows].all()
    assert plm.predict_fraction == 4 / 24
    check = pretrain_step.check_same_work(sides)  # equal parameter counts and eval losses, or SystemExit
    assert check["plm"] == pytest.approx(check["transformers"], abs=1e-4)
    for side in sides.values():  # both train
        assert torch.isfinite(train_step(*side))


def test_electra_sides_share_embeddings_and_agree_at_equal_weights():
    recipe = load_recipe("electra-mini", ["model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.d_ff=64",
                                          "model.embedding_size=16", "model.max_positions=32"])
    sides, plm, batch = pretrain_step.build_electra(tiny_args(), recipe, 2, 32, 60)
    hf = sides["transformers"][0]
    gen, disc = hf["generator"], hf["discriminator"]
    assert gen.electra.embeddings is disc.electra.embeddings
    assert gen.generator_lm_head.weight is disc.electra.embeddings.word_embeddings.weight
    assert plm.mlm_fraction == pytest.approx(min(0.15, 19 / 32))
    check = pretrain_step.check_same_work(sides)
    assert check["plm"] == pytest.approx(check["transformers"], abs=1e-4)
    for side in sides.values():
        assert torch.isfinite(train_step(*side))


def test_electra_batch_is_the_objectives_window_batch():
    recipe = load_recipe("electra-mini")
    from plmcli.objectives.rtd import ReplacedTokenDetection

    obj = ReplacedTokenDetection(recipe.objective, None, pretrain_step.special_ids(recipe), 32)
    obj.configure_model(replace(recipe.model, vocab_size=0), 60)
    batch = pretrain_step.electra_batch(obj, 3, 60, 0)
    ids, pos = batch["input_ids"], batch["mlm_positions"]
    assert ids.shape == (3, 32) and (ids[:, 0] == obj.special_ids["cls"]).all() and (ids[:, -1] == obj.special_ids["sep"]).all()
    assert 0 < len(pos) <= 3 * 19 and isinstance(batch["sample_seed"], int)
    again = pretrain_step.electra_batch(obj, 3, 60, 0)
    assert torch.equal(again["input_ids"], ids) and again["sample_seed"] == batch["sample_seed"]


# ---------------------------------------------------------------- the speed-ups keep the distribution


def test_blockwise_inverse_cdf_sample_follows_the_softmax_across_blocks():
    from plmcli.objectives.rtd import sample

    # 7 tokens in blocks of 3 (the last one padded), a token of probability 0 inside the first block
    logits = torch.tensor([2.0, -1e4, 0.0, -1.0, 1.0, 0.5, 3.0])
    draws = sample(logits.expand(100_000, 7), torch.Generator().manual_seed(1), block=3)
    freq = torch.bincount(draws, minlength=7).float() / len(draws)
    torch.testing.assert_close(freq, logits.softmax(-1), atol=0.005, rtol=0)
    assert not (draws == 1).any() and draws.max() < 7
    one_hot = torch.full((5, 130), -1e4).scatter(1, torch.tensor([[0], [63], [64], [127], [129]]), 0.0)
    assert sample(one_hot).tolist() == [0, 63, 64, 127, 129]  # all mass on one token: that token, at block edges too


def test_profile_table_names_the_matmul_share():
    ops = [("aten::mm", 5.0, 0.5), ("aten::bmm", 2.0, 0.2), ("aten::bernoulli_", 3.0, 0.3)]
    line = common.profile_table({"plm": ops}, rows=2)
    assert line.startswith("- **plm** (10 ms/step of op self time, 70% in matmuls): `aten::mm` 50% (5 ms), `aten::bmm` 20%")
    assert "bernoulli" not in line  # only the top `rows` ops are listed
