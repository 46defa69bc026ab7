"""An optimizer step's loss is a mean per target over all of its micro-batches and processes, as one big
batch gives it, however uneven the micro-batches' targets (masked tokens, labelled pairs, padding) are;
and an evaluation scores the same samples on any number of processes."""

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import TINY_RECIPE, tiny_corpus
from plm_process import start_ranks
from plmcli import api
from plmcli.objectives.registry import objective_class

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("one_thread")]

# BERT at a tiny size, masked as it trains: whole-word masking over character tokens skips a word that would
# overshoot a row's budget, so rows of one length mask different numbers of tokens and micro-batches hold
# uneven targets (the budget counted over maskable tokens, mask_count maskable: each row's own). Full windows: the
# samples of a step do not depend on the micro batch (no length grouping).
TINY_BERT = """\
extends: bert-mini
model: {n_layer: 2, n_head: 2, d_model: 32, d_ff: 64, max_positions: 64, dropout: 0.0, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
objective: {dynamic: true, pairs: none, packing: window, masking: wwm, mask_prob: 0.4, max_predictions: 0, mask_count: maskable}
train: {seq_len: 64, global_batch_size: 8, max_steps: 1, eval_every: 0, save_every: 0, log_every: 1, grad_clip: 0.0}
optim: {name: sgd, lr: 1.0, weight_decay: 0.0, warmup_steps: 0, schedule: constant}
"""


def _first_loss(run) -> float:
    return next(json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x)


def test_accumulation_with_uneven_targets_equals_one_big_batch(tmp_path, monkeypatch):
    """One SGD step at lr 1 from the same weights: w1 = w0 - g, so the weights compare the gradients.
    Accumulation 4 (micro batch 2) gives one big batch's (micro batch 8) loss and gradient to 1e-6, though
    its micro-batches mask different numbers of tokens."""
    (tmp_path / "bert.yaml").write_text(TINY_BERT, encoding="utf-8")
    corpus = [str(tiny_corpus(tmp_path / "corpus.txt", n_docs=60))]
    seen = []
    counts = objective_class("mlm").loss_counts

    def recorded(self, batch):
        out = counts(self, batch)
        seen.append(int(out["mlm"]))
        return out

    monkeypatch.setattr(objective_class("mlm"), "loss_counts", recorded)
    api.pretrain(str(tmp_path / "bert.yaml"), corpus, str(tmp_path / "big"))
    api.pretrain(str(tmp_path / "bert.yaml"), corpus, str(tmp_path / "accum"), overrides=["train.micro_batch_size=2"])
    assert len(seen) == 5 and sum(seen[1:]) == seen[0] and len(set(seen[1:])) > 1, seen  # uneven micro-batches
    big, accum = load_file(str(tmp_path / "big" / "model.safetensors")), load_file(str(tmp_path / "accum" / "model.safetensors"))
    moved = 0
    for k in big:
        torch.testing.assert_close(accum[k], big[k], rtol=0, atol=1e-6)
        moved += int(k.endswith("weight"))
    assert moved > 10
    assert _first_loss(tmp_path / "accum") == pytest.approx(_first_loss(tmp_path / "big"), rel=1e-6)


def test_val_loss_is_the_same_on_one_and_two_processes(tmp_path):
    """train.eval_batches counts batches of the recipe's micro batch (here the global batch: micro batch 0),
    so 2 processes, each with micro-batches of half the size, score the very samples 1 process scores,
    token-weighted: the same val_loss (to float rounding) after the same step."""
    (tmp_path / "tiny.yaml").write_text(TINY_RECIPE, encoding="utf-8")
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    common = ["--recipe", tmp_path / "tiny.yaml", "--data", corpus, "--set", "model.dropout=0.0",
              "--set", "train.max_steps=1", "--set", "train.eval_batches=2", "--set", "optim.lr=1e-9"]
    procs = start_ranks(tmp_path, 1, "pretrain", *common, "--out", tmp_path / "one")
    procs += start_ranks(tmp_path, 2, "pretrain", *common, "--out", tmp_path / "two")
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    one, two = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("one", "two"))
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-6, abs=0)
