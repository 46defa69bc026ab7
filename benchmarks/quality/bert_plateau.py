"""Does a small masked LM learn to use context in a CPU budget? plm's bert-mini, transformers' BertForMaskedLM
started from the same weights, and plm's nezha-mini, trained on the same batches with the same optimizer.

The question behind it: `bert-sst2` finds bert-mini's pretraining stuck on the MLM plateau (loss at the unigram
level, attention uniform). If transformers' BERT under identical training left the plateau where plm's does not,
plm would have a training bug; if both stay and only the relative-position model leaves, the plateau belongs to
BERT's learned absolute positions at this budget.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks import common

NAME = "bert-plateau"
HELP = ("MLM loss per step of plm's bert-mini, transformers' BertForMaskedLM (same init, batches, optimizer) and "
        "nezha-mini, and how much each attends to its neighbours")
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
MODELS = ("plm-bert", "hf-bert", "plm-nezha")


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps per model")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence, [CLS] and [SEP] included")
    p.add_argument("--lr", type=float, default=7e-4, help="peak learning rate (linear warmup, linear decay)")
    p.add_argument("--warmup", type=int, default=200, help="warmup steps")
    p.add_argument("--every", type=int, default=250, help="report the mean train loss over each this many steps")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16", help="bf16: torch.autocast on the CPU")
    p.add_argument("--corpus", default="sst2,wikitext2", help="parts of the bert-sst2 corpus (ptb, wikitext2, sst2)")
    p.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)} to train")
    p.add_argument("--seed", type=int, default=0, help="seeds the init, the windows and the masks")


def windows(split, seq_len: int, cls: int, sep: int):
    """Every document's ids in one stream, cut into [CLS] + (seq_len - 2) tokens + [SEP] rows (B, seq_len)."""
    import numpy as np

    ids = np.concatenate([np.asarray(x, np.int64) for x in split["input_ids"]])
    n = seq_len - 2
    body = ids[: len(ids) // n * n].reshape(-1, n)
    rows = np.empty((len(body), seq_len), np.int64)
    rows[:, 0], rows[:, 1:-1], rows[:, -1] = cls, body, sep
    return rows


def masked(rows, rng, vocab: int, mask_id: int):
    """BERT's 15% (80/10/10, at most 20 a row) on `rows` -> (input ids, flat target positions, labels)."""
    import numpy as np
    import torch

    from plmcli.data.masking import mask_batch

    special = np.zeros(rows.shape, bool)
    special[:, [0, -1]] = True
    x, target = mask_batch(rows, special, None, rng, mask_prob=0.15, max_predictions=20, strategy="token",
                           mask_id=mask_id, vocab_size=vocab)
    pos = np.flatnonzero(target)
    return torch.from_numpy(x), torch.from_numpy(pos), torch.from_numpy(rows.reshape(-1)[pos])


def build_models(names, vocab: int, special_ids: dict, seed: int):
    """name -> (model, logits(x, pos) -> (N, V), attention(x) -> list of (B, H, T, T))."""
    from dataclasses import replace

    import torch
    from transformers import BertConfig as HFConfig
    from transformers import BertForMaskedLM

    from plmcli.config import load_recipe
    from plmcli.models.layers import record_attention
    from plmcli.models.registry import build_model

    def plm(recipe):
        r = load_recipe(recipe)
        torch.manual_seed(seed)
        return build_model(r.family, replace(r.model, vocab_size=vocab, nsp_head=False))

    def plm_logits(m):
        return lambda x, pos: m(x, mlm_positions=pos).mlm_logits

    def plm_attention(m):
        def attention(x):
            with record_attention() as maps:
                m.encode(x)
            return maps
        return attention

    out = {}
    bert = plm("bert-mini")
    if "plm-bert" in names:
        out["plm-bert"] = (bert, plm_logits(bert), plm_attention(bert))
    if "hf-bert" in names:
        hf_cfg, state = bert.to_hf({"tokenizer": {"special_token_ids": special_ids}})
        hf = BertForMaskedLM(HFConfig(**{k: v for k, v in hf_cfg.items() if k != "architectures"},
                                      attn_implementation="sdpa"))
        missing, unexpected = hf.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "decoder" not in k]:  # the decoder is tied to the embeddings
            raise SystemExit(f"bert-plateau: weights did not map onto BertForMaskedLM: {missing} {unexpected}")
        hf.tie_weights()

        def hf_logits(x, pos):
            return hf(input_ids=x).logits.flatten(0, 1).index_select(0, pos)

        def hf_attention(x):
            hf.set_attn_implementation("eager")
            try:
                return list(hf(input_ids=x, output_attentions=True).attentions)
            finally:
                hf.set_attn_implementation("sdpa")

        out["hf-bert"] = (hf, hf_logits, hf_attention)
    if "plm-nezha" in names:
        nezha = plm("nezha-mini")
        out["plm-nezha"] = (nezha, plm_logits(nezha), plm_attention(nezha))
    return out


