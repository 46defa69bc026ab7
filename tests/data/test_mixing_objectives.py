"""Weighted data mixing beyond clm (plmcli/data/mixing.py: BlendsSources): masked LMs (static make-mlm-data
instances built per source, dynamic masking) and ELECTRA train on a 2-source mix in its shares, resume bitwise,
and every mix reports one validation loss per source beside the pooled one."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import recorded_feeds, run, tiny_recipe
from test_mixing import corpus_text
from plmcli import api
from plmcli.data import mixing

pytestmark = pytest.mark.usefixtures("one_thread")

# Two alphabets with no letter in common: every wordpiece of a row tells its source.
A_WORDS = "alpha beta gamma delta epsilon zeta".split()
B_WORDS = "fury curvy jury crux wry yuck".split()

TINY_BERT = """\
extends: bert-mini
model: {n_layer: 1, n_head: 2, d_model: 16, d_ff: 32, max_positions: 32}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {dupe_factor: 2}
train: {seq_len: 32, global_batch_size: 4, max_steps: 6, eval_every: 3, eval_batches: 0, save_every: 3, log_every: 1}
"""
DYNAMIC = "objective: {dynamic: true, pairs: none, max_predictions: 0, packing: %s}\n"
TINY_ELECTRA = """\
extends: electra-mini
model: {n_layer: 1, n_head: 2, d_model: 16, d_ff: 32, embedding_size: 8, generator_size: 0.5, max_positions: 32}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 32, global_batch_size: 4, max_steps: 6, eval_every: 3, eval_batches: 0, save_every: 3, log_every: 1}
"""


@pytest.fixture
def sources(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(corpus_text(A_WORDS, 150), encoding="utf-8")
    b.write_text(corpus_text(B_WORDS, 60), encoding="utf-8")
    return a, b


def _from_b(rows: torch.Tensor, run_dir: Path) -> int:
    """How many rows hold source b's words: by the majority of their wordpieces (a random replacement may bring
    one of the other source's), padding and special tokens aside."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    a_letters, b_letters = set("".join(A_WORDS)), set("".join(B_WORDS))
    out = 0
    for row in rows.tolist():
        pieces = [tok.id_to_token(i).removeprefix("##") for i in row]
        in_a = sum(bool(p) and set(p) <= a_letters for p in pieces)
        in_b = sum(bool(p) and set(p) <= b_letters for p in pieces)
        assert in_a != in_b, pieces
        out += in_b > in_a
    return out


