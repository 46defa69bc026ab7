"""GPU MFU: BERT-base at 128 tokens and GPT-2 small at 1024 pretrain in bf16 on one GPU; tokens/s and MFU.

The prepared script for a session with a GPU (estimated 2 minutes on an H200, 5 with --compile; each run
capped by --time-budget). Each model pretrains through `plmcli.api.pretrain` (the one loop: bf16 autocast, fused
AdamW, pinned-memory DataLoader workers) with SDPA restricted to the flash kernel, so a run that would fall
back to a slower attention kernel fails instead of reporting a slower number as flash. After a warmup the
timed steps' tokens/s come from the loop's own metrics.jsonl, and MFU twice: as the loop logs it (the
model's `flops_per_token`) and as this script counts it, matmul by matmul from the recipe's dimensions.

Data: the sample corpus shipped in plmcli/corpus/, tokenizers trained on it (nothing is downloaded). That
text is too small for the recipes' vocabularies (WordPiece gets ~4.9k tokens, byte-level BPE ~6k), so the
models are built at the recipes' 30,522 / 50,257 (`model.vocab_size`, rows past the tokenizer's never
seen): the output layer, the largest matmul, costs what it costs in the real models. BERT masks
dynamically over full 128-token windows (RoBERTa-style batches, no NSP pairs, no padding); `--bert-data
static` measures the recipe's own padded NSP instances instead. Without CUDA: one skip line, exit 0.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import time
from pathlib import Path

from benchmarks import common

DYNAMIC_DATA = "full 128-token windows masked afresh, no NSP pairs, no padding"
STATIC_DATA = "the recipe's NSP instances of varying length, run unpadded; only real tokens are counted"

NAME = "gpu-mfu"
HELP = "BERT-base seq 128 and GPT-2 small seq 1024 pretraining in bf16 on one GPU: tokens/s and MFU (skips without CUDA)"
DEFAULTS = {"keep": None}  # the shared options it takes (benchmarks/__main__.py), its defaults
GOAL_MFU = 0.45

# Micro-batches (one per optimizer step): BERT's paper batch, 256 × 128 = 32,768 tokens a step, and the
# same 32,768 tokens for GPT-2 as 32 × 1024. Every matmul then has 32k rows, long enough to keep the
# tensor cores busy, and the per-step costs (optimizer, launches, logging) are spread over ~50 ms of work.
# By an estimate of eager bf16's saved activations (~70 bytes per hidden unit per token and layer) each
# takes ~25 GB of an H200's 141 GB: GPT-2's (N, V) logits never exist whole (plmcli.models.lm_loss).
# `mlm`: the masked-LM run, whose data --bert-data chooses.
MODELS = {
    "bert-base": {"batch": 256, "mlm": True, "head_transform": True, "pooled_classes": 2},
    "gpt2-small": {"batch": 32, "mlm": False, "head_transform": False, "pooled_classes": 0},
}
BERT_DATA = {
    # Full windows, masked afresh each batch: no padding, so no attention mask and SDPA's flash kernel.
    "dynamic": ["objective.dynamic=true", "objective.pairs=none"],
    # The recipe's make-mlm-data NSP instances: padded batches run unpadded (plmcli.models.layers.bidirectional:
    # jagged SDPA, flash's variable-length kernel or the memory-efficient one), no FLOPs spent on padding.
    "static": [],
}


def add_arguments(p) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models to measure")
    p.add_argument("--batch", nargs="+", default=[], metavar="MODEL=N",
                   help="micro-batch (= global batch) per model, e.g. gpt2-small=16 (default: "
                        + ", ".join(f"{k}={v['batch']}" for k, v in MODELS.items()) + ")")
    p.add_argument("--warmup", type=int, default=50, help="steps left out of the measurement (CUDA start-up, autotuning, compilation)")
    p.add_argument("--steps", type=int, default=300, help="timed optimizer steps after the warmup")
    p.add_argument("--log-every", type=int, default=50,
                   help="steps per logged window (long windows keep the loop's per-window clock honest)")
    p.add_argument("--time-budget", type=float, default=150.0, help="seconds of training each run may take at most")
    p.add_argument("--compile", action="store_true", help="torch.compile the models (train.compile=true)")
    p.add_argument("--bert-data", choices=list(BERT_DATA), default="dynamic",
                   help="dynamic: full masked windows, no padding; static: the recipe's NSP instances of varying length, "
                        "run unpadded")
    p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers (train.num_workers)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe override for every run, e.g. --set model.dropout=0 (repeatable)")


def skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def preflight() -> dict:
    """What this GPU offers the runs; SystemExit naming the problem when CUDA is there but plm would not
    use it as measured (a CPU fallback, no bf16, no flash kernel, no fused AdamW)."""
    import torch

    from plmcli.train.distributed import use_cpu
    from plmcli.train.peaks import peak_flops

    if use_cpu():  # before any CUDA call: accelerate would train on the CPU, for minutes, and report it
        raise SystemExit(f"{NAME}: CUDA is available but plm would train on the CPU (ACCELERATE_USE_CPU is "
                         f"{os.environ.get('ACCELERATE_USE_CPU', 'unset')!r}, torch.accelerator finds no GPU); "
                         "unset ACCELERATE_USE_CPU and check CUDA_VISIBLE_DEVICES")
    device = torch.device("cuda", 0)
    try:
        torch.ones(8, device=device).sum().item()  # a broken driver / runtime fails here, not mid-run
    except RuntimeError as e:
        raise SystemExit(f"{NAME}: CUDA is available but unusable: {e}") from None
    if not torch.cuda.is_bf16_supported():
        raise SystemExit(f"{NAME}: {torch.cuda.get_device_name(device)} has no bf16; these runs measure bf16 training")
    q = torch.randn(2, 12, 128, 64, device=device, dtype=torch.bfloat16)
    try:
        with attention_kernels(flash_only=True):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
    except RuntimeError as e:
        raise SystemExit(f"{NAME}: SDPA's flash kernel does not run here ({str(e).splitlines()[0]}); "
                         "it needs an sm80+ GPU and a CUDA build of torch with flash attention") from None
    from plmcli.train.optim import build_optimizer

    opt = build_optimizer(torch.nn.Linear(8, 8, device=device), "adamw", 1e-3)
    if not opt.defaults.get("fused"):
        raise SystemExit(f"{NAME}: build_optimizer did not pick the fused AdamW kernel for CUDA parameters")
    return {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda, "peak": peak_flops(device),
            "memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30}


def attention_kernels(flash_only: bool):
    """SDPA limited to flash, or flash + memory-efficient (a fallback for jagged batches of varying length)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = [SDPBackend.FLASH_ATTENTION] + ([] if flash_only else [SDPBackend.EFFICIENT_ATTENTION])
    return sdpa_kernel(kernels)


