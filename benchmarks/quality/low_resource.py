"""What pretraining is for: finetuning on few labelled rows, pretrained vs random init vs scikit-learn.

One CPU pretraining per language on the unlabelled text of ../shared/data (`--recipe`: `word2vec-transfer`, a few
CPU-minutes, the best at this budget; `nezha-mini-cpu`, a half-hour masked LM), then
`plm finetune` with no tuning flags on SST-2 slices of 500 / 1,000 / 2,000 / 5,000 / all training rows, on 1,000
ChnSentiCorp reviews (`--chinese-rows` for other counts) and on 1,000 CoNLL-2003 sentences: from the pretrained run and from `--init random` (the
same architecture and tokenizer), beside a scikit-learn baseline on the same rows (bag-of-words logistic
regression; a per-token logistic regression over word features for NER, no CRF). Every slice is drawn with the
seed, so the three seeds vary the labelled rows as well as the initialisation and order.

Jobs run in fresh processes, `--jobs` at a time with `--threads / --jobs` torch threads each; a finished one
under --keep is read back, so the command resumes where it stopped and a last call gathers the table.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import common
from benchmarks.quality.low_resource_baselines import bag_of_words, layer_probe, token_classifier

NAME = "low-resource"
HELP = ("SST-2 at 500..all labelled rows, ChnSentiCorp and CoNLL-2003 at 1,000: a ≤ 30-minute CPU pretraining vs "
        "random init vs scikit-learn, 3 seeds, and a plot")
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
RECIPE = "word2vec-transfer"
GOAL_GAIN = 0.05
"""Pretrained at least 5 points above random init at 1,000 rows (and above the scikit-learn baseline)."""


def add_arguments(p) -> None:
    p.add_argument("--pretrain-steps", type=int, default=3300,
                   help="pretraining steps per language of a loop-trained recipe (nezha-mini-cpu: 16 × 128 tokens each, ~27 "
                        "CPU-minutes at 1 thread in bf16 on a 2-core AMD EPYC); a fixed count, so a loaded machine "
                        "stretches the wall time, not the work. word2vec fits its own epochs")
    p.add_argument("--pretrain-minutes", type=float, default=60.0,
                   help="wall-clock cap of each language's pretraining (one process each, run side by side)")
    p.add_argument("--recipe", default=RECIPE, help="the pretraining recipe")
    p.add_argument("--rows", default="1000,500,2000,5000,all", help="SST-2 labelled rows (comma-separated; 'all')")
    p.add_argument("--seeds", default="42,1,2", help="seeds: each draws the labelled rows and seeds the finetune")
    p.add_argument("--chinese-rows", default="1000",
                   help="ChnSentiCorp labelled rows (comma-separated; 'all'): the issue's 1,000, and others to see "
                        "where Chinese transfer pays")
    p.add_argument("--tasks", default="sst2,chnsenticorp,conll2003", help="which tasks to run")
    p.add_argument("--jobs", type=int, default=2, help="processes at a time (each gets --threads / --jobs threads)")
    p.add_argument("--all-epochs", type=int, default=1,
                   help="finetuning epochs of the all-rows SST-2 cell (the defaults would choose 3; 67k rows "
                        "need fewer to pass the defaults' 600 steps many times over)")
    p.add_argument("--max-steps", type=int, help="cap every finetune (smoke test)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="[LANG:]KEY=VALUE",
                   help="a recipe override for the pretraining (repeatable; `zh:model.window=20` for one language only)")
    p.add_argument("--stage", choices=("all", "pretrain", "finetune", "report"), default="all",
                   help="stop after this stage (report: only gather what --keep holds)")


# ---------------------------------------------------------------- corpora (unlabelled text only)

def _grouped(lines, n=8) -> list[str]:
    lines = [x.strip() for x in lines if x.strip()]
    return ["\n".join(lines[i:i + n]) for i in range(0, len(lines), n)]


def _conll_blocks(path: Path) -> list[list[str]]:
    """The sentences of a CoNLL file as lists of their raw lines, -DOCSTART- lines dropped."""
    blocks, cur = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if cur:
                blocks.append(cur)
            cur = []
        else:
            cur.append(line)
    if cur:
        blocks.append(cur)
    return blocks


def english_corpus(path: Path) -> Path:
    """SST-2 train sentences + CoNLL-2003 train sentences + WikiText-2 valid articles: no labels read."""
    d = common.SHARED_DATA
    sst = [ln.split("\t")[0] for ln in (d / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    docs = _grouped(sst)
    docs += _grouped(" ".join(line.split()[0] for line in b) for b in _conll_blocks(d / "conll2003" / "eng.train"))
    docs += common.wikitext_articles(d / "wikitext-2-raw" / "wiki.valid.raw")
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def chinese_corpus(path: Path) -> Path:
    """ChnSentiCorp train reviews (one document each) + THUCNews titles (dev and test files, 8 to a document)."""
    d = common.SHARED_DATA / "chinese"
    reviews = [ln.split("\t", 1)[1] for ln in (d / "ChnSentiCorp" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    titles = [ln.split("\t")[0] for f in ("dev.txt", "test.txt")
              for ln in (d / "THUCNews-titles" / f).read_text(encoding="utf-8").splitlines()]
    path.write_text("\n\n".join([r.strip() for r in reviews if r.strip()] + _grouped(titles)) + "\n", encoding="utf-8")
    return path


CORPORA = {"en": english_corpus, "zh": chinese_corpus}
LANGUAGE = {"sst2": "en", "conll2003": "en", "chnsenticorp": "zh"}


# ---------------------------------------------------------------- labelled slices, drawn with the seed

def _sample(items: list, rows, seed: int) -> list:
    return list(items) if rows == "all" else random.Random(seed).sample(list(items), int(rows))


def make_slice(root: Path, task: str, rows, seed: int) -> Path:
    """A data dir holding `rows` training rows drawn with `seed` and the task's full dev set."""
    d = common.SHARED_DATA
    out = root / "data" / f"{task}-{rows}-seed{seed}"
    if task == "sst2":
        src, folder = d / "glue" / "SST-2", out / "SST-2"
        head, *lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        dev = (src / "dev.tsv").read_text(encoding="utf-8")
        train = head + "".join(_sample(lines, rows, seed))
        names = ("train.tsv", "dev.tsv")
    elif task == "chnsenticorp":
        src, folder = d / "chinese" / "ChnSentiCorp", out
        head, *lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        train, dev = head + "".join(_sample(lines, rows, seed)), (src / "dev.tsv").read_text(encoding="utf-8")
        names = ("train.tsv", "dev.tsv")
    else:
        src, folder = d / "conll2003", out
        blocks = _sample(_conll_blocks(src / "eng.train"), rows, seed)
        train = "\n\n".join("\n".join(b) for b in blocks) + "\n"
        dev = (src / "eng.testa").read_text(encoding="utf-8")
        names = ("eng.train", "eng.testa")
    if not (folder / names[1]).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / names[0]).write_text(train, encoding="utf-8")
        (folder / names[1]).write_text(dev, encoding="utf-8")
    return out


