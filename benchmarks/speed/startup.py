"""CLI start-up: wall time of `plm --help`, `plm recipes` and `import plmcli.cli` in fresh processes, and
which heavy libraries each one imports (from `python -X importtime`).

`plm --help` should answer at once: the CLI imports torch, datasets and transformers only inside the
commands that need them (plmcli/cli.py). The console script itself is timed (the file pip installed
next to this Python), not a version manager's shim in front of it, which adds its own start-up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from benchmarks import common

NAME = "startup"
HELP = "wall time of plm --help, plm recipes and `import plmcli.cli` in fresh processes; heavy imports, importtime top"
DEFAULTS = {"repeats": 10}  # the shared options it takes (benchmarks/__main__.py), its defaults
GOAL_S = 1.0
HEAVY = ("torch", "transformers", "datasets", "accelerate", "numpy", "pyarrow", "pandas", "tokenizers", "safetensors",
         "scipy", "sklearn", "matplotlib", "jieba", "rich", "yaml")
"""Top-level packages worth naming when a command imports them (the first three must stay out of --help)."""
MUST_NOT = ("torch", "datasets", "transformers")


def add_arguments(p) -> None:
    p.add_argument("--top", type=int, default=12, help="importtime entries to list per command")


def plm_command() -> list[str]:
    """The installed `plm` console script of this Python (else `python -m plmcli`)."""
    script = Path(sysconfig.get_path("scripts")) / "plm"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "plmcli"]


def parse_importtime(stderr: str) -> list[dict]:
    """`python -X importtime` lines -> [{"name", "self_us", "cumulative_us", "depth"}] in import order.

    depth 0 = imported by the program itself (or lazily, inside a function) rather than by another
    module's import; summing their cumulative times gives the whole import cost, each module once.
    """
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3:
            continue
        field = parts[2].rstrip()
        depth = (len(field) - len(field.lstrip()) - 1) // 2
        rows.append({"name": field.strip(), "self_us": int(parts[0]), "cumulative_us": int(parts[1]), "depth": depth})
    return rows


def top_level(rows: list[dict], n: int) -> list[dict]:
    """The n costliest depth-0 imports by cumulative time."""
    return sorted((r for r in rows if r["depth"] == 0), key=lambda r: -r["cumulative_us"])[:n]


def _imported_packages(argv: list[str], env: dict) -> list[str]:
    """The HEAVY packages in sys.modules after `plm ARGV` ran to completion (in one fresh process)."""
    code = ("import json, sys\nsys.argv = ['plm'] + json.loads(sys.argv[1])\nfrom plmcli.cli import app\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], env=env, cwd=common.REPO_ROOT,
                          capture_output=True, text=True)
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    return [m for m in HEAVY if m in loaded]


def _importtime(args_: list[str], env: dict) -> list[dict]:
    proc = subprocess.run([sys.executable, "-X", "importtime", *args_], env=env, cwd=common.REPO_ROOT,
                          capture_output=True, text=True)
    return parse_importtime(proc.stderr)


def worker(_job: dict) -> dict:
    """`plm recipes`' work in stages, each timed in one fresh process (seconds): what the wall time is made of."""
    from importlib import import_module

    t = [time.perf_counter()]
    import_module("plmcli.cli")
    t.append(time.perf_counter())
    import_module("torch")
    t.append(time.perf_counter())
    from plmcli.config import load_recipe, shipped_recipes
    from plmcli.models.registry import FAMILIES, model_class

    for family in FAMILIES:  # what validating the recipes' model sections imports
        model_class(family)
    t.append(time.perf_counter())
    recipes = [load_recipe(n) for n in shipped_recipes()]
    t.append(time.perf_counter())
    # count_params initialises each model on the meta device; torch's meta path for nn.init imports torch._dynamo
    import_module("torch._dynamo")
    t.append(time.perf_counter())
    from plmcli.api import count_params

    for r in recipes:
        count_params(r)
    t.append(time.perf_counter())
    names = ["import plmcli.cli", "import torch", "import the model modules (recipe validation resolves each family's Config)",
             f"load and validate the {len(recipes)} shipped recipes (YAML, extends)",
             "import torch._dynamo (nn.init on the meta device goes through torch._refs → torch._compile)",
             f"count_params: build {len(recipes)} models on the meta device"]
    return {n: b - a for n, a, b in zip(names, t, t[1:])}


