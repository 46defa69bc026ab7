"""What every benchmark shares: thread pinning, interleaved repeats, the machine line, BENCHMARKS.md sections."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import re
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = REPO_ROOT / "BENCHMARKS.md"
# Shared data sits next to the checkout, not inside it (it is too big to commit).
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

INTRO = """# Benchmarks

plm side by side with its peers. From the repository root, `python -m benchmarks --help` lists the
benchmarks and `python -m benchmarks NAME --help` shows one benchmark's options. Each benchmark rewrites only
its own section below (between its `bench:NAME` comment markers) with the command, machine and date of the
run, so re-running the recorded command reproduces a section. Throughput is CPU-bound and sensitive to
other load: sections marked *Preliminary* were measured on a shared machine.
"""


def given(keys: dict) -> dict:
    """Config keys given a value, as an override layer (None: left to the config's default)."""
    return {k: v for k, v in keys.items() if v is not None}


def set_threads(n: int) -> None:
    """Pin torch's intra-op threads so both sides of a comparison get the same CPU budget."""
    import torch

    torch.set_num_threads(n)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Flags that decide how fast a large matmul can go: vector width, then bf16 dot-product units (AVX512-BF16)
# and tiles (AMX). The machine kind changes between runs (an Intel Xeon with AMX, an AMD EPYC with
# AVX512-BF16), so every figure is recorded with them.
PEAK_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The PEAK_FLAGS the CPU has (from /proc/cpuinfo, or the text given), in PEAK_FLAGS order."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [f for f in PEAK_FLAGS if f in have]
    return []


def has_bf16_units(flags: list[str]) -> bool:
    """bf16 matmuls run natively (AVX512-BF16 dot products or AMX tiles); elsewhere bf16 is emulated and slower."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def machine_info() -> dict:
    import torch

    info = {"cpu": cpu_model(), "flags": cpu_flags(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = "not installed"
    return info


def machine_line(info: dict | None = None) -> str:
    i = info or machine_info()
    flags = " ".join(i.get("flags", [])) or "none of " + "/".join(PEAK_FLAGS)
    return (f"{i['cpu']} (flags: {flags}), {i['cores']} cores ({i['threads']} torch threads); Python {i['python']}, "
            f"torch {i['torch']}, transformers {i['transformers']}")


def interleave(runners: dict[str, Callable[[], float]], repeats: int, warmup: int = 1,
               log: Callable[[str], None] = print, fmt: str = "{:,.0f}") -> dict[str, list[float]]:
    """Call each runner `warmup` times (discarded), then A, B, A, B, ... for `repeats` rounds.

    Each call returns one measurement (e.g. tokens/s), logged with `fmt`. Alternating rather than running A's repeats then B's
    means slow drift on a shared machine (another job, thermal throttling) hits both sides alike.
    """
    for name, fn in runners.items():
        for _ in range(warmup):
            fn()
        log(f"warmed up {name}")
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(repeats):
        for name, fn in runners.items():
            samples[name].append(fn())
        log(f"repeat {r + 1}/{repeats}: " + "  ".join(f"{n} {fmt.format(s[-1])}" for n, s in samples.items()))
    return samples


def summary(values: list[float]) -> dict:
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"median": med, "min": lo, "max": hi, "spread": (hi - lo) / med if med else float("nan")}


def timed(fn: Callable[[], object], n: int) -> float:
    """Seconds for n calls of fn."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line(argv: list[str]) -> str:
    return "python -m benchmarks " + shlex.join(argv)


def section_body(title: str, args, text: str, table: str, info: dict | None = None) -> str:
    """A section's Markdown: title, how it was produced, the prose, the table."""
    info = info or machine_info()
    parts = [f"## {title}", ""]
    if getattr(args, "preliminary", False):
        parts += ["**Preliminary:** measured on a machine shared with other jobs, so the timings are noisy; "
                  "re-run the command below on a quiet machine for final figures.", ""]
    parts += [f"- Command: `{command_line(args.argv)}`", f"- Machine: {machine_line(info)}",
              f"- Date: {info['date']}", "", text.strip(), "", table]
    return "\n".join(parts)


def write_section(name: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the `<!-- bench:NAME -->` ... `<!-- /bench:NAME -->` block in `path` (append it if absent)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.is_file() else INTRO
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a crash mid-write never leaves a truncated BENCHMARKS.md


def publish(name: str, body: str, args) -> None:
    print("\n" + body + "\n")
    if getattr(args, "no_write", False):
        print("(--no-write: BENCHMARKS.md left alone)")
        return
    write_section(name, body)
    print(f"wrote section '{name}' of {BENCHMARKS_MD}")


# ---------------------------------------------------------------- shared by several benchmarks


def shared_or_sample(relative: str, sample: Path) -> Path:
    """SHARED_DATA/relative when present, else `sample` (shipped with the repo), so every benchmark also
    runs, at toy size, on a machine without the shared data."""
    path = SHARED_DATA / relative
    return path if path.exists() else sample


def ptb_wikitext_text() -> tuple[str, str]:
    """(text, what it is): PTB train/valid/test, every 8 lines one document (PTB has no document breaks),
    then WikiText-2 raw valid as it is (its blank lines separate paragraphs); the shipped sample corpus
    when the shared data is absent."""
    ptb = [SHARED_DATA / "ptb" / f"ptb.{s}.txt" for s in ("train", "valid", "test")]
    wiki = SHARED_DATA / "wikitext-2-raw" / "wiki.valid.raw"
    if not all(p.is_file() for p in ptb + [wiki]):
        from plmcli.api import default_corpus

        src = Path(default_corpus())
        return src.read_text(encoding="utf-8"), f"the shipped sample corpus `{src.name}`"
    lines = [x for p in ptb for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]
    docs = ["\n".join(lines[i : i + 8]) for i in range(0, len(lines), 8)]
    text = "\n\n".join(docs) + "\n\n" + wiki.read_text(encoding="utf-8")
    return text, "PTB train+valid+test (8 lines a document) + WikiText-2 raw valid"


def hf_fast_tokenizer(tokenizer_json: str | Path, special_tokens: dict):
    """transformers' PreTrainedTokenizerFast over a plm tokenizer.json, with plm's special-token roles
    (role -> token string) as its pad_token / cls_token / ... attributes."""
    from transformers import PreTrainedTokenizerFast

    roles = {f"{r}_token": t for r, t in special_tokens.items() if r in ("pad", "unk", "cls", "sep", "mask", "bos", "eos")}
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), **roles)


