"""A family registered in plmcli.models.registry reaches every family-wide suite with no other edit: the suites
run in a pytest of their own with tests/throwaway_family.py's plugin registering a GPT subclass as "gpt_copy",
and each must collect tests of that family and pass them."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from throwaway_family import NAME

TESTS = Path(__file__).resolve().parent
SUITES = ["test_conformance.py", "models/test_skip_init.py", "eval/test_scoring.py", "analysis/test_probe.py",
          "analysis/test_attention.py"]


def test_a_registered_family_reaches_every_family_wide_suite(tmp_path):
    report = tmp_path / "junit.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "throwaway_family", "-k", NAME, "-p", "no:cacheprovider",
                        f"--junitxml={report}", *(str(TESTS / s) for s in SUITES)],
                       cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    outcomes = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        if NAME in case.get("name", ""):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
            outcomes[case.get("file") or case.get("classname").replace(".", "/") + ".py", kind] += 1
    for suite in SUITES:
        passed = sum(n for (where, kind), n in outcomes.items() if kind == "passed" and where.endswith(suite))
        assert passed, f"{suite} ran no test of {NAME}: {dict(outcomes)}"
    assert not any(kind in ("failure", "error") for _, kind in outcomes), dict(outcomes)
