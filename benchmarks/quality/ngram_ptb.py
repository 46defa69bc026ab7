"""n-gram LMs on Penn Treebank (Mikolov's split): plm's Kneser-Ney 5-gram against the published figure."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "ngram-ptb"
HELP = "ngram-kn5 and ngram-bigram-addk on PTB: test perplexity vs Mikolov's KN5 (141.2)"
PUBLISHED = {"ngram-kn5": 141.2}
GOAL = 148.0


def add_arguments(p) -> None:
    p.add_argument("--ptb", type=Path, default=common.SHARED_DATA / "ptb", help="folder with ptb.{train,test}.txt")


def run(args) -> int:
    train, test = args.ptb / "ptb.train.txt", args.ptb / "ptb.test.txt"
    if not train.is_file():
        print(f"ngram-ptb: skipped — {train} not found")
        return 0
    from plmcli import api

    info = common.machine_info()
    root = Path(tempfile.mkdtemp(prefix="plm-bench-ngram-"))
    rows = []
    for recipe, over in (("ngram-kn5", ["data.val_fraction=0"]), ("ngram-kn5", []), ("ngram-bigram-addk", ["data.val_fraction=0"])):
        out = root / f"{recipe}-{len(over)}"
        t0 = time.perf_counter()
        s = api.pretrain(recipe, [str(train)], str(out), overrides=over or None)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = api.eval_ppl([str(test)], str(out))
        eval_s = time.perf_counter() - t0
        held = "all of train" if over else "train minus 5% held out"
        rows.append([f"`{recipe}` ({held})", f"**{r['ppl']:.2f}**", PUBLISHED.get(recipe, "—"), f"{r['oov_rate']:.2%}",
                     f"{fit_s:.1f} s (counting {s.get('count_s', float('nan')):.1f} s)", f"{eval_s:.1f} s"])
    table = common.markdown_table(["model", "test ppl", "published", "OOV (PTB's `<unk>`)", "pretrain (wall, incl. tokenize)", "eval-ppl"], rows)
    text = f"""
`plm pretrain --recipe R --data ptb.train.txt` then `plm eval-ppl ptb.test.txt`: whitespace words, each line a
sentence with `<s>` padding and a scored `</s>`, interpolated modified Kneser-Ney (Chen & Goodman) or add-λ
(λ = 0.01, chosen on PTB valid). Mikolov et al. (2011) report 141.2 for a KN5 on this split. Goal: ≤ {GOAL:g}.
"""
    common.publish(NAME, common.section_body("n-gram LMs on PTB", args, text, table, info), args)
    return 0