def neighbour_mass(maps) -> float:
    """Mean attention probability on the previous and the next token, over layers, heads and positions."""
    import torch

    total = []
    for p in maps:
        p = p.float()
        total += [torch.diagonal(p, 1, -2, -1).mean(), torch.diagonal(p, -1, -2, -1).mean()]
    return float(torch.stack(total).mean())


def evaluate(logits, attention, val, shuffled, rows) -> tuple[float, float, float]:
    """(masked-token loss with context, with each row's other tokens shuffled, neighbour attention)."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        x, pos, y = val
        loss = float(F.cross_entropy(logits(x, pos).float(), y))
        xs, _, _ = shuffled
        loss_shuffled = float(F.cross_entropy(logits(xs, pos).float(), y))
        mass = neighbour_mass(attention(x[:rows]))
    return loss, loss_shuffled, mass


def shuffle_context(val, rng):
    """The validation batch with every row's unmasked, non-special tokens permuted among themselves."""
    import torch

    x, pos, y = val
    xs = x.clone()
    T = x.shape[1]
    hidden = torch.zeros(x.numel(), dtype=torch.bool)
    hidden[pos] = True
    hidden = hidden.view_as(x)
    for r in range(len(x)):
        free = [t for t in range(1, T - 1) if not hidden[r, t]]
        xs[r, free] = x[r, [free[i] for i in rng.permutation(len(free))]]
    return xs, pos, y


