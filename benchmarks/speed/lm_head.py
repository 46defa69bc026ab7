"""The output layer and its cross-entropy, forward and backward and without gradients, three ways on the same inputs.

plm's models take their LM / MLM loss through `plmcli.models.lm_loss.linear_cross_entropy`: the decoder
fused with the loss a chunk of rows at a time, the (N, V) logits never kept for backward. This times it
against the plain `F.cross_entropy(F.linear(h, w, b), y)` and against its own (n, V) row layout at the
shapes plm's recipes train with, so the CPU's layout and chunk choice (`chunk_rows`) rest on a figure.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import common

NAME = "lm-head"
HELP = "fused LM head + cross-entropy (vocab-major / row-major chunks) vs F.linear + F.cross_entropy: ms per fwd+bwd and per scoring call"
DEFAULTS = {"repeats": 7}  # the shared options it takes (benchmarks/__main__.py), its defaults

# (label, rows N, width C, vocabulary V, decoder bias): the head of each recipe's training step
SHAPES = [
    ("gpt-mini step (16 × 128 tokens)", 2048, 256, 4096, False),
    ("bert-mini MLM (15% of 32 × 128)", 608, 256, 30522, True),
    ("GPT-2 vocabulary, 8 × 128 tokens at C 768", 1024, 768, 50257, False),
]


def add_arguments(p) -> None:
    p.add_argument("--calls", type=int, default=3, help="fwd+bwd calls per sample")


DEFAULT = "fused, plm's default"


def run(args) -> int:
    import torch
    import torch.nn.functional as F

    from plmcli.models.lm_loss import chunk_rows, linear_cross_entropy

    common.set_threads(args.threads)
    info = common.machine_info()
    print(common.machine_line(info))
    rows = []
    for label, N, C, V, with_bias in SHAPES:
        g = torch.Generator().manual_seed(0)
        h = torch.randn(N, C, generator=g).requires_grad_()
        w = (torch.randn(V, C, generator=g) * 0.02).requires_grad_()
        b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if with_bias else None
        y = torch.randint(0, V, (N,), generator=g)
        sides = {
            "plain": lambda: F.cross_entropy(F.linear(h, w, b), y),
            "fused, (n, V) rows": lambda: linear_cross_entropy(h, w, y, bias=b, vocab_major=False),
            "fused, (V, n) vocab-major": lambda: linear_cross_entropy(h, w, y, bias=b, vocab_major=True),
            DEFAULT: lambda: linear_cross_entropy(h, w, y, bias=b),
        }
        losses = {k: f().item() for k, f in sides.items()}
        if max(losses.values()) - min(losses.values()) > 1e-5 * abs(losses["plain"]):
            raise SystemExit(f"lm-head: the heads disagree before timing: {losses}")

        def sampler(fn, backward: bool):
            def once() -> float:
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    if backward:
                        fn().backward()
                    else:
                        with torch.no_grad():
                            fn()
                return (time.perf_counter() - t0) / args.calls * 1e3
            return once

        for mode, backward in (("fwd + bwd", True), ("no grad (scoring)", False)):
            print(f"{label}, {mode}: N {N}, C {C}, V {V}, chunk {chunk_rows(V, h.device)} rows")
            samples = common.interleave({k: sampler(f, backward) for k, f in sides.items()}, args.repeats,
                                        fmt="{:,.1f} ms")
            med = {k: statistics.median(v) for k, v in samples.items()}
            rows.append([label, f"{N:,} × {C} · {V:,}" + (" + bias" if with_bias else ""), mode, chunk_rows(V, h.device),
                         *(f"{med[k]:,.1f}" for k in sides), f"{med['plain'] / med[DEFAULT]:.2f}×"])
    table = common.markdown_table(["shape", "h · wᵀ", "pass", "chunk rows", "plain ms", "fused rows ms",
                                   "fused vocab-major ms", "plm's default ms", "plain ÷ default"], rows)
    text = f"""
The output layer and its mean cross-entropy, forward and backward (gradients of h, the weight and the bias), and
forward alone under `torch.no_grad()` (how eval-ppl and every validation pass score), on random inputs (the
losses checked equal to 1e-5 first), {args.repeats} interleaved samples of {args.calls} calls per side and pass,
median ms per call:

- **plain**: `F.cross_entropy(F.linear(h, w, b), y)`, the (N, V) logits kept for backward.
- **fused, rows**: `plmcli.models.lm_loss.linear_cross_entropy(..., vocab_major=False)`: chunks of `chunk_rows`
  rows, each chunk's logits h · wᵀ as (n, V), softmax minus one-hot and both gradient products while the chunk
  is hot (the layout plm uses on a GPU).
- **fused, vocab-major**: the same with each chunk's logits as (V, n) = w · hᵀ (MKL runs that product 1.5–2×
  faster than the (n, V) one at 30–50k words), softmax along V.
- Without gradients the fused sides compute the loss alone, chunk by chunk: rows as `F.cross_entropy` of each
  (n, V) chunk, its product on oneDNN where that applies (`plmcli.kernels`: fp32 on a CPU), vocab-major as
  logsumexp − logit[y] over each (V, n) chunk from MKL.
- **plm's default** (`vocab_major=None`): vocab-major with gradients on a CPU; without them rows on oneDNN
  where it applies (its (n, V) product is as fast as MKL's (V, n) one, and cross-entropy's kernel along a
  contiguous V axis 3× faster than logsumexp across rows), else vocab-major; rows on a GPU.
"""
    common.publish(NAME, common.section_body("Fused LM head: layouts and chunks", args, text, table, info), args)
    return 0
