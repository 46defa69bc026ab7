"""What every benchmark shares: thread pinning, interleaved repeats, the machine line, BENCHMARKS.md sections."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import statistics
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


def machine_info() -> dict:
    import torch

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
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
    return (f"{i['cpu']}, {i['cores']} cores ({i['threads']} torch threads); Python {i['python']}, "
            f"torch {i['torch']}, transformers {i['transformers']}")


def interleave(runners: dict[str, Callable[[], float]], repeats: int, warmup: int = 1,
               log: Callable[[str], None] = print) -> dict[str, list[float]]:
    """Call each runner `warmup` times (discarded), then A, B, A, B, ... for `repeats` rounds.

    Each call returns one measurement (e.g. tokens/s). Alternating rather than running A's repeats then B's
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
        log(f"repeat {r + 1}/{repeats}: " + "  ".join(f"{n} {s[-1]:,.0f}" for n, s in samples.items()))
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
