"""nanoGPT's CPU shakespeare_char run, reproduced with plm's `gpt-char-shakespeare` recipe end to end.

The peer's figures are quoted, not re-run here (nanoGPT is a script, not a package): the row below is
what its README-style CPU command printed on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "nanogpt-char"
HELP = "gpt-char-shakespeare via plm's pretrain: val loss and wall time vs nanoGPT's quoted CPU run"

DEFAULT_DATA = common.SHARED_DATA / "tinyshakespeare" / "input.txt"
NANOGPT = {
    "val_loss": 1.886,
    "wall_s": 73.0,
    "command": ("python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 "
                "--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 "
                "--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0"),
}
GOAL_VAL_LOSS = 1.89


def add_arguments(p) -> None:
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="tiny shakespeare input.txt")
    p.add_argument("--recipe", default="gpt-char-shakespeare", help="plm recipe to run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, as `plm pretrain --set` (repeatable); changes what is compared")
    p.add_argument("--max-steps", type=int, help="stop early (a smoke test; the comparison needs the recipe's 2000)")
    p.add_argument("--repeats", type=int, default=1, help="runs to time; the table gives the median wall time and its range")
    p.add_argument("--keep", type=Path, help="write the runs under this dir and keep them (default: a temporary dir, deleted)")


def warm_cache(args, recipe) -> Path:
    """Tokenize (or find the cached corpus) and build the token streams pretrain will read, untimed.

    nanoGPT's figure excludes its `prepare.py` step too; this keeps the comparison to training itself.
    """
    from plmcli.data.corpus import prepare_corpus
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.objectives.registry import objective_class

    corpus_dir = prepare_corpus([str(args.data)], recipe.tokenizer, recipe.data)
    meta = json.loads((corpus_dir / "meta.json").read_text())
    tok = load_tokenizer(corpus_dir / "tokenizer.json")
    obj = objective_class(recipe.objective_name)(recipe.objective, tok, meta["tokenizer"]["special_token_ids"],
                                                 recipe.train.seq_len)
    for split, shuffle in (("train", True), ("validation", False)):
        if meta["counts"].get(split, {}).get("documents", 0):
            obj.stream(corpus_dir, split, recipe.train.global_batch_size, recipe.train.seed, 0, 1, shuffle)
    return corpus_dir


def pretrain_timed(args, out: Path) -> tuple[dict, float, float | None]:
    """(summary, wall seconds, median logged tokens/s) of one pretrain run into `out`."""
    from plmcli import api

    t0 = time.perf_counter()
    summary = api.pretrain(recipe=args.recipe, data=[str(args.data)], out=str(out), overrides=args.set or None,
                           max_steps=args.max_steps)
    wall = time.perf_counter() - t0
    # The median over the loop's logging windows shrugs off a burst from another job, which the wall time cannot.
    rates = [r["tok_per_s"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "tok_per_s" in r]
    return summary, wall, statistics.median(rates) if rates else None


def run(args) -> int:
    if not args.data.is_file():
        print(f"nanogpt-char: skipped — {args.data} not found (the shared data lives in "
              f"{common.SHARED_DATA}; pass --data path/to/tinyshakespeare/input.txt)")
        return 0
    common.set_threads(args.threads)
    from plmcli.config import load_recipe

    recipe = load_recipe(args.recipe, args.set or None)
    info = common.machine_info()
    print(common.machine_line(info))
    print("warming the tokenize cache (untimed) ...")
    warm_cache(args, recipe)

    runs = []
    with tempfile.TemporaryDirectory(prefix="plm-bench-") as tmp:
        # pretrain repoints $PLM_RUNS/latest; keep the checkout's runs/latest where the user left it.
        os.environ["PLM_RUNS"] = str(Path(tmp) / "runs")
        for i in range(args.repeats):
            out = (args.keep or Path(tmp)) / f"run-{i + 1}"
            print(f"training {recipe.name} into {out} ({i + 1}/{args.repeats}) ...")
            runs.append(pretrain_timed(args, out))

    summary = runs[-1][0]
    vals = [s["val_loss"] for s, _, _ in runs if s.get("val_loss") is not None]
    val = statistics.median(vals) if vals else None  # seeded, so every repeat should give the same value
    walls = common.summary([w for _, w, _ in runs])
    loops = common.summary([s["elapsed_s"] for s, _, _ in runs])
    steady = [r for _, _, r in runs if r]
    steady_rate = statistics.median(steady) if steady else float("nan")
    steps = summary["steps"]
    met_loss = val is not None and val <= GOAL_VAL_LOSS
    met_time = walls["median"] <= NANOGPT["wall_s"]
    t, m = recipe.train, recipe.model

    def span(st):
        return f"{st['median']:.1f} s" + (f" ({st['min']:.1f}–{st['max']:.1f})" if args.repeats > 1 else "")

    rows = [
        ["plm `" + recipe.name + "`", f"{val:.3f}" if val is not None else "n/a", span(walls), span(loops),
         f"{steady_rate:,.0f}", steps],
        ["nanoGPT (quoted)", f"{NANOGPT['val_loss']:.3f}", f"≈{NANOGPT['wall_s']:.0f} s", "", "", 2000],
        ["goal", f"≤ {GOAL_VAL_LOSS}", f"≤ {NANOGPT['wall_s']:.0f} s", "", "", ""],
        ["**met?**", "**yes**" if met_loss else "**no**", "**yes**" if met_time else "**no**", "", "", ""],
    ]
    table = common.markdown_table(["run", "val loss", "wall time", "train loop", "logged tokens/s (median)", "steps"], rows)
    smoke = "" if args.max_steps is None else (
        f"\n**Smoke test:** stopped at {steps} steps (`--max-steps`), so this is not the comparison.\n")
    text = f"""
