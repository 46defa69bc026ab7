"""Pretraining-step throughput of XLNet and ELECTRA: plm's objective step vs transformers doing the same work.

- xlnet: plm's `plm` objective (`PermutationLM.step`: two-stream attention, the factorisation order's perm
  mask, span targets, the memory of the previous segment) on xlnet-mini, against transformers'
  `XLNetLMHeadModel` given the same input ids, segments, perm_mask, target_mapping, labels and memory.
- electra: plm's `rtd` objective (`ReplacedTokenDetection.step`: generator MLM at the masked positions, a
  sample of its softmax (`rtd.sample`), the discriminator on the corrupted ids, MLM + λ·BCE) on electra-mini,
  against transformers' `ElectraForMaskedLM` (generator) + `ElectraForPreTraining` (discriminator) with one
  shared embeddings module, as ELECTRA shares them, drawing the same sample noise.

Both sides start from the same weights (plm's, through the models' `to_hf` export, the mapping the parity
tests check); before timing, their losses on the batch are compared in eval mode and must agree.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks import common
from benchmarks.speed.gpt_train_step import limit_text, measure, rate_table

NAME = "pretrain-step"
HELP = ("pretraining-step tokens/s of plm's XLNet (permutation LM) or ELECTRA (replaced-token detection) vs "
        "transformers doing the same step")
DEFAULTS = {"repeats": 5}  # the shared options it takes (benchmarks/__main__.py), its defaults
RECIPES = {"xlnet": "xlnet-mini", "electra": "electra-mini"}
TITLES = {"xlnet": "XLNet", "electra": "ELECTRA"}
STREAM_SEGMENTS = 4  # each synthetic stream holds this many seq_len's of tokens: several segments to read


def add_arguments(p) -> None:
    p.add_argument("--family", choices=tuple(RECIPES), default="xlnet", help="which pretraining step to compare")
    p.add_argument("--recipe", help="recipe whose model/objective/optim set the config (default: xlnet-mini / electra-mini)")
    p.add_argument("--batch", type=int, help="sequences per step (default: the recipe's global batch)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the recipe's seq_len)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: the recipe's tokenizer vocab_size)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per repeat")
    p.add_argument("--warmup", type=int, default=1, help="untimed repeats per model first (allocation, optimizer state)")
    p.add_argument("--seed", type=int, default=0, help="seeds the batch and the init")
    common.add_limit_arguments(p)
    common.add_profile_arguments(p)


def special_ids(recipe) -> dict[str, int]:
    """The recipe's special-token roles numbered 0, 1, ... in their order (as a trained tokenizer puts them first)."""
    return {role: i for i, role in enumerate(recipe.tokenizer.special_tokens)}


def run_config(ids: dict[str, int]) -> dict:
    """The part of a run's config.json that `to_hf` reads."""
    return {"tokenizer": {"special_token_ids": ids}}


def hf_kwargs(config: dict) -> dict:
    """A to_hf config.json as keyword arguments of the transformers config class."""
    return {k: v for k, v in config.items() if k not in ("model_type", "architectures")}


def optimizer(model, o):
    from plmcli.train.optim import build_optimizer

    return build_optimizer(model, o.name, o.lr, o.weight_decay, tuple(o.betas), o.eps)


# ---------------------------------------------------------------- XLNet


def xlnet_stream(obj, B: int, V: int, seed: int):
    """The `plm` objective's own PermutationStream over a random token stream (~70% word starts, a sentence
    every ~20 tokens), so both sides read a batch built exactly as pretraining builds one."""
    import numpy as np

    from plmcli.objectives.plm import PermutationStream

    rng = np.random.default_rng(seed)
    n = B * obj.seq_len * STREAM_SEGMENTS
    tokens = rng.integers(len(obj.special_ids), V, n)
    words, starts = rng.random(n) < 0.7, rng.random(n) < 0.05
    words[0] = starts[0] = True
    return PermutationStream(obj, tokens, words, starts, B, seed, 0, 1, True, "train")


