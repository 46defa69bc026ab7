"""Training-step throughput: plm's BERT MLM against transformers' BertForMaskedLM on the same config.

Both run a whole optimizer step on the same masked batch (15% of positions, 80/10/10) with the same
AdamW and threads. plm computes the MLM head only at the masked positions (as the `mlm` objective
does); transformers computes it at every position and ignores the unmasked ones in the loss.
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.speed.gpt_train_step import autocast, limit_text, measure, publish_step, rate_table

NAME = "bert-train-step"
HELP = "training-step tokens/s of plm's BERT MLM vs transformers' BertForMaskedLM (BERT-mini, vocab 30522)"
DEFAULTS = {"repeats": 5}  # the shared options it takes (benchmarks/__main__.py), its defaults


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="bert-mini", help="recipe whose model section sets the config")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--vocab", type=int, default=30522, help="vocabulary size (BERT's uncased WordPiece)")
    p.add_argument("--mask-prob", type=float, default=0.15, help="share of positions to predict")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per repeat")
    p.add_argument("--warmup", type=int, default=1, help="untimed repeats per model first (allocation, optimizer state)")
    p.add_argument("--seed", type=int, default=0, help="seeds the batch and both inits")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: both sides under torch.autocast (CPU: AMX / AVX512-BF16 matmuls), as plm's "
                        "train.mixed_precision=bf16; published as its own section")
    common.add_limit_arguments(p)
    common.add_profile_arguments(p)


def build(args):
    from dataclasses import replace

    import numpy as np
    import torch
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

    def plm_loss():  # as plmcli.objectives.mlm.MaskedLM.step: no padding, so no attention mask
        with autocast(args.precision):
            return plm(x, mlm_positions=pos, mlm_labels=y).mlm_loss.float()

    def hf_loss():
        with autocast(args.precision):
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
    plm = sides["plm"][0]
    plm.mlm_fraction = n_masked / tokens  # the head runs at this batch's masked share: count what runs
    fpt = plm.flops_per_token(T)
    stats, peaks, profiles = measure(args, sides, tokens, info["flags"])
    if args.precision == "fp32":
        peaks = common.fp32_peaks(peaks)
    table = rate_table(stats, tokens, fpt, peaks)
    m = recipe.model
    text = f"""
One training step of `{recipe.name}`'s BERT ({m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, vocab {V},
dropout {m.dropout}) on {B} × {T} token ids with {n_masked} positions ({args.mask_prob:.0%}) masked 80/10/10:
forward, MLM loss, backward, `clip_grad_norm_(1.0)`, AdamW (foreach), `zero_grad`. No NSP head on either side.

- **plm**: `plmcli.models.bert.Bert`, the MLM head (transform + LayerNorm + tied decoder) run only on the
  masked positions, its decoder fused with the loss a chunk of rows at a time (`plmcli.models.lm_loss`,
  as the `mlm` objective calls it), SDPA attention, no attention mask when there is no padding.
- **transformers**: `BertForMaskedLM` (`attn_implementation="sdpa"`), `labels` with -100 off the masked
  positions — the head runs on all {tokens} positions.

{args.warmup} untimed repeat(s) each, then {args.repeats} interleaved repeats of {args.steps} steps (plm, transformers,
the probe(s), plm, ...). Goal: plm ≥ 3.0× (ratio of medians).
"""
    formula = (f"`Bert.flops_per_token` = 6·(N_blocks + s·(C² + C·V)) + 12·L·T·C with N_blocks = "
               f"{sum(p.numel() for p in plm.blocks.parameters()):,} encoder-block parameters, the MLM head (transform "
               f"and tied decoder) at the masked share s = {n_masked}/{tokens} = {plm.mlm_fraction:.3f} of the tokens "
               f"(embedding lookups, pooler and NSP left out) = {fpt / 1e6:.1f} MFLOP")
    text += limit_text(stats, info, args, formula, profiles)
    publish_step(NAME, "BERT-mini MLM training step: plm vs transformers", args, text, table, info)
    return 0