The `{recipe.name}` recipe ({m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, block {t.seq_len},
batch {t.global_batch_size}, {t.max_steps} steps, {recipe.tokenizer.kind} tokenizer, dropout {m.dropout}) run through `plmcli.api.pretrain` on
`tinyshakespeare/input.txt`, against nanoGPT's shakespeare_char CPU run with the same shape:

    {NANOGPT['command']}

nanoGPT's figures are quoted from a run on a 2-core CPU: val loss {NANOGPT['val_loss']} in about
{NANOGPT['wall_s']:.0f} s wall. Goal: val loss ≤ {GOAL_VAL_LOSS} in no more wall time.

- **Wall time** runs from the `api.pretrain` call to its return: model build, the training loop, every
  evaluation and the checkpoint/weights written at the end. Tokenization is excluded: the corpus cache and
  token streams are built once before the timer starts (as nanoGPT's `prepare.py` is not in its figure).
  **Train loop** is the loop's own `elapsed_s` (training steps plus evaluations). With `--repeats N` both
  are the median of N runs (min–max in brackets). **Logged tokens/s** is the median over the loop's
  {t.log_every}-step logging windows (evaluations fall inside some of them): the least noise-sensitive figure here.
- **Val loss** is plm's final evaluation: the token-weighted mean over the validation split
  (`eval_batches: {t.eval_batches}`; 0 = the whole split);
  nanoGPT's is an estimate from `eval_iters=20` random batches.
- **The splits differ.** nanoGPT holds out the last 10% of the *characters*; plm holds out the last 10% of
  the *paragraphs* (blank-line separated documents), and the blank line between two paragraphs is one
  `<eos>` token in plm's stream where nanoGPT's has a newline character. The two val sets are therefore
  close but not the same text, and plm's vocabulary has the extra `<eos>`/`<unk>` tokens.
{smoke}"""
    common.publish(NAME, common.section_body("nanoGPT shakespeare_char on CPU: plm vs nanoGPT", args, text, table, info),
                   args)
    return 0
