"""The front doors stay true: README's shape and first commands, the recipe tables generated from
`plm recipes --json`, links and repository paths that resolve, BENCHMARKS.md's generated summary, and no
references to the work log (issues, stops, sessions, design seeds) where a reader cannot follow them.

After adding or changing a recipe, rewrite both recipe tables (README.md's and docs/recipes.md's):

    python tests/test_docs.py
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RECIPES_MD = DOCS / "recipes.md"

# README's first fenced block: CI (.ci/run) and users copy these two commands; they change only on purpose.
FIRST_COMMANDS = [
    "pip install torch==2.13.0 && pip install -e . && plm pretrain --recipe gpt-mini && plm eval-ppl data/shakespeare-heldout.txt",
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q',
]
README_MAX_LINES = 150


def pages() -> list[Path]:
    """Every hand-read Markdown page the checks cover."""
    return [README, ROOT / "ARCHITECTURE.md", ROOT / "BENCHMARKS.md", ROOT / "PROFILING.md",
            *sorted(DOCS.glob("*.md"))]


# ---------------------------------------------------------------- the generated recipe tables


def recipes_json() -> list[dict]:
    """What `plm recipes --json` prints: name, family, objective, params, description per shipped recipe."""
    out = subprocess.run([sys.executable, "-m", "plmcli", "recipes", "--json"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def _params(n: int) -> str:
    if not n:
        return "–"  # counted, not trained: n-gram tables
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def recipe_table(recipes: list[dict]) -> str:
    """docs/recipes.md's table: one row per recipe."""
    rows = ["| recipe | family | objective | parameters | description |", "|---|---|---|---|---|"]
    rows += [f"| `{r['name']}` | {r['family'] or ''} | {r['objective'] or ''} | {_params(r['params'])} | "
             f"{_cell(r['description'] or '')} |" for r in sorted(recipes, key=lambda r: r["name"])]
    return "\n".join(rows)


def family_table(recipes: list[dict], width: int = 150) -> str:
    """README's table: the recipes grouped by family and objective (a long group over several rows), the recipe
    names in the first column (tests/test_packaging.py reads them there)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(recipes, key=lambda r: r["name"]):
        groups.setdefault((r["family"] or "", r["objective"] or ""), []).append(r)
    rows = ["| recipes | family | objective | parameters |", "|---|---|---|---|"]
    def row(chunk: list[dict], family: str, objective: str) -> str:
        small, large = (_params(f(r["params"] for r in chunk)) for f in (min, max))
        names = ", ".join(f"`{r['name']}`" for r in chunk)
        return f"| {names} | {family} | {objective} | {small if small == large else f'{small}–{large}'} |"

    for (family, objective), members in sorted(groups.items()):
        chunk: list[dict] = []
        for r in members:
            if chunk and len(", ".join(f"`{m['name']}`" for m in chunk + [r])) > width - 40:
                rows.append(row(chunk, family, objective))
                chunk = []
            chunk.append(r)
        rows.append(row(chunk, family, objective))
    return "\n".join(rows)


BLOCKS = {  # file -> (marker name, table builder)
    README: ("recipes-by-family", family_table),
    RECIPES_MD: ("recipes", recipe_table),
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {name}:begin -->\n)(.*?)(<!-- {name}:end -->)", re.S)


def generated(path: Path, recipes: list[dict]) -> str:
    """`path`'s text with its generated block rewritten from `recipes`."""
    name, build = BLOCKS[path]
    text = path.read_text(encoding="utf-8")
    assert _block(name).search(text), f"{path.name} lost its <!-- {name}:begin/end --> markers"
    return _block(name).sub(lambda m: m[1] + build(recipes) + "\n" + m[3], text, count=1)


def main() -> int:
    recipes = recipes_json()
    for path in BLOCKS:
        new = generated(path, recipes)
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
            print(f"rewrote the recipe table of {path.relative_to(ROOT)}")
        else:
            print(f"{path.relative_to(ROOT)}: recipe table already current")
    return 0


@pytest.fixture(scope="module")
def recipes() -> list[dict]:
    return recipes_json()


@pytest.mark.parametrize("path", list(BLOCKS), ids=lambda p: p.name)
def test_recipe_tables_are_generated(path, recipes):
    assert path.read_text(encoding="utf-8") == generated(path, recipes), (
        f"{path.relative_to(ROOT)}'s recipe table is not what `plm recipes --json` gives: "
        "run `python tests/test_docs.py` to rewrite it")


def test_every_recipe_is_in_both_tables(recipes):
    for path in BLOCKS:
        text = path.read_text(encoding="utf-8")
        assert {r["name"] for r in recipes} <= set(re.findall(r"`([a-z0-9.-]+)`", text)), path.name


# ---------------------------------------------------------------- README


