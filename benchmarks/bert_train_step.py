"""Training-step throughput: plm's BERT MLM against transformers' BertForMaskedLM on the same config.

Both run a whole optimizer step on the same masked batch (15% of positions, 80/10/10) with the same
AdamW and threads. plm computes the MLM head only at the masked positions (as the `mlm` objective
does); transformers computes it at every position and ignores the unmasked ones in the loss.
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.gpt_train_step import train_step

NAME = "bert-train-step"
HELP = "training-step tokens/s of plm's BERT MLM vs transformers' BertForMaskedLM (BERT-mini, vocab 30522)"


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="bert-mini", help="recipe whose model section sets the config")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--vocab", type=int, default=30522, help="vocabulary size (BERT's uncased WordPiece)")
    p.add_argument("--mask-prob", type=float, default=0.15, help="share of positions to predict")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per model, interleaved")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per repeat")
    p.add_argument("--seed", type=int, default=0, help="seeds the batch and both inits")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: both sides under torch.autocast (CPU: AMX / AVX512-BF16 matmuls), as plm's "
                        "train.mixed_precision=bf16; published as its own section")


def build(args):
    from dataclasses import replace

    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertForMaskedLM

    from plmcli.config import load_recipe
    from plmcli.data.masking import mask_batch
    from plmcli.models.bert import Bert
    from plmcli.train.optim import build_optimizer

    r = load_recipe(args.recipe)
    B, T, V = args.batch, args.seq_len, args.vocab
    cfg = replace(r.model, vocab_size=V, nsp_head=False)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(5, V, (B, T))
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    special = np.zeros((B, T), bool)
    special[:, [0, -1]] = True
    masked, target = mask_batch(ids, special, None, rng, mask_prob=args.mask_prob, strategy="token", mask_id=4,
                                vocab_size=V, max_predictions=0)
    x = torch.from_numpy(masked).long()
    pos = torch.from_numpy(np.flatnonzero(target)).long()
    y = torch.from_numpy(ids.reshape(-1)[np.flatnonzero(target)]).long()
    hf_labels = torch.full((B, T), -100, dtype=torch.long)
    hf_labels.view(-1)[pos] = y

    torch.manual_seed(args.seed)
    plm = Bert(cfg).train()
    hf_cfg = BertConfig(vocab_size=V, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
                        num_attention_heads=cfg.n_head, intermediate_size=cfg.d_ff or 4 * cfg.d_model,
                        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attn_dropout,
                        max_position_embeddings=cfg.max_positions, type_vocab_size=cfg.type_vocab_size,
                        layer_norm_eps=cfg.layer_norm_eps, attn_implementation="sdpa")
    torch.manual_seed(args.seed)
    hf = BertForMaskedLM(hf_cfg).train()

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def plm_loss():  # as plmcli.objectives.mlm.MaskedLM.step: no padding, so no attention mask
        with autocast():
            return F.cross_entropy(plm(x, mlm_positions=pos).mlm_logits.float(), y)

    def hf_loss():
        with autocast():
            return hf(input_ids=x, labels=hf_labels).loss

    o = r.optim
    opt = {m: build_optimizer(m, o.name, o.lr, o.weight_decay, tuple(o.betas), o.eps) for m in (plm, hf)}
    n = {k: sum(p.numel() for p in m.parameters()) for k, m in (("plm", plm), ("transformers", hf))}
    return r, {"plm": (plm, plm_loss, opt[plm]), "transformers": (hf, hf_loss, opt[hf])}, (B, T, V), n, int(len(pos))


def run(args) -> int:
    common.set_threads(args.threads)
    info = common.machine_info()
    recipe, sides, (B, T, V), n_params, n_masked = build(args)
    tokens = B * T
    print(f"{common.machine_line(info)}\n{recipe.name}: {n_params}, batch {B} x {T}, vocab {V}, {n_masked} masked")

    def runner(model, loss_fn, optimizer):
        def once() -> float:
            return args.steps * tokens / common.timed(lambda: train_step(model, loss_fn, optimizer), args.steps)
        return once

    samples = common.interleave({name: runner(*s) for name, s in sides.items()}, args.repeats, 1)
    stats = {name: common.summary(v) for name, v in samples.items()}
    ratio = stats["plm"]["median"] / stats["transformers"]["median"]
    best_ratio = stats["plm"]["max"] / stats["transformers"]["max"]
    rows = [[name, f"{s['median']:,.0f}", f"{s['min']:,.0f}–{s['max']:,.0f}", f"{1000 * tokens / s['median']:.1f}",
             f"{100 * s['spread']:.0f}%"] for name, s in stats.items()]
    rows.append(["**plm / transformers**", f"**{ratio:.2f}×**", f"best/best {best_ratio:.2f}×", "", ""])
    table = common.markdown_table(["model", "tokens/s (median)", "tokens/s (min–max)", "ms/step (median)", "spread"], rows)
    m = recipe.model
    text = f"""
One training step of `{recipe.name}`'s BERT ({m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, vocab {V},
dropout {m.dropout}) on {B} × {T} token ids with {n_masked} positions ({args.mask_prob:.0%}) masked 80/10/10:
forward, MLM loss, backward, `clip_grad_norm_(1.0)`, AdamW (foreach), `zero_grad`. No NSP head on either side.

- **plm**: `plmcli.models.bert.Bert`, the MLM head (transform + LayerNorm + tied decoder) run only on the
  masked positions, SDPA attention, no attention mask when there is no padding.
- **transformers**: `BertForMaskedLM` (`attn_implementation="sdpa"`), `labels` with -100 off the masked
  positions — the head runs on all {tokens} positions.

{args.repeats} interleaved repeats of {args.steps} steps after one warm-up each. Goal: plm ≥ 2.0× (the issue quotes
transformers at ~1,580 tok/s for this shape on this machine).
"""
    title = "BERT-mini MLM training step: plm vs transformers"
    if args.precision == "bf16":
        text += """
Both sides run under `torch.autocast("cpu", dtype=torch.bfloat16)`: on a CPU with AMX (Sapphire Rapids and
later) or AVX512-BF16 the matmuls run in bf16. plm's runs get the same with `--set train.mixed_precision=bf16`
(`auto` keeps fp32 on CPUs); without such units bf16 on a CPU is slower, not faster.
"""
        title += ", bf16 autocast"
    common.publish(NAME + ("-bf16" if args.precision == "bf16" else ""), common.section_body(title, args, text, table, info), args)
    return 0
