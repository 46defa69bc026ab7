"""benchmarks/gpu/gpu_device.sh, the one command that runs the GPU checks and benchmarks on a lent machine whose image
lacks `datasets`: its install logic, on a CPU, with stand-in wheels (the real ones are for the image's CPython
3.12), and the parts it runs, in order, each into its own log, within one time budget.

A `datasets` that fails to import is put first on PYTHONPATH, as on the image; the stand-in wheels then make
it importable the way the real ones do: the base wheels first, pyarrow's only when the import still fails.
"""

import pytest
import os
import subprocess
import sys
import zipfile
from pathlib import Path

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "gpu_device.sh"
# The parts in the order they must run: the GPU checks, cheapest and most important first, then the MFU and
# varlen benchmarks, which the budget may squeeze.
PARTS = ["gpu-check-syncs", "gpu-check-fp16", "gpu-check-workers", "gpu-check-resume", "gpu-check-checkpointing",
         "gpu-mfu", "gpu-varlen", "gpu-fsdp"]


def _wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal pure-Python wheel `name`-1.0 holding `files` ({path: source})."""
    dist = f"{name}-1.0.dist-info"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in files.items():
            z.writestr(rel, text)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "".join(f"{rel},,\n" for rel in [*files, f"{dist}/METADATA", f"{dist}/WHEEL"]))
    return path


def _run(tmp_path: Path, wheels: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    blocker = tmp_path / "image"  # the image: `import datasets` fails there
    blocker.mkdir(exist_ok=True)
    (blocker / "datasets.py").write_text("raise ImportError('no datasets in this image')\n")
    env = {**os.environ, "PYTHON": sys.executable, "PLM_WHEELS": str(wheels), "PLM_WHEELS_SITE": str(tmp_path / "site"),
           "OUT": str(tmp_path / "out"), "PYTHONPATH": os.pathsep.join([str(blocker), str(ROOT)]), **env_extra}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_without_wheels_it_says_how_to_get_them_and_exits_2(tmp_path):
    empty = tmp_path / "whl"
    empty.mkdir()
    r = _run(tmp_path, empty, "run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [(
        f"gpu_device.sh: datasets is not importable here and {empty}/ holds no wheels: run 'bash benchmarks/gpu/gpu_device.sh "
        f"wheels' where pip works, and carry {empty}")]
    assert not (tmp_path / "out" / "BENCHMARKS.md").exists()


def _started(stdout: str) -> list[str]:
    """The parts the script started or skipped, in order, from its `part i/N: NAME` lines."""
    return [line.split(": ")[2].split(" ")[0] for line in stdout.splitlines() if line.startswith("gpu_device.sh: part ")]


def _stand_ins(whl: Path) -> None:
    """A datasets wheel that needs a module only the stand-in "pyarrow" wheel has: the image's pyarrow too old
    (a stand-in dependency of its own, not "dill": torch imports the real one)."""
    _wheel(whl, "datasets", {"datasets/__init__.py": "import plm_newer_arrow\nimport plm_dep\n__version__ = 'stand-in'\n"})
    _wheel(whl, "plm_dep", {"plm_dep/__init__.py": ""})
    _wheel(whl, "pyarrow", {"plm_newer_arrow.py": ""})


def test_it_installs_the_base_wheels_then_pyarrow_only_when_still_needed_and_runs_every_part_in_order(tmp_path):
    whl = tmp_path / "whl"
    whl.mkdir()
    _stand_ins(whl)
    r = _run(tmp_path, whl, "run")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    assert {p.name for p in site.iterdir() if p.suffix == ".dist-info"} == {
        "datasets-1.0.dist-info", "plm_dep-1.0.dist-info", "pyarrow-1.0.dist-info"}
    assert "datasets stand-in" in r.stdout
    out = tmp_path / "out"
    assert (out / "BENCHMARKS.md").read_bytes() == (ROOT / "BENCHMARKS.md").read_bytes()
    assert _started(r.stdout) == PARTS
    for name in PARTS:  # this machine has no GPU: each part says so in its log, writes nothing
        assert "skipped: no CUDA device" in (out / f"{name}.log").read_text(), name
    parts = [line for line in r.stdout.splitlines() if line.startswith("gpu_device.sh: part ")]
    assert parts[0] == "gpu_device.sh: part 1/7: gpu-check-syncs (at most 75s)", parts


def test_a_spent_budget_skips_the_parts_left_each_with_a_line_in_its_log(tmp_path):
    whl = tmp_path / "whl"
    whl.mkdir()
    _stand_ins(whl)
    r = _run(tmp_path, whl, "run", PLM_GPU_BUDGET="0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert _started(r.stdout) == PARTS
    for name in PARTS:
        log = (tmp_path / "out" / f"{name}.log").read_text()
        assert "skipped: " in log and "of the 0s budget left" in log, log
    assert (tmp_path / "out" / "BENCHMARKS.md").is_file()


def test_with_a_new_enough_pyarrow_the_fallback_wheel_stays_out(tmp_path):
    whl = tmp_path / "whl"
    whl.mkdir()
    _wheel(whl, "datasets", {"datasets/__init__.py": "__version__ = 'stand-in'\n"})
    _wheel(whl, "pyarrow", {"plm_newer_arrow.py": ""})
    # gpu-mfu's options pass through; --help ends it at once
    r = _run(tmp_path, whl, "run", "--help", PLM_GPU_PARTS="gpu-mfu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _started(r.stdout) == ["gpu-mfu"] and sorted(p.name for p in (tmp_path / "out").glob("*.log")) == ["gpu-mfu.log"]
    assert {p.name for p in (tmp_path / "site").iterdir() if p.suffix == ".dist-info"} == {"datasets-1.0.dist-info"}
    assert "usage: python -m benchmarks gpu-mfu" in (tmp_path / "out" / "gpu-mfu.log").read_text()
