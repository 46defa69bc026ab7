"""The shape of plmcli: imports point down the declared layers, no import cycle, models stay leaf-ward,
no private name crosses a module, no capability probe outside models/base.py, short functions and files.

Every .py under plmcli/ is parsed (ast), so imports inside functions (the lazy ones that keep `plm --help`
fast) count the same as those at the top. Each failure names file:line.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import plmcli

ROOT = Path(plmcli.__file__).resolve().parent

LAYERS = (
    ("cli", "__main__"),
    ("api",),
    ("pipelines",),
    ("train", "eval", "generate", "interop", "analysis"),
    # recipe_params serves api and the progress bar's "a smaller recipe" hint in train/, and needs only
    # config, data.store and models.registry: a service beside the run directory, under train/.
    ("runs", "recipe_params"),
    ("objectives",),
    ("models", "data"),
    ("kernels",),  # CPU kernels behind one switch: torch and numpy only, called by models and objectives
    ("config",),
    ("config_sections", "config_schema", "errors", "registry_util", "__init__"),
)
"""Top to bottom: a module imports its own layer or one below. Same-layer imports (a package's own
modules, analysis -> train, data -> models) are allowed where they make no cycle (test_no_import_cycle)."""

LAYER_OF_MODULE = {
    # The registries are name -> "module:attr" tables that import registry_util alone and resolve a class
    # only when called: config validates a recipe's model and objective sections through them.
    "plmcli.models.registry": "registry_util",
    "plmcli.objectives.registry": "registry_util",
}
"""Modules whose layer is not their package's."""

MODELS_MUST_NOT_IMPORT = ("eval", "objectives", "train", "api", "cli", "interop", "runs", "pipelines", "analysis")

MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600

_MODEL_SECTION = "a model config section (a dataclass, not a model): the fields differ by family"
PROBE_ALLOWED = {
    # (path under plmcli/, attribute): why this getattr/hasattr is no capability check on a model
    ("config.py", "CSafeLoader"): "libyaml's C loader is optional in PyYAML builds",
    ("config_schema.py", "holds"): "Annotated[...] metadata: only constraint objects have .holds",
    ("config_schema.py", "value"): "an ast node read while collecting attribute docstrings",
    ("data/text.py", "buffer"): "sys.stdin may be a text-only stream (test runners, notebooks)",
    ("train/distributed.py", "accelerator"): "torch.accelerator exists from torch 2.6 on",
    ("train/distributed.py", "fsdp_plugin"): "older accelerate AcceleratorState has no fsdp_plugin",
    ("pipelines/pretrain.py", "max_positions"): _MODEL_SECTION,
}

# ---------------------------------------------------------------- violations in files other helpers own
# models/, eval/, objectives/ (scoring), config.py and pipelines/finetune.py (finetune config) are being
# reworked on other branches. Their violations are listed here, by check, so this branch's test passes;
# the lead empties these lists after merging (an entry that no longer matches anything fails the test).

KNOWN_UPWARD: set[tuple[str, str]] = set()  # (importer, imported module)
KNOWN_MODELS_IMPORTS = {(f, m) for f, m in KNOWN_UPWARD if f.startswith("models/")}
KNOWN_CYCLES: set[frozenset[str]] = set()  # the modules of each cycle
KNOWN_PRIVATE: set[tuple[str, str]] = set()  # (importer, name)
KNOWN_PROBES: set[tuple[str, str]] = set()  # (path, attribute)
KNOWN_LONG_FUNCTIONS: set[tuple[str, str]] = set()  # (path, function)
KNOWN_LONG_FILES: set[str] = set()


# ---------------------------------------------------------------- the parsed package


