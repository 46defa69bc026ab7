"""The classic-LM recipes train at mini size on the corpora shipped with plm, and eval-ppl scores text
with each."""

import math
from pathlib import Path

import pytest

from plmcli import api

SAMPLE = Path(__file__).resolve().parents[1] / "data"
SMALL = ["train.max_steps=2", "train.eval_every=2", "train.eval_batches=1", "train.save_every=2", "train.log_every=1",
         "tokenizer.vocab_size=300"]
MINI = {
    "ngram-bigram-addk": [],
    "ngram-kn5": [],
    "nnlm-ptb": ["model.d_embed=8", "model.d_hidden=16", "train.seq_len=16", "train.global_batch_size=4"] + SMALL,
    "rnn-ptb": ["model.d_embed=16", "model.d_hidden=16", "train.seq_len=8", "train.global_batch_size=4"] + SMALL,
    "gru-ptb": ["model.d_embed=16", "model.d_hidden=16", "train.seq_len=8", "train.global_batch_size=4"] + SMALL,
    "lstm-ptb-small": ["model.d_embed=16", "model.d_hidden=16", "train.seq_len=8", "train.global_batch_size=4"] + SMALL,
    "elmo-mini": ["model.d_proj=8", "model.d_hidden=16", "train.seq_len=8", "train.global_batch_size=4"] + SMALL,
    "seq2seq-attn-mini": ["model.d_embed=16", "model.d_hidden=16", "train.global_batch_size=4"] + SMALL,
    "transformer-mini": ["model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32", "model.d_ff=64",
                         "train.global_batch_size=4"] + SMALL,
    "transformer-mini-denoising": ["model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32",
                                   "model.d_ff=64", "train.seq_len=32", "train.global_batch_size=4"] + SMALL,
}


@pytest.mark.parametrize("recipe", sorted(MINI))
def test_mini_recipe_on_the_shipped_corpus(recipe, tmp_path):
    s = api.pretrain(recipe, out=str(tmp_path / "run"), overrides=MINI[recipe] or None)
    assert s["stop_reason"] in ("max_steps", "fit")
    parallel = "transformer-mini" == recipe or "seq2seq" in recipe
    text = tmp_path / "eval.txt"
    source = SAMPLE / ("reverse-sample.txt" if parallel else "shakespeare-sample.txt")
    text.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[:40]), encoding="utf-8")
    r = api.eval_ppl([str(text)], str(tmp_path / "run"))
    assert math.isfinite(r["ppl"]) and r["ppl"] > 1 and r["tokens"] > 0
