import json
from plmcli.config import override_layers
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli import api
from plmcli.api import count_params
from plmcli.config import load_recipe
from plmcli.config_sections import TokenizerConfig
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from plmcli.eval.scoring import score
from plmcli.models.rnn import RNNLM, RNNConfig


pytestmark = pytest.mark.usefixtures("one_thread")


CELLS = ["rnn", "lstm", "gru"]


def tiny(**kw):
    return RNNConfig(**(dict(vocab_size=53, n_layer=2, d_embed=12, d_hidden=16) | kw))


@pytest.mark.parametrize("cell", CELLS)
def test_shapes_and_state(cell):
    torch.manual_seed(0)
    m = RNNLM(tiny(cell=cell)).eval()
    logits, state = m(torch.randint(0, 53, (3, 7)))
    assert logits.shape == (3, 7, 53)
    hs = state if cell == "lstm" else (state,)
    assert len(hs) == (2 if cell == "lstm" else 1)
    assert all(h.shape == (2, 3, 16) for h in hs)


@pytest.mark.parametrize("cell", CELLS)
def test_state_continues_the_sequence_exactly(cell):
    """Two segments with the state carried = one pass over both: what BPTT and eval-ppl rely on."""
    torch.manual_seed(0)
    m = RNNLM(tiny(cell=cell)).eval()
    x = torch.randint(0, 53, (2, 12))
    full, _ = m(x)
    a, s = m(x[:, :5])
    b, _ = m(x[:, 5:], s)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-6, rtol=1e-5)
    fresh, _ = m(x[:, 5:])
    assert not torch.allclose(fresh, b)  # the state really mattered


@pytest.mark.parametrize("cell", CELLS)
def test_no_future_leak(cell):
    torch.manual_seed(0)
    m = RNNLM(tiny(cell=cell)).eval()
    x = torch.randint(0, 53, (2, 10))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % 53
    a, _ = m(x)
    b, _ = m(y)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_tied_embeddings_with_and_without_projection():
    same = RNNLM(tiny(d_embed=16, tie_embeddings=True))
    assert same.lm_head.weight is same.wte.weight and same.proj is None
    proj = RNNLM(tiny(tie_embeddings=True))  # 12 ≠ 16: a 16 -> 12 projection feeds the tied softmax
    assert proj.lm_head.weight is proj.wte.weight and proj.proj.weight.shape == (12, 16)
    assert proj(torch.randint(0, 53, (1, 4)))[0].shape == (1, 4, 53)
    untied = RNNLM(tiny())
    assert untied.lm_head.weight is not untied.wte.weight
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(untied) - n(proj) == 53 * 16 - 16 * 12  # the shared matrix counted once


def test_init_range_and_dropout_placement():
    torch.manual_seed(0)
    m = RNNLM(tiny(init_range=0.05, dropout_embed=0.5, dropout_hidden=0.5, dropout_output=0.5))
    for name, p in m.named_parameters():
        assert p.abs().max() <= 0.05 and p.std() > 0.02, name
    assert m.rnn.dropout == 0.5  # between the layers; torch's RNNs never drop the recurrent connection
    x = torch.randint(0, 53, (2, 6))
    assert not torch.equal(m(x)[0], m(x)[0])  # training: dropout on
    m.eval()
    assert torch.equal(m(x)[0], m(x)[0])
    assert RNNLM(tiny(n_layer=1, dropout_hidden=0.5)).rnn.dropout == 0  # one layer: nothing in between
    with pytest.raises(ValueError, match="cell"):
        RNNLM(tiny(cell="lstmm"))


def test_zaremba_small_parameter_count():
    # embedding 10000·200 + 2 LSTM layers of 4·200·(200+200) weights and 2·4·200 biases (torch keeps two
    # bias vectors) + softmax 200·10000 + 10000
    assert count_params(load_recipe("lstm-ptb-small")) == 2_000_000 + 2 * (320_000 + 1_600) + 2_010_000