def test_readme_first_block_holds_the_two_commands():
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert block, "README.md has no fenced block"
    lines = [line for line in block[1].splitlines() if line and not line.startswith("#")]
    assert lines == FIRST_COMMANDS


def test_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (≤ {README_MAX_LINES}): move reference to docs/"
    long = [i for i, line in enumerate(lines, 1) if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README.md lines over 200 characters: {long}"
    assert "Every command has `--help` with an example." in text
    assert "exit code 2" in " ".join(text.split())  # the one-line error contract
    for page in ["docs/README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]:
        assert f"]({page}" in text, f"README.md does not link {page}"


def test_docs_prose_is_wrapped():
    """docs/ prose lines stay readable in a terminal; code and table rows may be wider."""
    for path in sorted(DOCS.glob("*.md")):
        fence = False
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fence = not fence
            elif not fence and not line.startswith("|"):
                assert len(line) <= 120, f"{path.name}:{i} has {len(line)} characters"


# ---------------------------------------------------------------- links and paths

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A backticked path into the repository, e.g. `plmcli/train/peaks.py` or `tests/test_layering.py` (or into the
# package, as ARCHITECTURE.md writes `data/store.py` for plmcli/data/store.py).
REPO_PATH = re.compile(r"`((?:plmcli|tests|benchmarks|data|docs|\.ci)/[\w./-]*)`")


def _targets(path: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        out.append((target, (path.parent / target.split("#", 1)[0]).resolve()))
    for rel in REPO_PATH.findall(text):
        if not re.search(r"[<>*{}]", rel):  # a pattern such as `RUN/phases/<name>/`, not a path
            out.append((rel, ROOT / rel.rstrip("/")))
    return out


def _anchors(path: Path) -> set[str]:
    """The #fragments GitHub gives `path`'s headings: lower case, punctuation dropped, spaces to hyphens, a repeat -1."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    seen: dict[str, int] = {}
    out = set()
    for title in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        base = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_anchors_resolve(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or "#" not in target:
            continue
        file, frag = target.split("#", 1)
        page = (path.parent / file).resolve() if file else path
        if page.suffix == ".md" and page.exists() and frag not in _anchors(page):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to headings that do not exist: {broken}"


# Paths in a peer's repository, not plm's.
FOREIGN_PATHS = {"BENCHMARKS.md": {"data/shakespeare_char/prepare.py"}}  # nanoGPT's, in the nanogpt-char section


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_resolve(path):
    foreign = FOREIGN_PATHS.get(str(path.relative_to(ROOT)), set())
    dangling = [target for target, resolved in _targets(path) if target not in foreign
                and not resolved.exists() and not (ROOT / "plmcli" / target.rstrip("/")).exists()]
    assert not dangling, f"{path.relative_to(ROOT)} points at what is not in the repository: {dangling}"


# ---------------------------------------------------------------- no work-log references

# The work log's vocabulary, which a reader of the repository cannot follow: "issue 20 §1", "stop 37", "this
# session", "seed 003 §7.3.4.2" (the design notes). plm itself has no sessions, so every "session" is the log's;
# a legitimate use one day (an HTTP session, say) would go into ALLOWED with its page. A random seed ("seed 42")
# is fine: a design seed is the one with a § or a zero-padded number.
WORK_LOG = re.compile(r"\bissues?\s+#?\d+|\bstops?\s+\d+|\bsessions?\b|\bseed\s+\d+\s*§|\bseed\s+0\d{2}\b", re.I)
# A design document that is not in the repository.
MISSING_DOCS = re.compile(r"\bDESIGN\.md\b")
ALLOWED: dict[str, set[str]] = {}


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_work_log_references(path):
    rel = str(path.relative_to(ROOT))
    text = path.read_text(encoding="utf-8")
    found = [m[0] for m in WORK_LOG.finditer(text)] + MISSING_DOCS.findall(text)
    found = [f for f in found if f not in ALLOWED.get(rel, set())]
    assert not found, (f"{rel} refers to the work log: {found}; cite the paper or the section of the docs the code "
                       "follows, or say what was measured")


# ---------------------------------------------------------------- BENCHMARKS.md


def test_benchmarks_summary_is_current():
    from benchmarks import summary

    text = summary.BENCHMARKS_MD.read_text(encoding="utf-8")
    assert summary.current(text) == summary.render(text), (
        "BENCHMARKS.md's summary is stale (a benchmark rewrote its section): run `python benchmarks/summary.py`")


def test_benchmarks_layout():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    titles = re.findall(r"^## (.+)$", text, re.M)
    assert len(titles) == len(set(titles)), "two BENCHMARKS.md sections share a title"
    assert text.index("<!-- summary:begin -->") < text.index("<!-- bench:"), "the summary is not at the top"
    assert "](PROFILING.md)" in text


if __name__ == "__main__":
    sys.exit(main())
