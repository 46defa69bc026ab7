"""nanoGPT's CPU shakespeare_char run and plm's `gpt-char-shakespeare` recipe, measured in the same run.

nanoGPT is a script, not a package: its unmodified source (../shared/peers/nanoGPT) is copied to a temp
dir, its `prepare.py` makes the character data from the same input.txt offline (untimed), and its
`train.py` runs as a subprocess, alternating with `plm pretrain` as a subprocess (A B A B ...), both
with the same thread budget. Both walls are process walls taken the same way, by the parent.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

NAME = "nanogpt-char"
HELP = "nanoGPT's shakespeare_char CPU run vs plm's gpt-char-shakespeare, interleaved: val losses and process walls"
DEFAULTS = {"repeats": 1, "keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults

DEFAULT_DATA = common.SHARED_DATA / "tinyshakespeare" / "input.txt"
DEFAULT_NANOGPT = common.REPO_ROOT.parent / "shared" / "peers" / "nanoGPT"
# nanoGPT README's laptop overrides, at the shape of plm's gpt-char-shakespeare recipe.
NANOGPT_OVERRIDES = ("--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                     "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--dropout=0.0")
GOAL_RATIO = 0.8

_EVAL = re.compile(r"^step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)", re.M)
_ITER = re.compile(r"^iter (\d+): loss ([0-9.]+), time ([0-9.]+)ms", re.M)


def add_arguments(p) -> None:
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="tiny shakespeare input.txt")
    p.add_argument("--nanogpt", type=Path, default=DEFAULT_NANOGPT, help="nanoGPT's source tree (read only: it runs from a copy)")
    p.add_argument("--recipe", default="gpt-char-shakespeare", help="plm recipe to run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, as `plm pretrain --set` (repeatable); changes what is compared")
    p.add_argument("--max-steps", type=int,
                   help="both sides stop early (nanoGPT's max_iters and lr_decay_iters): a smoke test, not the comparison")
    common.add_limit_arguments(p)


def nanogpt_argv(max_iters: int = 2000) -> list[str]:
    """train.py's command line: the shipped config, the CPU overrides, and the horizon (lr decay over all of it)."""
    argv = ["train.py", "config/train_shakespeare_char.py", *NANOGPT_OVERRIDES,
            f"--max_iters={max_iters}", f"--lr_decay_iters={max_iters}"]
    if max_iters <= 100:  # a smoke test: its cosine divides by lr_decay_iters - warmup_iters (100 in the config)
        argv.append(f"--warmup_iters={max_iters // 2}")
    return argv