def train(name, model, logits, batches, args, log) -> list[float]:
    import torch
    import torch.nn.functional as F

    from plmcli.train.optim import build_optimizer

    opt = build_optimizer(model, "adamw", args.lr, 0.01, (0.9, 0.999), 1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / args.warmup, max(0.0, (args.steps - s) / max(1, args.steps - args.warmup))))
    model.train()
    means, window = [], []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, pos, y = batches(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(logits(x, pos).float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        window.append(loss.item())
        if len(window) == args.every:
            means.append(sum(window) / len(window))
            window = []
            log(f"{name}: step {step + 1}: mean loss {means[-1]:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    return means


def run(args) -> int:
    if not (common.SHARED_DATA / "glue" / "SST-2").is_dir():
        print(f"bert-plateau: skipped — {common.SHARED_DATA} has no GLUE SST-2")
        return 0
    import numpy as np
    from datasets import load_from_disk

    from benchmarks.quality.bert_sst2 import NAMES, build_corpus
    from plmcli import api

    common.set_threads(args.threads)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if set(names) - set(MODELS):
        raise SystemExit(f"bert-plateau: unknown --models {sorted(set(names) - set(MODELS))}; choose from {MODELS}")
    root = args.keep or Path(tempfile.mkdtemp(prefix="plm-bert-plateau-"))
    root.mkdir(parents=True, exist_ok=True)
    parts = tuple(x.strip() for x in args.corpus.split(",") if x.strip())
    corpus = build_corpus(root / "corpus.txt", parts)
    meta = api.tokenize([str(corpus)], str(root / "tok"), recipe="bert-mini", force=True)
    ids = meta["tokenizer"]["special_token_ids"]
    vocab = meta["tokenizer"]["vocab_size"]
    data = load_from_disk(str(root / "tok" / "dataset"))
    train_rows = windows(data["train"], args.seq_len, ids["cls"], ids["sep"])
    val_rows = windows(data["validation"], args.seq_len, ids["cls"], ids["sep"])[:64]

    def batches(step):
        rng = np.random.default_rng([args.seed, 0, step])
        return masked(train_rows[rng.integers(0, len(train_rows), args.batch)], rng, vocab, ids["mask"])

    val = masked(val_rows, np.random.default_rng([args.seed, 1, 0]), vocab, ids["mask"])
    shuffled = shuffle_context(val, np.random.default_rng([args.seed, 2, 0]))
    unigram = np.bincount(train_rows[:, 1:-1].ravel(), minlength=vocab) + 1.0
    unigram_loss = float(-np.log(unigram / unigram.sum())[val[2].numpy()].mean())

    models = build_models(names, vocab, ids, args.seed)
    curves, finals = {}, {}
    for name, (model, logits, attention) in models.items():
        model.eval()
        start = evaluate(logits, attention, val, shuffled, 8)
        curves[name] = train(name, model, logits, batches, args, print)
        finals[name] = (start, evaluate(logits, attention, val, shuffled, 8))
        print(f"{name}: val loss {finals[name][1][0]:.3f}, shuffled context {finals[name][1][1]:.3f}, "
              f"neighbour attention {finals[name][1][2]:.4f}")

    steps = [args.every * (i + 1) for i in range(min(map(len, curves.values())))]
    rows = [[f"train loss, steps {s - args.every + 1}–{s}", *(f"{curves[n][i]:.3f}" for n in curves)]
            for i, s in enumerate(steps)]
    rows += [
        ["val loss at init", *(f"{finals[n][0][0]:.3f}" for n in curves)],
        [f"**val loss after {args.steps} steps**", *(f"**{finals[n][1][0]:.3f}**" for n in curves)],
        ["same, each row's context shuffled", *(f"{finals[n][1][1]:.3f}" for n in curves)],
        ["attention on the previous/next token (uniform: {:.4f})".format(1 / args.seq_len),
         *(f"{finals[n][1][2]:.4f}" for n in curves)],
    ]
    table = common.markdown_table(["", *curves], rows)
    tokens = args.steps * args.batch * args.seq_len
    text = f"""
Three masked LMs of bert-mini's size (4 layers, d_model 256, 4 heads, vocab {vocab:,}) trained for {args.steps}
steps of {args.batch} × {args.seq_len} tokens ({tokens / 1e6:.1f}M tokens) on the `bert-sst2` corpus
({" + ".join(NAMES[x] for x in parts)}, windows cut from one stream) — the **same batches** (BERT's 15% masking,
80/10/10, at most 20 a row, drawn per step from one seed) and the **same optimizer** (plm's AdamW grouping, lr
{args.lr:g}, {args.warmup} warmup steps then linear decay, weight decay 0.01, clip 1.0, {args.precision}):

- **plm-bert**: `plmcli.models.bert.Bert` from the `bert-mini` recipe (learned absolute positions, post-LN).
- **hf-bert**: `transformers.BertForMaskedLM` **holding plm-bert's initial weights** (`Bert.to_hf`), SDPA.
- **plm-nezha**: `nezha-mini` (the same encoder with NEZHA's functional relative positions), same seed.

Validation: {len(val_rows)} held-out windows with one fixed masking; "shuffled" permutes each row's unmasked
tokens, so a model that does not read context scores the same on both. The unigram model of the training
windows scores {unigram_loss:.3f} nats on the same masked tokens.
"""
    common.publish(NAME, common.section_body("Small MLMs on the plateau: plm BERT vs transformers BERT vs NEZHA",
                                             args, text, table), args)
    return 0
