"""Does `plm finetune` learn from a small labelled set with its defaults? From a 30-step bert-mini,
2,000 SST-2 rows, the old defaults (lr 2e-5, 3 epochs) stayed at the majority class.

Three measurements:
- dev accuracy of `plm finetune` with no tuning flags, from the 30-step run and from `--init random`, over seeds,
  next to the BERT-base defaults (lr 2e-5, 3 epochs) given explicitly;
- the spread of the [CLS] state across inputs (how far apart the classifier's inputs start);
- plm's SequenceClassifier and transformers' BertForSequenceClassification holding the same weights, trained
  on the same batches with the same optimizer: if their losses agree, the model code is not the cause.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks import common

NAME = "small-data-finetune"
HELP = ("plm finetune's defaults on 2,000 SST-2 rows from a 30-step bert-mini and from random init; "
        "plm's classifier vs transformers' BertForSequenceClassification on the same batches")
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
OLD = {"optim.lr": 2e-5, "train.epochs": 3}
"""BERT-base's defaults (Devlin et al.), plm finetune's for every model before the size defaults."""
BERT_MINI_WEIGHTS = 3_300_000
"""bert-mini's weights outside its embedding tables (the finetunes' size-defaults line prints 3.30M)."""


PILOTS = """
Pilots on the same slice and 30-step run, seed 42, before the size defaults (`plm finetune --task sst2 --from RUN
--data-dir SLICE --lr LR --epochs E`): lr 1e-4, 3 epochs (the issue's run) 0.5092 / 0.5092 / 0.5092 by epoch from
the pretrained run and 0.4908 / 0.5092 / 0.5092 from random init; lr 1e-3, 3 epochs from the pretrained run still
at dev loss 0.698 after two epochs: neither 5× BERT-base's lr (189 steps) nor 50× (126 seen) moves it. The pooler
is not saturated (no pooled unit beyond |0.99| on 256 dev sentences), labels, padding masks and segment ids reach
the model as transformers' do (same logits to 6e-8 on a batch), and the loss is the head's on [CLS]: what was
missing is enough movement (steps × lr), which the defaults now give a small model (at least 600 steps at 3e-4; dev
accuracy leaves the majority class between steps 63 and 189 in every run above and levels off after ~300). A second
slice (rows 30,001–32,000 of SST-2 train, seed 7, the same 30-step run, 10 epochs each): the defaults 0.6686 from
the pretrained run (best at epoch 4, then 0.64–0.66) and 0.6972 from random init; lr 1e-4 instead 0.6583; lr 1e-3
0.5092 after every one of the 10 epochs. Of the three, 3e-4 is the best for this size; the margin over the issue's
0.65 from the 30-step run is 2–8 points, depending on slice and seed.
"""
"""What was measured while looking for the cause (1 thread, this slice): fixed prose, re-run by hand."""


def add_arguments(p) -> None:
    p.add_argument("--rows", type=int, default=2000, help="SST-2 training rows (the first N of train.tsv)")
    p.add_argument("--seeds", default="42,1,2", help="finetuning seeds (comma-separated)")
    p.add_argument("--inits", default="pretrained,random", help="which of pretrained, random to finetune")
    p.add_argument("--kinds", default="defaults,bert-base", help="defaults (no tuning flags) and/or bert-base "
                   "(lr 2e-5, 3 epochs given explicitly; first seed only)")
    p.add_argument("--pretrain-steps", type=int, default=30, help="bert-mini pretraining steps")
    p.add_argument("--hf-seed", type=int, default=42, help="seed of the plm vs transformers comparison")
    p.add_argument("--hf-epochs", type=int, default=3, help="epochs of the plm vs transformers comparison")
    p.add_argument("--no-hf", action="store_true", help="skip the plm vs transformers comparison")


def make_slice(root: Path, rows: int) -> Path:
    """root/slice/SST-2 with the first `rows` training rows and the full dev set (a GLUE data dir)."""
    src = common.SHARED_DATA / "glue" / "SST-2"
    folder = root / "slice" / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "train.tsv").write_text("".join(lines[: rows + 1]), encoding="utf-8")
    (folder / "dev.tsv").write_text((src / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return folder.parent


def finetune(run: Path, data: Path, out: Path, **flags) -> dict:
    """metrics.json of one `plm finetune --task sst2` (flags: config keys given; the rest are the defaults). A
    finished one under --keep is read back: separate processes can each run some, and a last call gathers."""
    import json
    import shutil

    from plmcli import api

    if (out / "metrics.json").is_file():
        return json.loads((out / "metrics.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    cfg = api.finetune_config(None, {"task.name": "sst2", "model.from_run": str(run), "task.data_dir": str(data), **flags})
    result = api.finetune(cfg, str(out))
    shutil.rmtree(out / "data", ignore_errors=True)
    (out / "model.safetensors").unlink(missing_ok=True)
    return result


def classifier_pair(run: Path, data: Path, work: Path, init: str, seed: int):
    """(plm SequenceClassifier, transformers BertForSequenceClassification with the same weights, the objective),
    both without dropout so that the same batches give the same losses."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from plmcli.config_sections import TaskOptions
    from plmcli.data.tasks.registry import get_task
    from plmcli.runs import load_encoder, load_run_tokenizer, run_config, task_objective

    cfg = run_config(run)
    cfg = {**cfg, "model": {**cfg["model"], "dropout": 0.0, "attn_dropout": 0.0}}
    task = get_task("sst2", TaskOptions())
    encoder = load_encoder(run, cfg, pretrained=init == "pretrained", seed=seed)
    obj = task_objective(task, load_run_tokenizer(run, cfg), cfg["tokenizer"]["special_token_ids"], 128,
                         type(encoder), 0.0)
    if not (work / "meta.json").is_file():
        obj.encode_splits(task.load(str(data)), work)
    torch.manual_seed(seed)
    plm = obj.build_model(encoder)
    hf_cfg, state = encoder.to_hf_sequence_classification({**cfg, "finetune": {"classifier_dropout": 0.0}}, plm.head)
    hf = BertForSequenceClassification(BertConfig(**{k: v for k, v in hf_cfg.items() if k != "architectures"},
                                                  attn_implementation="eager"))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{NAME}: weights did not map onto BertForSequenceClassification: {missing} {unexpected}")
    return plm, hf, obj


def cls_spread(plm, obj, work: Path) -> dict:
    """How much the classifier's input moves between inputs: the per-dimension std of the pooled [CLS] over 512
    dev sentences, relative to its overall std, and the mean cosine between two sentences' pooled states."""
    import torch
    import torch.nn.functional as F

    batch = obj.stream(work, "validation", 512, 0, 0, 1, shuffle=False)[0]
    plm.eval()
    with torch.no_grad():
        _, pooled = plm.encoded(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    cos = F.cosine_similarity(pooled[:, None], pooled[None], -1).mean()
    return {"relative": float(pooled.std(0).mean() / pooled.std()), "cos": float(cos)}


def train_pair(plm, hf, obj, work: Path, lr: float, epochs: int, seed: int, log) -> dict:
    """Train both on the same batches (plm's length-grouped training order), AdamW with plm's groups, 10% warmup
    then linear decay, clip 1.0; their per-step losses and dev accuracy after the last step."""
    import math

    import torch
    import torch.nn.functional as F

    from plmcli.data.store import load_meta
    from plmcli.train.optim import build_optimizer
    from plmcli.train.schedule import build_scheduler

    n = load_meta(work)["counts"]["train"]["documents"]
    steps = epochs * math.ceil(n / 32)
    stream = obj.stream(work, "train", 32, seed, 0, 1, shuffle=True)
    dev = obj.stream(work, "validation", 256, 0, 0, 1, shuffle=False)
    forward = {"plm": lambda b: plm(b["input_ids"], b["token_type_ids"], b["attention_mask"]),
               "hf": lambda b: hf(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                                  attention_mask=b["attention_mask"]).logits}
    out = {}
    for name, model in (("plm", plm), ("hf", hf)):
        opt = build_optimizer(model, "adamw", lr, 0.01, (0.9, 0.999), 1e-8)
        sched = build_scheduler(opt, "linear", int(0.1 * steps), steps)
        model.train()
        losses = []
        for k in range(steps):
            b = stream[k]
            loss = F.cross_entropy(forward[name](b).float(), b["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        model.eval()
        right = total = 0
        with torch.no_grad():
            for k in range(dev.batches_per_epoch()):
                b = dev[k]
                right += int((forward[name](b).argmax(-1) == b["labels"]).sum())
                total += len(b["labels"])
        out[name] = {"losses": losses, "accuracy": right / total}
        log(f"{name}: lr {lr:g}, {steps} steps: last-epoch train loss "
            f"{sum(losses[-steps // epochs:]) / (steps // epochs):.4f}, dev accuracy {right / total:.4f}", flush=True)
    return out


def compare_with_transformers(run: Path, data: Path, root: Path, lr: float, epochs: int, seed: int) -> list[list]:
    """Table rows: per-epoch mean train loss, the largest per-step loss difference and dev accuracy of plm's
    classifier and transformers' holding the same weights, from the pretrained run and from random init."""
    import json

    cached = root / f"hf-lr{lr:g}-epochs{epochs}-seed{seed}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    rows = []
    for init in ("pretrained", "random"):
        plm, hf, obj = classifier_pair(run, data, root / "hf-data", init, seed)
        spread = cls_spread(plm, obj, root / "hf-data")
        got = train_pair(plm, hf, obj, root / "hf-data", lr, epochs, seed, print)
        a, b = got["plm"]["losses"], got["hf"]["losses"]
        per = len(a) // epochs

        def means(xs):
            return " / ".join(f"{sum(xs[i * per:(i + 1) * per]) / per:.4f}" for i in range(epochs))

        diff = max(abs(x - y) for x, y in zip(a, b))
        rows.append([init, f"{spread['relative']:.4f}", f"{spread['cos']:.5f}", means(a), means(b), f"{diff:.1e}",
                     f"{got['plm']['accuracy']:.4f}", f"{got['hf']['accuracy']:.4f}"])
    cached.write_text(json.dumps(rows))
    return rows


def reading(results: dict, hf_rows: list[list]) -> str:
    """The section's reading, from the figures: did the defaults reach the issue's 0.65, and does transformers'
    BERT follow plm's losses."""
    worst = {init: min(r["dev"]["accuracy"] for r in runs) for (init, label), runs in results.items()
             if label == "defaults"}
    old = {init: runs[0]["dev"]["accuracy"] for (init, label), runs in results.items() if label != "defaults"}
    lines = []
    if worst:
        met = all(a >= 0.65 for a in worst.values())
        lines.append(f"Reading: with no tuning flags the worst seed reaches "
                     f"{', '.join(f'{a:.4f} ({i})' for i, a in worst.items())}: the issue's 0.65 is "
                     f"{'met' if met else '**not met**'}")
    if old:
        lines.append(f"with BERT-base's lr 2e-5 and 3 epochs (189 steps) the same runs end at "
                     f"{', '.join(f'{a:.4f} ({i})' for i, a in old.items())} (the majority class is 0.5092)")
    if hf_rows:
        lines.append("before finetuning the pooled [CLS] hardly depends on the sentence: its spread across inputs is "
                     + ", ".join(f"{r[1]} of its scale ({r[0]}; mean cosine {r[2]})" for r in hf_rows)
                     + " — attention starts near uniform, so [CLS]'s row is mostly its own embedding, and a few "
                     "hundred "
                     "updates pass before the classifier's input separates the classes")
        diff = max(float(r[5]) for r in hf_rows)
        lines.append(f"transformers' BERT with the same weights and batches follows plm's per-step loss to within "
                     f"{diff:.1e} (largest difference over every step), so the failure was not in plm's model code "
                     f"but in settings that give a small, collapsed encoder too few and too small updates"
                     if diff < 1e-3
                     else f"transformers' BERT with the same weights and batches **departs** from plm's loss (by up "
                     f"to {diff:.1e} a step): look for a difference in the model code")
    return "\n" + "; ".join(lines) + ".\n" if lines else ""


def _chosen_part(note: str) -> str:
    """'lr 0.0003, 10 epochs (...)' out of size_defaults' line."""
    return note.split(": ", 1)[1].split(";")[0] if ": " in note else "n/a"


def run(args) -> int:
    if not (common.SHARED_DATA / "glue" / "SST-2").is_dir():
        print(f"{NAME}: skipped — {common.SHARED_DATA} has no GLUE SST-2")
        return 0
    from plmcli import api
    from plmcli.pipelines.finetune import size_row

    common.set_threads(args.threads)
    root = args.keep or Path(tempfile.mkdtemp(prefix="plm-small-data-"))
    root.mkdir(parents=True, exist_ok=True)
    data = make_slice(root, args.rows)
    run_dir = root / f"pretrain-{args.pretrain_steps}"
    if not (run_dir / "summary.json").is_file():
        api.pretrain("bert-mini", out=str(run_dir), overrides={"train.max_steps": args.pretrain_steps})
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    results, chosen = {}, ""
    kinds = {"defaults": ("defaults", {}), "bert-base": ("lr 2e-5, 3 epochs (BERT-base's)", OLD)}
    for init in [x for x in args.inits.split(",") if x]:  # none: the comparison with transformers alone
        for kind in [x for x in args.kinds.split(",") if x]:
            label, flags = kinds[kind]
            for seed in seeds if not flags else seeds[:1]:
                r = finetune(run_dir, data, root / f"ft-{init}-{kind}-{seed}", **{"model.init": init, "train.seed": seed}, **flags)
                chosen = r.get("size_defaults") or r["settings"].get("size_defaults") or chosen
                results.setdefault((init, label), []).append(r)
                print(f"{init}, {label}, seed {seed}: dev accuracy by epoch "
                      f"{[round(h['accuracy'], 4) for h in r['history']]}", flush=True)
    rows = []
    for (init, label), runs in results.items():
        accs = [r["dev"]["accuracy"] for r in runs]
        s = runs[0]["settings"]
        rows.append([init, label, f"{s['lr']:g}", s["epochs"], s["total_steps"],
                     ", ".join(str(r["settings"]["seed"]) for r in runs), ", ".join(f"{a:.4f}" for a in accs),
                     f"**{min(accs):.4f}**"])
    table = common.markdown_table(["init", "flags", "lr", "epochs", "steps", "seeds", "dev accuracy (best epoch)",
                                   "worst seed"], rows)
    lr = size_row(BERT_MINI_WEIGHTS)[1]  # what the size defaults give bert-mini
    hf_rows = []
    if not args.no_hf:
        hf_rows = compare_with_transformers(run_dir, data, root, lr, args.hf_epochs, args.hf_seed)
        table += "\n\n" + common.markdown_table(
            ["init", "[CLS] spread", "mean cos", f"plm train loss by epoch (lr {lr:g})", "transformers train loss",
             "largest step difference", "plm dev acc", "transformers dev acc"], hf_rows)
    text = f"""
`bert-mini` pretrained for {args.pretrain_steps} steps on its shipped sample (near random), then
`plm finetune --task sst2` on the first {args.rows:,} rows of SST-2 train (dev: the full SST-2 dev set, 872
sentences, 50.9% of them positive), from the pretrained run and with `--init random`: with no tuning flags
("defaults": `size_defaults` chose {_chosen_part(chosen)}) and with BERT-base's lr 2e-5 and 3 epochs given
explicitly (plm's defaults for every model before). Dev accuracy of the best epoch (dev after every epoch).

The second table: plm's `SequenceClassifier` and transformers' `BertForSequenceClassification` holding the same
weights (`Bert.to_hf_sequence_classification`), dropout off in both, trained on the same batches (plm's
length-grouped order, batch 32, seed {args.hf_seed}) with the same AdamW (plm's groups, weight decay 0.01), 10%
warmup then linear decay, clip 1.0, lr {lr:g}, {args.hf_epochs} epochs. "[CLS] spread" is the per-dimension std
of the pooled [CLS] over 512 dev sentences relative to its overall std, at the start; "mean cos" the mean cosine
between two sentences' pooled states: how little the classifier's input depends on the sentence before finetuning.
"""
    text += reading(results, hf_rows) + PILOTS
    common.publish(NAME, common.section_body("Finetuning on small data", args, text, table), args)
    return 0