def rate_rows(stats: dict[str, dict], baseline: str, unit_fmt: str = "{:,.0f}", extra: dict | None = None) -> list[list]:
    """Table rows [side, median, min–max, × baseline, *extra[side]] from `summary` stats of rates (higher = better)."""
    base = stats[baseline]["median"]
    rows = []
    for name, s in stats.items():
        rows.append([name, unit_fmt.format(s["median"]), f"{unit_fmt.format(s['min'])}–{unit_fmt.format(s['max'])}",
                     f"{s['median'] / base:.2f}×", *((extra or {}).get(name, []))])
    return rows


def child_env(threads: int | None = None, **extra: str) -> dict:
    """Environment for a benchmark's subprocess: this checkout's plmcli first on the path, offline HF
    libraries, no progress bars, and (with `threads`) the same thread budget for torch/OpenMP and the
    tokenizers' Rust pool as the parent gives torch."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads))
    env.update(extra)
    return env


def run_worker(module: str, payload: dict, env: dict) -> dict:
    """Run `module.worker(payload)` in a fresh interpreter and return the dict it returns (sent back as
    JSON on the last line of stdout): each measurement starts from a clean process, so one side's thread
    pools, caches or forked workers cannot change the next side's conditions."""
    import json
    import subprocess
    import sys

    code = f"import json, sys; from {module} import worker; print(json.dumps(worker(json.loads(sys.argv[1]))))"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(payload)], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{module} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shown(path: str | Path) -> str:
    """`path` as a reader re-running from the repository root would write it (data/..., ../shared/data/...)."""
    p = Path(path).absolute()  # not resolve(): a symlinked path keeps the name the user gave
    for base, prefix in ((REPO_ROOT, ""), (REPO_ROOT.parent, "../")):
        if p.is_relative_to(base):
            return prefix + str(p.relative_to(base))
    return str(path)