def prepare_nanogpt(src: Path, text: Path, dest: Path, env: dict | None = None) -> Path:
    """A copy of nanoGPT's tree under `dest` with its shakespeare_char data made from `text`; its root.

    prepare.py downloads input.txt only when the file is missing beside it, so the copy puts ours there
    first and no network is touched; it then writes train.bin / val.bin (the last 10% of the characters).
    """
    root = dest / "nanoGPT"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("out*", "__pycache__", "*.bin", "*.pkl", "input.txt"))
    prep = root / "data" / "shakespeare_char"
    shutil.copyfile(text, prep / "input.txt")
    proc = subprocess.run([sys.executable, "prepare.py"], cwd=prep, env=env, capture_output=True, text=True)
    if proc.returncode or not (prep / "train.bin").is_file():
        raise SystemExit(f"nanoGPT's prepare.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return root


def parse_nanogpt_log(text: str) -> dict:
    """What train.py printed: every evaluation (step, train loss, val loss), the last one's losses, and
    the per-iteration times (ms) of its `iter N: ... time T ms` lines (an iteration that evaluated
    includes the evaluation)."""
    evals = [(int(s), float(tr), float(va)) for s, tr, va in _EVAL.findall(text)]
    if not evals:
        raise ValueError("no 'step N: train loss X, val loss Y' line in nanoGPT's output")
    iters = [(int(i), float(ms)) for i, _, ms in _ITER.findall(text)]
    return {"evals": evals, "val_loss": evals[-1][2], "train_loss": evals[-1][1], "last_eval_step": evals[-1][0],
            "iters": len(iters), "iter_ms": [ms for _, ms in iters]}


def timed_process(argv: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    """(wall seconds from spawn to exit, stdout) of one process; a failure stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def plm_argv(args, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "plmcli", "pretrain", "--recipe", args.recipe, "--data", str(args.data), "--out", str(out)]
    for s in args.set:
        argv += ["--set", s]
    if args.max_steps:
        argv += ["--max-steps", str(args.max_steps)]
    return argv


def plm_result(out: Path, wall: float) -> dict:
    """plm's side of one round, read from the run directory: summary and the median logged step time."""
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tok_per_s"] for r in rows if "tok_per_s" in r]
    tokens_per_step = summary["tokens"] / max(summary["steps"], 1)
    # The median over the 50-step logging windows leaves out the few that held an evaluation.
    step_ms = 1000 * tokens_per_step / statistics.median(rates) if rates else float("nan")
    return {"wall": wall, "val_loss": summary.get("val_loss"), "loop": summary["elapsed_s"], "steps": summary["steps"],
            "step_ms": step_ms, "evals": sum("val_loss" in r for r in rows), "tokens_per_step": tokens_per_step,
            "flops_per_token": run_flops_per_token(out)}


def run_flops_per_token(out: Path) -> float:
    """Training FLOPs per token of the run's model: `GPT.flops_per_token`, 6N + 12·L·T·C with N all weights but
    the position table, the formula of nanoGPT's own `estimate_mfu` too."""
    from plmcli.runs import build_run_model

    cfg = json.loads((out / "config.json").read_text())
    return build_run_model(out, cfg, init=False).flops_per_token(cfg["seq_len"])  # a count: no weights needed


def nanogpt_result(stdout: str, wall: float) -> dict:
    log = parse_nanogpt_log(stdout)
    return {"wall": wall, "val_loss": log["val_loss"], "loop": sum(log["iter_ms"]) / 1000, "steps": log["iters"],
            "step_ms": statistics.median(log["iter_ms"]) if log["iter_ms"] else float("nan"), "evals": len(log["evals"])}


def warm_cache(args) -> None:
    """Tokenize the corpus and build the token streams pretrain reads, untimed (as nanoGPT's prepare.py is)."""
    from plmcli.config import load_recipe
    from plmcli.data.corpus import prepare_corpus
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.objectives.registry import objective_class

    recipe = load_recipe(args.recipe, args.set or None)
    corpus_dir = prepare_corpus([str(args.data)], recipe.tokenizer, recipe.data)
    meta = json.loads((corpus_dir / "meta.json").read_text())
    tok = load_tokenizer(corpus_dir / "tokenizer.json")
    obj = objective_class(recipe.objective_name)(recipe.objective, tok, meta["tokenizer"]["special_token_ids"],
                                                 recipe.train.seq_len)
    for split, shuffle in (("train", True), ("validation", False)):
        if meta["counts"].get(split, {}).get("documents", 0):
            obj.stream(corpus_dir, split, recipe.train.global_batch_size, recipe.train.seed, 0, 1, shuffle)


def measure(args, root: Path, flags: list[str]) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    """The A B rounds: nanoGPT then plm, `args.repeats` times, each a fresh process on the same threads; after
    each round one sample of each GEMM probe in this process, on the same thread count: (sides, probe samples)."""
    print("copying nanoGPT and preparing its shakespeare_char data (offline, untimed) ...")
    env = common.child_env(args.threads, MKL_NUM_THREADS=str(args.threads))
    peer = prepare_nanogpt(args.nanogpt, args.data, root, env)
    print("warming plm's tokenize cache (untimed) ...")
    warm_cache(args)
    env = common.child_env(args.threads, MKL_NUM_THREADS=str(args.threads))  # now with PLM_RUNS / PLM_CACHE set
    sides: dict[str, list[dict]] = {"nanoGPT": [], "plm": []}
    probes = common.probe_runners(args, flags)
    probe_samples: dict[str, list[float]] = {name: [] for name in probes}
    for r in range(args.repeats):
        out_dir = root / f"nanogpt-out-{r + 1}"
        wall, stdout = timed_process([sys.executable, *nanogpt_argv(args.max_steps or 2000), f"--out_dir={out_dir}"],
                                     peer, env)
        (root / f"nanogpt-{r + 1}.log").write_text(stdout)
        sides["nanoGPT"].append(nanogpt_result(stdout, wall))
        out = root / f"plm-{r + 1}"
        wall, _ = timed_process(plm_argv(args, out), common.REPO_ROOT, env)
        sides["plm"].append(plm_result(out, wall))
        for name, probe in probes.items():
            probe_samples[name].append(probe())
        print(f"round {r + 1}/{args.repeats}: " + "  ".join(
            f"{k} {v[-1]['wall']:.1f} s (val {v[-1]['val_loss']:.4f}, step {v[-1]['step_ms']:.1f} ms)" for k, v in sides.items())
            + "".join(f"  {k} {v[-1]:.1f} GFLOP/s" for k, v in probe_samples.items()))
    return sides, probe_samples


def table(sides: dict[str, list[dict]], repeats: int, step_gflop: float, peaks: dict[str, float]) -> tuple[str, dict]:
    """The Markdown table and the verdict {ratio, met_time, met_loss}. Each side's wall is split into
    start-up + exit (wall − loop), the steps (steps × median step) and the rest of the loop (evaluations,
    checkpoints, slow steps): where one side spends what the other does not. `step_gflop`: one step's
    training GFLOP (the same model on both sides), so the median step's GFLOP/s is set against the fp32 probes
    (`peaks`: {"fp32": GFLOP/s, "fp32-onednn": ...}; bf16 left out, both sides run fp32)."""
    peaks = common.fp32_peaks(peaks)
    fields = ("wall", "val_loss", "loop", "step_ms", "steps")
    med = {k: {f: statistics.median(r[f] for r in v) for f in fields} for k, v in sides.items()}
    for m in med.values():
        m["outside"], m["stepping"] = m["wall"] - m["loop"], m["steps"] * m["step_ms"] / 1000
        m["rest"] = m["loop"] - m["stepping"]

    def span(k, f):
        vals = [r[f] for r in sides[k]]
        return f"{med[k][f]:.1f} s" + (f" ({min(vals):.1f}–{max(vals):.1f})" if repeats > 1 else "")

    rows = [[k, f"{m['val_loss']:.4f}", span(k, "wall"), f"{m['outside']:.1f} s", span(k, "loop"), f"{m['stepping']:.1f} s",
             f"{m['rest']:.1f} s", f"{m['step_ms']:.1f}", int(m["steps"]), sides[k][0]["evals"],
             f"{1000 * step_gflop / m['step_ms']:.1f}",
             *(f"{100 * step_gflop / m['step_ms'] * 1000 / peak:.0f}%" for peak in peaks.values())]
            for k, m in med.items()]
    blank = [""] * (len(peaks) - 1)
    p, n = med["plm"], med["nanoGPT"]
    ratio = p["wall"] / n["wall"]
    verdict = {"ratio": ratio, "met_time": ratio <= GOAL_RATIO, "met_loss": p["val_loss"] <= n["val_loss"]}
    yes = {True: "**yes**", False: "**no**"}
    rows += [["plm ÷ nanoGPT", f"{p['val_loss'] - n['val_loss']:+.4f}", f"**{ratio:.2f}×**", f"{p['outside'] - n['outside']:+.1f} s",
              f"{p['loop'] / n['loop']:.2f}×", f"{p['stepping'] / n['stepping']:.2f}×", f"{p['rest'] - n['rest']:+.1f} s",
              f"{p['step_ms'] / n['step_ms']:.2f}×", "", "", "", "", *blank],
             ["goal", "≤ +0", f"≤ {GOAL_RATIO}×", *[""] * 9, *blank],
             ["**met?**", yes[verdict["met_loss"]], yes[verdict["met_time"]], *[""] * 9, *blank]]
    headers = ["side", "val loss (last eval)", "process wall", "start-up + exit", "train loop", "loop: steps",
               "loop: evals, saves", "median step ms", "steps", "evals", "GFLOP/s (median step)",
               *(f"% of {k} GEMM" for k in peaks)]
    return common.markdown_table(headers, rows), verdict


def run(args) -> int:
    for path, what in ((args.data, "tinyshakespeare/input.txt"), (args.nanogpt / "train.py", "nanoGPT's source")):
        if not path.exists():
            print(f"nanogpt-char: skipped — {path} not found ({what}; the shared data and peers live next to the checkout)")
            return 0
    common.set_threads(args.threads)
    info = common.machine_info()
    print(common.machine_line(info))
    with common.isolated_workdir("plm-bench-nanogpt-", args.keep) as root:
        sides, probe_samples = measure(args, root, info["flags"])
    probe_stats = {name: common.summary(v) for name, v in probe_samples.items()}
    fpt, tokens_per_step = sides["plm"][0]["flops_per_token"], int(sides["plm"][0]["tokens_per_step"])
    tab, verdict = table(sides, args.repeats, fpt * tokens_per_step / 1e9, common.split_probes(probe_stats)[1])
    text = describe(args, sides, verdict) + limit_text(args, info, probe_stats, fpt, tokens_per_step)
    common.publish(NAME, common.section_body("nanoGPT shakespeare_char on CPU: plm vs nanoGPT, same run", args, text, tab, info),
                   args)
    return 0


def limit_text(args, info: dict, probe_stats: dict, fpt: float, tokens_per_step: int) -> str:
    return (f"\n{common.probe_line(probe_stats, info['flags'], args.gemm_size)} The probe runs in this benchmark's "
            f"process after each round, on the {args.threads} threads the children get. Training FLOPs per token: "
            f"`GPT.flops_per_token` = 6·N + 12·L·T·C, N all weights but the position table = {fpt / 1e6:.2f} MFLOP "
            f"({tokens_per_step} tokens a step; nanoGPT's `estimate_mfu` counts the same), the same for both sides: GFLOP/s = a step's FLOPs / the median "
            "step, and its share of each fp32 probe's median. At this size every matmul is 768 rows by 128 to 512 "
            "columns (or a weight gradient summing 768 rows), far below a 2048² GEMM's rate on both sides.\n")


def describe(args, sides, verdict) -> str:
    from plmcli.config import load_recipe

    recipe = load_recipe(args.recipe, args.set or None)
    t, m = recipe.train, recipe.model
    smoke = "" if args.max_steps is None else (
        f"\n**Smoke test:** both sides stopped at {args.max_steps} steps (`--max-steps`), so this is not the comparison.\n")
    return f"""
nanoGPT's unmodified source (`{common.shown(args.nanogpt)}`, MIT) runs from a temp copy: its
`data/shakespeare_char/prepare.py` makes train.bin/val.bin from the same `{common.shown(args.data)}` (copied
beside it, so it downloads nothing), then, in the same run and alternating with plm (nanoGPT, plm, nanoGPT,
plm, ...; {args.repeats} round{'s' * (args.repeats > 1)}), each side runs as a fresh process with
OMP_NUM_THREADS={args.threads}:

    python {' '.join(nanogpt_argv(args.max_steps or 2000))}
    python -m plmcli pretrain --recipe {args.recipe} --data {common.shown(args.data)} --out RUN{''.join(' --set ' + s for s in args.set)}

plm's `{recipe.name}`: {m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, block {t.seq_len}, batch
{t.global_batch_size}, {t.max_steps} steps, dropout {m.dropout}, AdamW lr {recipe.optim.lr:g} cosine to
{recipe.optim.min_lr_ratio:g}× after {recipe.optim.warmup_steps} warmup steps, clip {t.grad_clip:g}: nanoGPT's config with the overrides above.

- **Process wall**, both sides alike: from spawning the interpreter to its exit, timed by this benchmark.
  nanoGPT's holds the interpreter and imports, model build, {2000 if args.max_steps is None else args.max_steps} + 1
  iterations (its loop runs iterations 0..max_iters), an evaluation every 250 (eval_iters 20 random batches
  of each split) and a `ckpt.pt` (model + optimizer) each time val improved. plm's holds the interpreter
  and imports, finding the tokenized corpus in its cache (tokenizing was done before, untimed, as
  prepare.py was), model build, the loop, its evaluations (every {t.eval_every} steps and at the end;
  `eval_batches: {t.eval_batches}`, 0 = the whole validation split), the final checkpoint (model,
  optimizer, RNG, data position: a bitwise resume) and `model.safetensors`.
- **Train loop**: nanoGPT's is the sum of its printed per-iteration times (its last evaluation included);
  plm's its `elapsed_s`, taken at the last step: the steps and the evaluations before it, while the final
  evaluation and the final saves fall in **start-up + exit** (wall − loop). **Loop: steps** is steps ×
  median step, **loop: evals, saves** the rest of the loop. **Median step ms**: nanoGPT's median printed
  iteration time; plm's from the median of its 50-step logging windows' tokens/s. Both medians leave out
  the iterations that evaluated.
- **Val loss**: nanoGPT's is its last printed estimate (20 random batches of 12 × 64); plm's the
  token-weighted mean over its validation split. The splits differ: nanoGPT holds out the last 10% of the
  *characters*, plm the last 10% of the *paragraphs*, and the blank line between paragraphs is one
  `<eos>` token in plm's stream.
- **Goal**: plm's median wall ≤ {GOAL_RATIO}× nanoGPT's at a val loss no worse: ratio {verdict['ratio']:.2f}×.
{smoke}
**Where the time goes, and why {GOAL_RATIO}× is out of reach** (profiled on an AMD EPYC, 2 threads, quiet,
2026-12-06). The two models are one computation: pre-LN GPT, no biases, exact GELU, SDPA with its causal
kernel, tied output layer, 4 × 128 at block 64. A bare forward + backward of plm's GPT and of nanoGPT's
`model.py` on the same 12 × 64 batch, 7 interleaved rounds of 30: 42.7 and 43.2 ms (median), op time
44.5 and 42.3 ms; on both sides the matmuls are 60% of it (26.5 / 24.9 ms, about 140 GFLOP/s where one
large GEMM runs at 180), SDPA's flash kernels 18%, GELU 11%: the same kernels, at the same speed.
Attending explicitly (two batched matmuls and a softmax, 20% faster than flash on this shape in isolation)
changed a whole training step by nothing measurable (36.4 vs 36.6 ms, 6 interleaved rounds), so it is not used.
What was plm's own, and is gone:
- evaluations: the recipe scored the whole validation split (145 batches) every 250 steps, 9 times, about an
  eighth of the run; now at step 1000 and at the end (2 × 111k tokens, more validation text than nanoGPT's
  9 × 20 batches of 768);
- the optimizer: the multi-tensor AdamW took 5.3 ms a step where torch's fused CPU kernel takes 2.4 ms (the
  same numbers to 1 ulp; nanoGPT's per-tensor AdamW: 6.2 ms, gradient fill included);
- data: a NumPy generator built per row to find the epoch's window offset (about 0.3 ms each, 12 a step),
  now once per epoch;
- start-up: importing `datasets` (2 s) for a run whose corpus is already tokenized.
What is left is the forward and backward both sides run alike (plm's whole step, optimizer and data included,
is 0.90× nanoGPT's per-iteration time in a bare in-process A/B; in the full runs the two sides' stepping comes
out within ±5% of each other, and plm's median step, read from 50-step logging windows, reads a few % high:
steps × median can exceed its whole loop), plus a start-up of the same kind (torch, torch._dynamo at the optimizer's
first use, and accelerate). In the full 2000-step run the steps are about 90% of both walls, so {GOAL_RATIO}× would
need plm's step 20% faster than nanoGPT's while its forward and backward, 80% of it, run the same kernels:
that takes other kernels (compiling the model, bf16), which nanoGPT's CPU command turns off, so neither is used here.
bf16 would not buy it at this size anyway: plm's GPT at this config, 12 × 64 tokens, forward + backward + fused AdamW,
2 threads, 6 interleaved rounds of 30 steps (AMD EPYC with avx512_bf16, quiet, 2026-12-06): 43.0 ms a step in fp32,
43.6 ms under bf16 autocast.
"""
