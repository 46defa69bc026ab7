"""Optional features and their extras: with the package missing, each feature stops with one PlmError line naming
the extra that installs it (plmcli.errors.needs), and errors.EXTRAS agrees with pyproject's extras."""

import ast
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plmcli.errors import EXTRAS, PlmError, needs

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]
META = {"all", "test", "peers"}
"""Extras that gather others (all, test) or serve the benchmarks (peers): no feature's package of their own."""
MODULE_OF = {"mlflow-skinny": "mlflow"}
"""Distributions whose import name is not their name with - as _."""


def hide(monkeypatch, package: str) -> None:
    """Make `import package` (and of any of its submodules, loaded or not) raise ImportError, as when it is not
    installed: None in sys.modules halts the import."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def clear_caches(*modules) -> None:
    """Forget what the modules' functools caches hold (an import done before the package was hidden)."""
    for module in modules:
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def assert_one_line(e: PlmError, package: str, extra: str) -> None:
    text = str(e)
    assert "\n" not in text
    assert f"needs {package}, which is not installed" in e.message
    assert e.hint == f"pip install 'plm[{extra}]'"


def requirement_name(req: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", req).group(0).lower().replace("_", "-")


# ---------------------------------------------------------------- each feature with its package missing


def test_needs_returns_the_module_or_one_line():
    assert needs("json.decoder", "zh", "x") is sys.modules["json.decoder"]
    with pytest.raises(PlmError) as e:
        needs("plm_no_such_package.sub", "lora", "LoRA finetuning")
    assert str(e.value) == "LoRA finetuning needs plm_no_such_package, which is not installed — pip install 'plm[lora]'"


def test_chinese_segmentation_without_jieba(monkeypatch):
    from plmcli.data import knowledge, masking

    hide(monkeypatch, "jieba")
    clear_caches(masking, knowledge)
    with pytest.raises(PlmError) as e:
        masking.jieba_word_spans("我们在北京")
    assert_one_line(e.value, "jieba", "zh")
    assert "Chinese word segmentation" in e.value.message
    with pytest.raises(PlmError) as e:
        knowledge.tag("我们在北京")  # ERNIE's units: jieba's part-of-speech tagger
    assert_one_line(e.value, "jieba", "zh")
    with pytest.raises(PlmError) as e:
        knowledge.units_key("phrases")
    assert_one_line(e.value, "jieba", "zh")


def test_thulac_units_without_thulac(monkeypatch):
    from plmcli.data import knowledge

    pytest.importorskip("jieba")
    clear_caches(knowledge)
    hide(monkeypatch, "thulac")
    with pytest.raises(PlmError) as e:
        knowledge.units("我们在北京的希尔顿酒店", "entities-thulac")
    assert_one_line(e.value, "thulac", "zh-ner")
    with pytest.raises(PlmError) as e:
        knowledge.units_key("entities-thulac")  # before any data is built
    assert_one_line(e.value, "thulac", "zh-ner")
    clear_caches(knowledge)


def test_conll_scoring_without_seqeval(monkeypatch):
    from plmcli.data.tasks.conll import Conll2003

    task = Conll2003()
    task.restore({"tags": ["O", "B-LOC", "I-LOC"]})
    hide(monkeypatch, "seqeval")
    with pytest.raises(PlmError) as e:
        task.score([[1, 2, 0]], [[1, 2, 0]])
    assert_one_line(e.value, "seqeval", "tasks")
    assert "CoNLL" in e.value.message


def test_cmrc_scoring_without_nltk(monkeypatch):
    from plmcli.data.tasks import squad

    hide(monkeypatch, "nltk")
    clear_caches(squad)
    with pytest.raises(PlmError) as e:
        squad.cmrc_words("hello world.")
    assert_one_line(e.value, "nltk", "tasks")
    assert "CMRC" in e.value.message
    clear_caches(squad)


def test_plot_without_matplotlib(monkeypatch, tmp_path):
    from plmcli.analysis.plot import plot_runs
    from plmcli.cli import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 - s}) + "\n" for s in (1, 2)))
    hide(monkeypatch, "matplotlib")
    with pytest.raises(PlmError) as e:
        plot_runs([str(run)])
    assert_one_line(e.value, "matplotlib", "plot")
    assert not (run / "plots.png").exists()
    result = CliRunner().invoke(app, ["plot", str(run)])  # the CLI: one `error:` line, exit code 2
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "plm[plot]" in lines[0], result.output


# ---------------------------------------------------------------- the extras agree with pyproject


def test_each_optional_package_is_in_its_extra():
    for module, extra in EXTRAS.items():
        assert extra in OPTIONAL, f"errors.EXTRAS names extra '{extra}' ({module}), which pyproject lacks"
        modules = {MODULE_OF.get(n, n.replace("-", "_")) for n in map(requirement_name, OPTIONAL[extra])}
        assert module in modules, f"pyproject's extra '{extra}' does not install {module}"


def test_each_feature_extra_is_in_errors_extras_and_all():
    known = {(MODULE_OF.get(n, n.replace("-", "_")), extra) for extra, reqs in OPTIONAL.items() if extra not in META
             for n in map(requirement_name, reqs)}
    assert known == set(EXTRAS.items())
    gathered = set(re.fullmatch(r"plm\[(.*)\]", OPTIONAL["all"][0]).group(1).split(","))
    assert len(OPTIONAL["all"]) == 1 and gathered == set(OPTIONAL) - META
    assert "plm[all]" in OPTIONAL["test"]


def test_core_dependencies_hold_no_optional_package():
    core = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert "tensorboard" in core  # the default tracker: a plain install writes event files
    assert not core & {n for extra in set(OPTIONAL) - META for n in map(requirement_name, OPTIONAL[extra])}


def test_every_optional_import_goes_through_needs():
    """plmcli imports no optional package directly, and each needs() call names the package's own extra."""
    problems, calls = [], 0
    for path in sorted((ROOT / "plmcli").rglob("*.py")):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        helper = any(isinstance(n, ast.ImportFrom) and n.module == "plmcli.errors" and any(a.name == "needs" for a in n.names)
                     for n in ast.walk(tree))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            problems += [f"{rel}:{node.lineno} imports {n} (use errors.needs)" for n in names if n.split(".")[0] in EXTRAS]
            if isinstance(node, ast.Call) and (
                    (helper and isinstance(node.func, ast.Name) and node.func.id == "needs")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "needs" and getattr(node.func.value, "id", "") == "errors")):
                calls += 1
                module, extra = (a.value if isinstance(a, ast.Constant) else None for a in node.args[:2])
                if not isinstance(module, str) or EXTRAS.get(module.split(".")[0]) != extra:
                    problems.append(f"{rel}:{node.lineno} needs({module!r}, {extra!r}): not the package's extra in errors.EXTRAS")
    assert problems == []
    assert calls >= 8  # jieba (3), seqeval, nltk (2), matplotlib (3): what this file was written with
