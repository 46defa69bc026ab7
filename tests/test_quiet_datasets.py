"""Off a terminal datasets' progress bars are off, without importing datasets (seconds of start-up)."""

import json
import os
import subprocess
import sys

CODE = """
import json, os, sys
from plmcli.pipelines.common import quiet_datasets_off_terminal
quiet_datasets_off_terminal()
imported = "datasets" in sys.modules
import datasets
from datasets.utils.tqdm import are_progress_bars_disabled
print(json.dumps([imported, os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS"), are_progress_bars_disabled()]))
"""


def _run(**env):
    base = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_DISABLE_PROGRESS_BARS"}
    out = subprocess.run([sys.executable, "-c", CODE], env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_off_a_terminal_bars_are_disabled_without_importing_datasets():
    assert _run() == [False, "1", True]


def test_a_value_the_user_set_stays():
    assert _run(HF_DATASETS_DISABLE_PROGRESS_BARS="0") == [False, "0", False]
