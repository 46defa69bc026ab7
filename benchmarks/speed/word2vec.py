"""word2vec on PTB: plm's skip-gram and CBOW against gensim's Word2Vec with the same settings on the same text.

Both train on ptb.train.txt, each line a sentence (gensim: LineSentence; plm: data.doc_per_line), with the
recipe's settings passed to gensim one by one. Each side's vectors go through the word2vec text format, and
each file is scored twice on gensim's own copies of questions-words.txt and wordsim353.tsv: by gensim's
KeyedVectors.evaluate_word_analogies / evaluate_word_pairs and by `plm eval-vectors`, which must agree.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks import common

NAME = "word2vec"
HELP = "word2vec-sg / word2vec-cbow on PTB vs gensim's Word2Vec: analogy accuracy, WordSim-353 ρ, training words/s"
DEFAULTS = {"repeats": 3}  # the shared options it takes (benchmarks/__main__.py), its defaults
RECIPES = {"skip-gram": "word2vec-sg", "cbow": "word2vec-cbow"}
DEFAULT_CORPUS = common.SHARED_DATA / "ptb" / "ptb.train.txt"


def add_arguments(p) -> None:
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                   help="one sentence per line, whitespace-separated words")
    p.add_argument("--archs", default="skip-gram,cbow", help="comma-separated: skip-gram, cbow")
    p.add_argument("--epochs", type=int, default=5, help="passes over the corpus, both sides")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", default="1,2",
                   help="comma-separated worker threads, one row pair per count: gensim workers=N vs plm model.workers=N")


def gensim_run(corpus: Path, m, arch: str, epochs: int, threads: int, seed: int, out: Path) -> dict:
    """gensim's Word2Vec with plm's model section `m`; vectors written to `out`."""
    from gensim.models import Word2Vec
    from gensim.models.word2vec import LineSentence

    sentences = LineSentence(str(corpus))
    model = Word2Vec(vector_size=m.dim, window=m.window, negative=m.negative, hs=0, ns_exponent=m.ns_exponent,
                     sample=m.sample, alpha=m.alpha, min_alpha=m.min_alpha, min_count=m.min_count,
                     sg=int(arch == "skip-gram"), cbow_mean=1, workers=threads, seed=seed, epochs=epochs)
    model.build_vocab(sentences)
    t0 = time.perf_counter()
    _, raw = model.train(sentences, total_examples=model.corpus_count, epochs=epochs)
    train_s = time.perf_counter() - t0
    model.wv.save_word2vec_format(str(out))
    return {"vocab": len(model.wv), "train_s": train_s, "words_per_s": raw / train_s}


def plm_run(corpus: Path, arch: str, epochs: int, workers: int, seed: int, run_dir: Path, out: Path) -> dict:
    from plmcli import api

    t0 = time.perf_counter()
    s = api.pretrain(RECIPES[arch], [str(corpus)], str(run_dir),
                     overrides=[f"model.epochs={epochs}", f"model.workers={workers}", f"train.seed={seed}"])
    wall = time.perf_counter() - t0
    api.export(str(run_dir), "word2vec", str(out))
    return {"vocab": s["vocab"], "words": s["tokens"], "train_s": s["train_s"],
            "words_per_s": s["tokens"] * epochs / s["train_s"], "wall_s": wall, "trainer": s.get("trainer")}


def scores(vectors: Path, questions: str, pairs: str) -> dict:
    """Both evaluators on one file; they must agree on every section."""
    from gensim.models import KeyedVectors

    from plmcli import api

    kv = KeyedVectors.load_word2vec_format(str(vectors))
    acc, sections = kv.evaluate_word_analogies(questions)
    _, spearman, oov_ratio = kv.evaluate_word_pairs(pairs)
    ours = api.eval_vectors(str(vectors), questions, pairs)
    a = ours["analogies"]
    theirs = [(s["section"], len(s["correct"]), len(s["correct"]) + len(s["incorrect"])) for s in sections[:-1]]
    agree = theirs == [(s["section"], s["correct"], s["scored"]) for s in a["sections"]] and \
        abs(ours["similarity"]["spearman"] - spearman[0]) < 1e-6
    return {"gensim_acc": acc, "plm_acc": a["accuracy"], "correct": a["correct"], "scored": a["scored"],
            "questions": a["questions"], "rho": spearman[0], "plm_rho": ours["similarity"]["spearman"],
            "pairs": ours["similarity"]["pairs"], "agree": agree}


def mean_scores(runs: list[dict]) -> dict:
    """The scores of several Hogwild! runs averaged (correct answers rounded): one run's analogies move by ±0.3
    points from run to run."""
    mean = {k: statistics.mean(r[k] for r in runs) for k in ("gensim_acc", "plm_acc", "correct", "rho")}
    return {**runs[0], **mean, "correct": round(mean["correct"])}


def compare(args, arch: str, workers: int, root: Path, questions: str, pairs: str, notes: dict) -> tuple[list, dict]:
    """gensim and plm on one architecture with `workers` threads each, interleaved: the table rows, plm's first run."""
    import gensim

    from plmcli.config import load_recipe

    m = load_recipe(RECIPES[arch]).model
    runs: dict[str, list[dict]] = {"gensim": [], "plm": []}
    first: dict[str, tuple[bytes, dict]] = {}
    hogwild: dict[str, list[dict]] = {"gensim": [], "plm": []}
    for r in range(args.repeats):
        for tool, done in runs.items():  # gensim, plm, gensim, plm, ...: drift in the load hits both alike
            vec = root / f"{tool}-{arch}-{workers}-{r + 1}.txt"
            t = plm_run(args.corpus, arch, args.epochs, workers, args.seed, root / f"{arch}-{workers}-{r + 1}", vec) \
                if tool == "plm" else gensim_run(args.corpus, m, arch, args.epochs, workers, args.seed, vec)
            done.append(t)
            if tool not in first:  # 1 worker: the vectors are scored once; later rounds must give the same bytes
                first[tool] = (vec.read_bytes(), scores(vec, questions, pairs))
                if not first[tool][1]["agree"]:
                    notes["disagree"].append(f"{tool} {arch}")
                hogwild[tool].append(first[tool][1])
            elif workers == 1 and vec.read_bytes() != first[tool][0]:
                notes["changed"].append(f"{tool} {arch} (round {r + 1})")
            elif workers > 1:  # Hogwild!: every round's vectors differ, so every round is scored and averaged
                hogwild[tool].append(scores(vec, questions, pairs))
            print(f"round {r + 1}/{args.repeats} {tool} {arch} workers={workers}: {t}")
    rate = {tool: common.summary([t["words_per_s"] for t in v]) for tool, v in runs.items()}
    rows, many = [], "" if workers == 1 else f", {workers} workers"  # 1 worker: the rows benchmarks/summary.py reads
    for tool in ("plm", "gensim"):
        s, w = (first[tool][1] if workers == 1 else mean_scores(hogwild[tool])), rate[tool]
        train_s = statistics.median(t["train_s"] for t in runs[tool])
        side = f"{tool} {arch}" + (f" (`{RECIPES[arch]}`)" if tool == "plm" else f" {gensim.__version__}") + many
        rows.append([side, f"{runs[tool][0]['vocab']:,}", f"**{s['gensim_acc']:.2%}**", f"{s['plm_acc']:.2%}",
                     f"{s['correct']:,} / {s['scored']:,} of {s['questions']:,}",
                     f"{s['rho']:.3f} ({s['pairs']} pairs)", f"**{w['median']:,.0f}**",
                     f"{w['min']:,.0f}–{w['max']:,.0f}", f"{train_s:.1f} s"])
    rows.append([f"**plm ÷ gensim, {arch}{many}**", "", "", "", "", "",
                 f"**{rate['plm']['median'] / rate['gensim']['median']:.2f}×**", "", ""])
    return rows, runs["plm"][0]