# ---------------------------------------------------------------- what the numbers are computed from


def matmul_flops_per_token(n_layer: int, d_model: int, d_ff: int, seq_len: int, vocab: int, *, head_share: float = 1.0,
                           head_transform: bool = False, pooled_classes: int = 0) -> float:
    """Training FLOPs per token of a dense Transformer, counted matmul by matmul.

    A matmul of (n, a) by (a, b) costs 2·n·a·b forward and twice that backward (the gradients of both
    operands), so a weight matrix costs 6 FLOPs per entry per token. Per layer: QKV and output
    projections (4d²) and the feed-forward (2·d·d_ff); attention's QKᵀ and PV 4·T·d forward, 12·T·d in
    all, the full T×T square even for a causal mask (PaLM's convention; a causal flash kernel skips half).
    The LM head (d×V, after a d×d transform for BERT) runs at `head_share` of the tokens; a pooler and a
    classifier once per sequence. Biases, norms, embeddings lookups and softmaxes are left out.
    """
    d = d_model
    layer = 6 * (4 * d * d + 2 * d * d_ff) + 12 * seq_len * d
    head = 6 * head_share * ((d * d if head_transform else 0) + d * vocab)
    pooled = 6 * (d * d + d * pooled_classes) / seq_len if pooled_classes else 0.0
    return n_layer * layer + head + pooled


