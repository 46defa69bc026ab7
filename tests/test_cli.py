"""The command line through Typer's CliRunner (in process) and a real subprocess."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_model

from helpers import ToyEncoder, ToyEncoderConfig, assert_clean_error, reverse_pairs, run, tiny_corpus, tiny_recipe, tiny_s2s_recipe


@pytest.fixture
def files(tmp_path):
    return tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "corpus.txt")


def test_help_has_examples():
    for cmd in ([], ["tokenize"], ["pretrain"], ["eval-ppl"], ["recipes", "show"]):
        res = run(*cmd, "--help")
        assert res.exit_code == 0
        assert "Example" in res.output or "Start with" in res.output, cmd


def test_recipes_list_and_show():
    res = run("recipes", "--json")
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["gpt2-small"]["params"] == pytest.approx(124.4e6, rel=0.01)
    assert rows["gpt-char-shakespeare"]["family"] == "gpt"
    res = run("recipes", "show", "gpt2-small", "--set", "train.max_steps=5")
    assert res.exit_code == 0 and "max_steps: 5" in res.output and "family: gpt" in res.output


def test_tokenize_pretrain_eval_roundtrip(files, tmp_path):
    recipe, corpus = files
    res = run("tokenize", corpus, "--out", tmp_path / "tok", "--recipe", recipe, "--val-fraction", "0.2", "--json")
    assert res.exit_code == 0, res.output
    meta = json.loads(res.output)
    assert meta["counts"]["validation"]["documents"] == 6 and meta["tokenizer"]["kind"] == "char"
    res = run("pretrain", "--recipe", recipe, "--data", tmp_path / "tok", "--out", tmp_path / "run", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["steps"] == 6 and summary["val_loss"] > 0
    # A text far longer than the model's 32 positions is windowed.
    long_text = tmp_path / "long.txt"
    long_text.write_text(corpus.read_text() * 3)
    res = run("eval-ppl", long_text, "--model", tmp_path / "run", "--json", "--max-length", "32", "--stride", "16")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["tokens"] == len(long_text.read_text()) and 1 < out["ppl"] < 60
    assert {"ppl", "nll", "tokens", "bpb", "words", "word_ppl", "stride", "max_length"} <= set(out)
    # runs/latest is the default model
    res = run("eval-ppl", long_text, "--json", "--max-length", "32", "--stride", "16")
    assert res.exit_code == 0 and json.loads(res.stdout)["ppl"] == pytest.approx(out["ppl"], rel=1e-6)
    # a memory length means nothing to a model without memory
    assert_clean_error(run("eval-ppl", long_text, "--mem-len", "64"), "apply to models with memory")


def test_tokenize_split_sentences(tmp_path):
    reviews = tmp_path / "reviews.txt"
    reviews.write_text("Great film. Loved it!\n好看。还想再看！真的\nNo end here\n", encoding="utf-8")
    res = run("tokenize", reviews, "--out", tmp_path / "tok", "--tokenizer", "char", "--doc-per-line",
              "--split-sentences", "--val-fraction", "0", "--json")
    assert res.exit_code == 0, res.output
    meta = json.loads(res.output)
    assert meta["split_sentences"] is True
    assert meta["counts"]["train"]["documents"] == 3 and meta["counts"]["train"]["sentences"] == 2 + 3 + 1


@pytest.mark.parametrize("kind", ["missing", "empty", "binary", "latin1", "blank-gz"])
def test_bad_corpus(kind, tmp_path):
    p = tmp_path / "in.txt"
    if kind == "empty":
        p.write_text("")
    elif kind == "binary":
        p.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    elif kind == "latin1":
        p.write_bytes("fine line\ncaf\xe9 au lait\n".encode("latin-1"))
    elif kind == "blank-gz":
        p = tmp_path / "in.txt.gz"
        p.write_bytes(gzip.compress(b"\n\n  \n"))
    res = run("tokenize", p, "--out", tmp_path / "out", "--tokenizer", "char")
    needle = {"missing": "not found", "empty": "no text", "binary": "binary", "latin1": "line 2", "blank-gz": "no text"}[kind]
    assert_clean_error(res, needle)
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_bad_recipe_inputs(files, tmp_path):
    recipe, corpus = files
    assert_clean_error(run("pretrain", "--recipe", "gpt-mni"), "unknown recipe", "gpt-mini")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--set", "optim.lrr=1"), "unknown key 'lrr'", "did you mean 'lr'")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--set", "train.max_steps=abc"), "not an integer")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--set", "max_steps"), "section.key=value")
    assert_clean_error(run("pretrain", "--resume", "--out", tmp_path / "nope"), "not a run directory")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", corpus, "--out", tmp_path / "r",
                           "--set", "model.vocab_size=10"), "tokenizer has", "model.vocab_size")
    assert not (tmp_path / "r").exists()
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", corpus, "--set", "train.seq_len=64"), "max_positions")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", corpus, "--time-budget", "soon"), "duration")


def test_bad_data_leaves_no_run_behind(files, tmp_path):
    recipe, corpus = files
    runs = Path(os.environ["PLM_RUNS"])
    assert run("pretrain", "--recipe", recipe, "--data", corpus, "--out", runs / "good").exit_code == 0
    one = tmp_path / "one.txt"
    one.write_text("just one document\nwith two lines\n")
    # found while preparing the data (make-mlm-data), and found by the loop (no window fits): either way no
    # run directory is left, and runs/latest still names the last good run
    assert_clean_error(run("pretrain", "--recipe", "bert-mini", "--data", one, "--out", runs / "bad"), "at least 2 documents")
    short = tmp_path / "short.txt"
    short.write_text("a b\n\nc d\n")
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", short, "--out", runs / "bad2"), "too few")
    assert not (runs / "bad").exists() and not (runs / "bad2").exists()
    assert (runs / "latest").resolve() == (runs / "good").resolve()
    (runs / "mine").mkdir()  # an empty --out the user made: left in place, as empty as it was
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", short, "--out", runs / "mine"), "too few")
    assert (runs / "mine").is_dir() and not any((runs / "mine").iterdir())


def test_eval_ppl_on_an_encoder_run(tmp_path, monkeypatch):
    from plmcli.models import registry

    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    run_dir = tmp_path / "enc"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"family": "toyenc", "model": {"vocab_size": 5}, "tokenizer": {}}))
    save_model(ToyEncoder(ToyEncoderConfig(vocab_size=5)), str(run_dir / "model.safetensors"))
    (run_dir / "tokenizer.json").write_text("{}")
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    assert_clean_error(run("eval-ppl", text, "--model", run_dir), "not a causal LM")


def test_eval_ppl_without_runs(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    assert_clean_error(run("eval-ppl", text), "runs/latest")


def test_debug_shows_traceback():
    res = run("--debug", "pretrain", "--recipe", "gpt-mni")
    assert res.exit_code != 0 and res.exception is not None and type(res.exception).__name__ == "PlmError"


@pytest.mark.e2e
def test_real_subprocess(files, tmp_path):
    recipe, corpus = files
    env = {**os.environ, "PLM_RUNS": str(tmp_path / "runs")}
    cmd = [sys.executable, "-m", "plmcli"]
    p = subprocess.run(cmd + ["pretrain", "--recipe", str(recipe), "--data", str(corpus), "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(cmd + ["eval-ppl", str(corpus), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"] > 100
    p = subprocess.run(cmd + ["pretrain", "--recipe", "nope"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and p.stderr.startswith("error: unknown recipe 'nope'") and "Traceback" not in p.stderr


BERT_TINY = """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 32, d_ff: 64, max_positions: 64}
tokenizer: {vocab_size: 300, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {dupe_factor: 1}
train: {seq_len: 32, global_batch_size: 4, max_steps: 3, eval_every: 3, eval_batches: 2, save_every: 3, log_every: 1}
"""


def test_make_mlm_data_pretrain_finetune(tmp_path):
    recipe = tmp_path / "bert-tiny.yaml"
    recipe.write_text(BERT_TINY)
    corpus = tiny_corpus(tmp_path / "c.txt", n_docs=40)
    assert run("tokenize", corpus, "--out", tmp_path / "tok", "--recipe", recipe).exit_code == 0
    res = run("make-mlm-data", tmp_path / "tok", "--out", tmp_path / "mlm", "--max-seq-len", 32, "--dupe-factor", 2,
              "--masking", "wwm", "--json")
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)
    assert meta["format"] == "plm-mlm" and meta["counts"]["train"]["instances"] > 0
    res = run("pretrain", "--recipe", recipe, "--data", tmp_path / "mlm", "--out", tmp_path / "bert", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["steps"] == 3 and summary["val_ppl"] > 1
    sample = Path(__file__).resolve().parents[1] / "data" / "glue-sample"
    res = run("finetune", "--task", "sst2", "--data-dir", sample, "--from", tmp_path / "bert", "--out", tmp_path / "ft",
              "--max-steps", 4, "--dropout", 0.05, "--warmup-ratio", 0.25, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert out["task"] == "sst2" and 0 <= out["dev"]["accuracy"] <= 1 and (tmp_path / "ft" / "SST-2.tsv").is_file()
    assert out["settings"]["dropout"] == 0.05 and out["settings"]["warmup_steps"] == 1
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", sample, "--from", tmp_path / "bert",
                           "--dropout", 1.5), "--dropout 1.5 is out of range")
    # A static dataset longer than the model's positions is refused, naming the fix.
    assert run("make-mlm-data", tmp_path / "tok", "--out", tmp_path / "mlm128", "--max-seq-len", 128).exit_code == 0
    assert_clean_error(run("pretrain", "--recipe", recipe, "--data", tmp_path / "mlm128", "--set", "train.seq_len=32"))


def test_make_mlm_data_bad_inputs(tmp_path):
    (tmp_path / "plain").mkdir()
    assert_clean_error(run("make-mlm-data", tmp_path / "plain", "--out", tmp_path / "o"), "plm tokenize")
    one = tmp_path / "one.txt"
    one.write_text("just one document\nwith two lines\n")
    assert run("tokenize", one, "--out", tmp_path / "tok1", "--recipe", "bert-mini", "--val-fraction", "0").exit_code == 0
    assert_clean_error(run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "o"), "at least 2 documents", "--pairs sop")
    for doc in (["--packing", "doc_sentences"], ["--no-cross-documents"]):  # the older name still works
        assert_clean_error(run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "o", *doc), "DOC-SENTENCES", "--pairs none")
    assert_clean_error(run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "o", "--pairs", "none", "--packing", "window"),
                       "--packing 'window' is not one of full_sentences, doc_sentences")
    assert_clean_error(run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "o", "--pairs", "none",
                           "--packing", "full_sentences", "--no-cross-documents"),
                       "--no-cross-documents (the older name of --packing doc_sentences) contradicts --packing full_sentences")
    assert not (tmp_path / "o").exists()
    res = run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "doc", "--pairs", "none", "--no-cross-documents", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["packing"] == "doc_sentences"
    new = run("make-mlm-data", tmp_path / "tok1", "--out", tmp_path / "doc", "--pairs", "none", "--packing", "doc_sentences", "--json")
    assert new.exit_code == 0 and json.loads(new.stdout) == json.loads(res.stdout)  # one output: reused, same key


def test_finetune_bad_inputs(files, tmp_path):
    recipe, corpus = files
    assert run("pretrain", "--recipe", recipe, "--data", corpus, "--out", tmp_path / "gpt").exit_code == 0
    sample = Path(__file__).resolve().parents[1] / "data" / "glue-sample"
    # A GPT run is finetuned GPT-style now (tests/objectives/test_gpt_transfer.py); its own bad option is one clean line.
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", sample, "--from", tmp_path / "gpt",
                           "--aux-lm-weight", "-1"), "--aux-lm-weight -1.0")
    assert_clean_error(run("finetune", "--task", "sst3", "--from", tmp_path / "gpt"), "unknown task")
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", sample, "--from", tmp_path / "gpt", "--crf"),
                       "--crf (task.crf) applies to tagging tasks, and sst2 is not one")  # was: ignored
    assert_clean_error(run("finetune", "--task", "sst2", "--data-dir", sample, "--from", tmp_path / "gpt",
                           "--doc-stride", "64"), "--doc-stride (task.doc_stride) applies to qa tasks")
    assert_clean_error(run("finetune", "--task", "cola", "--data-dir", sample, "--from", tmp_path / "gpt"))


def test_generate_cli(tmp_path):
    res = run("pretrain", "--recipe", tiny_s2s_recipe(tmp_path / "r.yaml", "transformer", max_steps=3),
              "--data", reverse_pairs(tmp_path / "rev.txt", n=40), "--out", tmp_path / "s2s")
    assert res.exit_code == 0, res.output
    (tmp_path / "in.txt").write_text("a b c\n\nd e f\n")
    res = run("generate", tmp_path / "s2s", "--prompt", "a b", "--input", tmp_path / "in.txt", "--strategy", "beam",
              "--max-new-tokens", "4", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["prompt"] for r in rows] == ["a b", "a b c", "d e f"] and all(isinstance(r["output"], str) for r in rows)
    res = run("pretrain", "--recipe", tiny_recipe(tmp_path / "g.yaml"), "--data", tiny_corpus(tmp_path / "c.txt"),
              "--out", tmp_path / "gpt")
    assert res.exit_code == 0, res.output
    res = run("generate", "--prompt", "the cat", "--strategy", "sample", "--top-p", "0.9", "--max-new-tokens", "5")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) >= 1, res.output  # runs/latest = the GPT run
    res = run("generate", "--prompt", "x", "--strategy", "nucleus")
    assert res.exit_code == 2 and res.stderr.startswith("error: unknown decoding strategy")
    res = run("generate", tmp_path / "gpt")
    assert res.exit_code == 2 and "no prompts" in res.stderr
    res = run("generate", "--help")
    assert res.exit_code == 0 and "Example" in res.output