@contextlib.contextmanager
def isolated_workdir(prefix: str, keep: Path | None = None):
    """A work dir (temporary unless `keep`) that also holds the runs, runs/latest and the corpus cache
    (PLM_RUNS / PLM_CACHE), so a benchmark leaves nothing behind in the user's plm directories."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(keep) if keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        saved = {k: os.environ.get(k) for k in ("PLM_RUNS", "PLM_CACHE")}
        os.environ["PLM_RUNS"], os.environ["PLM_CACHE"] = str(root / "runs"), str(root / "cache")
        try:
            yield root
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# ---------------------------------------------------------------- distance from the machine's limit


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) product: one multiply and one add per term."""
    return 2 * m * k * n


def add_limit_arguments(p) -> None:
    """The GEMM probe's options, shared by the step benchmarks."""
    p.add_argument("--gemm-size", type=int, default=2048,
                   help="the probe multiplies two N×N matrices (large enough to run at the CPU's matmul peak)")
    p.add_argument("--gemm-calls", type=int, default=3, help="matmuls per probe sample (one sample per repeat)")


def gemm_runner(dtype: str, size: int, calls: int, seed: int = 0, onednn: bool = False) -> Callable[[], float]:
    """A runner for `interleave`: each call times `calls` (size × size) @ (size × size) matmuls in `dtype`
    ("fp32" / "bf16") at torch's current thread count and returns GFLOP/s. `onednn`: through oneDNN's
    matmul (plm's fp32 linears, plmcli.kernels) instead of torch.mm (MKL's sgemm for fp32; bf16's
    torch.mm is oneDNN already).

    Sampled once per repeat between the step runners, the probe sees the same load as the steps, so the
    share of it a step reaches is a ratio of two medians taken under the same conditions."""
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(size, size, generator=g).to(dt) for _ in range(2))
    flops = calls * matmul_flops(size, size, size)
    if onednn:
        from plmcli.kernels import linear

        b_t = b.t().contiguous()  # linear(a, bᵀ) = a · b

        def product():
            return linear(a, b_t)
    else:
        out = torch.empty(size, size, dtype=dt)

        def product():
            return torch.mm(a, b, out=out)

    def once() -> float:
        return flops / timed(product, calls) / 1e9

    return once


def probe_runners(args, flags: list[str]) -> dict[str, Callable[[], float]]:
    """{"gemm fp32": torch.mm, "gemm fp32-onednn": oneDNN's fp32 matmul (where plm's linears run on it),
    "gemm bf16" (only where the CPU has bf16 units)}.

    Two fp32 probes because the CPU's fp32 limit depends on the library: on an AMD EPYC (Zen 4) oneDNN's
    2048² product runs at 206–212 GFLOP/s and MKL's at 182–185; the steps are set against both."""
    from plmcli.kernels import onednn_enabled

    runners = {"gemm fp32": gemm_runner("fp32", args.gemm_size, args.gemm_calls)}
    if onednn_enabled():
        runners["gemm fp32-onednn"] = gemm_runner("fp32", args.gemm_size, args.gemm_calls, onednn=True)
    if has_bf16_units(flags):
        runners["gemm bf16"] = gemm_runner("bf16", args.gemm_size, args.gemm_calls)
    return runners


def achieved_gflops(tokens_per_s: float, flops_per_token: float) -> float:
    """The step's training FLOPs per token times tokens/s, in GFLOP/s."""
    return tokens_per_s * flops_per_token / 1e9


def limit_columns(tokens_per_s: float, flops_per_token: float, peaks: dict[str, float]) -> list[str]:
    """Table cells: achieved GFLOP/s, then its share of each probe in `peaks` ({"fp32": GFLOP/s, ...})."""
    achieved = achieved_gflops(tokens_per_s, flops_per_token)
    return [f"{achieved:.1f}", *(f"{100 * achieved / peak:.0f}%" for peak in peaks.values())]


def limit_headers(peaks: dict[str, float]) -> list[str]:
    return ["GFLOP/s (median)", *(f"% of {k} GEMM" for k in peaks)]