def script_flops_per_token(name: str, recipe) -> float:
    """`matmul_flops_per_token` from the recipe's dimensions (not from the model's own estimate)."""
    m, spec = recipe.model, MODELS[name]
    share = getattr(recipe.objective, "mask_prob", 1.0)  # an MLM head runs at the masked positions only
    return matmul_flops_per_token(m.n_layer, m.d_model, m.d_ff or 4 * m.d_model, recipe.train.seq_len,
                                  m.vocab_size or recipe.tokenizer.vocab_size, head_share=share,
                                  head_transform=spec["head_transform"], pooled_classes=spec["pooled_classes"])


def phaseless_recipe(name: str, out_dir: Path) -> Path:
    """The shipped recipe resolved to one YAML file without its `phases`: BERT-base's seq-512 phase would
    otherwise follow the measured one. The first phase's settings are the base recipe's own."""
    import yaml

    from plmcli.config import load_recipe

    d = load_recipe(name).to_dict()
    d.pop("phases", None)
    path = out_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def run_overrides(name: str, batch: int, args) -> list[str]:
    """The `--set` list of one run: bf16, one micro-batch a step, the recipe's full vocabulary, no
    checkpoints or evaluations until the end, then the data choice and the user's own overrides."""
    from plmcli.config import load_recipe

    vocab = load_recipe(name).tokenizer.vocab_size
    data = BERT_DATA[args.bert_data] if MODELS[name]["mlm"] else []
    return ["train.mixed_precision=bf16", f"train.global_batch_size={batch}", "train.micro_batch_size=0",
            f"model.vocab_size={vocab}", f"train.log_every={args.log_every}", "train.eval_every=0",
            "train.eval_batches=4", "train.save_every=0", f"train.num_workers={args.num_workers}",
            f"train.compile={'true' if args.compile else 'false'}", *data, *args.overrides]


def batches(args) -> dict[str, int]:
    out = {k: v["batch"] for k, v in MODELS.items()}
    for item in args.batch:
        key, _, value = item.partition("=")
        if key not in MODELS or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"{NAME}: --batch {item!r} must be MODEL=N with MODEL one of {', '.join(MODELS)}")
        out[key] = int(value)
    return out


def throughput(rows: list[dict], warmup: int) -> dict:
    """Tokens/s over the logged steps after `warmup`, from the loop's cumulative tokens and clock.

    Differences of the cumulative `elapsed_s` rather than the windows' `tok_per_s`: the loop reads its
    clock when a window's last step has been queued on the GPU, not run, and starts the next window after
    a sync, so each window leaves out the GPU work still queued at its end; in a difference of two
    cumulative readings that lag cancels. `loop_mfu` is the median of the loop's own per-window MFU.
    """
    logged = [r for r in rows if "tok_per_s" in r]
    start = next((r for r in reversed(logged) if r["step"] <= warmup), None)
    timed = [r for r in logged if r["step"] > warmup]
    if start is None or not timed:
        raise ValueError(f"no logged window after the {warmup}-step warmup (logged steps: {[r['step'] for r in logged]})")
    end = timed[-1]
    mfus = [r["mfu"] for r in timed if "mfu" in r]
    return {"timed_steps": end["step"] - start["step"], "tokens": end["tokens"] - start["tokens"],
            "seconds": end["elapsed_s"] - start["elapsed_s"],
            "tok_per_s": (end["tokens"] - start["tokens"]) / (end["elapsed_s"] - start["elapsed_s"]),
            "window_tok_per_s": statistics.median(r["tok_per_s"] for r in timed),
            "loop_mfu": statistics.median(mfus) if mfus else None,
            "loss_first": logged[0]["loss"], "loss_last": end["loss"]}


# ---------------------------------------------------------------- the runs


