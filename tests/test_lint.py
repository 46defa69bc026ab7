"""The code follows the lint rules pyproject.toml declares ([tool.ruff]): unused imports and names, undefined
names, bare excepts, line length. Run as a test, so the README's test command and CI both hold them."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    p = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "plmcli", "tests", "benchmarks"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