def _module_name(path: Path) -> str:
    parts = ["plmcli", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def sources() -> dict[str, tuple[str, ast.Module, int]]:
    """{module name: (path under plmcli/, tree, line count)} for every .py of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        out[_module_name(path)] = (path.relative_to(ROOT).as_posix(), ast.parse(text, str(path)), len(text.splitlines()))
    return out


def _package_of(module: str, rel: str) -> str:
    return module if rel.endswith("__init__.py") else module.rpartition(".")[0]


@functools.cache
def imports() -> list[tuple[str, str, int, str, str | None]]:
    """Every plmcli import, lazy ones included: (importer, imported module, line, importer's path, name).

    `from pkg import sub` where pkg.sub is a module imports that module; `from mod import name` imports mod
    (name is the imported name, None for `import mod`)."""
    mods, out = sources(), []
    for module, (rel, tree, _) in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [(module, a.name, node.lineno, rel, None) for a in node.names if a.name.split(".")[0] == "plmcli"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _package_of(module, rel).split(".")
                    base = base[: len(base) - node.level + 1]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                if src.split(".")[0] != "plmcli":
                    continue
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    out.append((module, sub if sub in mods else src, node.lineno, rel, None if sub in mods else a.name))
    return out


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> str:
    return LAYER_OF_MODULE.get(module, _top(module))


def _rank(module: str) -> int:
    top = _layer(module)
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: plmcli.{top} has no layer in tests/test_layering.py LAYERS — declare it")


def _report(problems: list[str], what: str):
    assert not problems, f"{len(problems)} {what}:\n  " + "\n  ".join(sorted(problems))


def _stale(known: set, found: set, name: str):
    stale = known - found
    assert not stale, f"{name} lists what no longer happens (fixed — remove it): {sorted(map(str, stale))}"


# ---------------------------------------------------------------- (a) (c) imports point down


def test_every_module_has_a_layer():
    for module in sources():
        _rank(module)
    assert not LAYER_OF_MODULE.keys() - sources().keys(), "LAYER_OF_MODULE names a module that is gone"


def test_imports_point_down():
    problems, seen = [], set()
    for importer, target, line, rel, _ in imports():
        if target in sources() and _rank(target) < _rank(importer):
            seen.add((rel, target))
            if (rel, target) not in KNOWN_UPWARD:
                problems.append(f"plmcli/{rel}:{line}: {importer} ({_layer(importer)}) imports {target} ({_layer(target)}), a layer above it")
    _report(problems, "imports point up the layers (cli → api → pipelines → train/eval/generate/interop/analysis → "
                      "runs → objectives → models/data → config → errors)")
    _stale(KNOWN_UPWARD, seen, "KNOWN_UPWARD")


def test_models_import_nothing_above_them():
    problems, seen = [], set()
    for importer, target, line, rel, _ in imports():
        if _top(importer) == "models" and _top(target) in MODELS_MUST_NOT_IMPORT:
            seen.add((rel, target))
            if (rel, target) not in KNOWN_MODELS_IMPORTS:
                problems.append(f"plmcli/{rel}:{line}: a model module imports {target}")
    _report(problems, "models/ imports of eval/objectives/train/api/cli/interop/runs/pipelines/analysis")
    _stale(KNOWN_MODELS_IMPORTS, seen, "KNOWN_MODELS_IMPORTS")


# ---------------------------------------------------------------- (b) no cycle


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), or a self-import."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in edges.get(v, ()):
                    found.append(sorted(comp))
    return found


def test_no_import_cycle():
    edges, where = {m: set() for m in sources()}, {}
    for importer, target, line, rel, _ in imports():
        if target in edges:
            edges[importer].add(target)
            where.setdefault((importer, target), f"plmcli/{rel}:{line}")
    problems, seen = [], set()
    for comp in _cycles(edges):
        seen.add(frozenset(comp))
        if frozenset(comp) not in KNOWN_CYCLES:
            inner = [f"{where[a, b]} ({a} -> {b})" for a in comp for b in sorted(edges[a]) if b in comp]
            problems.append(f"cycle among {', '.join(comp)}: " + "; ".join(inner))
    _report(problems, "import cycles (lazy imports included)")
    _stale(KNOWN_CYCLES, seen, "KNOWN_CYCLES")


# ---------------------------------------------------------------- (d) private names stay home


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module_outside(target: str, importer: str) -> str | None:
    """The first private component of `target` whose package `importer` is not in (`plmcli.cli._common`
    is for plmcli.cli's own modules)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        owner = ".".join(parts[:i])
        if _private(part) and not (importer == owner or importer.startswith(owner + ".")):
            return ".".join(parts[: i + 1])
    return None


def _private_attribute_reads(module: str, tree: ast.Module):
    """`alias._name` where alias names a plmcli module (`import plmcli.x as alias`, `from plmcli import x`)."""
    mods, aliases = sources(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if _private(node.attr) and aliases[node.value.id] != module:
                yield node.lineno, f"{aliases[node.value.id]}.{node.attr}"


def test_no_private_name_crosses_a_module():
    problems, seen = [], set()

    def flag(rel, line, name, text):
        seen.add((rel, name))
        if (rel, name) not in KNOWN_PRIVATE:
            problems.append(f"plmcli/{rel}:{line}: {text}")

    for importer, target, line, rel, name in imports():
        if name is not None and _private(name) and target != importer:
            flag(rel, line, name, f"imports private {name} from {target} — make it public or move it")
        hidden = _private_module_outside(target, importer)
        if hidden:
            flag(rel, line, hidden, f"imports {target}, private to {hidden.rpartition('.')[0]}")
    for module, (rel, tree, _) in sources().items():
        for line, dotted in _private_attribute_reads(module, tree):
            flag(rel, line, dotted.rpartition(".")[2], f"reads private {dotted}")
    _report(problems, "private names used outside their module")
    _stale(KNOWN_PRIVATE, seen, "KNOWN_PRIVATE")


# ---------------------------------------------------------------- (e) capabilities are declared, not probed


def test_no_capability_probe_outside_models_base():
    """getattr/hasattr with a literal attribute name asks an object what it can do; for a model that is
    `model.traits.<x>` or `isinstance(model, <Protocol from models/base.py>)`."""
    problems, seen = [], set()
    for module, (rel, tree, _) in sources().items():
        if rel == "models/base.py":
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                key = (rel, node.args[1].value)
                if key in PROBE_ALLOWED:
                    continue
                seen.add(key)
                if key not in KNOWN_PROBES:
                    problems.append(f"plmcli/{rel}:{node.lineno}: {node.func.id}(…, {node.args[1].value!r}) — read model.traits or "
                                    "isinstance(model, <Protocol in models/base.py>); a non-model use goes in PROBE_ALLOWED with its reason")
    _report(problems, "getattr/hasattr capability probes outside plmcli/models/base.py")
    _stale(KNOWN_PROBES, seen, "KNOWN_PROBES")


def test_probe_allowlist_is_short_and_used():
    assert len(PROBE_ALLOWED) <= 12, "PROBE_ALLOWED is for a few non-capability uses, not a way around the rule"
    used = {(rel, node.args[1].value) for _, (rel, tree, _) in sources().items() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)}
    assert not PROBE_ALLOWED.keys() - used, f"PROBE_ALLOWED entries with no call left: {sorted(PROBE_ALLOWED.keys() - used)}"


# ---------------------------------------------------------------- (f) (g) sizes


def test_functions_are_short():
    problems, seen = [], set()
    for module, (rel, tree, _) in sources().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    seen.add((rel, node.name))
                    if (rel, node.name) not in KNOWN_LONG_FUNCTIONS:
                        problems.append(f"plmcli/{rel}:{node.lineno}: {node.name} is {n} lines (max {MAX_FUNCTION_LINES}) — split it into named steps")
    _report(problems, "functions too long")
    _stale(KNOWN_LONG_FUNCTIONS, seen, "KNOWN_LONG_FUNCTIONS")


def test_files_are_short():
    problems, seen = [], set()
    for module, (rel, _, n) in sources().items():
        if n > MAX_FILE_LINES:
            seen.add(rel)
            if rel not in KNOWN_LONG_FILES:
                problems.append(f"plmcli/{rel}:1: {n} lines (max {MAX_FILE_LINES})")
    _report(problems, "files too long")
    _stale(KNOWN_LONG_FILES, seen, "KNOWN_LONG_FILES")


# ---------------------------------------------------------------- the checker checks


@pytest.mark.parametrize("edges, cycles", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"a"}}, [["a"]]),
])
def test_cycle_finder(edges, cycles):
    assert _cycles(edges) == cycles


def test_private_module_rule():
    assert _private_module_outside("plmcli.cli._common", "plmcli.cli.data") is None
    assert _private_module_outside("plmcli.cli._common", "plmcli.api") == "plmcli.cli._common"
