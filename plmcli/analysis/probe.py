"""`plm probe`: a linear probe on each layer's frozen word vectors (Tenney et al. 2019; Liu et al. 2019):
how much part-of-speech, chunk or named-entity information a layer holds in linearly readable form.

Data: CoNLL-2003, one word per line with its POS, chunk and NER tags (columns 2, 3, 4). Chunk and NER
tags are rewritten from IOB1 to IOB2, as `plm finetune --task conll2003` does, so B- marks every start.
The probe trains on the train file's words and is scored on the dev file's (eng.train / eng.testa, or
train.txt / valid.txt). A cap on sentences draws that many at random (seeded), kept in file order, so
a small sample is not just the first few documents.

Representation: a sentence is tokenized as the NER task does it (words joined by spaces, sub-tokens
assigned to words by character offsets: plmcli.objectives.tagging.word_pieces) and laid out as the
model reads text ([CLS] words [SEP]; XLNet's words [SEP] [CLS]; a causal LM's bos, else eos, then the
words); a word's vector at a layer is that of its FIRST sub-token. A causal LM's vectors have seen the
words to their left only. Layer 0 is the embedding output (no context): with the majority tag it is
the baseline a layer's score means something against.

Probe: multinomial logistic regression (scikit-learn, L-BFGS, L2 with C = 1) on standardized features,
one per layer. The problem is convex: its optimum, hence the score, depends on the representation and
not on a seed, a learning rate or an epoch count, which an SGD-trained probe would mix in.
Standardizing puts layers of different scales (a pre-LN residual stream grows with depth) under the
same regularization. Scores on the dev words: accuracy and macro-F1 over the dev tags (a dev tag the
train sample lacks stays in, always wrong).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError

TASKS = {"pos": 1, "chunk": 2, "ner": -1}
"""Task -> CoNLL-2003 column of its tags (0-based; NER the last, where the NER task reads it)."""
IOB_TASKS = ("chunk", "ner")
CONLL_COLUMNS = 4
PROGRESS_LOG_S = 30.0
"""Off a terminal (a log), a progress line at most this often (on a terminal: the bar)."""
MAX_SEQ_LEN = 512
"""Longest row fed to the model (its own max_positions when smaller); longer sentences are split into
windows at word boundaries, as for NER finetuning."""


# ------------------------------------------------------------------ data


def _first_word_line(path: Path) -> tuple[int, int]:
    """(line number, column count) of the first word line of a CoNLL file, or (0, 0)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if fields and fields[0] != "-DOCSTART-":
                return n, len(fields)
    return 0, 0


def _sample(sentences: list, cap: int | None, seed: int, split: str) -> list:
    if cap is None or len(sentences) <= cap:
        return sentences
    rng = np.random.default_rng(seed + (split == "dev"))  # the two splits draw independently
    return [sentences[i] for i in sorted(rng.choice(len(sentences), cap, replace=False))]


def load_data(task: str, data_dir: str | None = None, train: str | None = None, dev: str | None = None,
              max_sentences: int | None = 2000, max_dev_sentences: int | None = 500,
              seed: int = 0) -> dict[str, dict]:
    """split -> {file, sentences: [(words, tags)], total (sentences in the file)} for train and dev."""
    from plmcli.data.tasks import TaskOptions
    from plmcli.data.tasks.conll import iob1_to_iob2, read_conll
    from plmcli.data.tasks.registry import get_task

    if task not in TASKS:
        raise PlmError(f"unknown probe task '{task}'", f"use one of: {', '.join(TASKS)}")
    for name, cap in (("--max-sentences", max_sentences), ("--max-dev-sentences", max_dev_sentences)):
        if cap is not None and cap < 1:
            raise PlmError(f"{name} {cap} must be ≥ 1", f"e.g. {name} 500")
    files = get_task("conll2003", TaskOptions(train=train, dev=dev)).files(data_dir)
    out = {}
    for split, cap in (("train", max_sentences), ("dev", max_dev_sentences)):
        path = files[split]
        line, width = _first_word_line(path)
        if task != "ner" and width and width != CONLL_COLUMNS:
            raise PlmError(f"{path}:{line}: {width} columns; --task {task} reads column {TASKS[task] + 1} of "
                           f"CoNLL-2003's {CONLL_COLUMNS} (word POS chunk NER)",
                           "pass the CoNLL-2003 files (eng.train, eng.testa), or use --task ner on word ... tag files")
        rows = read_conll(path, labeled=True, column=TASKS[task])
        sentences = [(words, iob1_to_iob2(tags)[0] if task in IOB_TASKS else tags) for words, tags, _ in rows]
        out[split] = {"file": str(path), "total": len(sentences), "sentences": _sample(sentences, cap, seed, split)}
    return out


