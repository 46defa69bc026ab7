"""`python -m benchmarks gpu-check` on a machine without CUDA: one skip line, exit 0, nothing written."""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, where benchmarks/ lives

from benchmarks import common  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402


def test_gpu_check_skips_without_cuda(monkeypatch, capsys, tmp_path):
    # Skip mode even on a GPU machine; and were it to publish, it would write here, not BENCHMARKS.md.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "write_section", lambda name, body, path=None: (tmp_path / "written").write_text(body))
    before = common.BENCHMARKS_MD.read_text() if common.BENCHMARKS_MD.is_file() else None
    t0 = time.perf_counter()
    rc = main(["gpu-check"])
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert rc == 0
    assert out.strip() == "gpu-check: skipped: no CUDA device (torch.cuda.is_available() is False); BENCHMARKS.md left alone"
    assert not (tmp_path / "written").exists()
    assert (common.BENCHMARKS_MD.read_text() if common.BENCHMARKS_MD.is_file() else None) == before
    assert elapsed < 2.0, f"skip mode took {elapsed:.2f} s"
