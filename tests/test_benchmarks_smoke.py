"""The pieces of the comparison benchmarks that decide their numbers, checked against brute force.

Running the benchmarks themselves, even at toy size, takes tens of seconds each (they train tokenizers,
spawn processes, import transformers); these tests pin what their tables are computed from. (ppl-speed
checks its GPT2LMHeadModel copy against plm's logits itself before it times anything.)
"""

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.speed.ppl_speed import guide_nll, window_flops
from benchmarks.speed.startup import parse_importtime, top_level
from benchmarks.speed.tokenize_speed import write_corpus
from benchmarks.speed.varlen_sst2 import length_grouped, padding_share
from plmcli.eval.perplexity import sequence_nll
from plmcli.models.gpt import GPT, GPTConfig

pytestmark = [pytest.mark.bench, pytest.mark.usefixtures("one_thread")]


def test_length_grouped_batches_cover_each_sentence_once_sorted_within_windows():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 60, 200)
    indices = rng.permutation(200)[:150]
    batches = length_grouped(indices, lengths, batch_size=8, window=4, seed=1)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == sorted(indices.tolist())
    assert [len(b) for b in batches].count(8) == len(batches) - 1  # 150 = 18 × 8 + 6
    for lo in range(0, 150, 32):  # each window of 4 batches holds the window's sentences, longest first
        window = indices[lo : lo + 32]
        got = [b for b in batches if set(b.tolist()) <= set(window.tolist())]
        assert sum(len(b) for b in got) == len(window)
        ordered = np.concatenate(sorted(got, key=lambda b: -lengths[b[0]]))
        assert (np.diff(lengths[ordered]) <= 0).all()
    # grouping can only reduce padding on the same sentences
    plain = [lengths[indices[i : i + 8]] for i in range(0, 150, 8)]
    assert padding_share([lengths[b] for b in batches])[1] < padding_share(plain)[1]


def test_padding_share_counts_real_and_padded_positions():
    batches = [np.array([3, 5, 5]), np.array([4, 4]), np.array([7])]
    real, total, unpadded = padding_share(batches)
    assert (real, total, unpadded) == (3 + 5 + 5 + 4 + 4 + 7, 3 * 5 + 2 * 4 + 7, 2)


def test_parse_importtime_reads_depth_and_ranks_top_level_imports():
    stderr = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:       118 |        118 |   _io",
        "import time:       258 |        733 | _frozen_importlib_external",
        "import time:       902 |      17761 |     typer.main",
        "import time:       192 |      25376 |   typer",
        "import time:      4055 |      31627 | plmcli.cli",
        "some other stderr line",
    ])
    rows = parse_importtime(stderr)
    assert [(r["name"], r["depth"]) for r in rows] == [("_io", 1), ("_frozen_importlib_external", 0), ("typer.main", 2),
                                                        ("typer", 1), ("plmcli.cli", 0)]
    assert rows[3]["self_us"] == 192 and rows[3]["cumulative_us"] == 25376
    assert [r["name"] for r in top_level(rows, 5)] == ["plmcli.cli", "_frozen_importlib_external"]


def test_write_corpus_repeats_whole_documents_to_size(tmp_path):
    text = "a b c\nd e\n\nf g h i\n\nj\n"  # 3 documents, 20 bytes with the final blank line
    written = write_corpus(tmp_path, text, 130, 3)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 3 and written == sum(f.stat().st_size for f in files)
    assert 130 <= written < 130 + 3 * 20  # each file overshoots by less than one copy
    for f in files:
        body = f.read_text()
        assert body.endswith("\n\n")  # cut at a document break
        docs = [d for d in body.split("\n\n") if d]
        assert set(docs) <= {"a b c\nd e", "f g h i", "j"}