# ---------------------------------------------------------------- jobs, each in a fresh process

def worker(job: dict) -> dict:
    """One pretraining or finetune in this (fresh) process; its summary / metrics."""
    import os

    common.set_threads(job["threads"])
    os.environ["PLM_RUNS"], os.environ["PLM_CACHE"] = job["runs"], job["cache"]
    from plmcli import api
    from plmcli.config import override_layers

    if job["kind"] == "pretrain":
        root = Path(job["root"])
        root.mkdir(parents=True, exist_ok=True)
        corpus = CORPORA[job["lang"]](root / "corpus.txt")
        t0, c0 = time.perf_counter(), time.process_time()
        pre = api.pretrain(job["recipe"], [str(corpus)], str(root / "pretrain"),
                           override_layers(job["overrides"], {"train.max_steps": job["steps"]}), time_budget=job["budget"])
        # CPU time of this process (tokenizer training, encoding, steps, evaluations): the CPU-minutes
        return {"summary": pre, "wall": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "tok_per_s": pre["tokens"] / pre["elapsed_s"], "corpus_mb": corpus.stat().st_size / 1e6}

    t0 = time.perf_counter()
    cfg = api.finetune_config(None, common.given({
        "task.name": job["task"], "model.from_run": job["run"], "task.data_dir": job["data"], "train.seed": job["seed"],
        "model.init": job["init"], "train.epochs": job.get("epochs"), "train.max_steps": job.get("max_steps")}))
    res = api.finetune(cfg, job["out"])
    return {**res, "wall": time.perf_counter() - t0}


