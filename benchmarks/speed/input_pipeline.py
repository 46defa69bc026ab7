"""The input pipeline against the GPU it feeds: tokens/s of each objective's batch builder in one process, beside the
tokens/s one H100 consumes for that recipe at 45% MFU.

Training batches are built in DataLoader workers (`train.num_workers`, `auto` = up to 8 beside an accelerator),
so a GPU never waits while `stream[k]` builds micro-batch k if the workers together build faster than it trains.
Each recipe's builder is timed as it runs in a worker: `stream[k]` (or the next streamed batch) over consecutive
micro-batches of the recipe's micro batch and seq_len, after a warm-up, on real text. The GPU side is
0.45 × 989 TFLOP/s (an H100 SXM's dense bf16 peak, plmcli.train.peaks) ÷ the model's FLOPs per trained token
(`flops_per_token` of the full-size model built on the meta device, with the objective's predicted share; 6 per
weight for a family without one), in the tokens `objective.tokens_in` counts — the loop's MFU formula. The goal:
the `auto` workers of a 16-core single-GPU node build at least twice what the GPU consumes.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import common

NAME = "input-pipeline"
HELP = "tokens/s of every objective's batch builder in one process vs what one H100 consumes at 45% MFU"
DEFAULTS = {"repeats": 5, "keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults

MFU = 0.45
GOAL = 2.0  # the workers must build this many times what the GPU consumes
NODE_CORES = 16  # a single-GPU node: `auto` gives min(8, 16 // 1 - 1) = 8 workers


@dataclass
class Case:
    name: str
    recipe: str
    corpus: str
    """english | ptb | chinese | parallel: which text it reads (see `corpus`)."""
    overrides: list = field(default_factory=list)
    streaming: bool = False
    note: str = ""


# Static masking builds its instances once (make-mlm-data): one copy is enough to time the collator.
ONE_COPY = ["objective.dupe_factor=1"]
BERT_BASE_SIZE = ["model.n_layer=12", "model.n_head=12", "model.d_model=768", "model.d_ff=3072", "train.seq_len=512",
                  "train.global_batch_size=256", "train.micro_batch_size=32"]
CASES = [
    Case("bert-base", "bert-base", "english", ONE_COPY, note="static: make-mlm-data instances, NSP"),
    Case("bert-base/dynamic", "bert-base", "english", ["objective.dynamic=true", "objective.pairs=none"],
         note="dynamic token masking of 128-token windows"),
    Case("roberta-base", "roberta-base", "english", note="dynamic, FULL-SENTENCES"),
    Case("albert-base", "albert-base", "english", ONE_COPY, note="static n-gram masking, SOP"),
    Case("spanbert-base", "spanbert-base", "english", note="dynamic geometric spans of whole words"),
    Case("electra-base", "electra-base", "english", note="dynamic 85/0/15 masking + sample seeds"),
    Case("ernie-chinese-base", "ernie-chinese-base", "chinese", [*ONE_COPY, "objective.masking=knowledge",
                                                                 "objective.knowledge_units=entities"],
         note="static, entity units (its last phase)"),
    Case("ernie-chinese-base/dynamic", "ernie-chinese-base", "chinese",
         ["objective.dynamic=true", "objective.pairs=none", "objective.masking=knowledge",
          "objective.knowledge_units=entities"], note="dynamic masking of entity units"),
    Case("ernie2", "ernie2-mini", "english", [*ONE_COPY, *BERT_BASE_SIZE],
         note="ernie2-mini's tasks at ERNIE 2.0 base size (BERT-Base, 512)"),
    Case("xlnet-base", "xlnet-base", "english", note="permutations, two streams"),
    Case("txl-wt103-base", "txl-wt103-base", "english", note="TBPTT segments"),
    Case("gpt2-small", "gpt2-small", "english", note="1024-token windows"),
    Case("gpt2-small/streaming", "gpt2-small", "english", streaming=True, note="--streaming: read, encode, window"),
    Case("roberta-base/streaming", "roberta-base", "english", streaming=True, note="--streaming: FULL-SENTENCES, masked"),
    Case("transformer-base", "transformer-base", "parallel", note="translation pairs (6 N FLOPs per target token)"),
    Case("transformer-base/denoising", "transformer-base", "english", ["objective.name=denoising"],
         note="BART noising of document chunks (6 N per target token)"),
    Case("elmo", "elmo", "english", note="bidirectional LM windows"),
    Case("lstm-ptb-medium", "lstm-ptb-medium", "ptb", note="TBPTT segments"),
    Case("nnlm-ptb", "nnlm-ptb", "ptb", note="fixed windows"),
]


def add_arguments(p) -> None:
    p.add_argument("--cases", nargs="+", default=None, choices=[c.name for c in CASES], metavar="CASE",
                   help="time only these (default: all): " + ", ".join(c.name for c in CASES))
    p.add_argument("--batches", type=int, default=30, help="micro-batches timed per repeat")
    p.add_argument("--warmup", type=int, default=3, help="micro-batches built before timing")
    p.add_argument("--chinese-bytes", type=int, default=1 << 20,
                   help="ChnSentiCorp reviews read as the Chinese corpus (jieba tags them for ERNIE's units)")
    p.add_argument("--max-bytes", type=int, default=0, help="read at most this much of each text (0: all of it)")
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions of each builder")


def corpus(kind: str, root: Path, chinese_bytes: int, max_bytes: int = 0) -> tuple[Path, str]:
    """(text file, what it is) for a kind of text, at most `max_bytes` of it (whole lines; 0: all)."""
    path, what = _text(kind, root, chinese_bytes)
    if not max_bytes or path.stat().st_size <= max_bytes:
        return path, what
    cut = root / f"{kind}-{max_bytes}.txt"
    text = path.read_bytes()[:max_bytes]
    cut.write_bytes(text[: text.rfind(b"\n") + 1])
    return cut, f"{what}, its first {max_bytes >> 10} KB"


def _text(kind: str, root: Path, chinese_bytes: int) -> tuple[Path, str]:
    """(text file, what it is) for a kind of text: the shared data where present, else a shipped sample."""
    from plmcli.pipelines.common import default_corpus

    shipped = Path(default_corpus())
    if kind == "parallel":
        return Path(default_corpus("reverse-sample.txt")), "the shipped reverse-sample.txt pairs"
    if kind == "ptb":
        src = common.SHARED_DATA / "ptb" / "ptb.train.txt"
        return (src, "PTB train") if src.is_file() else (shipped, shipped.name)
    if kind == "english":
        src = common.SHARED_DATA / "wikitext-2-raw" / "wiki.valid.raw"
        return (src, "WikiText-2 raw valid") if src.is_file() else (shipped, shipped.name)
    src = common.SHARED_DATA / "chinese" / "ChnSentiCorp" / "train.tsv"
    if not src.is_file():
        return Path(default_corpus("chinese-sample.txt")), "the shipped chinese-sample.txt"
    out = root / "chnsenticorp.txt"
    if not out.is_file():  # one review a document, its sentences on lines (NSP and ERNIE's units need them)
        import re

        docs, size = [], 0
        for line in src.read_text(encoding="utf-8").splitlines()[1:]:
            text = line.split("\t", 1)[-1].strip()
            sentences = [s for s in re.split(r"(?<=[。！？!?])", text) if s.strip()]
            if sentences:
                docs.append("\n".join(sentences))
                size += len(docs[-1].encode())
            if size >= chinese_bytes:
                break
        out.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return out, f"ChnSentiCorp train reviews, first {chinese_bytes >> 10} KB"


def builder(case: Case, text: Path, cache: Path):
    """(objective, an iterator of its micro-batches, recipe) of `case` on `text`, its data prepared."""
    from plmcli.config import load_recipe
    from plmcli.data.store import load_meta
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.objectives.registry import objective_class

    r = load_recipe(case.recipe, case.overrides)
    cls = objective_class(r.objective_name)
    if case.streaming:
        from plmcli.data.streaming import StreamingObjective, prepare_stream_corpus

        corpus_dir = prepare_stream_corpus([str(text)], r.tokenizer, r.data, cls, cache_root=cache, objective_cfg=r.objective)
    else:
        corpus_dir = cls.prepare_corpus([str(text)], r.tokenizer, r.data)
    tok = load_tokenizer(corpus_dir / "tokenizer.json")
    obj = cls(r.objective, tok, load_meta(corpus_dir)["tokenizer"]["special_token_ids"], r.train.seq_len)
    obj.configure_model(copy.deepcopy(r.model), tok.get_vocab_size())
    micro = r.train.micro_batch_size or r.train.global_batch_size
    if case.streaming:
        # One reader in this process, as one worker of a run reads its own lanes.
        return obj, StreamingObjective(obj, 1).stream(corpus_dir, "train", micro, r.train.seed, 0, 1, True).loader(0), r
    data_dir = obj.prepare(corpus_dir, cache)
    stream = obj.stream(data_dir, "train", micro, r.train.seed, 0, 1, True)
    return obj, (stream[k] for k in range(1 << 62)), r


def gpu_tokens_per_s(r, obj) -> tuple[float, str]:
    """Tokens/s one H100 trains `r`'s full-size model at MFU, and how its FLOPs were counted."""
    import torch

    from plmcli.models.base import CountsFlops
    from plmcli.models.registry import build_model
    from plmcli.train.peaks import PEAKS

    cfg = copy.deepcopy(r.model)
    if not getattr(cfg, "vocab_size", 1):
        cfg.vocab_size = r.tokenizer.vocab_size  # the recipe's vocabulary, not what this corpus gave
    with torch.device("meta"):  # the full-size model's shapes, without its memory or its init
        model = build_model(r.family, cfg)
    obj.check_model(model)  # the share the MLM / permutation head predicts
    if isinstance(model, CountsFlops):
        fpt, how = model.flops_per_token(r.train.seq_len), "flops_per_token"
    else:
        fpt, how = 6 * sum(p.numel() for p in model.parameters()), "6 per weight"
    return MFU * dict(PEAKS)["H100"][0] / fpt, how