def xlnet_memory(obj, model, stream, k: int):
    """The memory the loop carries into micro-batch k of a stream: the content states of batches 0 … k-1."""
    import torch

    state = None
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(k):
            state = obj.step(model, stream[i], state).state
    model.train(was)
    return state


def build_xlnet(args, recipe, B: int, T: int, V: int):
    """({side: (model, loss_fn, optimizer)}, plm's model, the batch): one batch and memory, read by both sides."""
    import torch
    from transformers import XLNetConfig as HFConfig
    from transformers import XLNetLMHeadModel

    from plmcli.models.xlnet import XLNet
    from plmcli.objectives.plm import PermutationLM

    ids = special_ids(recipe)
    obj = PermutationLM(recipe.objective, None, ids, T)
    torch.manual_seed(args.seed)
    plm = XLNet(replace(recipe.model, vocab_size=V)).train()
    obj.check_model(plm)  # as the loop: freezes the finetuning summary, sets the predicted share
    stream = xlnet_stream(obj, B, V, args.seed)
    k = 2  # a segment with a full memory behind it (mem_len of the previous segments' states)
    batch, mems = stream[k], xlnet_memory(obj, plm, stream, k)
    assert not batch["reset"] and mems[0].shape[1] == min(plm.cfg.mem_len, k * recipe.objective.reuse_len)

    config, sd = plm.to_hf(run_config(ids))
    hf = XLNetLMHeadModel(HFConfig(**hf_kwargs(config), reuse_len=recipe.objective.reuse_len, use_mems_train=True))
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or set(missing) - {"lm_loss.weight"} or hf.lm_loss.weight is not hf.transformer.word_embedding.weight:
        raise SystemExit(f"pretrain-step: the XLNet weight mapping is off (missing {missing}, unexpected {unexpected})")
    hf.train()
    hf_mems = [m.transpose(0, 1).contiguous() for m in mems]  # transformers keeps memory as (M, B, C)
    perm = batch["perm_mask"].float()

    def plm_loss():  # exactly what the training loop calls
        return obj.step(plm, batch, mems).loss

    def hf_loss():
        return hf(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], perm_mask=perm,
                  target_mapping=batch["target_mapping"], mems=hf_mems, use_mems=True, labels=batch["labels"]).loss

    o = recipe.optim
    return {"plm": (plm, plm_loss, optimizer(plm, o)), "transformers": (hf, hf_loss, optimizer(hf, o))}, plm, batch


# ---------------------------------------------------------------- ELECTRA


