"""GPU: encoder training steps on batches of real sentence lengths, unpadded (jagged) vs padded with a mask.

On CUDA, plm's encoders run a padded batch unpadded (`plmcli.models.layers.bidirectional`: the states of
the real tokens only, as a jagged nested tensor, through SDPA's variable-length kernels, NVIDIA's
"unpadded BERT"); this compares that with the same model forced onto the padded path (a key mask, every
linear layer over the padding too). Same model, same batches, same AdamW, bf16 autocast. Before timing
it checks that both paths give the same hidden states at the real tokens and the same gradients
(to bf16 precision). Lengths: the SST-2 sample shipped in data/glue-sample (2,000 phrases, 3–60
tokens) tokenized with a WordPiece trained on them. Without CUDA: one skip line, exit 0 (`--device cpu`
runs it anyway, slowly: a CPU attends row by row).
"""

from __future__ import annotations

import contextlib
import statistics
import time

from benchmarks import common

NAME = "gpu-varlen"
HELP = "bert-base training steps at real SST-2 lengths on one GPU: unpadded (jagged) vs padded with a mask"
DEFAULTS = {"repeats": 3}  # the shared options it takes (benchmarks/__main__.py), its defaults
SAMPLE = common.REPO_ROOT / "data" / "glue-sample" / "SST-2" / "train.tsv"


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="bert-base", help="recipe whose model section sets the encoder")
    p.add_argument("--batch", type=int, default=256, help="sentences per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to exercise the script without a GPU")
    p.add_argument("--seed", type=int, default=0, help="seeds the batches and the init")


@contextlib.contextmanager
def attention_path(unpadded: bool):
    """Run encoders unpadded (plm's own choice on CUDA; forced on a CPU) or padded with a key mask."""
    from plmcli.models import layers

    original = layers.unpadded_attention
    layers.unpadded_attention = lambda device: unpadded
    try:
        yield
    finally:
        layers.unpadded_attention = original


def sentence_lengths(path=SAMPLE, vocab: int = 2000) -> list[int]:
    """Token counts ([CLS] + WordPiece pieces + [SEP]) of the sample's sentences."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    lines = [ln.split("\t")[0] for ln in path.read_text(encoding="utf-8").splitlines()[1:] if ln.strip()]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=["[UNK]"]))
    return [len(e.ids) + 2 for e in tok.encode_batch(lines)]


def make_batches(lengths, batch: int, n: int, vocab: int, seed: int):
    """n batches of `batch` sentences drawn from `lengths`: (ids (B, T) right-padded with 0, mask (B, T), labels (B,))."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lens = rng.choice(lengths, batch)
        T = int(lens.max())
        mask = torch.from_numpy(np.arange(T)[None, :] < lens[:, None]).long()
        ids = torch.from_numpy(rng.integers(5, vocab, (batch, T))) * mask
        out.append((ids, mask, torch.from_numpy(rng.integers(0, 2, batch))))
    return out


def build(cfg, device, seed: int):
    """(model, head, AdamW) on `device`: the encoder and a 2-way head on the pooled [CLS]."""
    import torch

    from plmcli.models.bert import Bert
    from plmcli.train.optim import build_optimizer

    torch.manual_seed(seed)
    model = Bert(cfg).to(device).train()
    head = torch.nn.Linear(cfg.d_model, 2).to(device)
    both = torch.nn.ModuleList([model, head])
    return model, head, build_optimizer(both, "adamw", 2e-5, 0.01)


