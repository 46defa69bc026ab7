"""What `pip install plm` ships: the README's commands need these files outside the repository."""

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from plmcli import api

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["corpus/shakespeare-sample.txt", "corpus/shakespeare-heldout.txt", "corpus/glue-sample/SST-2/train.tsv",
           "corpus/glue-sample/SST-2/dev.tsv", "corpus/glue-sample/SST-2/test.tsv"]


def test_samples_are_package_resources(tmp_path, monkeypatch):
    for name in SHIPPED:
        assert (resources.files("plmcli") / name).is_file(), name
    monkeypatch.chdir(tmp_path)  # outside the repository, `--data-dir glue-sample` names the shipped sample
    sample = Path(api.sample_data_dir("glue-sample"))
    assert (sample / "SST-2" / "dev.tsv").read_text() == (ROOT / "data" / "glue-sample" / "SST-2" / "dev.tsv").read_text()
    (tmp_path / "glue-sample").mkdir()  # a directory of that name here wins
    assert api.sample_data_dir("glue-sample") == "glue-sample"
    assert api.sample_data_dir("elsewhere/data") == "elsewhere/data"


def test_wheel_holds_the_samples(tmp_path):
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in tracked.stdout.splitlines():
        if rel.startswith(("plmcli/", "data/")) or rel in ("pyproject.toml", "README.md"):
            dest = src / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            p = ROOT / rel
            if p.is_symlink():
                dest.symlink_to(p.readlink())
            elif p.is_file():
                shutil.copyfile(p, dest)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist")], cwd=src, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (whl,) = (tmp_path / "dist").glob("plm-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    assert {f"plmcli/{n}" for n in SHIPPED} <= names
    assert "plmcli/recipes/gpt-mini.yaml" in names


def test_readme_lists_every_shipped_recipe():
    import re

    from plmcli.config import shipped_recipes

    table = (ROOT / "README.md").read_text(encoding="utf-8").split("### Recipes", 1)[1].split("\n\n", 2)[1]
    listed = set(re.findall(r"`([a-z0-9.-]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()
                                                           if line.startswith("| `"))))
    assert set(shipped_recipes()) - listed == set()
