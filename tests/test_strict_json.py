"""`--json` and the JSON files plm writes are strict JSON (RFC 8259): no bare Infinity / NaN, which jq and
JavaScript refuse. A non-finite number is written as null (plmcli.data.store.finite)."""

import json
import math

import numpy as np
import pytest

from helpers import run
from plmcli import api
from plmcli.data.store import finite, json_text, write_json


def strict(text: str):
    """json.loads that refuses the bare words Python's json accepts and writes (Infinity, -Infinity, NaN)."""
    def refuse(word):
        raise AssertionError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_null_at_any_depth():
    obj = {"ppl": math.inf, "low": -math.inf, "r": float("nan"), "n": 3, "x": 0.5, "ok": True, "name": "inf",
           "files": [{"ppl": np.float64("inf"), "nll": np.float64(1.25)}], "pair": (math.nan, 2.0), "none": None}
    want = {"ppl": None, "low": None, "r": None, "n": 3, "x": 0.5, "ok": True, "name": "inf",
            "files": [{"ppl": None, "nll": 1.25}], "pair": [None, 2.0], "none": None}
    assert finite(obj) == want
    assert strict(json_text(obj)) == want
    assert json.dumps(math.inf) == "Infinity"  # what Python writes unasked, and what strict parsers refuse
    with pytest.raises(AssertionError, match="Infinity"):
        strict(json.dumps({"ppl": math.inf}))


def test_write_json_is_strict(tmp_path):
    write_json(tmp_path / "m.json", {"val_ppl": math.inf, "loss": 2.0})
    assert strict((tmp_path / "m.json").read_text()) == {"val_ppl": None, "loss": 2.0}


def test_eval_ppl_json_of_an_unsmoothed_ngram_is_strict(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("a b\na c\nb a\n", encoding="utf-8")
    summary = api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                           overrides=["data.val_fraction=0", "model.k=0"])
    assert summary["stop_reason"] == "fit"
    strict((tmp_path / "run" / "summary.json").read_text())
    test = tmp_path / "test.txt"
    test.write_text("a b\nc a\n", encoding="utf-8")  # c a: P(c|<s>) = 0 and P(a|c) = 0 — ppl inf
    res = run("eval-ppl", test, "--model", tmp_path / "run", "--json")
    assert res.exit_code == 0, res.output
    got = strict(res.stdout)
    assert got["ppl"] is None and got["nll"] is None and got["zero_prob_tokens"] == 2
    assert got["ppl_excluding_zero_prob"] == pytest.approx(math.exp(-math.log(2 / 3 * 1 / 3 * 1 / 2 * 1 / 3) / 4))
    assert got["files"][0]["ppl"] is None


def test_summary_json_with_an_infinite_validation_ppl_is_strict(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("a b\na c\nb a\n" * 5 + "c c d\n", encoding="utf-8")
    summary = api.pretrain("ngram-bigram-addk", data=[str(train)], out=str(tmp_path / "run"),
                           overrides=["model.k=0", "data.val_fraction=0.3"])
    assert summary["val_ppl"] == math.inf and summary["val_zero_prob_tokens"] == 4  # "c c d" is held out
    saved = strict((tmp_path / "run" / "summary.json").read_text())
    assert saved["val_ppl"] is None and saved["val_loss"] is None and saved["val_zero_prob_tokens"] == 4
