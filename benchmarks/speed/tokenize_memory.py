"""`plm tokenize` on generated corpora of growing size: peak resident memory and throughput.

The corpus is synthetic but tokenizes like text: words drawn with their PTB (or shipped sample)
frequencies, 12-25 words a line, 3-6 lines a document, blank lines between documents, split over
several files. `plm tokenize` runs as a subprocess and the whole process tree (workers included) is
polled for its resident memory: the claim under test is that peak memory does not grow with the corpus.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import common

NAME = "tokenize-memory"
HELP = "plm tokenize on 100 MB ... 1 GB of generated text: peak RSS of the process tree and MB/s"


def add_arguments(p) -> None:
    p.add_argument("--sizes", nargs="+", default=["100M", "1G"], help="corpus sizes (K, M, G suffixes)")
    p.add_argument("--files", type=int, default=16, help="files per corpus")
    p.add_argument("--num-proc", type=int, default=2, help="plm tokenize --num-proc")
    p.add_argument("--format", choices=["txt", "jsonl"], default="txt",
                   help="txt: documents separated by blank lines; jsonl: one {\"text\": document} row each, read through datasets")
    p.add_argument("--tokenizer", default="bytelevel-bpe", help="plm tokenize --tokenizer")
    p.add_argument("--vocab-size", type=int, default=8192, help="plm tokenize --vocab-size")
    p.add_argument("--workdir", type=Path, default=None, help="where corpora and outputs go (default: a temp dir, removed)")
    p.add_argument("--plm-path", default=None,
                   help="the directory holding the plmcli under test (default: this checkout), e.g. an older one "
                        "unpacked with `git archive REV plmcli | tar -x -C DIR`, to compare")


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)B?", text.upper())
    if not m:
        raise SystemExit(f"--sizes: '{text}' is not a size like 100M or 1G")
    return int(float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)])


def word_table():
    """(words, probabilities) from PTB train if present, else from the sample corpus shipped with plm."""
    import numpy as np

    src = common.SHARED_DATA / "ptb" / "ptb.train.txt"
    if not src.is_file():
        from plmcli.api import default_corpus

        src = Path(default_corpus())
    counts = Counter(src.read_text(encoding="utf-8").split())
    words = np.array(list(counts), dtype=object)
    p = np.array(list(counts.values()), dtype=float)
    return words, p / p.sum(), src.name


def generate(out: Path, total: int, n_files: int, seed: int = 0, fmt: str = "txt") -> int:
    """Write about `total` bytes of documents into n_files files (text, or JSON Lines rows); returns the bytes written."""
    import numpy as np

    words, p, _ = word_table()
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for i in range(n_files):
        target = total * (i + 1) // n_files - written
        with open(out / f"part-{i:04d}.{fmt}", "w", encoding="utf-8") as f:
            done = 0
            while done < target:
                w = words[rng.choice(len(words), 100_000, p=p)]
                cuts = np.cumsum(rng.integers(12, 26, len(w) // 12))
                lines = [" ".join(w[a:b]) for a, b in zip(cuts[:-1], cuts[1:]) if b <= len(w)]
                docs, j = [], 0
                while j < len(lines):
                    k = int(rng.integers(3, 7))
                    docs.append("\n".join(lines[j : j + k]))
                    j += k
                chunk = ("".join(json.dumps({"text": d}) + "\n" for d in docs) if fmt == "jsonl"
                         else "\n\n".join(docs) + "\n\n")
                f.write(chunk)
                done += len(chunk)
        written += done
    return written


def _anon_bytes(pid: int) -> int:
    """RssAnon: resident memory not backed by a file (what the kernel cannot drop under pressure)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_polled(cmd: list[str], env: dict, cwd: Path, interval: float = 0.1) -> dict:
    """Run `cmd`, polling its process tree: peak Σ RSS, peak Σ RssAnon, peak single-process RSS, wall time."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak = {"tree_rss": 0, "tree_anon": 0, "one_rss": 0, "procs": 1}
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        rss = anon = 0
        for p in tree:
            try:
                r = p.memory_info().rss
            except psutil.Error:
                continue
            rss += r
            anon += _anon_bytes(p.pid)
            peak["one_rss"] = max(peak["one_rss"], r)
        peak["tree_rss"] = max(peak["tree_rss"], rss)
        peak["tree_anon"] = max(peak["tree_anon"], anon)
        peak["procs"] = max(peak["procs"], len(tree))
        time.sleep(interval)
    output = proc.communicate()[0]
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    return {**peak, "wall_s": time.perf_counter() - t0}


def run(args) -> int:
    info = common.machine_info()
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="plm-bench-tokmem-"))
    # The plm under test comes first on the path, and the command runs outside any checkout (`python -m`
    # would otherwise import the plmcli of its working directory).
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "PLM_CACHE": str(root / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [args.plm_path or str(common.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    rows, results = [], []
    source = word_table()[2]
    try:
        for size_arg in args.sizes:
            size = parse_size(size_arg)
            corpus, out = root / f"text-{size_arg}", root / f"tok-{size_arg}"
            t0 = time.perf_counter()
            n_bytes = generate(corpus, size, args.files, fmt=args.format)
            print(f"{size_arg}: generated {n_bytes / 1e6:,.0f} MB in {args.files} files ({time.perf_counter() - t0:.0f} s)")
            cmd = [sys.executable, "-m", "plmcli", "tokenize", str(corpus), "--out", str(out), "--tokenizer", args.tokenizer,
                   "--vocab-size", str(args.vocab_size), "--num-proc", str(args.num_proc), "--force"]
            r = run_polled(cmd, env, root)
            meta = json.loads((out / "meta.json").read_text())
            tokens = sum(c["tokens"] for c in meta["counts"].values())
            docs = sum(c["documents"] for c in meta["counts"].values())
            mb = n_bytes / 1e6
            results.append((mb, r))
            print(f"{size_arg}: {r['wall_s']:.0f} s, {mb / r['wall_s']:.2f} MB/s, peak tree RSS {r['tree_rss'] / 2**20:,.0f} MiB "
                  f"(anon {r['tree_anon'] / 2**20:,.0f} MiB)")
            rows.append([f"{mb:,.0f} MB", f"{docs:,}", f"{tokens:,}", f"{r['wall_s']:.0f} s", f"{mb / r['wall_s']:.2f}",
                         f"**{r['tree_rss'] / 2**20:,.0f}**", f"{r['tree_anon'] / 2**20:,.0f}", f"{r['one_rss'] / 2**20:,.0f}",
                         r["procs"]])
            shutil.rmtree(corpus, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    if len(results) > 1:
        (mb0, r0), (mb1, r1) = results[0], results[-1]
        growth = (r1["tree_rss"] - r0["tree_rss"]) / 2**20
        verdict = (f"From {mb0:,.0f} MB to {mb1:,.0f} MB of text ({mb1 / mb0:.1f}× the corpus) peak RSS changed by "
                   f"{growth:+,.0f} MiB ({r1['tree_rss'] / r0['tree_rss']:.2f}×).")
    else:
        verdict = ""
    table = common.markdown_table(["corpus", "documents", "tokens", "wall", "MB/s", "peak RSS, tree (MiB)",
                                   "peak RssAnon, tree (MiB)", "peak RSS, one process (MiB)", "processes"], rows)
    text = f"""
`plm tokenize DIR --out OUT --tokenizer {args.tokenizer} --vocab-size {args.vocab_size} --num-proc {args.num_proc}` on
generated text: words drawn with their frequencies in `{source}`, 12-25 words a line, 3-6 lines a document,
blank lines between documents, {args.files} files per corpus. The whole run is measured: training the
tokenizer on all of the text, encoding it in {args.num_proc} worker processes, and filing the Arrow
shards as the dataset. The process tree (the command and its workers) is polled every 0.1 s; **peak RSS,
tree** is the largest sum of their resident set sizes (shared pages counted in every process),
**RssAnon** the part not backed by a file. MB/s = text bytes / wall time. Goal: peak memory flat in
corpus size. {verdict}
"""
    if args.format != "txt":
        text = text.replace("generated text:", f"generated {args.format} files (one document a row, read through `datasets`):")
    # one section per input format, each titled with it (BENCHMARKS.md keeps both side by side)
    title = f"plm tokenize: peak memory vs corpus size, {'plain text' if args.format == 'txt' else 'JSON Lines'}"
    common.publish(NAME if args.format == "txt" else f"{NAME}-{args.format}", common.section_body(title, args, text, table, info), args)
    return 0