def run(args) -> int:
    info = common.machine_info()
    env = common.child_env(args.threads)
    plm = plm_command()
    commands = {
        "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
        'python -c "import plmcli.cli"': [sys.executable, "-c", "import plmcli.cli"],
        "plm --help": plm + ["--help"],
        "plm recipes": plm + ["recipes"],
    }
    on_path = shutil.which("plm")
    if on_path and Path(on_path).resolve() != Path(plm[0]).resolve():
        commands[f"plm --help via PATH ({on_path})"] = [on_path, "--help"]

    def runner(cmd):
        def once() -> float:
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, cwd=common.REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=True)
            return 1000 * (time.perf_counter() - t0)  # ms
        return once

    print(f"{common.machine_line(info)}\nconsole script: {' '.join(plm)}")
    samples = common.interleave({k: runner(c) for k, c in commands.items()}, args.repeats, 1, fmt="{:,.0f} ms")
    stats = {k: common.summary(v) for k, v in samples.items()}

    heavy = {"plm --help": _imported_packages(["--help"], env), "plm recipes": _imported_packages(["recipes"], env)}
    profiles = {'python -X importtime -c "import plmcli.cli"': _importtime(["-c", "import plmcli.cli"], env),
                "python -X importtime -m plmcli recipes": _importtime(["-m", "plmcli", "recipes"], env)}

    stages = common.run_worker("benchmarks.speed.startup", {}, env)
    stage_rows = [[k, f"{1000 * v:,.0f}"] for k, v in stages.items()]
    stage_rows.append(["**total (after the interpreter's start)**", f"**{1000 * sum(stages.values()):,.0f}**"])

    rows = []
    for name, s in stats.items():
        verdict = "" if "pass" in name or "PATH" in name else ("yes" if s["median"] < 1000 * GOAL_S else "**no**")
        rows.append([name, f"{s['median']:,.0f}", f"{s['min']:,.0f}–{s['max']:,.0f}", verdict,
                     ", ".join(heavy.get(name, [])) if name in heavy else ""])
    table = common.markdown_table(["command", "wall ms (median)", "min–max", f"< {GOAL_S:g} s?", "heavy packages imported"],
                                  rows)
    leaks = [m for m in MUST_NOT if m in heavy["plm --help"]]
    sections = []
    for title, prof in profiles.items():
        total = sum(r["cumulative_us"] for r in prof if r["depth"] == 0)
        top = top_level(prof, args.top)
        prof_rows = [[f"`{r['name']}`", f"{r['cumulative_us'] / 1000:,.0f}", f"{r['self_us'] / 1000:,.1f}",
                      f"{r['cumulative_us'] / max(total, 1):.0%}"] for r in top]
        sections.append(f"`{title}`: {total / 1000:,.0f} ms of imports in all; the costliest top-level imports:\n\n"
                        + common.markdown_table(["module", "cumulative ms", "self ms", "share"], prof_rows))
    recipes_imports = sum(r["cumulative_us"] for r in profiles["python -X importtime -m plmcli recipes"]
                          if r["depth"] == 0) / 1000
    rest = stats["plm recipes"]["median"] - stats["python -c pass (the interpreter alone)"]["median"] - recipes_imports
    text = f"""
Each command runs {args.repeats} times in a fresh process (after one untimed run each, interleaved), output
discarded; wall time from start to exit. `plm` is the console script `{plm[0]}`. Heavy packages: those of
{", ".join(HEAVY)} found in `sys.modules` after the command ran in-process (`app()` with the same
arguments). `--help` imports torch/datasets/transformers: **{"none — as intended" if not leaks else ", ".join(leaks)}**.
Goal: each plm command < {GOAL_S:g} s.

`plm recipes` = the interpreter ({stats["python -c pass (the interpreter alone)"]["median"]:,.0f} ms) + imports
({recipes_imports:,.0f} ms under importtime, which inflates them a little) + the rest, ≈ {rest:,.0f} ms: reading
the shipped YAML files and the parameter table `plmcli/recipes/params.json` (kept true by a test that
builds every recipe; a recipe whose model section changed since is recounted). No torch, no model built.

What the profile showed first, and why listing no longer works this way: validating every recipe and
building each model on the meta device to count its parameters (`count_params`), timed in stages in one
fresh process (each stage's imports are only what the earlier stages left to import):
"""
    stage_table = common.markdown_table(["stage of the old `plm recipes` (validate + build every model)", "ms"],
                                        stage_rows)
    body = common.section_body("CLI start-up time", args, text + "\n" + stage_table,
                               "\n\n".join([table, *sections]), info)
    common.publish(NAME, body, args)
    return 0