# ------------------------------------------------------------------ word vectors


def row_layout(model_cls, special_ids: dict) -> tuple[list[int], list[int]]:
    """(ids before the words, ids after them) as the model reads a text."""
    from plmcli.data.pairs import encoder_frame
    from plmcli.data.tasks import require_roles

    if model_cls.traits.bidirectional:
        require_roles(special_ids, ("cls", "sep"))
        frame = encoder_frame(model_cls.traits.pair_layout, special_ids["cls"], special_ids["sep"])
        return list(frame.before), list(frame.after)
    # A causal LM reads a document after its boundary token, as eval-ppl conditions its first token.
    start = special_ids.get("bos", special_ids.get("eos"))
    return ([start] if start is not None else []), []


def encode_rows(tokenizer, special_ids: dict, sentences: list[list[str]], prefix: list[int], suffix: list[int],
                max_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """(rows of ids, each row's first-sub-token positions), words in sentence order; a sentence longer
    than a row is split into windows at word boundaries (each word in exactly one)."""
    from plmcli.objectives.tagging import plan_windows, word_pieces

    budget = max_len - len(prefix) - len(suffix)
    if budget < 1:
        raise PlmError(f"the model reads {max_len} tokens, too few for a word between its special tokens",
                       "probe a run with more positions")
    unk = special_ids.get("unk", special_ids.get("pad", 0))
    rows, firsts = [], []
    for pieces in word_pieces(tokenizer, sentences, unk):
        for a, b in plan_windows([len(p) for p in pieces], budget):
            row, first = list(prefix), []
            for p in pieces[a:b]:
                first.append(len(row))
                row += p[:budget]
            rows.append(row + suffix)
            firsts.append(first)
    return rows, firsts


def word_vectors(model, rows: list[list[int]], firsts: list[list[int]], pad_id: int, batch_size: int = 32,
                 device=None, progress=None) -> list[np.ndarray]:
    """Per layer 0..L, the (words, C) float32 vectors at the `firsts` positions of `rows`, in row order.

    All layers are held at once (words × C × (L + 1) × 4 bytes: BERT-base at the default 2,000 + 500
    sentences, ~36k words, is ~1.4 GB), so the model runs once.
    """
    import torch

    from plmcli.analysis.hidden import hidden_states

    device = device or next(model.parameters()).device
    counts = np.array([len(f) for f in firsts], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(counts)])
    order = np.argsort([len(r) for r in rows], kind="stable")  # similar lengths together: little padding
    out: list[np.ndarray] = []
    for lo in range(0, len(rows), batch_size):
        idx = order[lo:lo + batch_size]
        T = max(len(rows[i]) for i in idx)
        ids = torch.full((len(idx), T), pad_id, dtype=torch.long)
        mask = torch.zeros(len(idx), T, dtype=torch.long)
        for b, i in enumerate(idx):
            ids[b, :len(rows[i])] = torch.tensor(rows[i])
            mask[b, :len(rows[i])] = 1
        states = hidden_states(model, ids.to(device), mask.to(device))
        b_idx = torch.tensor(np.repeat(np.arange(len(idx)), counts[idx]), device=device)
        t_idx = torch.tensor([t for i in idx for t in firsts[i]], dtype=torch.long, device=device)
        dest = np.concatenate([np.arange(start[i], start[i + 1]) for i in idx])
        if not out:
            out = [np.empty((int(start[-1]), h.shape[-1]), dtype=np.float32) for h in states]
        for layer, h in enumerate(states):
            out[layer][dest] = h[b_idx, t_idx].float().cpu().numpy()
        if progress:
            progress(len(idx))
    return out


# ------------------------------------------------------------------ the probe