def electra_batch(obj, B: int, V: int, seed: int) -> dict:
    """The `rtd` objective's own masked batch (window_batch: [CLS] window [SEP], masked afresh, with its
    generator-sample seed) over random token ids."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.integers(len(obj.special_ids), V, (B, obj.seq_len - 2)))
    return obj.window_batch(x, (0,), seed)


def hf_electra_loss(gen, disc, batch: dict, cfg):
    """transformers' generator and discriminator doing the `rtd` step: MLM loss at the masked positions
    (-100 elsewhere), the same sample (`rtd.sample`, same seed) written into the original ids, BCE over every token."""
    import torch

    from plmcli.objectives.rtd import sample

    ids, pos, labels = batch["input_ids"], batch["mlm_positions"], batch["mlm_labels"]
    hf_labels = torch.full_like(ids, -100).flatten().index_put((pos,), labels).view_as(ids)
    original = ids.flatten().index_put((pos,), labels)

    def loss():
        g = gen(input_ids=ids, labels=hf_labels)
        with torch.no_grad():
            noise = torch.Generator().manual_seed(batch["sample_seed"])
            sampled = sample(g.logits.detach().flatten(0, 1)[pos].float() / cfg.temperature, noise)
            corrupted = original.index_put((pos,), sampled)
            replaced = (corrupted != original).long().view_as(ids)
        d = disc(input_ids=corrupted.view_as(ids), labels=replaced)
        return cfg.gen_weight * g.loss + cfg.disc_weight * d.loss

    return loss


def build_electra(args, recipe, B: int, T: int, V: int):
    """({side: (model, loss_fn, optimizer)}, plm's model, the batch)."""
    import torch
    from torch import nn
    from transformers import ElectraConfig as HFConfig
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from plmcli.models.electra import Electra
    from plmcli.objectives.rtd import ReplacedTokenDetection

    ids = special_ids(recipe)
    obj = ReplacedTokenDetection(recipe.objective, None, ids, T)
    cfg = replace(recipe.model, vocab_size=0)
    obj.configure_model(cfg, V)  # as the pipeline: the vocabulary size reaches the model and the masking
    torch.manual_seed(args.seed)
    plm = Electra(cfg).train()
    obj.check_model(plm)  # sets the masked share flops_per_token counts
    batch = electra_batch(obj, B, V, args.seed)

    disc_config, disc_sd = plm.to_hf(run_config(ids))
    gen_config, gen_sd = plm.hf_extra_exports(run_config(ids))["generator"]
    disc = ElectraForPreTraining(HFConfig(**hf_kwargs(disc_config), attn_implementation="sdpa"))
    gen = ElectraForMaskedLM(HFConfig(**hf_kwargs(gen_config), attn_implementation="sdpa"))
    for net, sd in ((disc, disc_sd), (gen, gen_sd)):
        missing, unexpected = net.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"generator_lm_head.weight"}:
            raise SystemExit(f"pretrain-step: the ELECTRA weight mapping is off (missing {missing}, unexpected {unexpected})")
    gen.electra.embeddings = disc.electra.embeddings  # one embeddings module for both networks, as ELECTRA
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight  # the generator decodes with it
    hf = nn.ModuleDict({"generator": gen, "discriminator": disc}).train()

    def plm_loss():  # exactly what the training loop calls
        return obj.step(plm, batch).loss

    o = recipe.optim
    hf_loss = hf_electra_loss(gen, disc, batch, recipe.objective)
    return {"plm": (plm, plm_loss, optimizer(plm, o)), "transformers": (hf, hf_loss, optimizer(hf, o))}, plm, batch


# ---------------------------------------------------------------- the comparison


def eval_losses(sides: dict) -> dict[str, float]:
    """Each side's loss on the batch in eval mode (no dropout), at the shared starting weights."""
    import torch

    out = {}
    for name, (model, loss_fn, _) in sides.items():
        model.eval()
        with torch.no_grad():
            out[name] = float(loss_fn())
        model.train()
    return out


def check_same_work(sides: dict) -> dict[str, float]:
    """Equal parameter counts and equal eval-mode losses, or no comparison."""
    n = {name: sum(p.numel() for p in m.parameters() if p.requires_grad) for name, (m, _, _) in sides.items()}
    if n["plm"] != n["transformers"]:
        raise SystemExit(f"pretrain-step: the sides train different parameter counts ({n}); the mapping is wrong")
    losses = eval_losses(sides)
    if abs(losses["plm"] - losses["transformers"]) > 1e-4 * max(1.0, abs(losses["plm"])):
        raise SystemExit(f"pretrain-step: the sides' losses differ at equal weights ({losses}): not the same step")
    return losses | {"parameters": n["plm"]}