def run(args) -> int:
    why = skip_reason()
    if why:
        print(f"{NAME}: skipped: {why}; BENCHMARKS.md left alone")
        return 0
    import torch

    sizes = batches(args)
    if args.steps < 1 or args.warmup < args.log_every or args.log_every < 1:
        raise SystemExit(f"{NAME}: need --steps ≥ 1 and --warmup ≥ --log-every ≥ 1 (a logged window must end the warmup)")
    gpu = preflight()
    common.set_threads(args.threads)
    info = common.machine_info()
    peak = gpu["peak"]
    print(f"{common.machine_line(info)}\nGPU: {gpu['gpu']} ({gpu['memory_gib']:.0f} GiB), CUDA {gpu['cuda']}, bf16 peak "
          + (f"{peak / 1e12:,.0f} TFLOP/s" if peak else "unknown: not in plmcli.train.peaks.PEAKS, so no MFU"))
    results = []
    with common.isolated_workdir("plm-gpu-mfu-", args.keep) as root:
        for name in args.models:
            res = one_run(name, sizes[name], root, args, peak)
            results.append(res)
            print(summary_line(res))
        torch.cuda.synchronize()
    ok = all(r["ok"] for r in results)
    if ok:
        common.publish(NAME, render(args, info, gpu, results), args)
    else:
        print(f"{NAME}: a run failed; BENCHMARKS.md left alone")
    keys = ("model", "batch", "seq_len", "tok_per_s", "script_mfu", "loop_mfu", "fpt_script", "fpt_model", "peak_gib",
            "ok", "error", "note")
    print(json.dumps({"benchmark": NAME, "gpu": gpu["gpu"], "peak_tflops": peak and peak / 1e12, "compile": args.compile,
                      "goal_mfu": GOAL_MFU, "goal_met": ok and peak is not None
                      and all((r["script_mfu"] or 0) >= GOAL_MFU for r in results),
                      "runs": [{k: r.get(k) for k in keys} for r in results]}))
    return 0 if ok else 1


