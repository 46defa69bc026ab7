import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED


@pytest.fixture(autouse=True)
def _isolated_runs(tmp_path, monkeypatch):
    """Each test writes runs/ and caches under its own tmp dir."""
    monkeypatch.setenv("PLM_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("PLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine OpenMP threads waiting on
    each other make each step ~10× slower. Modules opt in with pytestmark = usefixtures("one_thread")."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def fed(monkeypatch):
    """Every training batch's input_ids the loop fed to CausalLM (helpers.recorded_feeds)."""
    from helpers import recorded_feeds
    from plmcli.objectives.clm import CausalLM

    return recorded_feeds(monkeypatch, CausalLM)