def _word_tokenizer(lines):
    cfg = TokenizerConfig(kind="word", vocab_size=200, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})
    tok = train_tokenizer(iter(lines), cfg)
    return tok, {"tokenizer": {"special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}}


@pytest.mark.parametrize("cell", CELLS)
def test_eval_ppl_equals_one_pass_over_the_text(cell, tmp_path):
    text = tiny_corpus(tmp_path / "t.txt", n_docs=6).read_text()
    lines = [x for x in text.splitlines() if x.strip()]
    tok, cfg = _word_tokenizer(lines + ["zebra"])
    (tmp_path / "eval.txt").write_text(text + "an unseen zebra word\n")
    torch.manual_seed(0)
    m = RNNLM(tiny(cell=cell, vocab_size=tok.get_vocab_size()))
    res = score(m, [str(tmp_path / "eval.txt")], tok, cfg, max_length=7)  # chunks of 7 carry the state

    eos = tok.token_to_id("<eos>")
    ids = [eos]
    for line in lines + ["an unseen zebra word"]:
        ids += tok.encode(line, add_special_tokens=False).ids + [eos]  # eos ends every line, blank ones skipped
    seq = torch.tensor(ids)
    with torch.no_grad():
        logits, _ = m.eval()(seq[None, :-1])
    nll = F.cross_entropy(logits[0], seq[1:], reduction="sum").item()
    assert res["tokens"] == len(ids) - 1 == sum(len(x.split()) for x in lines) + 4 + len(lines) + 1
    assert res["nll"] * res["tokens"] == pytest.approx(nll, rel=1e-5)
    assert res["ppl"] == pytest.approx(math.exp(nll / res["tokens"]), rel=1e-5)
    assert res["oov_rate"] == pytest.approx(3 / (res["tokens"] - len(lines) - 1))  # "an", "unseen", "word" -> <unk>
    assert res["first_token"] == "conditioned on eos" and res["line_end"].startswith("<eos>")
    assert score(m, [str(tmp_path / "eval.txt")], tok, cfg, max_length=1000)["nll"] == pytest.approx(res["nll"], rel=1e-5)
    (tmp_path / "oov.txt").write_text("quite unknown\n\nwords\n")
    with pytest.raises(PlmError, match="every word .* is out of the model's vocabulary"):
        score(m, [str(tmp_path / "oov.txt")], tok, cfg)


RECIPES = ["rnn-ptb", "gru-ptb", "lstm-ptb-small", "lstm-ptb-medium"]
TINY_RUN = ["model.d_embed=16", "model.d_hidden=16", "train.global_batch_size=4", "train.seq_len=8",
            "data.val_fraction=0.2", "train.eval_every=4", "train.save_every=4", "train.log_every=1"]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trains_and_scores(name, tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    s = api.pretrain(name, [str(corpus)], str(tmp_path / "run"), overrides=override_layers(TINY_RUN, {"train.max_steps": 8}))
    assert s["steps"] == 8 and math.isfinite(s["val_loss"])
    res = api.eval_ppl([str(corpus)], str(tmp_path / "run"))
    assert math.isfinite(res["ppl"]) and 1 < res["ppl"] < 200 and res["oov_rate"] == 0


def test_step_schedule_reaches_the_loop(tmp_path):
    """The recipe's decay_start / decay_every / decay_factor drive the logged lr."""
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    over = TINY_RUN + ["optim.decay_start=3", "optim.decay_every=2", "optim.decay_factor=0.5", "optim.lr=1.0"]
    api.pretrain("lstm-ptb-small", [str(corpus)], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 7}))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # lr logged after step k is the lr of step k+1 (0-based k): steps 0-2 at 1, 3-4 at 0.5, 5-6 at 0.25, 7 at 0.125
    assert [r["lr"] for r in rows if "loss" in r] == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.25, 0.125])