def run(args) -> int:
    if not args.corpus.is_file():
        print(f"word2vec: skipped — {args.corpus} not found")
        return 0
    try:
        from gensim.test.utils import datapath
    except ImportError:
        print("word2vec: skipped — gensim is not installed (pip install -e '.[peers]')")
        return 0
    from plmcli.config import load_recipe

    common.set_threads(args.threads)
    info = common.machine_info()
    questions, pairs = datapath("questions-words.txt"), datapath("wordsim353.tsv")
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    rows, notes, plm = [], {"disagree": [], "changed": []}, {}
    with common.isolated_workdir("plm-bench-word2vec-") as root:
        for arch in [a.strip() for a in args.archs.split(",") if a.strip()]:
            for workers in counts:
                more, plm = compare(args, arch, workers, root, questions, pairs, notes)
                rows += more
    table = common.markdown_table(["side", "vocab", "analogies (gensim's eval)", "(plm eval-vectors)",
                                   "correct / in vocab of all", "WordSim-353 ρ", "train words/s (median)",
                                   "min–max", "train time (median)"], rows)
    same = "every later round's 1-worker vectors are byte for byte the first's on both sides" if not notes["changed"] \
        else "the vectors of " + ", ".join(notes["changed"]) + " DIFFER from the first round's"
    words = plm["words"]  # every architecture trains on the same corpus
    m = load_recipe(RECIPES["skip-gram"]).model
    ptb = args.corpus == DEFAULT_CORPUS
    if ptb:
        corpus = f"""Penn Treebank's training text ({args.corpus.name}: {words:,} words, each line a sentence) because it is the largest
word-level corpus with a training split in the shared data; its 10k lowercased vocabulary, with numbers as `N`,
leaves most analogy questions out of vocabulary, and both sides skip the same ones."""
    else:
        corpus = f"""`{args.corpus}` ({words:,} words, each line a sentence); analogy questions with a word out of
vocabulary are skipped by both sides alike."""
    text = f"""
{corpus} Same settings on both sides
(the recipe's: dim {m.dim}, window {m.window}, negative {m.negative}, sample {m.sample:g}, min_count {m.min_count},
{args.epochs} epochs, alpha 0.025 (skip-gram) or 0.05 (CBOW) falling to {m.min_alpha:g}), and the same number of
worker threads: gensim `workers=N` against plm `model.workers=N` (its compiled trainer, trainer: {plm.get("trainer")};
{args.threads} torch thread(s)). Several workers are Hogwild! on both sides, so their vectors change run to run.
Words/s = corpus words × epochs / training time, vocabulary building and
tokenizing left out on both sides; {args.repeats} rounds per row pair in one process, gensim then plm in each
(interleaved), and the median of the rounds. Each side's vectors are written in the word2vec text format and
scored on gensim's own questions-words.txt and wordsim353.tsv by gensim's `evaluate_word_analogies` /
`evaluate_word_pairs` and by `plm eval-vectors` — with one worker the first round's, with several (Hogwild!, other
vectors each round) every round's, and the table gives their mean:
{"they agree on every file" if not notes["disagree"] else "they DISAGREE on " + ", ".join(notes["disagree"])};
{same}.
"""
    common.publish(NAME, common.section_body(f"word2vec on {'PTB' if ptb else args.corpus.name}: plm vs gensim",
                                             args, text, table, info), args)
    return 0