def train_step(model, head, opt, batch, device) -> None:
    import torch
    import torch.nn.functional as F

    ids, mask, y = (t.to(device, non_blocking=True) for t in batch)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        _, pooled = model.encode(ids, attention_mask=mask)
        loss = F.cross_entropy(head(pooled).float(), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(head.parameters()), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def agreement(model, head, batch, device) -> dict:
    """Max |difference| between the two paths: hidden states at real tokens (eval mode) and parameter
    gradients of one training loss (dropout off), both under bf16 autocast."""
    import torch
    import torch.nn.functional as F

    ids, mask, y = (t.to(device) for t in batch)
    keep = mask.bool()
    results = {}
    model.eval()
    for name in ("padded", "unpadded"):
        with attention_path(name == "unpadded"):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                h, pooled = model.encode(ids, attention_mask=mask)
                loss = F.cross_entropy(head(pooled).float(), y)
            grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
            results[name] = (h[keep].detach().float(), [g.float() if g is not None else None for g in grads])
    model.train()
    (hp, gp), (hu, gu) = results["padded"], results["unpadded"]
    grad_diff = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-12))
                    for a, b in zip(gp, gu) if a is not None and b is not None)
    return {"hidden_max_abs_diff": float((hp - hu).abs().max()), "hidden_max_abs": float(hp.abs().max()),
            "grad_max_rel_diff": grad_diff}


def run(args) -> int:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{NAME}: skipped: no CUDA device (torch.cuda.is_available() is False); BENCHMARKS.md left alone")
        return 0
    from dataclasses import replace

    from plmcli.config import load_recipe

    common.set_threads(args.threads)
    r = load_recipe(args.recipe)
    cfg = replace(r.model, vocab_size=30522, nsp_head=True)  # the pooler, which the head reads
    lengths = sentence_lengths()
    batches = make_batches(lengths, args.batch, args.steps, cfg.vocab_size, args.seed)
    model, head, opt = build(cfg, device, args.seed)
    check = agreement(model, head, batches[0], device)
    print(f"agreement: {check}")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def runner(unpadded: bool):
        def once() -> float:
            with attention_path(unpadded):
                sync()
                t0 = time.perf_counter()
                for b in batches:
                    train_step(model, head, opt, b, device)
                sync()
                return sum(int(b[1].sum()) for b in batches) / (time.perf_counter() - t0)
        return once

    samples = common.interleave({"padded + key mask": runner(False), "unpadded (jagged)": runner(True)},
                                args.repeats, 1)
    stats = {k: common.summary(v) for k, v in samples.items()}
    base = stats["padded + key mask"]["median"]
    real = sum(int(b[1].sum()) for b in batches)
    padded = sum(b[1].numel() for b in batches)
    rows = [[k, f"{s['median']:,.0f}", f"{s['min']:,.0f}–{s['max']:,.0f}", f"{s['median'] / base:.2f}×"]
            for k, s in stats.items()]
    table = common.markdown_table(["path", "real tokens/s (median)", "min–max", "vs padded"], rows)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else common.cpu_model()
    text = f"""
Device: {name}. `{args.recipe}`'s encoder ({cfg.n_layer} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}) + a 2-way head
on the pooled [CLS], training steps (forward, loss, backward, clip, AdamW) in bf16 autocast on {args.steps} batches of
{args.batch} sentences whose lengths are drawn from the SST-2 sample in data/glue-sample ({min(lengths)}–{max(lengths)}
tokens, mean {statistics.mean(lengths):.1f}); each batch padded to its longest row, so {1 - real / padded:.0%} of the
positions are padding. Padded: `plmcli.models.layers.unpadded_attention` forced off (a key mask, the linear layers
over every position). Unpadded: plm's own path on CUDA (`layers.bidirectional`: jagged states, SDPA's
variable-length kernels). {args.repeats} interleaved repeats after a warm-up.

Agreement before timing (eval mode, bf16): hidden states at real tokens differ by at most
{check['hidden_max_abs_diff']:.3g} (values up to {check['hidden_max_abs']:.3g}); parameter gradients by at most
{100 * check['grad_max_rel_diff']:.2g}% of each tensor's largest entry.
"""
    common.publish(NAME, common.section_body("Unpadded vs padded encoder steps at real lengths (GPU)", args, text, table),
                   args)
    return 0