def one_run(name: str, batch: int, root: Path, args, peak: float | None) -> dict:
    """Pretrain `name` at micro-batch `batch` for warmup + steps; what its metrics.jsonl says, checked."""
    import torch

    from plmcli import api
    from plmcli.config import override_layers
    from plmcli.config import load_recipe
    from plmcli.models.registry import build_model, model_class

    recipe_path = phaseless_recipe(name, root)
    over = run_overrides(name, batch, args)
    recipe = load_recipe(str(recipe_path), over)
    res = {"model": name, "batch": batch, "seq_len": recipe.train.seq_len, "ok": False, "error": None,
           "tok_per_s": None, "loop_mfu": None, "script_mfu": None, "peak_gib": None}
    out = root / f"{name}-b{batch}"
    gc.collect()  # what an earlier run (one that ran out of memory) left behind
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        with attention_kernels(flash_only=not MODELS[name]["mlm"] or args.bert_data == "dynamic"):
            summary = api.pretrain(str(recipe_path), None, str(out),
                                   override_layers(over, {"train.max_steps": args.warmup + args.steps}),
                                   time_budget=args.time_budget)
    except torch.OutOfMemoryError:
        res["error"] = f"out of GPU memory at batch {batch} × {recipe.train.seq_len}: pass --batch {name}={max(1, batch // 2)}"
        return res
    res["wall_s"] = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    cfg = json.loads((out / "config.json").read_text())
    with torch.device("meta"):  # the run's model again, without memory, for its size and FLOPs estimate
        model = build_model(cfg["family"], model_class(cfg["family"]).Config(**cfg["model"]))
    n_params = sum(p.numel() for p in model.parameters())
    fpt_model = model.flops_per_token(recipe.train.seq_len)
    fpt_script = script_flops_per_token(name, recipe)
    try:
        res.update(throughput(rows, args.warmup))
    except ValueError as e:
        res["error"] = f"{e}: raise --time-budget or lower --warmup"
        return res
    res.update(steps=summary["steps"], stop_reason=summary["stop_reason"],
               loop_s=summary["elapsed_s"], params=n_params, vocab=cfg["model"]["vocab_size"],
               tokenizer_vocab=cfg["tokenizer"].get("vocab_size"), fpt_model=fpt_model, fpt_script=fpt_script,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    res["script_mfu"] = fpt_script * res["tok_per_s"] / peak if peak else None
    problems = []
    if torch.cuda.max_memory_allocated() < 4 * n_params:  # fp32 weights alone: the model never reached the GPU
        problems.append(f"only {res['peak_gib']:.2f} GiB of GPU memory was used for {n_params:,} parameters: the run was not on the GPU")
    if peak and res["loop_mfu"] is None:
        problems.append("the loop logged no MFU: it did not train on the CUDA device")
    if not all(math.isfinite(r["loss"]) for r in rows if "loss" in r):
        problems.append("a logged loss is not finite")
    if res["timed_steps"] < args.steps and summary["stop_reason"] == "time_budget":  # measured, on fewer steps
        res["note"] = f"--time-budget {args.time_budget:g} s ended the run after {res['timed_steps']} of {args.steps} timed steps"
    res["error"] = "; ".join(problems) or None
    res["ok"] = not problems
    return res


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def summary_line(r: dict) -> str:
    if r["tok_per_s"] is None:
        return f"{r['model']} batch {r['batch']}: FAILED: {r['error']}"
    line = (f"{r['model']} {r['batch']} × {r['seq_len']}: {r['tok_per_s']:,.0f} tok/s over {r['timed_steps']} steps, MFU "
            f"{_pct(r['script_mfu'])} (loop: {_pct(r['loop_mfu'])}), loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}, "
            f"peak memory {r['peak_gib']:.1f} GiB")
    if r.get("note"):
        line += f"; note: {r['note']}"
    return line + (f"; FAILED: {r['error']}" if r["error"] else "")


def render(args, info: dict, gpu: dict, results: list[dict]) -> str:
    peak = gpu["peak"]
    peak_text = (f"{peak / 1e12:,.0f} TFLOP/s dense bf16 (plmcli.train.peaks.PEAKS)" if peak
                 else "unknown (not in plmcli.train.peaks.PEAKS), so no MFU")
    kernels = (" (and the memory-efficient one: static BERT batches of varying length run unpadded, as jagged "
               "tensors)") if args.bert_data == "static" else ""
    text = f"""
GPU: {gpu['gpu']}, CUDA {gpu['cuda']}; peak for MFU: {peak_text}. Goal: MFU ≥ {100 * GOAL_MFU:.0f}% for both.

Each model pretrains through `plmcli.api.pretrain` on one GPU in bf16 autocast with fused AdamW and SDPA
restricted to the flash kernel{kernels}, {'torch.compile' if args.compile else 'eager (no torch.compile)'},
{args.num_workers} DataLoader workers with pinned memory, one micro-batch per optimizer step, on the sample corpus shipped in `plmcli/corpus/` with
tokenizers trained there. The
models are built at the recipes' vocabularies (30,522 / 50,257): the tokenizers trained on the sample have
fewer tokens, and the unused rows cost the output layer the same FLOPs. BERT data: {args.bert_data}
({DYNAMIC_DATA if args.bert_data == 'dynamic' else STATIC_DATA}).

- **tokens/s** over the {args.steps} steps after a {args.warmup}-step warmup, from the loop's cumulative
  tokens and clock in metrics.jsonl (logged every {args.log_every} steps).
- **MFU** = FLOPs per token × tokens/s / peak, with FLOPs counted matmul by matmul by this script
  (6 per weight per token, attention 12·L·T·d, BERT's MLM head at 15% of the tokens);
  **loop MFU** is the median of what the loop logged per window with the model's own `flops_per_token`.
- **peak memory** is torch.cuda.max_memory_allocated.
"""
    headers = ["model", "batch × tokens", "params", "tokens/s", "MFU", "loop MFU", "FLOPs/token", "loss first → last",
               "peak memory", "wall"]
    rows = [[f"`{r['model']}`", f"{r['batch']} × {r['seq_len']}", f"{r['params'] / 1e6:.1f}M", f"{r['tok_per_s']:,.0f}",
             _pct(r["script_mfu"]), _pct(r["loop_mfu"]), f"{r['fpt_script'] / 1e6:,.0f}M",
             f"{r['loss_first']:.3f} → {r['loss_last']:.3f}", f"{r['peak_gib']:.1f} GiB", f"{r['wall_s']:.0f} s"]
            for r in results]
    return common.section_body("GPU MFU: BERT-base and GPT-2 small in bf16 on one GPU", args, text,
                               common.markdown_table(headers, rows), info)
