"""eval-ppl's default window (the training seq_len), refused zero / negative lengths, and the bytes of bpb."""

from plmcli.config import override_layers
import json
import math
import re

import pytest
from typer.testing import CliRunner

from helpers import tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.cli import app
from plmcli.errors import PlmError
from plmcli.eval.perplexity import window_length

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A tiny GPT: 32 positions, trained on 16-token sequences."""
    root = tmp_path_factory.mktemp("window")
    corpus = tiny_corpus(root / "corpus.txt")
    api.pretrain(str(tiny_recipe(root / "tiny.yaml")), [str(corpus)], str(root / "run"), overrides={"train.max_steps": 3})
    text = root / "eval.txt"
    text.write_text(corpus.read_text() * 2, encoding="utf-8")
    return root / "run", text


def test_window_length_rules():
    assert window_length(None, 256, 128) == (128, "training seq_len; the model has 256 positions")
    assert window_length(None, 256, 512) == (256, "the model's positions, below training seq_len 512")
    assert window_length(None, 256, None) == (256, "the model's positions; the run records no training seq_len")
    assert window_length(64, 256, 128) == (64, "--max-length")


def test_default_window_is_the_training_seq_len(gpt_run):
    run, text = gpt_run
    assert json.loads((run / "config.json").read_text())["seq_len"] == 16
    res = api.eval_ppl([str(text)], str(run))
    assert (res["max_length"], res["stride"]) == (16, 8)
    assert res["window_from"] == "training seq_len; the model has 32 positions"
    explicit = api.eval_ppl([str(text)], str(run), max_length=16, stride=8)
    assert explicit["window_from"] == "--max-length"
    assert res["nll"] == pytest.approx(explicit["nll"], rel=1e-9) and res["tokens"] == explicit["tokens"]
    full = api.eval_ppl([str(text)], str(run), max_length=32)
    assert (full["max_length"], full["stride"]) == (32, 16) and full["nll"] != pytest.approx(res["nll"], rel=1e-6)


def test_cli_prints_the_window_and_why(gpt_run):
    run, text = gpt_run
    res = runner.invoke(app, ["eval-ppl", str(text), "--model", str(run)])
    assert res.exit_code == 0, res.output
    assert "window 16/8 (training seq_len; the model has 32 positions)" in res.stdout
    out = json.loads(runner.invoke(app, ["eval-ppl", str(text), "--model", str(run), "--json"]).stdout)
    assert (out["max_length"], out["stride"], out["window_from"]) == (16, 8, "training seq_len; the model has 32 positions")
    assert out["bytes"] == len(text.read_bytes())
    help_text = " ".join(re.sub("[│╭╮╰╯─]", " ", runner.invoke(app, ["eval-ppl", "--help"]).stdout).split())
    assert "training seq_len" in help_text and "CRLF" in help_text


@pytest.mark.parametrize("args,needle", [
    (["--stride", "0"], "--stride 0 must be ≥ 1"),
    (["--stride", "-4"], "--stride -4 must be ≥ 1"),
    (["--max-length", "0"], "--max-length 0 must be ≥ 1"),
    (["--tgt-len", "0"], "--tgt-len 0 must be ≥ 1"),
    (["--mem-len", "-1"], "--mem-len -1 must be ≥ 0"),
    (["--batch-size", "0"], "--batch-size 0 must be ≥ 1"),
])
def test_zero_and_negative_lengths_are_refused(gpt_run, args, needle):
    run, text = gpt_run
    res = runner.invoke(app, ["eval-ppl", str(text), "--model", str(run), *args])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert "Traceback" not in res.output


def test_masked_lm_default_window_and_zero_length(tmp_path):
    corpus = tiny_corpus(tmp_path / "c.txt")
    overrides = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=24",
                 "tokenizer.vocab_size=120", "tokenizer.min_frequency=1", "objective.dynamic=true", "objective.pairs=none",
                 "data.val_fraction=0.2", "train.seq_len=12", "train.global_batch_size=4", "train.eval_every=0",
                 "train.save_every=0", "train.log_every=1"]
    api.pretrain("bert-mini", [str(corpus)], str(tmp_path / "run"), overrides=override_layers(overrides, {"train.max_steps": 2}))
    res = api.eval_ppl([str(corpus)], str(tmp_path / "run"))
    assert res["pseudo"] is True and res["max_length"] == 12
    assert res["window_from"] == "training seq_len; the model has 24 positions"
    with pytest.raises(PlmError, match="--max-length 0 must be ≥ 1"):
        api.eval_ppl([str(corpus)], str(tmp_path / "run"), max_length=0)


def test_bpb_counts_the_text_as_scored_so_crlf_equals_lf(gpt_run, tmp_path):
    """A CRLF file is read as its LF copy (as Python's text mode and datasets read it): same tokens,
    same NLL, and the same bytes, those of the LF text, so the same bpb."""
    run, text = gpt_run
    lf = text.read_bytes()
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(lf.replace(b"\n", b"\r\n"))
    no_final_newline = tmp_path / "nofinal.txt"
    no_final_newline.write_bytes(lf.rstrip(b"\n"))
    a = api.eval_ppl([str(text)], str(run))
    for other in (crlf, no_final_newline):
        b = api.eval_ppl([str(other)], str(run))
        assert b["bytes"] == a["bytes"] == len(lf) and b["tokens"] == a["tokens"]
        assert b["bpb"] == pytest.approx(a["bpb"], rel=1e-12)
        assert b["bpb"] == pytest.approx(b["nll"] * b["tokens"] / (math.log(2) * len(lf)), rel=1e-12)
    assert len(crlf.read_bytes()) > len(lf)
