"""BERT's descendants at one size and one CPU budget: bert-mini, electra-mini and albert-mini (and any
other encoder recipe) each pretrained for the same wall-clock minutes on the same corpus, then finetuned
on SST-2 with the same settings; dev accuracy side by side.

ELECTRA's claim (Clark et al. 2020, §3.3) is sample efficiency: the discriminator learns from every token,
not the 15% that are masked, so at equal compute it should finetune better than an MLM. ALBERT's claim is
parameter efficiency, not compute: with all layers shared it has a fraction of BERT's parameters at the
same compute per token, and is expected to trail BERT slightly at this size.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks import common
from benchmarks.quality.bert_sst2 import build_corpus
from benchmarks.quality.pretraining import pretrain_compute, steps_for

NAME = "family-sst2"
HELP = "bert-mini vs electra-mini vs albert-mini: same size and CPU budget, SST-2 dev accuracy"
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults


def add_arguments(p) -> None:
    p.add_argument("--recipes", nargs="+", default=["bert-mini", "electra-mini", "albert-mini"],
                   help="encoder recipes to compare")
    p.add_argument("--pretrain-tflop", type=float, default=75.0,
                   help="training compute per recipe, in TFLOP (the model's flops_per_token × tokens): ~10 min of bert-mini "
                        "on 2 cores; unlike a wall-clock budget it does not depend on other load")
    p.add_argument("--epochs", type=int, default=1, help="finetuning epochs over the 67k SST-2 train sentences")
    p.add_argument("--lr", type=float, default=1e-4, help="finetuning lr")
    p.add_argument("--batch-size", type=int, default=32, help="finetuning batch size")
    p.add_argument("--max-seq-len", type=int, default=64, help="finetuning tokens per sentence (SST-2 sentences are short)")
    p.add_argument("--max-finetune-steps", type=int, help="cap finetuning steps (smoke test)")


def run(args) -> int:
    if not (common.SHARED_DATA / "glue" / "SST-2").is_dir():
        print(f"{NAME}: skipped — {common.SHARED_DATA} has no GLUE SST-2")
        return 0
    common.set_threads(args.threads)
    from plmcli import api
    from plmcli.config import load_recipe

    info = common.machine_info()
    print(common.machine_line(info))
    root = args.keep or Path(tempfile.mkdtemp(prefix="plm-family-sst2-"))
    root.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(root / "corpus.txt")
    rows = []
    for name in args.recipes:
        r = load_recipe(name)
        d = root / name
        d.mkdir(exist_ok=True)
        # A recipe finished by an earlier invocation with the same --keep is read back, not redone: the
        # recipes can run as separate processes (one thread each) and a last call gathers the table.
        done = d / "pretrain" / "summary.json"
        if done.is_file():
            pre, fpt = json.loads(done.read_text()), steps_for(r, args.pretrain_tflop)[1]
            pre_wall = pre["elapsed_s"]
        else:
            pre, pre_wall, fpt = pretrain_compute(name, corpus, d / "pretrain", args.pretrain_tflop)
        t0 = time.perf_counter()
        if (d / "sst2" / "metrics.json").is_file():
            res = json.loads((d / "sst2" / "metrics.json").read_text())
            ft_wall = res["elapsed_s"]
        else:
            cfg = api.finetune_config(None, common.given({
                "task.name": "sst2", "model.from_run": str(d / "pretrain"), "task.data_dir": str(common.SHARED_DATA / "glue"),
                "train.epochs": args.epochs, "optim.lr": args.lr, "train.batch_size": args.batch_size, "train.seed": 42,
                "task.max_seq_len": args.max_seq_len, "train.max_steps": args.max_finetune_steps}))
            res = api.finetune(cfg, str(d / "sst2"))
            ft_wall = time.perf_counter() - t0
        print(f"  {name}: SST-2 dev accuracy {res['dev']['accuracy']:.4f}")
        rows.append([f"`{name}`", r.objective_name, f"{api.count_params(r) / 1e6:.2f}M", f"{fpt / 1e6:.1f}M", f"{pre['steps']:,}",
                     f"{pre['tokens']:,}", f"{pre_wall / 60:.1f} min", f"{pre.get('val_ppl', float('nan')):.1f}",
                     f"{res['steps']:,} ({ft_wall / 60:.1f} min)", f"**{res['dev']['accuracy']:.4f}**"])
    table = common.markdown_table(["recipe", "objective", "params (pretraining)", "FLOPs/token", "pretrain steps", "tokens", "pretrain wall",
                                   "val MLM ppl", "finetune steps (wall)", "SST-2 dev acc"], rows)
    text = f"""
Each recipe pretrained with the same training compute, {args.pretrain_tflop:g} TFLOP (its model's
`flops_per_token` × tokens: 6 FLOPs per weight-token plus attention, ELECTRA counting both networks and ALBERT
its shared layer at every depth), with its recipe's schedule stretched over those steps, on the same corpus as
the `bert-sst2` section (PTB train + WikiText-2 valid + SST-2 train sentences), then finetuned on the full SST-2 train set: {args.epochs} epoch(s),
lr {args.lr:g}, batch
{args.batch_size}, {args.max_seq_len} tokens, warmup 10% + linear decay, seed 42, dev accuracy of the best
evaluation. All three have bert-mini's size (4 layers, 256 hidden, 4 heads) and an 8k lowercased vocabulary
(WordPiece for BERT and ELECTRA, a unigram model for ALBERT as its SentencePiece). ELECTRA's "val MLM ppl" is its
small generator's; ALBERT shares one layer's weights across the four and predicts n-grams with SOP.
"""
    common.publish(NAME, common.section_body("BERT, ELECTRA, ALBERT at one size and CPU budget: SST-2", args, text,
                                             table, info), args)
    return 0