def describe(family: str, recipe, B: int, T: int, V: int, check: dict, args) -> str:
    m, o = recipe.model, recipe.objective
    if family == "xlnet":
        what = f"""
One pretraining step of `{recipe.name}`'s XLNet ({m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, d_ff
{m.d_ff}, vocab {V}, dropout {m.dropout}) on {B} × {T} tokens: {o.num_predict} span targets per sequence, reuse_len
{o.reuse_len}, a memory of {m.mem_len} states per layer from the previous segments. The batch is micro-batch 2 of the
`plm` objective's own `PermutationStream` over a random token stream (A <sep> B <sep> <cls>, perm mask, target
mapping), the memory the loop would carry into it.

- **plm**: `PermutationLM.step` on `plmcli.models.xlnet.XLNet`, as the loop calls it.
- **transformers**: `XLNetLMHeadModel` from plm's `to_hf` export (same weights), `perm_mask`, `target_mapping`,
  `token_type_ids`, `mems` (transposed to (M, B, C)), `use_mems=True`, `labels` → its loss."""
    else:
        what = f"""
One pretraining step of `{recipe.name}`'s ELECTRA ({m.n_layer} layers; discriminator d_model {m.d_model}, generator
× {m.generator_size}; embeddings {m.embedding_size}, vocab {V}, dropout {m.dropout}) on {B} × {T} tokens, masked by the
`rtd` objective's own `window_batch` (mask_prob {o.mask_prob}, at most {o.max_predictions}, 85% [MASK] / 15% kept):
generator MLM loss, a sample of its softmax at each masked position (`rtd.sample`, the same function and seed on both sides), discriminator BCE on every token,
loss = {o.gen_weight} · MLM + {o.disc_weight} · RTD.

- **plm**: `ReplacedTokenDetection.step` on `plmcli.models.electra.Electra`, as the loop calls it (the MLM head at
  the masked positions only).
- **transformers**: `ElectraForMaskedLM` + `ElectraForPreTraining` from plm's `to_hf` exports (same weights), one
  embeddings module shared by both, `attn_implementation="sdpa"`; the generator's logits at every position, its
  `labels` loss, the same sample (same seed) written in, the discriminator's `labels` loss."""
    return what + f"""

Both sides: forward, loss, backward, `clip_grad_norm_(1.0)`, AdamW (foreach, `build_optimizer`), `zero_grad`.
Same work, checked before timing: {check['parameters']:,} trained parameters each, and at the shared starting weights in
eval mode the losses agree (plm {check['plm']:.6f}, transformers {check['transformers']:.6f}).
{args.warmup} untimed repeat(s) each, then {args.repeats} interleaved repeats of {args.steps} steps. Goal: plm ≥ 1.5×
(ratio of medians).
"""


def run(args) -> int:
    from plmcli.config import load_recipe

    common.set_threads(args.threads)
    info = common.machine_info()
    recipe = load_recipe(args.recipe or RECIPES[args.family])
    B = args.batch or recipe.train.global_batch_size
    T = args.seq_len or recipe.train.seq_len
    V = args.vocab or recipe.tokenizer.vocab_size
    sides, plm, _ = (build_xlnet if args.family == "xlnet" else build_electra)(args, recipe, B, T, V)
    check = check_same_work(sides)
    print(f"{common.machine_line(info)}\n{recipe.name}: batch {B} x {T}, vocab {V}; eval losses {check}")
    fpt = plm.flops_per_token(T)
    stats, peaks, profiles = measure(args, sides, B * T, info["flags"])
    peaks = common.fp32_peaks(peaks)
    table = rate_table(stats, B * T, fpt, peaks)
    text = describe(args.family, recipe, B, T, V, check, args) + limit_text(stats, info, args, formula(args.family, plm, T, fpt), profiles)
    title = f"{TITLES[args.family]} pretraining step: plm vs transformers"
    common.publish(f"{NAME}-{args.family}", common.section_body(title, args, text, table, info), args)
    return 0


def formula(family: str, plm, T: int, fpt: float) -> str:
    if family == "xlnet":
        return (f"`XLNet.flops_per_token` = 6 × (content stream's matmuls per token, the memory's k/v and the "
                f"position keys amortised over the {T} tokens, the query stream and tied LM head at the predicted "
                f"share {plm.predict_fraction:.3f}) + 6 × attention (q·k, p·v over klen = T + mem_len keys, q·W_R R "
                f"over klen + T distances, both streams) = {fpt / 1e6:.1f} MFLOP")
    return (f"`Electra.flops_per_token` = 6·(N_gen + N_disc + N_rtd_head + s·(C_g·E + E·V)) + 12·L·T·(C + C_g), "
            f"both networks' bodies and projections at every token, the generator's MLM head at the masked share "
            f"s = {plm.mlm_fraction:.3f} = {fpt / 1e6:.1f} MFLOP")
