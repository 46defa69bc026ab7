"""SST-2 finetuning steps at the sentences' real lengths: how much padding each batching costs.

Four ways to feed the same bert-mini classifier (or transformers' BertForSequenceClassification) the same
SST-2 sentences, 32 to a batch, timed over whole training steps (batch building, forward, loss, backward,
clip, AdamW, zero_grad):

- plm on plain shuffled batches (dynamic right padding to the batch's longest row; no attention mask
  when a batch has no padding, see plmcli.models.layers.padding_mask);
- the same batches padded to a fixed 128 (what a `padding="max_length"` pipeline feeds the model);
- transformers: BertForSequenceClassification fed by DataCollatorWithPadding (dynamic padding);
- plm with length-grouped batches, what `plm finetune` does by default: the same sentences sorted by
  length within a window of batches (as HF's `group_by_length` megabatches), batch order then shuffled.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchmarks import common

NAME = "varlen-sst2"
HELP = "SST-2 training steps at real lengths: plm's dynamic batches vs fixed 128 vs transformers (+ length grouping)"
DEFAULTS = {"repeats": 3}  # the shared options it takes (benchmarks/__main__.py), its defaults
FIXED = 128


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="bert-mini", help="recipe whose model and tokenizer sections are used")
    p.add_argument("--batch", type=int, default=32, help="sentences per step")
    p.add_argument("--batches", type=int, default=50, help="steps timed per repeat (the same sentences on every side)")
    p.add_argument("--window", type=int, default=50, help="length grouping sorts within windows of this many batches")
    p.add_argument("--lr", type=float, default=2e-5, help="AdamW lr (finetune's default)")
    p.add_argument("--seed", type=int, default=0, help="seeds the sentence order and the inits")
    common.add_limit_arguments(p)


def length_grouped(indices, lengths, batch_size: int, window: int, seed: int = 0) -> list:
    """`indices` cut into batches of sentences of similar length: each window of window·batch_size
    indices sorted by length (longest first), cut into batches, then the batch order shuffled (seeded),
    so a model does not see all short batches first. Every index lands in exactly one batch."""
    import numpy as np

    idx = np.asarray(indices)
    span = window * batch_size
    batches = []
    for lo in range(0, len(idx), span):
        w = idx[lo : lo + span]
        w = w[np.argsort(-np.asarray(lengths)[w], kind="stable")]
        batches += [w[i : i + batch_size] for i in range(0, len(w), batch_size)]
    order = np.random.default_rng(seed).permutation(len(batches))
    return [batches[i] for i in order]


def padding_share(batch_lengths: list) -> tuple[int, int, int]:
    """(real tokens, padded positions, batches without padding) of batches given as arrays of row lengths
    padded to their longest row."""
    real = sum(int(b.sum()) for b in batch_lengths)
    total = sum(len(b) * int(b.max()) for b in batch_lengths)
    return real, total, sum(int(b.min() == b.max()) for b in batch_lengths)


def _data(args, root: Path):
    """(tokenizer, special ids, objective, encoded data dir, data description): SST-2 encoded the way
    `plm finetune` encodes it, with the recipe's tokenizer trained on the training sentences."""
    from plmcli.config import load_recipe
    from plmcli.data.tasks.registry import get_task
    from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
    from plmcli.runs import task_objective
    from plmcli.models.registry import model_class

    glue = common.shared_or_sample("glue/SST-2", common.REPO_ROOT / "data" / "glue-sample" / "SST-2")
    task = get_task("sst2")
    splits = task.load(str(glue))
    recipe = load_recipe(args.recipe)
    tok = train_tokenizer((e.text_a for e in splits["train"]), recipe.tokenizer)  # not timed
    specials = resolve_special_tokens(recipe.tokenizer)
    ids = special_token_ids(tok, specials)
    obj = task_objective(task, tok, ids, FIXED, model_class(recipe.family))
    obj.encode_splits(splits, root / "data")
    tok.save(str(root / "tokenizer.json"))
    return recipe, tok, specials, ids, obj, f"`{common.shown(glue)}` ({len(splits['train']):,} training sentences)"


