"""CMRC2018 span QA from a Chinese mini run: EM / character F1 of the official CMRC scorer.

Only the dev and trial sets of CMRC2018 are available offline (../shared/data/chinese/cmrc2018), so the
model is finetuned on the dev set's questions and evaluated on the trial set's, which are disjoint
passages. The numbers are therefore not comparable to published dev-set scores (those train on the
10k-question train set); they show the path working end to end at mini scale.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "cmrc2018"
HELP = "CMRC2018 EM/F1 from a Chinese bert-mini pretrained here (train on dev, evaluate on trial)"
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
CHINESE = common.SHARED_DATA / "chinese"


def build_corpus(path: Path) -> Path:
    """Chinese pretraining text: CMRC2018 dev passages (never the trial ones, which are evaluated),
    THUCNews titles and ChnSentiCorp reviews — one document per passage, titles 16 to a document."""
    docs = []
    for a in json.loads((CHINESE / "cmrc2018" / "cmrc2018_dev.json").read_text(encoding="utf-8"))["data"]:
        for p in a["paragraphs"]:
            docs.append(p["context"].replace("\n", " ").strip())
    titles = []
    for split in ("dev", "test"):
        titles += [ln.split("\t")[0] for ln in (CHINESE / "THUCNews-titles" / f"{split}.txt").read_text(encoding="utf-8").splitlines()]
    docs += ["\n".join(titles[i:i + 16]) for i in range(0, len(titles), 16)]
    reviews = [ln.split("\t")[-1] for ln in (CHINESE / "ChnSentiCorp" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    docs += ["\n".join(reviews[i:i + 8]) for i in range(0, len(reviews), 8)]
    path.write_text("\n\n".join(d for d in docs if d) + "\n", encoding="utf-8")
    return path


def add_arguments(p) -> None:
    p.add_argument("--from", dest="from_run", type=Path, help="a pretrained Chinese encoder run (default: pretrain here)")
    p.add_argument("--pretrain-tflop", type=float, default=60.0, help="compute budget when pretraining here")
    p.add_argument("--epochs", type=int, default=2, help="finetuning epochs")
    p.add_argument("--lr", type=float, default=1e-4, help="finetuning lr")
    p.add_argument("--batch-size", type=int, default=32, help="finetuning batch size")
    p.add_argument("--max-seq-len", type=int, default=256, help="window length")
    p.add_argument("--max-steps", type=int, help="cap finetuning steps (smoke test)")


# bert-mini's shape over characters (BertNormalizer splits CJK characters), whole jieba words masked together.
OVERRIDES = ["objective.masking=chinese-wwm"]


def run(args) -> int:
    if not (CHINESE / "cmrc2018" / "cmrc2018_trial.json").is_file():
        print(f"{NAME}: skipped — {CHINESE} has no cmrc2018")
        return 0
    common.set_threads(args.threads)
    from plmcli import api

    info = common.machine_info()
    print(common.machine_line(info))
    root = args.keep or Path(tempfile.mkdtemp(prefix="plm-cmrc-"))
    root.mkdir(parents=True, exist_ok=True)
    source, pre = args.from_run, None
    if source is None:
        from benchmarks.quality.pretraining import pretrain_compute

        source = root / "bert-mini-zh"
        pre, _, _ = pretrain_compute("bert-mini", build_corpus(root / "corpus-zh.txt"), source, args.pretrain_tflop, OVERRIDES)
    t0 = time.perf_counter()
    cfg = api.finetune_config(None, common.given({
        "task.name": "cmrc2018", "model.from_run": str(source), "train.epochs": args.epochs, "optim.lr": args.lr,
        "train.batch_size": args.batch_size, "train.seed": 42, "task.max_seq_len": args.max_seq_len,
        "train.max_steps": args.max_steps, "task.train": str(CHINESE / "cmrc2018" / "cmrc2018_dev.json"),
        "task.dev": str(CHINESE / "cmrc2018" / "cmrc2018_trial.json")}))
    res = api.finetune(cfg, str(root / "cmrc"))
    wall = time.perf_counter() - t0
    d = res["dev"]
    print(f"  CMRC2018 trial: EM {d['exact_match']:.2f} F1 {d['f1']:.2f}")
    rows = []
    if pre is not None:
        rows.append(["pretrain (bert-mini, Chinese, wwm)", f"{pre['steps']:,} steps, {pre['tokens']:,} tokens",
                     f"val MLM ppl {pre.get('val_ppl', float('nan')):.1f}", ""])
    rows.append(["finetune on dev (3,216 questions)", f"{res['steps']:,} steps, {wall / 60:.1f} min",
                 f"EM **{d['exact_match']:.2f}**, F1 **{d['f1']:.2f}**", f"best epoch {res['best_epoch']}"])
    table = common.markdown_table(["stage", "work", "result (trial set)", "note"], rows)
    text = f"""
A Chinese bert-mini (4 layers, 256 hidden, character-level WordPiece 8k, whole-word masking over jieba words)
pretrained by plm for {args.pretrain_tflop:g} TFLOP on CMRC2018 dev passages + THUCNews titles + ChnSentiCorp
reviews, then `plm finetune --task cmrc2018 --train cmrc2018_dev.json --dev cmrc2018_trial.json` with windows of
{args.max_seq_len} tokens (stride 128, question ≤ 64), {args.epochs} epochs, lr {args.lr:g}, batch {args.batch_size}.
Scored by the official CMRC2018 script's rules (character-level F1 over the longest common substring,
punctuation removed). The trial set's passages are never seen in pretraining or finetuning. Published
dev-set numbers (e.g. BERT-base ≈ 64 EM / 84 F1) train on the 10k-question train set, which is not
available offline here: these figures show the path at mini scale, not a comparable score.
"""
    common.publish(NAME, common.section_body("CMRC2018 span QA: Chinese bert-mini", args, text, table, info), args)
    return 0
