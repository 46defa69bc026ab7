"""Masked-LM data: plm's make-mlm-data (and its masking kernel) vs transformers' MLM collators, same tokens.

transformers' users mask with `DataCollatorForLanguageModeling` (in transformers 5 whole-word masking is its
`whole_word_mask=True`; `DataCollatorForWholeWordMask` is gone) batch by batch; plm's `make-mlm-data` builds whole static datasets (instances,
80/10/10 masking, Arrow on disk).
Both are measured in tokens/s over the same WordPiece-encoded corpus.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "mlm-data"
HELP = "make-mlm-data and plm's masking vs transformers' DataCollatorForLanguageModeling (token and whole-word)"
DEFAULTS = {"repeats": 3}  # the shared options it takes (benchmarks/__main__.py), its defaults


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, default=32, help="sequences per collator batch")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--batches", type=int, default=40, help="collator batches timed per repeat")
    p.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="make-mlm-data process counts to time")


def _corpus(tmp: Path) -> Path:
    from plmcli.config import load_recipe
    from plmcli.data.corpus import tokenize_corpus

    src = common.SHARED_DATA / "ptb" / "ptb.train.txt"
    if not src.is_file():
        from plmcli.api import default_corpus

        src = Path(default_corpus())
    lines = [x.strip() for x in src.read_text(encoding="utf-8").splitlines() if x.strip()]
    text = tmp / "corpus.txt"  # PTB has no document breaks: 8 consecutive sentences make one (NSP needs several)
    text.write_text("\n\n".join("\n".join(lines[i : i + 8]) for i in range(0, len(lines), 8)) + "\n", encoding="utf-8")
    tok = load_recipe("bert-mini").tokenizer
    tokenize_corpus([str(text)], tmp / "tok", tok, doc_per_line=False, val_fraction=0.0)
    return tmp / "tok"


def run(args) -> int:
    import json

    import numpy as np
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    from plmcli.data.corpus import token_stream
    from plmcli.data.masking import mask_batch
    from plmcli.data.mlm_data import make_mlm_data
    from plmcli.objectives.mlm_units import word_start_stream

    common.set_threads(args.threads)
    info = common.machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="plm-bench-mlm-"))
    corpus = _corpus(tmp)
    meta = json.loads((corpus / "meta.json").read_text())
    ids_of = meta["tokenizer"]["special_token_ids"]
    B, T = args.batch, args.seq_len
    stream = np.asarray(token_stream(corpus, "train", None), dtype=np.int64)
    words = np.asarray(word_start_stream(corpus, "train", ids_of["sep"]), dtype=bool)[: len(stream)]
    n_seq = min(len(stream) // (T - 2), args.batches * B)
    body = stream[: n_seq * (T - 2)].reshape(n_seq, T - 2)
    seqs = np.concatenate([np.full((n_seq, 1), ids_of["cls"]), body, np.full((n_seq, 1), ids_of["sep"])], 1)
    ws = np.concatenate([np.ones((n_seq, 1), bool), words[: n_seq * (T - 2)].reshape(n_seq, T - 2),
                         np.ones((n_seq, 1), bool)], 1)
    special = np.zeros_like(seqs, dtype=bool)
    special[:, [0, -1]] = True
    batches = [slice(i, i + B) for i in range(0, n_seq - B + 1, B)]
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(corpus / "tokenizer.json"), unk_token="[UNK]", pad_token="[PAD]",
                                     cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    lists = [[{"input_ids": row.tolist()} for row in seqs[s]] for s in batches]
    # transformers 5 finds words through character offsets: adjacent offsets = one word. Offsets that
    # encode exactly our corpus' word boundaries make both sides mask the same words.
    starts = np.cumsum(1 + ws, axis=1) - 1
    offsets = np.stack([starts, starts + 1], -1)
    wwm_lists = [[{"input_ids": row.tolist(), "offset_mapping": off.tolist()} for row, off in zip(seqs[s], offsets[s])]
                 for s in batches]
    # return_tensors="pt" is the collators' default and what run_mlm.py and the Trainer use; "np" skips
    # the torch conversion and is transformers' fastest path. Both are measured; the goal is read against both.
    hf = {(kind, rt): DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, whole_word_mask=kind == "wwm",
                                                      return_tensors=rt)
          for kind in ("token", "wwm") for rt in ("pt", "np")}
    rng = np.random.default_rng(0)
    V = meta["tokenizer"]["vocab_size"]
    n_tok = len(batches) * B * T

    def timed(fn):
        def once():
            t0 = time.perf_counter()
            for i, s in enumerate(batches):
                fn(i, s)
            return n_tok / (time.perf_counter() - t0)
        return once

    def hf_runner(kind, rt):
        data = wwm_lists if kind == "wwm" else lists
        return timed(lambda i, s: hf[kind, rt](data[i]))

    def plm_runner(kind):
        return timed(lambda i, s: mask_batch(seqs[s], special[s], ws[s] if kind == "wwm" else None, rng, mask_prob=0.15,
                                             max_predictions=20, strategy=kind, mask_id=ids_of["mask"], vocab_size=V))

    label = {"token": "DataCollatorForLanguageModeling", "wwm": "DataCollatorForLanguageModeling(whole_word_mask=True)"}
    runners = {}
    for kind in ("token", "wwm"):
        for rt in ("pt", "np"):
            runners[f"transformers {label[kind]}, return_tensors={rt}"] = hf_runner(kind, rt)
        runners[f"plm mask_batch {kind}"] = plm_runner(kind)
    for fn in runners.values():  # the first torch conversion pays one-off start-up costs
        fn()
    samples = common.interleave(runners, args.repeats, 1)
    stats = {k: common.summary(v) for k, v in samples.items()}
    base = {(kind, rt): stats[f"transformers {label[kind]}, return_tensors={rt}"]["median"]
            for kind in ("token", "wwm") for rt in ("pt", "np")}

    def versus(rate, kind):
        return f"**{rate / base[kind, 'pt']:.1f}×** / {rate / base[kind, 'np']:.1f}×"

    rows = []
    for k, s in stats.items():
        kind = "wwm" if "wwm" in k or "whole_word" in k else "token"
        rows.append([k, f"{s['median']:,.0f}", f"{s['min']:,.0f}–{s['max']:,.0f}",
                     versus(s["median"], kind) if k.startswith("plm") else ""])
    for masking in ("token", "wwm"):
        for procs in args.num_proc:
            best = None
            for _ in range(args.repeats):  # defaults of the command: dupe factor 5, NSP pairs
                t0 = time.perf_counter()
                m = make_mlm_data(corpus, tmp / f"mlm-{masking}", max_seq_len=T, masking=masking, pairs="nsp",
                                  num_proc=procs, force=True)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            tokens = m["counts"]["train"]["tokens"]
            rate = tokens / best
            rows.append([f"plm make-mlm-data --masking {masking} --num-proc {procs} (whole pipeline, {tokens:,} tokens out)",
                         f"{rate:,.0f}", f"{best:.2f} s (best of {args.repeats})", versus(rate, masking)])
    table = common.markdown_table(["what", "tokens/s (median)", "range / time", "vs transformers: pt / np"], rows)
    text = f"""
Corpus: PTB train (or the shipped sample) encoded with `bert-mini`'s WordPiece ({V:,} tokens). The collators
get {len(batches)} batches of {B} × {T} token ids as lists (how a Trainer feeds them) and mask 15%, once with
`return_tensors="pt"` (their default, what `run_mlm.py` and the Trainer use) and once with `"np"` (no torch
conversion, their fastest); whole-word masking gets the corpus' word boundaries as offsets.
plm's `mask_batch` gets the same ids as arrays (BERT semantics: max 20 predictions, [CLS]/[SEP] never
masked; wwm with the same word boundaries). `make-mlm-data` runs the whole BERT `create_pretraining_data`
pipeline at its defaults (dupe factor 5, NSP pairs, short_seq_prob 0.1, truncation, masking, Arrow on disk)
over the corpus; its rate counts output tokens. The last column divides by the pt and the np collator.
Goal: make-mlm-data ≥ 10× the collators' tokens/s.
"""
    common.publish(NAME, common.section_body("MLM data: plm vs transformers' collators", args, text, table, info), args)
    return 0