def run(args) -> int:
    from dataclasses import replace

    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding

    from benchmarks.speed.gpt_train_step import train_step
    from plmcli.data.batching import EpochOrder
    from plmcli.data.tasks import load_split
    from plmcli.models.registry import build_model
    from plmcli.train.optim import build_optimizer

    common.set_threads(args.threads)
    info = common.machine_info()
    root = Path(tempfile.mkdtemp(prefix="plm-bench-varlen-"))
    try:
        recipe, tok, specials, ids, obj, source = _data(args, root)
        stream = obj.stream(root / "data", "train", args.batch, args.seed, 0, 1, True)
        d = load_split(root / "data" / "train.npz")
        collator = DataCollatorWithPadding(common.hf_fast_tokenizer(root / "tokenizer.json", specials),
                                           return_tensors="pt")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    B = args.batch
    off = d["offsets"]
    lengths = np.diff(off)
    n_batches = min(args.batches, len(lengths) // B)
    if n_batches < 1:
        raise SystemExit(f"varlen-sst2: {len(lengths)} sentences make no batch of {B}")
    # The sentences every side trains on: the first n_batches batches of the objective's epoch-0 order.
    # plm_idx: plain shuffled batches (epoch 0 of EpochOrder), what the peers and the padded row read;
    # grouped_idx: the same sentences grouped by length, as `plm finetune` batches them by default
    # (plmcli.data.batching.LengthGroupedOrder: windows of GROUP_WINDOW batches sorted, then shuffled).
    order = EpochOrder(len(lengths), args.seed)
    plm_idx = [np.array([order(p)[1] for p in range(k * B, (k + 1) * B)]) for k in range(n_batches)]
    grouped_idx = length_grouped(np.concatenate(plm_idx), lengths, B, args.window, args.seed)

    cfg = replace(recipe.model, vocab_size=tok.get_vocab_size())
    torch.manual_seed(args.seed)
    backbone = build_model(recipe.family, cfg)
    plm = obj.build_model(backbone).train()
    hf_cfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
                        num_attention_heads=cfg.n_head, intermediate_size=cfg.d_ff or 4 * cfg.d_model,
                        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attn_dropout,
                        max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.type_vocab_size,
                        layer_norm_eps=cfg.layer_norm_eps, num_labels=2, attn_implementation="sdpa",
                        pad_token_id=ids["pad"])
    torch.manual_seed(args.seed)
    hf = BertForSequenceClassification(hf_cfg).train()
    opt = {m: build_optimizer(m, "adamw", args.lr, 0.01) for m in (plm, hf)}

    def fetch(indices):
        return stream.fetch([0] * len(indices), list(indices))

    def padded(batch, T=FIXED):  # what padding="max_length" hands the model: every row T long
        extra = T - batch["input_ids"].shape[1]
        out = dict(batch)
        for key, value in (("input_ids", ids["pad"]), ("token_type_ids", 0), ("attention_mask", 0)):
            out[key] = F.pad(batch[key], (0, extra), value=value)
        return out

    # What a tokenizer(..., truncation=True) map leaves for the collator: the same ids as plm's rows.
    features = {int(i): {"input_ids": d["ids"][off[i] : off[i + 1]].tolist(), "token_type_ids": [0] * int(lengths[i]),
                         "attention_mask": [1] * int(lengths[i]), "labels": int(d["labels"][i])}
                for i in np.concatenate(plm_idx)}

    def plm_side(make_batches):
        def steps():
            for batch in make_batches():
                train_step(plm, lambda b=batch: obj.step(plm, b).loss, opt[plm])

        def once() -> float:
            return real_tokens / common.timed(steps, 1)
        return once

    def hf_step(batch):
        return hf(**batch).loss

    def hf_once() -> float:
        def steps():
            for idx in plm_idx:
                batch = collator([features[i] for i in idx])
                train_step(hf, lambda b=batch: hf_step(b), opt[hf])
        return real_tokens / common.timed(steps, 1)

    real_tokens = int(lengths[np.concatenate(plm_idx)].sum())
    sides = {
        "plm, shuffled batches (dynamic padding)": plm_side(lambda: (fetch(i) for i in plm_idx)),
        f"plm, padded to {FIXED}": plm_side(lambda: (padded(fetch(i)) for i in plm_idx)),
        "transformers + DataCollatorWithPadding": hf_once,
        f"plm finetune: length-grouped (window {args.window})": plm_side(lambda: (fetch(i) for i in grouped_idx)),
    }
    shapes = {name: [lengths[i] for i in group] for name, group in
              (("plm, shuffled batches (dynamic padding)", plm_idx), (f"plm finetune: length-grouped (window {args.window})", grouped_idx))}
    check = collator([features[i] for i in plm_idx[0]])["input_ids"].shape[1]
    if check != lengths[plm_idx[0]].max():
        raise SystemExit(f"varlen-sst2: the collator padded to {check}, not the batch's longest row")
    shapes["transformers + DataCollatorWithPadding"] = shapes["plm, shuffled batches (dynamic padding)"]
    print(f"{common.machine_line(info)}\n{source}: {n_batches} batches of {B}, {real_tokens:,} real tokens")

    samples = common.interleave(sides | common.probe_runners(args, info["flags"]), args.repeats, 1)
    probe_stats = {k: common.summary(v) for k, v in samples.items()}  # the probes' too: probe_line reads them
    stats, peaks = common.split_probes(probe_stats)
    peaks = common.fp32_peaks(peaks)  # fp32 steps
    # Useful work per real token: the encoder blocks' matmuls (6 per weight) and attention over the
    # sentence's own tokens; padding, the pooler and the 2-way head are not counted.
    m = recipe.model
    body = sum(p.numel() for p in backbone.blocks.parameters())
    timed_len = float(lengths[np.concatenate(plm_idx)].mean())
    fpt = 6 * body + 12 * m.n_layer * timed_len * m.d_model
    extra = {}
    for name in sides:
        if name in shapes:
            real, total, unpadded = padding_share(shapes[name])
        else:
            real, total, unpadded = real_tokens, n_batches * B * FIXED, 0
        n = len(shapes.get(name, plm_idx))
        extra[name] = [f"{1 - real / total:.0%}", f"{total / n / B:.1f}", f"{unpadded}/{n}",
                       *common.limit_columns(stats[name]["median"], fpt, peaks)]
    rows = common.rate_rows(stats, "plm, shuffled batches (dynamic padding)", extra=extra)
    table = common.markdown_table(["batches", "real tokens/s (median)", "min–max", "vs plm dynamic", "padding share",
                                   "mean padded length", "batches with no padding", *common.limit_headers(peaks)], rows)
    mean_len = lengths.mean()
    text = f"""
SST-2 training sentences from {source}, encoded as `plm finetune` encodes them (`[CLS] sentence [SEP]`,
truncated to {FIXED}; mean length {mean_len:.1f} tokens, longest {lengths.max()}), with `{recipe.name}`'s
{recipe.tokenizer.kind} tokenizer trained on those sentences (not timed). Model: `{recipe.name}` ({m.n_layer} layers,
d_model {m.d_model}, {m.n_head} heads, dropout {m.dropout}) + a 2-way head on the pooled [CLS], in train mode; AdamW lr
{args.lr:g}, weight decay 0.01, clipping 1.0. Every side trains on the same {n_batches} × {B} sentences (the first
{n_batches} batches of a shuffled epoch) per repeat; a step includes building its batch (plm: the
objective's `fetch`; transformers: `DataCollatorWithPadding` over the tokenized rows; padded to {FIXED}: the objective's
batch right-padded with [PAD] and attention mask 0). transformers gets `BertForSequenceClassification` at the
same size (`attn_implementation="sdpa"`). Length-grouped: the same sentences sorted by length within windows of
{args.window} batches (HF `group_by_length`'s megabatch), cut into batches, batch order shuffled.

Real tokens/s counts non-padding tokens only, so every row divides the same work by its time.
Padding share = padded positions that hold [PAD]. {args.repeats} interleaved repeats after one warm-up each.

{common.probe_line(probe_stats, info["flags"], args.gemm_size)} Useful FLOPs per real token: 6 × {body:,} encoder-block
weights + 12·L·T·C attention at the timed sentences' mean length T = {timed_len:.1f} = {fpt / 1e6:.1f} MFLOP, the same
for every row (padding, the pooler and the 2-way head not counted), so the share of the fp32 probe says how much
of the machine each way of batching turns into real work. At a dozen tokens a sentence a batch of {B} is a few
hundred rows, and every matmul {m.d_model} to {(m.d_ff or 4 * m.d_model):,} columns wide: far from a large GEMM's rate even with no
padding at all.
"""
    common.publish(NAME, common.section_body("SST-2 at real lengths: dynamic vs fixed padding vs transformers",
                                             args, text, table, info), args)
    return 0