class _HFLike(torch.nn.Module):
    """A plm GPT behind transformers' causal-LM call: `model(ids, labels=...)` -> .loss, the mean NLL
    of labels[:, 1:] (shifted inside, -100 ignored), as GPT2LMHeadModel computes it."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, ids, labels):
        logits = self.gpt(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return SimpleNamespace(loss=loss, logits=logits)


def _token_nll(gpt, seq, start, p):
    """-log p(seq[p] | seq[start:p]) by a direct forward pass."""
    with torch.no_grad():
        logits = gpt(torch.as_tensor(seq[start:p])[None])[0, -1]
    return -torch.log_softmax(logits.double(), -1)[seq[p]].item()


def test_guide_loop_weighting_and_boundary_contexts_match_brute_force():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=37, max_positions=16, n_layer=1, n_head=2, d_model=16, dropout=0.0,
                        attn_dropout=0.0)).eval()
    seq = np.random.default_rng(0).integers(0, 37, 41)
    n, L, S = len(seq), 12, 5
    g = guide_nll(_HFLike(gpt), torch.as_tensor(seq)[None], L, S)

    # The guide's windows: [b, min(b+L, n)) scoring targets [prev_end, end) (the first window from 1).
    guide_tokens, prev_end, windows = {}, 0, 0
    for b in range(0, n, S):
        end = min(b + L, n)
        for p in range(max(prev_end, 1), end):
            guide_tokens[p] = b
        windows, prev_end = windows + 1, end
        if end == n:
            break
    assert sorted(guide_tokens) == list(range(1, n))  # every token after the first, once
    assert g["windows"] == windows and g["exact_tokens"] == n - 1 and g["tokens"] == n - 1 - (windows - 1)
    brute = {p: _token_nll(gpt, seq, b, p) for p, b in guide_tokens.items()}
    assert g["exact_nll"] == pytest.approx(sum(brute.values()) / (n - 1), abs=1e-5)
    # As written, the guide weights each later window's mean by one label fewer than it averages.
    sums, prev_end = [], 0
    for b in range(0, n, S):
        end = min(b + L, n)
        scored = [brute[p] for p in range(max(prev_end, 1), end)]
        sums.append((np.mean(scored), len(scored) - (1 if b else 0)))
        prev_end = end
        if end == n:
            break
    assert g["nll"] == pytest.approx(sum(m * k for m, k in sums) / sum(k for _, k in sums), abs=1e-5)

    # plm's windows: the token at each window boundary is the only one scored with another context.
    nll, count = sequence_nll(lambda x: gpt(x), seq, L, S, batch_size=3)
    plm_tokens, prev_end, start = {}, 0, 0
    while prev_end < n - 1:
        end = min(start + L, n - 1)
        for p in range(prev_end + 1, end + 1):
            plm_tokens[p] = start
        prev_end, start = end, start + S
    assert count == n - 1 and sorted(plm_tokens) == list(range(1, n))
    differ = [p for p in plm_tokens if plm_tokens[p] != guide_tokens[p]]
    assert differ == [b + L for b in range(0, n, S) if b + L <= n - 1]  # here 12, 17, ..., 37
    assert all(p - plm_tokens[p] == L and p - guide_tokens[p] == L - S for p in differ)
    plm_brute = sum(brute[p] for p in plm_tokens if p not in differ) + sum(_token_nll(gpt, seq, plm_tokens[p], p) for p in differ)
    assert nll == pytest.approx(plm_brute, abs=1e-4)
    assert math.isfinite(nll)



def test_bert_plateau_neighbour_mass_windows_and_shuffled_context():
    from benchmarks.quality.bert_plateau import neighbour_mass, shuffle_context, windows

    T = 6
    uniform = torch.full((2, 3, T, T), 1 / T)
    assert neighbour_mass([uniform]) == pytest.approx(1 / T)
    shifted = torch.zeros(1, 1, T, T)
    shifted[0, 0, torch.arange(T - 1), torch.arange(1, T)] = 1.0  # every token looks at the next one
    assert neighbour_mass([shifted]) == pytest.approx(0.5)  # the mean of next (1) and previous (0)

    rows = windows({"input_ids": [[5, 6, 7], [8, 9, 10, 11, 12]]}, seq_len=5, cls=2, sep=3)
    assert rows.tolist() == [[2, 5, 6, 7, 3], [2, 8, 9, 10, 3]]  # one stream cut into 3-token windows

    x = torch.arange(20, 40).view(2, 10)
    pos = torch.tensor([3, 12, 15])
    xs, pos2, _ = shuffle_context((x, pos, None), np.random.default_rng(0))
    assert torch.equal(pos2, pos)
    flat, flat_s = x.flatten(), xs.flatten()
    assert torch.equal(flat_s[pos], flat[pos]) and torch.equal(xs[:, [0, -1]], x[:, [0, -1]])  # targets, ends kept
    for r in range(2):
        assert sorted(xs[r].tolist()) == sorted(x[r].tolist()) and not torch.equal(xs[r], x[r])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # the CPU's jagged SDPA kernel
def test_gpu_varlen_pieces_run_on_a_cpu_and_the_two_paths_agree():
    from benchmarks.gpu.gpu_varlen import agreement, attention_path, build, make_batches, sentence_lengths, train_step
    from plmcli.models import layers
    from plmcli.models.bert import BertConfig

    lengths = sentence_lengths()
    assert len(lengths) == 2000 and min(lengths) >= 3  # [CLS] + at least one piece + [SEP]
    batches = make_batches(lengths, batch=6, n=2, vocab=50, seed=0)
    ids, mask, y = batches[0]
    assert ids.shape == mask.shape and mask.shape[1] == mask.sum(1).max() and (ids[mask == 0] == 0).all()
    cfg = BertConfig(vocab_size=50, max_positions=128, n_layer=2, n_head=2, d_model=16, d_ff=32)
    device = torch.device("cpu")
    model, head, opt = build(cfg, device, seed=0)
    check = agreement(model, head, batches[0], device)
    assert check["hidden_max_abs_diff"] < 0.05 * check["hidden_max_abs"] and check["grad_max_rel_diff"] < 0.1
    with attention_path(True):
        assert layers.unpadded_attention(device)
        before = [p.detach().clone() for p in model.parameters()]
        train_step(model, head, opt, batches[1], device)
    assert not layers.unpadded_attention(device)  # restored
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_window_flops_counts_each_matrix_multiply():
    """ppl-speed's FLOP bound, counted row by row and layer by layer: qkv (d→3d), output projection (d→d),
    feed-forward (d→4d→d), causal attention as half the L×L products; plm's last layer computes only keys and
    values (and their attention) at the context rows, and its output layer only at the scored rows."""
    n_layer, d, V, L, S = 3, 8, 50, 12, 5
    guide = plm = 0
    for layer in range(n_layer):
        for t in range(L):
            full = 2 * d * (3 * d + d + 4 * d + 4 * d) + 2 * L * d
            guide += full
            plm += 2 * d * 2 * d + 2 * L * d if layer == n_layer - 1 and t < L - S else full
    guide += L * 2 * d * V
    plm += S * 2 * d * V
    assert window_flops(n_layer, d, V, L, S) == {"guide": guide, "plm": plm}


def test_lm_head_benchmark_times_equal_heads_and_writes_nothing_with_no_write(monkeypatch, capsys):
    from benchmarks.speed import lm_head
    from benchmarks.__main__ import main

    monkeypatch.setattr(lm_head, "SHAPES", [("tiny", 40, 8, 300, True)])
    assert main(["lm-head", "--repeats", "1", "--calls", "1", "--threads", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "| tiny | 40 × 8 · 300 + bias | fwd + bwd | 2048 |" in out and "(--no-write: BENCHMARKS.md left alone)" in out
    assert "| tiny | 40 × 8 · 300 + bias | no grad (scoring) | 2048 |" in out


def test_lstm_step_benchmark_reports_both_sides_share_of_the_fp32_probe(capsys):
    from benchmarks.__main__ import main

    assert main(["lstm-step", "--vocab", "50", "--steps", "1", "--repeats", "1", "--threads", "1",
                 "--gemm-size", "64", "--gemm-calls", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "| side | tokens/s (median) | min–max | × plain | GFLOP/s (median) | % of fp32 GEMM |" in out
    weights = 2 * (2 * 800 * 200 + 2 * 800) + 50 * 200 + 50  # two 200-wide LSTM layers (4 gates) and the 50-word head
    assert "Large-GEMM probe (64×64 @ 64×64" in out and f"6 × {weights:,} = 3.9 MFLOP" in out
    rows = [line for line in out.splitlines() if line.startswith(("| plm |", "| plain nn.LSTM loop |"))]
    assert len(rows) == 2 and all(line.rstrip().endswith("% |") for line in rows)


def test_varlen_sst2_sets_every_row_against_the_fp32_probe(capsys):
    from benchmarks.__main__ import main

    assert main(["varlen-sst2", "--batch", "4", "--batches", "2", "--repeats", "1", "--threads", "1",
                 "--gemm-size", "64", "--gemm-calls", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "| batches with no padding | GFLOP/s (median) | % of fp32 GEMM |" in out
    assert "Large-GEMM probe (64×64 @ 64×64" in out and "Useful FLOPs per real token: 6 × " in out
    rows = [line for line in out.splitlines() if line.startswith(("| plm", "| transformers"))]
    assert len(rows) == 4 and all(line.rstrip().endswith("% |") for line in rows)


def test_input_pipeline_sets_each_builder_against_what_an_h100_consumes(capsys):
    from benchmarks.__main__ import main

    assert main(["input-pipeline", "--cases", "bert-base/dynamic", "gpt2-small/streaming", "--batches", "2", "--repeats", "1",
                 "--warmup", "1", "--max-bytes", "60000", "--threads", "1", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "| recipe | builder | micro-batch | tokens / batch | per-worker tok/s | H100 tok/s at 45% MFU |" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| bert-base/dynamic |", "| gpt2-small/streaming |"))]
    assert len(rows) == 2
    assert rows[0][2] == "64 × 128" and rows[0][3] == "8,192"  # bert-base's micro-batch, every token real
    for r in rows:  # the verdict is the auto workers' supply against the goal
        rate, gpu, supply = (float(r[i].replace(",", "").rstrip("×")) for i in (4, 5, 8))
        assert rate > 0 and gpu > 0 and supply == pytest.approx(8 * rate / gpu, rel=0.01, abs=0.06)
        assert r[-1].rstrip(" |") == ("yes" if supply >= 2 else "**no**")


def test_the_benchmarks_help_lists_every_benchmark():
    """`python -m benchmarks --help` (argparse %-formats each help text: a "45% MFU" once crashed it)."""
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stderr
    assert "45% MFU" in " ".join(p.stdout.split())  # input-pipeline's help, wrapped in the listing
    from benchmarks.__main__ import BENCHMARKS, GROUPS

    # every name under its group's heading, the headings in order
    headings = [p.stdout.index(f"\n{group}: ") for group in GROUPS]
    assert headings == sorted(headings)
    for name, (group, _) in BENCHMARKS.items():
        at = p.stdout.index(f"\n  {name} ")
        assert max(h for h in headings if h < at) == headings[GROUPS.index(group)], f"{name} is not under {group}"