def time_builder(batches_of, obj, warmup: int, batches: int, repeats: int) -> tuple[list[float], float]:
    """(tokens/s of each timed round, tokens per micro-batch)."""
    for _ in range(warmup):
        next(batches_of)
    rates, tokens = [], []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        for _ in range(batches):
            got = obj.tokens_in(next(batches_of))
            n += got
            tokens.append(got)
        rates.append(n / (time.perf_counter() - t0))
    return rates, statistics.mean(tokens)


def profile(batches_of, batches: int) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(batches):
        next(batches_of)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def run(args) -> int:
    from plmcli.data.batching import loader_workers

    common.set_threads(args.threads)
    # As in a loader worker (batching.WorkerStart): the tokenizer encodes a streamed batch on one thread.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    info = common.machine_info()
    print(common.machine_line(info))
    auto = loader_workers("auto", accelerated=True, cores=NODE_CORES, local_processes=1)
    load = os.getloadavg()[0]
    cases = [c for c in CASES if args.cases is None or c.name in args.cases]
    rows, texts = [], {}
    with common.isolated_workdir("plm-bench-input-", keep=args.keep) as root:
        for case in cases:
            text, what = corpus(case.corpus, root, args.chinese_bytes, args.max_bytes)
            texts[case.corpus] = what
            t0 = time.perf_counter()
            obj, batches_of, r = builder(case, text, root / "cache")
            print(f"{case.name}: data ready in {time.perf_counter() - t0:.1f} s")
            rates, per_batch = time_builder(batches_of, obj, args.warmup, args.batches, args.repeats)
            rate = statistics.median(rates)
            gpu, how = gpu_tokens_per_s(r, obj)
            need = math.ceil(GOAL * gpu / rate)
            supply = auto * rate / gpu
            micro = r.train.micro_batch_size or r.train.global_batch_size
            print(f"{case.name}: {rate:,.0f} tok/s per worker (rounds {', '.join(f'{x:,.0f}' for x in rates)}), "
                  f"H100 {gpu:,.0f} tok/s ({how}); {need} workers for {GOAL:g}×; {auto} give {supply:.1f}×")
            if args.profile:
                profile(batches_of, args.batches)
            batches_of.close()
            rows.append([case.name, case.note, f"{micro} × {r.train.seq_len}", f"{per_batch:,.0f}", f"{rate:,.0f}",
                         f"{gpu:,.0f}", f"{rate / gpu:.2f}×", str(need), f"{supply:.1f}×",
                         "yes" if supply >= GOAL else "**no**"])
    table = common.markdown_table(
        ["recipe", "builder", "micro-batch", "tokens / batch", "per-worker tok/s", "H100 tok/s at 45% MFU",
         "one worker ÷ GPU", f"workers for {GOAL:g}×", f"{auto} workers (`auto`) ÷ GPU", f"≥ {GOAL:g}×"], rows)
    short = [row[0] for row in rows if row[-1] != "yes"]
    paragraphs = [
        f"Each builder timed in one process, as it runs in a DataLoader worker: `stream[k]` (or the next streamed "
        f"batch) at the recipe's micro batch and seq_len, {args.repeats} rounds of {args.batches} consecutive "
        f"micro-batches after {args.warmup} of warm-up, the median round. Tokens as the loop counts them "
        f"(`objective.tokens_in`: real tokens; target tokens for seq2seq). Text: "
        + "; ".join(f"{k}: {v}" for k, v in texts.items()) + f". Load average {load:.1f} when it started.",
        f"The GPU column is what one H100 SXM trains at {MFU:.0%} MFU of its 989 TFLOP/s dense bf16 peak: that ÷ the "
        "full-size model's FLOPs per token (`flops_per_token` at the recipe's seq_len with the share the objective "
        "predicts, the model built on the meta device; 6 per weight for a family without one). `auto` on a "
        f"{NODE_CORES}-core single-GPU node starts {auto} workers (min(8, cores // processes − 1)); its column is "
        f"{auto} × the per-worker rate ÷ the GPU's, the goal ≥ {GOAL:g}×.",
        f"Per-worker throughput was measured on this 2-core CPU; the {NODE_CORES}-core node's figure is that rate × "
        f"{auto}, an estimate to be checked on a GPU node: its cores and the handing of each batch from a worker to "
        "the training process (pickling, shared memory, pinning) decide the real one, most of all for the smallest "
        "batches. " + ("Every recipe meets the goal." if not short else "Short of the goal: " + ", ".join(short) + "."),
        "Where the slowest builders spend their time (`--profile`): streamed text in the tokenizer's encode_batch on "
        "one thread (about two thirds of a streamed RoBERTa batch), then packing lines into rows; BART's noising in "
        "its per-chunk span infilling; translation batches of the sample's short pairs in the Arrow gather of their "
        "rows.",
    ]
    text = "\n\n".join(textwrap.fill(p, 118) for p in paragraphs)
    common.publish(NAME, common.section_body("Input pipeline: batch builders vs one H100", args, text, table, info), args)
    return 0