def fit_probe(x_train: np.ndarray, y_train: np.ndarray, x_dev: np.ndarray, y_dev: np.ndarray, seed: int = 0,
              max_iter: int = 1000) -> dict:
    """Multinomial logistic regression on standardized features: dev accuracy, macro-F1, L-BFGS iterations."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x_train)
    clf = LogisticRegression(C=1.0, max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(scaler.transform(x_train), y_train)
    pred = clf.predict(scaler.transform(x_dev))
    return {"accuracy": float(np.mean(pred == y_dev)), "macro_f1": _macro_f1(y_dev, pred, f1_score),
            "iterations": int(np.max(clf.n_iter_)),
            "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught)}


def _macro_f1(y_true, y_pred, f1_score) -> float:
    """Mean F1 over the tags in the dev gold or predictions (an unpredictable dev-only tag scores 0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tag never predicted: F1 0, which is the point
        return float(f1_score(y_true, y_pred, average="macro"))


def majority_baseline(y_train: np.ndarray, y_dev: np.ndarray) -> dict:
    """The most frequent train tag (ties: the first by name) predicted for every dev word."""
    from sklearn.metrics import f1_score

    tag = int(np.bincount(y_train).argmax())
    pred = np.full_like(y_dev, tag)
    return {"tag_id": tag, "accuracy": float(np.mean(pred == y_dev)), "macro_f1": _macro_f1(y_dev, pred, f1_score)}


# ------------------------------------------------------------------ the command


def probe(run: str | None, task: str, out: str, data_dir: str | None = None, train: str | None = None,
          dev: str | None = None, max_sentences: int | None = 2000, max_dev_sentences: int | None = 500,
          seed: int = 0, batch_size: int = 32, console=None) -> dict:
    """Probe every layer of `run` for `task` (pos | chunk | ner); writes OUT/probe.json, OUT/probe.tsv and
    OUT/probe_{task}.png, and returns what probe.json holds. `console` (rich, stderr): the progress through the
    sentences and the layers, a bar on a terminal, elsewhere a line at most every PROGRESS_LOG_S seconds."""
    import torch

    from plmcli.analysis.hidden import families_with_layers, layer_spec
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.models.registry import model_class
    from plmcli.runs import load_encoder, resolve_run, run_config
    from plmcli.train.progress import StageProgress

    started = time.monotonic()
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise PlmError(f"--out {out_dir} is a file", "pass a directory for probe.json, probe.tsv and the figure")
    check_option("--batch-size", batch_size, Range(1), "e.g. --batch-size 32")
    # numpy's generators refuse a negative seed, and only once the sentences are sampled
    check_option("--seed", seed, Range(0), "e.g. --seed 0")
    path = resolve_run(run, "plm probe RUN").resolve()  # runs/latest -> the run it points at, for the report and the figure
    cfg = run_config(path)
    cls = model_class(cfg["family"])
    if layer_spec(cls) is None:
        raise PlmError(f"run {path} is a {cfg['family']} model, which has no Transformer layers to probe",
                       f"probe a run of one of: {', '.join(families_with_layers())} (roberta recipes are bert)")
    data = load_data(task, data_dir, train, dev, max_sentences, max_dev_sentences, seed)
    labels = {s: [t for _, tags in data[s]["sentences"] for t in tags] for s in ("train", "dev")}
    names = sorted(set(labels["train"]))
    if len(names) < 2:
        raise PlmError(f"the train sample has one {task} tag only ({names[0]}): nothing to tell apart",
                       "probe on more sentences (--max-sentences) or another --train file")
    index = {t: i for i, t in enumerate(names)}
    unseen = sorted(set(labels["dev"]) - set(names))
    index.update({t: len(names) + i for i, t in enumerate(unseen)})  # ids the probe never predicts
    y = {s: np.array([index[t] for t in labels[s]], dtype=np.int64) for s in labels}
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    prefix, suffix = row_layout(cls, special_ids)  # a tokenizer without [CLS]/[SEP] fails here, before any work
    tok = load_tokenizer(path / "tokenizer.json")
    model = load_encoder(path, cfg).eval()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    max_len = min(model.max_positions, MAX_SEQ_LEN)  # every family with probe_layers has a position bound

    with StageProgress(console, log_every=PROGRESS_LOG_S) as bar:
        feats = {}
        for split in ("train", "dev"):
            words = [w for w, _ in data[split]["sentences"]]
            rows, firsts = encode_rows(tok, special_ids, words, prefix, suffix, max_len)
            bar.start(f"{split} vectors", len(rows))
            feats[split] = word_vectors(model, rows, firsts, special_ids.get("pad", 0), batch_size, device, bar.advance)
        layers = []
        bar.start("probing layers", len(feats["train"]))
        for layer, (x_tr, x_dev) in enumerate(zip(feats["train"], feats["dev"])):
            layers.append({"layer": layer, **fit_probe(x_tr, y["train"], x_dev, y["dev"], seed)})
            bar.advance(1)
    majority = majority_baseline(y["train"], y["dev"])
    majority = {"tag": names[majority.pop("tag_id")], **majority}

    causal = not cls.traits.bidirectional
    best = max(layers, key=lambda r: r["accuracy"])
    counts = {s: {"file": data[s]["file"], "sentences": len(data[s]["sentences"]), "of": data[s]["total"],
                  "words": int(len(y[s]))} for s in ("train", "dev")}
    result = {
        "run": str(path), "family": cfg["family"], "task": task, "layers": layers, "majority": majority,
        "best_layer": best["layer"], "tags": names, "dev_tags_unseen_in_train": unseen, **counts,
        "representation": "each word's first sub-token, frozen; layer 0 = the embedding output",
        "context": ("left context only: a causal LM's word vector has seen the words before it, never after"
                    if causal else "both sides of the sentence"),
        "probe": "multinomial logistic regression on standardized features (scikit-learn, L-BFGS, L2 C=1)",
        "seed": seed, "elapsed_s": round(time.monotonic() - started, 2),
    }
    result["files"] = _write_outputs(result, out_dir)
    return result


def _write_outputs(result: dict, out_dir: Path) -> dict:
    """probe.json, probe.tsv and probe_{task}.png, each written whole (temp file + rename)."""
    from plmcli.data.store import write_json, write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out_dir / "probe.json"), "tsv": str(out_dir / "probe.tsv"),
             "png": str(out_dir / f"probe_{result['task']}.png")}
    lines = ["layer\taccuracy\tmacro_f1"] + [f"{r['layer']}\t{r['accuracy']:.6f}\t{r['macro_f1']:.6f}"
                                             for r in result["layers"]]
    write_text(Path(files["tsv"]), "\n".join(lines) + "\n")
    plot_curve(result, files["png"])
    write_json(Path(files["json"]), {**result, "files": files})
    return files