def probe_line(stats: dict[str, dict], flags: list[str], size: int) -> str:
    """One sentence of the probe's medians (and 'bf16: none' where the CPU has no bf16 units)."""
    parts = [f"{name.split()[-1]} {s['median']:,.1f} GFLOP/s (min–max {s['min']:,.1f}–{s['max']:,.1f})"
             for name, s in stats.items() if name.startswith("gemm ")]
    if not has_bf16_units(flags):
        parts.append("bf16 none (no avx512_bf16 / amx_bf16: bf16 matmuls are emulated)")
    return (f"Large-GEMM probe ({size}×{size} @ {size}×{size}, one sample per repeat, same process and threads; fp32 is "
            "torch.mm (MKL), fp32-onednn oneDNN's matmul, which plm's fp32 linears run on): " + "; ".join(parts) + ".")


def fp32_peaks(peaks: dict[str, float]) -> dict[str, float]:
    """The fp32 probes of `peaks` (MKL's and oneDNN's): an fp32 step's limits."""
    return {k: v for k, v in peaks.items() if k.startswith("fp32")}


def split_probes(stats: dict[str, dict]) -> tuple[dict[str, dict], dict[str, float]]:
    """(the step sides' stats, {"fp32": median GFLOP/s, "bf16": ...}) from `interleave`'s summaries."""
    sides = {k: v for k, v in stats.items() if not k.startswith("gemm ")}
    peaks = {k.split()[-1]: v["median"] for k, v in stats.items() if k.startswith("gemm ")}
    return sides, peaks


# ---------------------------------------------------------------- profiles


def add_profile_arguments(p) -> None:
    p.add_argument("--profile", action="store_true",
                   help="also profile each side's step: top ops by self CPU time, printed and written into the section")
    p.add_argument("--profile-steps", type=int, default=3, help="steps to profile per side")
    p.add_argument("--profile-rows", type=int, default=12, help="ops to show per profile")


def profile_ops(step: Callable[[], object], steps: int) -> list[tuple[str, float, float]]:
    """[(op, self CPU ms per step, share of the profiled self time)] of `steps` calls of `step`, largest first."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    rows = [(e.key, e.self_cpu_time_total / 1000 / steps) for e in prof.key_averages()]
    total = sum(ms for _, ms in rows) or 1.0
    return sorted(((k, ms, ms / total) for k, ms in rows), key=lambda r: -r[1])


def profile_table(profiles: dict[str, list[tuple[str, float, float]]], rows: int) -> str:
    """Markdown: for each side, its top `rows` ops as 'op share (ms/step)'."""
    lines = []
    for name, ops in profiles.items():
        total = sum(ms for _, ms, _ in ops)
        matmuls = sum(share for op, _, share in ops if op in MATMUL_OPS)
        top = ", ".join(f"`{op}` {100 * share:.0f}% ({ms:.0f} ms)" for op, ms, share in ops[:rows])
        lines.append(f"- **{name}** ({total:.0f} ms/step of op self time, {100 * matmuls:.0f}% in matmuls): {top}")
    return "\n".join(lines)


# The ops that run at the GEMM probe's speed at best; everything else is time a step spends below it.
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
                        "mkldnn::_linear_pointwise",  # plm's fp32 linears (plmcli.kernels)
                        "aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})


def wikitext_articles(path: Path) -> list[str]:
    """WikiText-2 raw text as one document per article: a new one at each top-level `= Title =` heading, the
    section headings themselves dropped, an article's lines kept as its sentences."""
    docs: list[str] = []
    article: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if s.startswith("= ") and not s.startswith("= = ") and article:
            docs.append("\n".join(article))
            article = []
        if s and not s.startswith("="):
            article.append(s)
    if article:
        docs.append("\n".join(article))
    return docs


def tiny_corpus(path: Path, n_docs: int = 30) -> Path:
    """A tiny corpus of 30 three-line documents that trains in a second or two (tests, CPU smoke runs)."""
    words = "the cat sat on a mat while dogs ran far away from home and back again".split()
    docs = []
    for d in range(n_docs):
        lines = [" ".join(words[(d + i + j) % len(words)] for j in range(6 + i % 3)) for i in range(3)]
        docs.append("\n".join(lines))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a launcher's rendezvous (torchrun, accelerate launch)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
