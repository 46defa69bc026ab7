"""Transformer-XL vs GPT at the same size, data, budget and window (Dai et al. 2019's claim, at mini scale).

Both recipes (`txl-mini`, `gpt-mini`) have 4 layers, 256 hidden, 4 heads, a 4096 byte-level BPE, windows
of 128 tokens, batch 16 and the same AdamW schedule; they train for the same number of steps (= tokens)
on the first 90% of tiny Shakespeare's lines, and `plm eval-ppl` scores the last 10%. GPT reads the test
text in windows of its 128 positions, every token scored once with 64..128 tokens of context (stride 64).
Transformer-XL reads it in segments of 128 with 128 states of memory per layer, as it was trained; the
no-memory row (mem_len 0 at evaluation) shows how much of the difference the memory makes.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "txl-vs-gpt"
HELP = "txl-mini vs gpt-mini on tiny Shakespeare: same size, data, steps and window; test perplexity"
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults

DEFAULT_DATA = common.SHARED_DATA / "tinyshakespeare" / "input.txt"


def add_arguments(p) -> None:
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="tiny shakespeare input.txt")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps for each model (16 × 128 tokens each)")
    p.add_argument("--test-fraction", type=float, default=0.1, help="the last share of lines held out as test text")


def split_lines(src: Path, dst: Path, test_fraction: float) -> tuple[Path, Path]:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = int(len(lines) * (1 - test_fraction))
    train, test = dst / "train.txt", dst / "test.txt"
    train.write_text("".join(lines[:cut]), encoding="utf-8")
    test.write_text("".join(lines[cut:]), encoding="utf-8")
    return train, test


def run(args) -> int:
    if not args.data.is_file():
        print(f"{NAME}: skipped — {args.data} not found (pass --data path/to/tinyshakespeare/input.txt)")
        return 0
    common.set_threads(args.threads)
    from plmcli import api
    from plmcli.config import override_layers
    from plmcli.config import load_recipe

    info = common.machine_info()
    print(common.machine_line(info))
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="plm-bench-") as tmp:
        os.environ["PLM_RUNS"] = str(Path(tmp) / "runs")
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        train, test = split_lines(args.data, Path(tmp), args.test_fraction)
        over = [f"train.eval_every={args.steps}", f"train.save_every={args.steps}", "train.log_every=50"]
        for recipe in ("gpt-mini", "txl-mini"):
            out = root / recipe
            print(f"training {recipe} for {args.steps} steps into {out} ...")
            t0 = time.perf_counter()
            s = api.pretrain(recipe, [str(train)], str(out), override_layers(over, {"train.max_steps": args.steps}))
            results[recipe] = {"summary": s, "wall": time.perf_counter() - t0}
            print(f"  val loss {s['val_loss']:.4f} in {s['elapsed_s']:.0f} s")
        evals = [
            ("gpt-mini", "windows of 128, stride 64", dict(max_length=128, stride=64)),
            ("gpt-mini", "windows of 128, stride 128", dict(max_length=128, stride=128)),
            ("txl-mini", "segments of 128 + memory 128", dict(tgt_len=128, mem_len=128)),
            ("txl-mini", "segments of 128, no memory", dict(tgt_len=128, mem_len=0)),
        ]
        for recipe, how, kw in evals:
            t0 = time.perf_counter()
            res = api.eval_ppl([str(test)], str(root / recipe), **kw)
            dt = time.perf_counter() - t0
            s = results[recipe]["summary"]
            params = api.count_params(load_recipe(recipe))
            rows.append([f"`{recipe}`", f"{params / 1e6:.2f}M", how, f"{res['ppl']:.2f}", f"{res['bpb']:.4f}",
                         f"{res['tokens']:,}", f"{s['val_loss']:.4f}", f"{s['elapsed_s']:.0f} s", f"{dt:.0f} s"])
            print(f"  {recipe} {how}: ppl {res['ppl']:.3f}")
            results.setdefault("ppl", {})[(recipe, how)] = res["ppl"]
    ppl = results["ppl"]
    gpt_best = min(v for (r, _), v in ppl.items() if r == "gpt-mini")
    txl = ppl[("txl-mini", "segments of 128 + memory 128")]
    nomem = ppl[("txl-mini", "segments of 128, no memory")]
    met = txl < gpt_best
    table = common.markdown_table(
        ["model", "params", "test reading", "test ppl", "bits/byte", "tokens scored", "final val loss", "train loop",
         "eval time"], rows)
    text = f"""
`txl-mini` vs `gpt-mini` (4 layers, 256 hidden, 4 heads, d_ff 1024, byte-level BPE 4096, windows of 128,
batch 16, AdamW 1e-3 cosine, dropout 0.1), each trained for {args.steps} steps ({args.steps * 16 * 128:,}
tokens) on the first {1 - args.test_fraction:.0%} of the lines of tiny Shakespeare; test perplexity of
`plm eval-ppl` on the last {args.test_fraction:.0%} (every token scored once). Same tokenizer (one cached
corpus), same token budget. The loops differ in how they read the training text, as each model's paper
does: GPT random 128-token windows (shuffled), Transformer-XL 16 parallel streams read in order, the
memory carried from segment to segment. The final val loss is each loop's own validation (GPT: disjoint
windows; TXL: segments with memory), so it is not comparable across rows; the test ppl is.

Result: Transformer-XL with memory {txl:.2f} vs GPT's best {gpt_best:.2f} — **{'lower, goal met' if met else 'not lower, goal NOT met'}**.
Read without memory the same Transformer-XL scores {nomem:.2f}: at test time the memory is worth
{(nomem - txl) / nomem:.1%} of its perplexity, and the rest of its lead over GPT comes from how it was trained
(relative positions, and segments that always see the preceding text through the memory, where GPT's
windows start cold).
"""
    common.publish(NAME, common.section_body("Transformer-XL vs GPT: same size, data, budget and window", args,
                                             text, table, info), args)
    return 0