def _recipe(tmp_path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _weights_equal(x: Path, y: Path) -> bool:
    a, b = load_file(str(x / "model.safetensors")), load_file(str(y / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


TINY_ERNIE2 = TINY_BERT.replace("extends: bert-mini", "extends: ernie2-mini").replace("objective: {dupe_factor: 2}",
                                                                                       "objective: {dupe_factor: 1}")
CASES = {"bert-static": (TINY_BERT, "mlm"), "bert-dynamic": (TINY_BERT + DYNAMIC % "window", "mlm"),
         "roberta-full-sentences": (TINY_BERT + DYNAMIC % "full_sentences", "mlm"),
         "electra": (TINY_ELECTRA, "rtd"), "ernie2": (TINY_ERNIE2, "ernie2")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_mix_trains_in_its_shares_and_resumes_bitwise(sources, tmp_path, monkeypatch, case):
    from plmcli.objectives.registry import objective_class

    text, objective = CASES[case]
    fed = recorded_feeds(monkeypatch, objective_class(objective))
    a, b = sources
    recipe, data = _recipe(tmp_path, text), [f"{a}:0.75", f"{b}:0.25"]
    full = api.pretrain(str(recipe), data, str(tmp_path / "full"))
    assert full["steps"] == 6 and np.isfinite(full["val_loss"])
    rows = [r for x in fed for r in x]
    assert len(rows) == 24 and abs(_from_b(torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), tmp_path / "full")
                                   - 24 * 0.25) < 1
    first = [x.clone() for x in fed]
    fed.clear()
    api.pretrain(str(recipe), data, str(tmp_path / "half"), stop_after=3)
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert len(fed) == len(first) and all(torch.equal(x, y) for x, y in zip(fed, first))
    assert _weights_equal(tmp_path / "full", tmp_path / "half")
    # one validation loss per source, named by its file's stem, in metrics.jsonl and the summary
    evals = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals + [full]:
        each = [r["val_loss/a"], r["val_loss/b"]]
        assert min(each) - 1e-5 <= r["val_loss"] <= max(each) + 1e-5  # the pooled loss: their token-weighted mean


def test_one_source_mix_reports_the_single_corpus_loss(tmp_path):
    """A mix of one source trains as that corpus alone: the same val_loss, and its val_loss/NAME is the pooled one."""
    recipe = tiny_recipe(tmp_path / "tiny.yaml")
    a = tmp_path / "a.txt"
    a.write_text(corpus_text(A_WORDS, 120), encoding="utf-8")
    one = api.pretrain(str(recipe), [str(a)], str(tmp_path / "one"), stop_after=3)
    mix = api.pretrain(str(recipe), [f"{a}:1"], str(tmp_path / "mix"), stop_after=3)
    assert "val_loss/a" not in one and mix["val_loss/a"] == mix["val_loss"]
    assert mix["val_loss"] == pytest.approx(one["val_loss"], rel=1e-6)


def test_a_source_weighted_0_still_reports_its_validation_loss(sources, tmp_path):
    recipe = tiny_recipe(tmp_path / "tiny.yaml")
    a, b = sources
    s = api.pretrain(str(recipe), [f"{a}:1", f"{b}:0"], str(tmp_path / "r"), stop_after=3)
    assert s["val_loss/b"] > s["val_loss/a"]  # never trained on b's alphabet
    assert s["val_loss/a"] <= s["val_loss"] <= s["val_loss/b"]


def test_source_names_are_stems_made_unique():
    mix = {"dirs": ["x", "y", "z", "w"], "names": ["/data/web.txt", "/other/web.txt", "wiki/", "web.jsonl"]}
    assert mixing.source_names(mix) == ["web", "web-2", "wiki", "web-3"]
    assert mixing.source_names({"dirs": ["x", "y"]}) == ["source0", "source1"]


def test_token_budget_packing_is_refused_in_one_line(sources, tmp_path):
    a, b = sources
    recipe = _recipe(tmp_path, TINY_BERT + DYNAMIC % "doc_sentences")
    res = run("pretrain", "--recipe", recipe, "--data", f"{a}:1", "--data", f"{b}:1", "--out", tmp_path / "m")
    assert res.exit_code == 2 and "doc_sentences" in res.stderr and "\n" not in res.stderr.strip(), res.output


TINY_SEQ2SEQ = """\
extends: %s
model: {n_encoder_layers: 1, n_decoder_layers: 1, d_model: 16, d_ff: 32, n_head: 2, max_positions: 32, pad_vocab_multiple: 1}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 24, global_batch_size: 4, max_steps: 4, eval_every: 2, eval_batches: 0, save_every: 2, log_every: 1}
"""


@pytest.mark.parametrize("recipe", ["transformer-mini-denoising", "transformer-mini"])
def test_seq2seq_mixes_and_resumes_bitwise(sources, tmp_path, recipe):
    a, b = sources
    if recipe == "transformer-mini":  # translation: parallel text, source<TAB>target per line
        for f in (a, b):
            f.write_text("".join(f"{line}\t{' '.join(reversed(line.split()))}\n"
                                 for line in f.read_text().splitlines() if line), encoding="utf-8")
    path, data = _recipe(tmp_path, TINY_SEQ2SEQ % recipe), [f"{a}:0.75", f"{b}:0.25"]
    full = api.pretrain(str(path), data, str(tmp_path / "full"))
    assert full["steps"] == 4 and full["val_loss/a"] > 0 and full["val_loss/b"] > 0
    api.pretrain(str(path), data, str(tmp_path / "half"), stop_after=2)
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert _weights_equal(tmp_path / "full", tmp_path / "half")


def test_per_source_sums_stay_on_the_device_and_reduce_with_the_pooled_ones():
    """The pass reads nothing back per batch (a TorchDispatchMode sees no scalar read), and the sources' sums join
    the pooled ones in the one reduction over the processes."""
    from contextlib import nullcontext

    from torch.utils._python_dispatch import TorchDispatchMode

    from plmcli.objectives.base import StepOutput
    from plmcli.train.validation import evaluate

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    class Accelerator:  # two processes that scored the same batches: every sum doubles
        device, num_processes, reduced, distributed_type = torch.device("cpu"), 2, [], "MULTI_GPU"

        def autocast(self):
            return nullcontext()

        def reduce(self, t, reduction):
            self.reduced.append(t.shape)
            return t * 2

    class Objective:
        ppl_metric = "loss"

        def evaluate(self, *args):
            return None

        def init_state(self):
            return None

        def step(self, model, batch, state=None):  # loss = the batch's value per token, over its tokens
            count = batch["x"].sum()
            return StepOutput(batch["v"], {"loss": batch["v"] * count}, count)

    src = mixing.SOURCE
    stream = [{"x": torch.tensor([2, 2]), "v": torch.tensor(1.0), src: 0}, {"x": torch.tensor([4]), "v": torch.tensor(4.0), src: 1},
              {"x": torch.tensor([4]), "v": torch.tensor(2.0), src: 0}, None]

    class Stream(list):
        def batches_per_epoch(self):
            return len(self)

    acc = Accelerator()
    with Reads():
        res = evaluate(acc, torch.nn.Linear(1, 1), Objective(), Stream(stream), 0, ["web", "books"])
    assert Reads.n == 0 and acc.reduced == [torch.Size([1 + 1 + 2 * 2])]
    assert res["val_loss"] == pytest.approx((4 + 16 + 8) / 12)
    assert res["val_loss/web"] == pytest.approx((4 + 8) / 8) and res["val_loss/books"] == pytest.approx(4.0)


@pytest.mark.distributed
def test_two_processes_report_the_per_source_losses_of_one(sources, tmp_path):
    """torchrun on 2 CPU processes (gloo): each scores half the validation batches, and the sources' sums are reduced
    with the pooled ones, so val_loss/NAME is the one process's (with accumulation 2: the same steps)."""
    import os
    import subprocess
    import sys

    from helpers import free_port

    a, b = sources
    recipe = tiny_recipe(tmp_path / "tiny.yaml")
    args = ["--recipe", recipe, "--data", f"{a}:0.75", "--data", f"{b}:0.25", "--set", "train.micro_batch_size=2",
            "--set", "train.eval_batches=0"]
    one = api.pretrain(str(recipe), [f"{a}:0.75", f"{b}:0.25"], str(tmp_path / "one"),
                       {"train.micro_batch_size": 2, "train.eval_batches": 0})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    head = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
            str(free_port())]
    res = subprocess.run([sys.executable, *head, "-m", "plmcli", "pretrain", *map(str, args), "--out", tmp_path / "two"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    for key in ("val_loss", "val_loss/a", "val_loss/b"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key


def test_a_streamed_masked_lm_mix_resumes_bitwise(sources, tmp_path, monkeypatch):
    """--streaming with dynamic masking: each batch's masks are keyed by the lanes' positions, which in a mix hold -1
    for a source lane's line end not known yet — still a valid seed, and the same one on resume."""
    from plmcli.objectives.registry import objective_class

    fed = recorded_feeds(monkeypatch, objective_class("mlm"))
    a, b = sources
    recipe, data = _recipe(tmp_path, TINY_BERT + DYNAMIC % "window"), [f"{a}:0.75", f"{b}:0.25"]
    full = api.pretrain(str(recipe), data, str(tmp_path / "full"), streaming=True)
    assert full["steps"] == 6 and np.isfinite(full["val_loss/a"]) and np.isfinite(full["val_loss/b"])
    first = [x.clone() for x in fed]
    fed.clear()
    api.pretrain(str(recipe), data, str(tmp_path / "half"), streaming=True, stop_after=3)
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    assert len(fed) == len(first) and all(torch.equal(x, y) for x, y in zip(fed, first))
    assert _weights_equal(tmp_path / "full", tmp_path / "half")


def test_a_source_without_validation_is_said_in_one_line(tmp_path, capsys):
    """Text with no blank line is one document, so data.val_fraction holds none of it out: said before training,
    for one corpus and for a mix's source, instead of a run that ends with no validation loss and no reason."""
    recipe = tiny_recipe(tmp_path / "tiny.yaml")
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("".join(f"line {i} of a text without blank lines\n" for i in range(300)), encoding="utf-8")
    many = tmp_path / "many.txt"
    many.write_text(corpus_text(A_WORDS, 150), encoding="utf-8")
    api.pretrain(str(recipe), [str(one_doc)], str(tmp_path / "a"), overrides=["train.max_steps=1"])
    err = capsys.readouterr().err
    assert "note: the corpus has no validation split" in err and "data.doc_per_line=true" in err
    api.pretrain(str(recipe), [f"{many}:0.5", f"{one_doc}:0.5"], str(tmp_path / "b"), overrides=["train.max_steps=1"])
    assert "note: no validation split in the mix's source one, so no val_loss/one for it" in capsys.readouterr().err
    api.pretrain(str(recipe), [str(many)], str(tmp_path / "c"), overrides=["train.max_steps=1"])
    assert "validation split" not in capsys.readouterr().err