def plot_curve(result: dict, path: str | Path) -> Path:
    """Dev accuracy per layer, the majority-tag baseline dashed."""
    from plmcli.analysis.figures import pyplot, save_png

    plt = pyplot()
    xs = [r["layer"] for r in result["layers"]]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(xs, [r["accuracy"] for r in result["layers"]], marker="o", label=f"linear probe ({result['task']})")
    m = result["majority"]
    ax.axhline(m["accuracy"], linestyle="--", color="grey", label=f"majority tag ({m['tag']})")
    ax.set_xticks(xs)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("dev accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    note = ", left context only" if result["context"].startswith("left") else ""
    ax.set_title(f"{Path(result['run']).name} ({result['family']}{note}): {result['task']} probe\n"
                 f"{result['train']['words']:,} train / {result['dev']['words']:,} dev words "
                 f"({result['train']['sentences']:,} / {result['dev']['sentences']:,} sentences)", fontsize=10)
    return save_png(fig, path)


def print_report(result: dict, console=None) -> None:
    """What was probed, then the majority baseline and one row per layer as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    tr, dev = result["train"], result["dev"]
    console.print(f"{result['task']} probe of {result['run']} ({result['family']}): {tr['words']:,} train words "
                  f"({tr['sentences']:,} of {tr['of']:,} sentences), {dev['words']:,} dev words "
                  f"({dev['sentences']:,} of {dev['of']:,}); context: {result['context']}",
                  highlight=False, soft_wrap=True)
    t = Table("layer", "accuracy", "macro-F1")
    m = result["majority"]
    t.add_row(f"majority ({m['tag']})", f"{m['accuracy']:.4f}", f"{m['macro_f1']:.4f}", style="dim")
    for r in result["layers"]:
        name = ("0 (embeddings)" if r["layer"] == 0 else str(r["layer"])) + ("" if r["converged"] else " *")
        t.add_row(name, f"{r['accuracy']:.4f}", f"{r['macro_f1']:.4f}",
                  style="bold" if r["layer"] == result["best_layer"] else None)
    console.print(t)
    if not all(r["converged"] for r in result["layers"]):
        console.print("* L-BFGS stopped at its iteration limit before converging", highlight=False, soft_wrap=True)
    console.print(f"best layer {result['best_layer']}; wrote {', '.join(result['files'].values())}",
                  highlight=False, soft_wrap=True)