def run_jobs(jobs: list[dict], n: int, env: dict) -> list[dict]:
    """Each job's result, running `n` at a time; a job whose result.json exists is read back, not re-run."""

    def one(job):
        done = Path(job["done"])
        if done.is_file():
            return json.loads(done.read_text())
        if job["kind"] == "finetune" and Path(job["out"]).exists():
            shutil.rmtree(job["out"])  # an interrupted finetune (no result written): it starts over
        label = done.stem if job["kind"] == "finetune" else done.parent.name
        print(f"  start {label}", flush=True)
        got = common.run_worker("benchmarks.quality.low_resource", job, env)
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(got))
        tmp.replace(done)
        print(f"  done  {label}: {_main_metric(got)}", flush=True)
        return got

    with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
        return list(pool.map(one, jobs))


def _main_metric(res: dict):
    if "dev" not in res:
        return f"{res['summary'].get('val_ppl', float('nan')):.1f} val ppl, {res['wall'] / 60:.1f} min"
    dev = res["dev"]
    return dev.get("f1", dev.get("accuracy"))


def bf16_units() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# ---------------------------------------------------------------- the stages

def pretrain_jobs(args, root: Path, langs: list[str]) -> list[dict]:
    base = {"kind": "pretrain", "recipe": args.recipe, "budget": args.pretrain_minutes * 60, "steps": args.pretrain_steps,
            "threads": max(1, args.threads // max(1, min(args.jobs, len(langs)))),
            "runs": str(root / "runs"), "cache": str(root / "cache"),
            # bf16 about doubles the tokens a half hour reads on CPUs with bf16 units, and costs on others
            "overrides": [f"train.mixed_precision={'bf16' if bf16_units() else 'no'}"]}
    return [{**base, "lang": lang, "root": str(root / f"pretrain-{lang}"),
             "overrides": base["overrides"] + language_overrides(args.recipe, lang) + _user_overrides(args, lang),
             "done": str(root / f"pretrain-{lang}" / "result.json")} for lang in langs]


def language_overrides(recipe: str, lang: str) -> list[str]:
    """Chinese in jieba's words where the recipe's tokenizer is the word tokenizer (its default: one word per
    ideograph); for word2vec, windows 20 words wide over the Chinese corpus, whose documents are whole reviews, and
    no word in the vocabulary that has no vector. All measured on ChnSentiCorp's 1,000-row slices (see the section's paragraph)."""
    from plmcli.config import load_recipe

    if lang != "zh":
        return []
    cfg = load_recipe(recipe)
    if cfg.tokenizer.kind != "word":
        return []
    # jieba's tokenizer cuts a word it lacks into known units (every ideograph is one): a word seen once, which
    # word2vec gives no vector (min_count 2), is better read as its characters, which have vectors
    return ["tokenizer.segment=jieba"] + (
        ["model.window=20", f"tokenizer.min_frequency={cfg.model.min_count}"] if cfg.family == "word2vec" else [])


def making_command(args) -> argparse.Namespace:
    """`args` as the command that made the figures: `--stage report` only gathers what it left under --keep."""
    argv, shown = list(args.argv), []
    while argv:
        item = argv.pop(0)
        if item == "--stage" and argv and argv[0] == "report":
            argv.pop(0)
        elif item != "--stage=report":
            shown.append(item)
    return argparse.Namespace(**{**vars(args), "argv": shown})


def _user_overrides(args, lang: str) -> list[str]:
    """--set values for `lang`: unprefixed ones apply to every language, `zh:`/`en:` ones to that one only."""
    out = []
    for item in args.overrides:
        head, sep, rest = item.partition(":")
        if sep and head in CORPORA:
            if head == lang:
                out.append(rest)
        else:
            out.append(item)
    return out


def finetune_jobs(args, root: Path, tasks: list[str], seeds: list[int]) -> list[dict]:
    """Every (task, rows, seed, init): seed by seed (a first seed of every cell before a second of any), within a
    seed the issue's 1,000-row cells first and the all-rows cell last."""
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    cells = [("sst2", r) for r in rows if "sst2" in tasks]
    cells += [("conll2003", "1000")] if "conll2003" in tasks else []
    cells += [("chnsenticorp", r.strip()) for r in args.chinese_rows.split(",") if r.strip() and "chnsenticorp" in tasks]
    cells.sort(key=lambda c: (c[1] == "all", c[1] != "1000"))
    threads = max(1, args.threads // max(1, args.jobs))
    jobs = []
    for seed in seeds:
        for task, r in cells:
            data = make_slice(root, task, r, seed)
            for init in ("pretrained", "random"):
                out = root / "ft" / f"{task}-{r}-{init}-seed{seed}"
                jobs.append({"kind": "finetune", "task": "classification" if task == "chnsenticorp" else task,
                             "name": task, "rows": r, "seed": seed, "init": init, "data": str(data),
                             "run": str(root / f"pretrain-{LANGUAGE[task]}" / "pretrain"), "out": str(out),
                             "epochs": args.all_epochs if (task, r) == ("sst2", "all") else None, "max_steps": args.max_steps,
                             "threads": threads, "runs": str(root / "runs"), "cache": str(root / "cache"),
                             "done": str(out.parent / f"{out.name}.json")})
    return jobs


def run(args) -> int:
    d = common.SHARED_DATA
    if not ((d / "glue" / "SST-2").is_dir() and (d / "conll2003").is_dir() and (d / "chinese").is_dir()):
        print(f"{NAME}: skipped — {d} lacks SST-2, CoNLL-2003 or the Chinese data")
        return 0
    root = args.keep or Path(tempfile.mkdtemp(prefix="plm-low-resource-"))
    root.mkdir(parents=True, exist_ok=True)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    env = common.child_env(threads=max(1, args.threads // max(1, args.jobs)))
    langs = sorted({LANGUAGE[t] for t in tasks})
    if args.stage != "report":
        print(f"{NAME}: pretraining {', '.join(langs)} side by side with {args.recipe} ...", flush=True)
        run_jobs(pretrain_jobs(args, root, langs), args.jobs, env)
    if args.stage in ("all", "finetune"):
        jobs = finetune_jobs(args, root, tasks, seeds)
        print(f"{NAME}: {len(jobs)} finetunes, {args.jobs} at a time ...", flush=True)
        run_jobs(jobs, args.jobs, env)
    if args.stage == "pretrain":
        return 0
    return report(args, root, tasks, seeds)


# ---------------------------------------------------------------- scikit-learn baselines on the same rows

def baseline(root: Path, task: str, rows, seed: int) -> float:
    done = root / "sklearn" / f"{task}-{rows}-seed{seed}.json"
    if done.is_file():
        return json.loads(done.read_text())["score"]
    data = make_slice(root, task, rows, seed)
    score = token_classifier(data, seed) if task == "conll2003" else bag_of_words(task, data, seed)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({"score": score}))
    return score


# ---------------------------------------------------------------- the table, the plot, the reading

TITLES = {"sst2": "SST-2 (dev accuracy)", "chnsenticorp": "ChnSentiCorp (dev accuracy)",
          "conll2003": "CoNLL-2003 NER (dev entity F1)"}


def _stats(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "–"
    m, s = _stats(xs)
    return f"{m:.4f} ± {s:.4f}"


def _points(a: float, b: float) -> str:
    return "–" if a != a or b != b else f"{(a - b) * 100:+.1f}"


def gather(args, root: Path, tasks: list[str], seeds: list[int]) -> list[dict]:
    """One row per (task, labelled rows) with every seed's score for each init and the baseline."""
    by_key: dict[tuple, dict] = {}
    for job in finetune_jobs(args, root, tasks, seeds):
        cell = by_key.setdefault((job["name"], job["rows"]), {
            "task": job["name"], "rows": job["rows"], "pretrained": [], "random": [], "steps": set(), "wall": [],
            "chosen": set()})
        done = Path(job["done"])
        if done.is_file():
            res = json.loads(done.read_text())
            cell[job["init"]].append(res["dev"][res["main_metric"]])
            cell["steps"].add(res["steps"])
            cell["chosen"].add((res["settings"]["lr"], res["settings"]["epochs"]))
            cell["wall"].append(res["wall"])
    cells = list(by_key.values())
    for c in cells:
        c["sklearn"] = [baseline(root, c["task"], c["rows"], s) for s in seeds]
        c["n_rows"] = _row_count(root, c["task"], c["rows"], seeds[0])
    return cells


def _row_count(root: Path, task: str, rows, seed: int) -> int:
    if rows != "all":
        return int(rows)
    folder = make_slice(root, task, rows, seed)
    train = folder / "SST-2" / "train.tsv" if task == "sst2" else folder / "train.tsv"
    return len(train.read_text(encoding="utf-8").splitlines()) - 1


def plot(cells: list[dict], path: Path, recipe: str = RECIPE) -> Path:
    """Score against labelled rows (SST-2, and ChnSentiCorp dashed when it has several row counts; log scale) and
    the two other tasks at 1,000 rows, mean ± std over the seeds."""
    from plmcli.analysis.figures import pyplot, save_png

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    styles = {"pretrained": ("C0", "o"), "random": ("C3", "s"), "sklearn": ("C2", "^")}
    labels = {"pretrained": f"{recipe} pretrained", "random": "same model, random init",
              "sklearn": "scikit-learn baseline"}
    counts = {t: {c["rows"] for c in cells if c["task"] == t} for t in ("sst2", "chnsenticorp")}
    curves = [t for t, rows in counts.items() if rows and (t == "sst2" or len(rows) > 1)]
    for task in curves:
        ordered = sorted((c for c in cells if c["task"] == task), key=lambda c: c["n_rows"])
        for kind, (color, marker) in styles.items():
            pts = [(c["n_rows"], *_stats(c[kind])) for c in ordered if c[kind]]
            if pts:
                x, m, s = zip(*pts)
                a.errorbar(x, m, yerr=s, color=color, marker=marker, linestyle="-" if task == "sst2" else "--",
                           capsize=3, label=labels[kind] if task == curves[0] else None)  # the title names the dashed task
    a.set_xscale("log")
    a.set_xlabel("labelled training rows")
    a.set_ylabel("dev accuracy")
    a.set_title(" and ".join(TITLES[t].split(" (")[0] + ("" if t == "sst2" else " (dashed)") for t in curves))
    a.grid(alpha=0.3)
    a.legend(loc="lower right", fontsize="small")
    others = [c for c in cells if c["task"] != "sst2" and c["rows"] == "1000"]
    for k, (kind, (color, _)) in enumerate(styles.items()):
        ms = [(_stats(c[kind]) if c[kind] else (0.0, 0.0)) for c in others]
        b.bar([i + (k - 1) * 0.27 for i in range(len(others))], [m for m, _ in ms], 0.27,
              yerr=[s for _, s in ms], color=color, capsize=3, label=labels[kind])
    b.set_xticks(range(len(others)), [TITLES[c["task"]].replace(" (", "\n(") for c in others])
    b.set_ylim(0, 1)
    b.set_title("1,000 labelled rows")
    b.grid(alpha=0.3, axis="y")
    fig.suptitle("Finetuning on few labelled rows: pretrained vs random init vs scikit-learn "
                 "(mean ± std over the seeds run)")
    return save_png(fig, path)


def reading(cells: list[dict], probe: dict | None, seed: int) -> str:
    """The goal line, the gain of every cell, and what the frozen-state probe says, from the numbers."""
    mean = {(c["task"], c["rows"], k): _stats(c[k])[0] for c in cells for k in ("pretrained", "random", "sklearn")
            if c[k]}
    goals = []
    for task in TITLES:
        if all((task, "1000", k) in mean for k in ("pretrained", "random", "sklearn")):
            p, r, s = (mean[(task, "1000", k)] for k in ("pretrained", "random", "sklearn"))
            met = p - r >= GOAL_GAIN and p > s
            goals.append(f"{TITLES[task].split(' (')[0]} **{'met' if met else 'NOT met'}** — {p:.4f} vs {r:.4f} "
                         f"({(p - r) * 100:+.1f} points) and {s:.4f} ({(p - s) * 100:+.1f})")
    out = [f"Goal at 1,000 rows (pretrained ≥ {GOAL_GAIN * 100:.0f} points above random init and above scikit-learn): "
           + "; ".join(goals) + "."] if goals else []
    gains = [f"{TITLES[c['task']].split(' (')[0]} {c['n_rows']:,} "
             f"{(mean[(c['task'], c['rows'], 'pretrained')] - mean[(c['task'], c['rows'], 'random')]) * 100:+.1f}"
             for c in cells if c["pretrained"] and c["random"]]
    out.append("Pretrained − random init, points, by cell: " + "; ".join(gains) + ".")
    if probe is None:  # no SST-2 in this run
        return "\n\n".join(out)
    best = {k: max(v) for k, v in probe.items()}
    bow = mean.get(("sst2", "1000", "sklearn"), float("nan"))
    out.append(
        f"Before any finetuning (SST-2, the 1,000 rows of seed {seed}): a logistic regression on each layer's "
        f"mean-pooled frozen states (layer 0 = embeddings) reaches "
        f"{' / '.join(f'{a:.3f}' for a in probe['pretrained'])} from the pretrained network and "
        f"{' / '.join(f'{a:.3f}' for a in probe['random'])} from a random one (best {best['pretrained']:.3f} vs "
        f"{best['random']:.3f}), against {bow:.3f} for word counts: what the pretraining put into the states "
        f"about sentiment is {(best['pretrained'] - best['random']) * 100:+.1f} points over random features and "
        f"{(best['pretrained'] - bow) * 100:+.1f} against knowing which words occur.")
    return "\n\n".join(out)


FIGURE = common.REPO_ROOT / "benchmarks" / "figures" / "low-resource-{recipe}.png"

WHY = {
    "nezha-mini-cpu": (
        "at bert-mini's size a learned position table keeps a half-hour CPU MLM on the unigram plateau (section "
        "\"Small MLMs on the plateau\": val loss 6.44 with context and 6.44 with it shuffled), so its encoder has nothing "
        "to transfer; NEZHA's functional relative positions leave the plateau within a few hundred steps at the same "
        "size and cost, and the pretraining text includes the unlabelled sentences of the tasks' own training sets "
        "(task-adaptive pretraining, no labels read). Dynamic masking with no sentence pairs, batch 16 and no dropout "
        "were the fastest-learning settings of the `bert-sst2` pilots."),
    "word2vec-transfer": (
        "with a few MB of text and 30 CPU-minutes, static word vectors are what the text can teach a small labelled "
        "set: word2vec reads the corpus 20 times in 2–7 CPU-minutes, while the MLM of `nezha-mini-cpu` reads it about "
        "six times in 22 and its frozen states probe below a bag of words (its section). Finetuned, a word2vec run "
        "is Kim's (2014) CNN over its vectors (\"CNN-non-static\": filters over 3, 4 and 5 words, 100 maps each, ReLU, "
        "the largest value of each map over the row, dropout 0.5, the output layer; the vectors train with it): the "
        "vectors know, for a word seen in no labelled row, the words it is used like, and the filters read the words "
        "in order (\"不 好\", \"not good\"), which a mean of them loses. From random init the same network must learn "
        "its vectors and its 120,000 filter weights from the labelled rows alone — which is what the vectors buy. "
        "**Why the CNN** (same vectors, the 1,000-row slices, 3 seeds, pretrained vs random init, AMD EPYC, "
        "2026-12-06): until then the head was a deep averaging network (Iyyer et al. 2015: the mean of the vectors "
        "under two hidden ReLU layers), which gave SST-2 0.7420 vs 0.6873 (+5.5) and ChnSentiCorp 0.8497 vs 0.8186 "
        "(+3.1, short of the goal); the CNN gives more from the vectors in every cell of the table (SST-2 500 … all "
        "+1.4 / +1.3 / +2.3 / +2.1 / +1.3 points over the averaging network's 0.7164 / 0.7420 / 0.7450 / 0.7722 / "
        "0.8089, ChnSentiCorp 250 … all +1.4 / +0.7 / +0.7 / +0.9 / +1.1 over 0.8172 / 0.8350 / 0.8497 / 0.8614 / "
        "0.9106); from random init it does about as well as the averaging network on SST-2 (0.6957 vs 0.6873 at 1,000) "
        "and worse on ChnSentiCorp below all rows (0.7936 vs 0.8186 at 1,000). Against the best random-init network on "
        "these slices rather than the same one (SST-2: the CNN itself; ChnSentiCorp: the averaging network, 0.8186) the "
        "CNN from the vectors is +5.9 and +3.8 points above it at 1,000 rows. Not kept: the CNN with the "
        "averaging network's two hidden layers over its maps (pilot, ChnSentiCorp) 0.8525 vs 0.7736; the averaging "
        "network with its hidden layers pretrained too (half of a review's words predicted from the mean of the other "
        "half's vectors, 10 epochs of the corpus, 2.3 CPU-minutes) 0.8511 — no more than the vectors alone. "
        "Settings of the vectors, measured under the averaging network: with the plain average under a linear layer "
        "(fastText's classifier) plm measured +2.4 points on SST-2 (0.7347 vs 0.7102); window 10 (+2.9), 300-d "
        "(+2.0) and frozen vectors (0.7152) did not move that beyond noise. What moves it is text: the same recipe on "
        "random quarters and halves of the corpus' documents, and on the corpus plus PTB train and tiny Shakespeare "
        "(out of domain), gave +0.5 points at 0.27M words, +1.9 at 0.52M, +2.4 at 1.05M (this corpus), +2.9 at 2.1M. "
        "A tagger is Collobert et al.'s (2011) window approach: the vectors of words i−2 … i+2 with each word's "
        "capitalization feature, through two hidden ReLU layers. Measured before it was built (the same vectors, the "
        "CoNLL 1,000-row slices, 3 seeds; pretrained vs random init, F1): each word's own vector under a linear layer "
        "0.4361 vs 0.4478; a window, one hidden layer of 300, no case 0.6467 vs 0.5760 (+7.1, below scikit-learn's "
        "0.6903); with the case 0.7250 vs 0.6752 (+5.0); with the case read off the vocabulary (an unknown word's case "
        "lost) 0.6653 vs 0.6191 — the letter case of the words the vocabulary lacks is what a tagger of 1,000 sentences "
        "needs besides the vectors; two hidden layers of the window's width 0.7149 vs 0.6340 (+8.1). Chinese is cut "
        "into jieba's words (`tokenizer.segment=jieba`, in pretraining and so in finetuning): with one word per "
        "ideograph the averaging network gave 0.7989 vs 0.7872 (+1.2), below scikit-learn's character bigrams "
        "(0.8147). Its windows are 20 words wide (`model.window=20` for Chinese only: each document of that corpus is "
        "a whole review, 69 jieba words on average, whose words share its polarity; English keeps 5). Under the "
        "averaging network (ChnSentiCorp 1,000-row slices, 3 seeds, pretrained vs random init, quiet AMD EPYC, "
        "2026-12-06): window 5 0.8342 vs 0.8178 (+1.6); window 20 0.8431 vs 0.8167 (+2.6); CBOW 0.8394 vs 0.8158; "
        "300-d 0.8328 vs 0.8067; the 1,200 unlabelled test reviews added to the text 0.8406 vs 0.8178; Iyyer et al.'s "
        "word dropout (0.3) 0.8350; frozen vectors 0.8417; 256 tokens a review instead of 128 0.8403 vs 0.8147; "
        "CMRC2018's 1,104 Wikipedia passages added 0.8450 vs 0.8128; `model.min_count=1` 0.8478 vs 0.8161; no word in "
        "the vocabulary without a vector (`tokenizer.min_frequency=2`, kept: 2.7% of the dev tokens had none, 2.1% "
        "words seen once in the text, which now become their characters, which have vectors, and 0.6% [UNK]) 0.8511 "
        "vs 0.8169 (+3.4); with that vocabulary windows of 50 words 0.8492 vs 0.8183, 50-d vectors 0.8483 vs 0.8264, "
        "ULMFiT's concat pooling ([last; max; mean] of the vectors) 0.8456 vs 0.8186, one hidden layer 0.8506 vs "
        "0.8239 — every setting of the vectors ended between 0.83 and 0.852 under the mean, where the CNN reads "
        "0.857 from the same vectors. The jieba vocabulary is the same in every process since 2026-12-06 (ideographs "
        "of equal count had taken a set's order, which followed the process' string hash seed), so a re-run of this "
        "command gives these vectors bit for bit."),
}
"""Why each pretraining recipe the benchmark has been run with was chosen (the section's paragraph)."""


def how(args, fitted: bool) -> str:
    """How the pretraining ran, in the section's words; `fitted`: by the model's own fit (word2vec), no loop steps."""
    threads = max(1, args.threads // max(1, args.jobs))
    side = f"the two side by side, one process and {threads} torch thread each"
    if fitted:
        return (f"One `{args.recipe}` run per language ({side}; \"CPU\" below is the process's CPU time, tokenizer "
                "training included — the issue's budget is 30 CPU-minutes)")
    return (f"One pretraining per language with the `{args.recipe}` recipe, {args.pretrain_steps:,} steps of 16 × 128 "
            f"tokens each ({side}; \"CPU\" below is the process's CPU time, tokenizer training and encoding "
            "included — the issue's budget is 30 CPU-minutes; bf16 autocast where the CPU has bf16 units)")


def pretrain_row(corpus: str, r: dict) -> list[str]:
    """One pretraining's row: the loop's steps and tokens, or word2vec's epochs and the words it read (corpus ×
    epochs) — tokens/s over what was read either way."""
    s = r["summary"]
    read = s["tokens"] if s["steps"] else s["tokens"] * s["epochs"]
    return [corpus, f"{r['corpus_mb']:.1f} MB", f"{s['steps']:,}" if s["steps"] else f"{s['epochs']} epochs",
            f"{read:,}", f"{read / s['elapsed_s']:,.0f}", f"{r['cpu_s'] / 60:.1f} min", f"{r['wall'] / 60:.1f} min",
            f"{s['val_ppl']:.1f}" if "val_ppl" in s else "–"]


def report(args, root: Path, tasks: list[str], seeds: list[int]) -> int:
    pre = {lang: json.loads((root / f"pretrain-{lang}" / "result.json").read_text())
           for lang in sorted({LANGUAGE[t] for t in tasks})}
    order = {"sst2": 0, "chnsenticorp": 1, "conll2003": 2}
    cells = sorted(gather(args, root, tasks, seeds), key=lambda c: (order[c["task"]], c["n_rows"]))
    png = plot(cells, root / f"low-resource-{args.recipe}.png", args.recipe)
    if not args.no_write:
        figure = Path(str(FIGURE).format(recipe=args.recipe))
        figure.parent.mkdir(parents=True, exist_ok=True)
        figure.write_bytes(png.read_bytes())
    names = {"en": "English: SST-2 train sentences + CoNLL-2003 train sentences + WikiText-2 valid",
             "zh": "Chinese: ChnSentiCorp train reviews + THUCNews titles"}
    pre_rows = [pretrain_row(names[lang], r) for lang, r in pre.items()]
    rows = []
    for c in cells:
        p, r, s = (_stats(c[k])[0] if c[k] else float("nan") for k in ("pretrained", "random", "sklearn"))
        steps = "/".join(str(x) for x in sorted(c["steps"])) or "–"
        rows.append([TITLES[c["task"]], f"{c['n_rows']:,}", _fmt(c["pretrained"]), _fmt(c["random"]),
                     _fmt(c["sklearn"]), f"**{_points(p, r)}**", _points(p, s), steps,
                     f"{statistics.mean(c['wall']) / 60:.1f} min" if c["wall"] else "–"])
    jobs = finetune_jobs(args, root, tasks, seeds)
    finished = sum(Path(j["done"]).is_file() for j in jobs)
    # what the size defaults chose for the 1,000-row cells, as their finetunes recorded it
    chosen = "; ".join(sorted({f"lr {lr:g}, {epochs} epochs" for c in cells if c["rows"] == "1000"
                               for lr, epochs in c["chosen"]})) or "see each run's metrics.json"
    if finished < len(jobs):
        print(f"{NAME}: {finished} of {len(jobs)} finetunes done; the rest show – (re-run without --stage to finish)")
    probe = layer_probe(root, make_slice(root, "sst2", "1000", seeds[0]), seeds[0]) if "sst2" in tasks else None
    verdict = reading(cells, probe, seeds[0])
    text = f"""
What pretraining buys a user with few labelled rows. {how(args, all(not r["summary"]["steps"] for r in pre.values()))}, on unlabelled text from
../shared/data only. Then `plm finetune` with **no
tuning flags** (the size defaults choose lr and epochs from the labelled rows — {chosen} at 1,000; dev after every epoch, the best
kept){f", except `--epochs {args.all_epochs}` on all SST-2 rows" if "all" in args.rows else ""}, from the pretrained run
and with `--init random` (same architecture and tokenizer, fresh weights), beside scikit-learn on the same rows:
a logistic regression on binary uni+bigram counts (words; characters for Chinese), C chosen by 5-fold
cross-validation on the training rows, and for NER a per-token logistic regression over word, shape and affix
features of the token and its two neighbours on each side (no CRF), scored by plm's own seqeval scorer. Each
seed ({", ".join(map(str, seeds))}) draws the labelled rows *and* seeds the finetune; mean ± sample std over the seeds.
Dev sets are the full ones (SST-2 872 sentences, ChnSentiCorp 1,200 reviews, CoNLL-2003 testa 3,250 sentences).

Why this recipe: {WHY.get(args.recipe, "(not written for this recipe)")}

Finetunes done: {finished} of {len(jobs)} (seed by seed; a cell with fewer seeds has a smaller std sample, one
seed shows ± 0.0000; `–`: not run yet — the same command with the same --keep finishes them).

{verdict}

![accuracy against labelled rows](benchmarks/figures/low-resource-{args.recipe}.png)
"""
    table = (common.markdown_table(["pretraining corpus", "text", "steps", "tokens read", "tokens/s", "CPU", "wall", "val MLM ppl"],
                                   pre_rows) + "\n\n" +
             common.markdown_table(["task", "labelled rows", "pretrained", "random init", "scikit-learn",
                                    "pretrained − random (points)", "pretrained − sklearn", "finetune steps",
                                    "finetune wall (mean)"], rows))
    # one section per recipe: each pretraining's table stays beside the others
    common.publish(f"{NAME}-{args.recipe}", common.section_body(f"Low-resource transfer: {args.recipe} pretrained vs random init vs "
                                             "scikit-learn", making_command(args), text, table), args)
    print(f"plot: {png}")
    return 0
