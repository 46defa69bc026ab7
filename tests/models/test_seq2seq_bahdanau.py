"""Bahdanau's decoder (model.decoder: bahdanau): the score from s_{t-1}, c_t fed into the RNN step."""

import json
import math

import pytest
import torch

from helpers import reverse_pairs, tiny_s2s_recipe
from plmcli.config import load_recipe
from plmcli.errors import PlmError
from plmcli.models.seq2seq import Seq2Seq, Seq2SeqConfig


def tiny(**kw):
    base = dict(vocab_size=40, d_embed=16, d_hidden=24, dropout=0.0, max_positions=32, decoder="bahdanau",
                attention="additive")
    return Seq2SeqConfig(**(base | kw))


def padded_batch():
    torch.manual_seed(1)
    src = torch.randint(5, 40, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    src[1, 3:] = 0
    return src, mask, torch.randint(5, 40, (2, 5))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("score", ["dot", "general", "additive"])
def test_shapes_padding_and_incremental_decoding(cell, score):
    torch.manual_seed(0)
    model = Seq2Seq(tiny(cell=cell, attention=score, n_layer=2)).eval()
    src, mask, tgt = padded_batch()
    logits = model(src, mask, tgt)
    assert logits.shape == (2, 5, 40) and torch.isfinite(logits).all()
    w = model.attention_weights(src, mask, tgt)
    assert w.shape == (2, 5, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5))
    assert (w[1, :, 3:] == 0).all()
    torch.testing.assert_close(model(src[1:, :3], mask[1:, :3], tgt[1:]), logits[1:], atol=1e-5, rtol=1e-5)
    state, steps = model.encode(src, mask), []
    for t in range(tgt.shape[1]):
        step, state = model.decode_step(tgt[:, t], state)
        steps.append(step)
    torch.testing.assert_close(torch.stack(steps, 1), logits, atol=1e-5, rtol=1e-5)


def test_attention_reads_the_previous_state_not_the_current_input():
    """Bahdanau attends from s_{t-1}: step 1's weights cannot depend on y_0. Luong attends from h_t, which has read y_0."""
    src, mask, tgt = padded_batch()
    other = tgt.clone()
    other[:, 0] = (other[:, 0] + 1) % 40
    differ = lambda a, b: (a - b).abs().max().item() > 1e-4  # noqa: E731
    for decoder in ("bahdanau", "luong"):
        torch.manual_seed(0)
        model = Seq2Seq(tiny(decoder=decoder, init_range=1.0)).eval()  # wide weights: attention far from uniform
        with torch.no_grad():
            w, w2 = model.attention_weights(src, mask, tgt), model.attention_weights(src, mask, other)
        if decoder == "bahdanau":
            assert torch.equal(w[:, 0], w2[:, 0])
        else:
            assert differ(w[:, 0], w2[:, 0])
        assert differ(w[:, 1], w2[:, 1])  # later steps see y_0 through the state


def test_one_step_by_hand():
    """A GRU decoder step with the paper's equations written out: e_j = vᵀ tanh(W s_0 + U h_j + b),
    α = softmax(e), c = Σ α_j h_j, s_1 = GRU([E y_0; c], s_0), logits = W_out tanh(W_o [c; s_1; E y_0]) + b."""
    torch.manual_seed(3)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=7, d_embed=3, d_hidden=4, bidirectional=False, cell="gru", dropout=0.0,
                                  attention="additive", d_attention=5, decoder="bahdanau", tie_embeddings=False,
                                  max_positions=8)).eval()
    src, mask, y0 = torch.tensor([[2, 5, 3]]), torch.ones(1, 3, dtype=torch.bool), torch.tensor([4])
    state = model.encode(src, mask)
    with torch.no_grad():
        h, s0 = state["memory"][0], state["h"][0, -1]  # (S, H) annotations h_j, and s_0
        a = model.attention
        e = torch.tanh(s0 @ a.w_q.weight.T + h @ a.w_k.weight.T + a.w_k.bias) @ a.v.weight[0]
        alpha = torch.softmax(e, 0)
        c = alpha @ h
        emb = model.embed.weight[y0[0]]
        x = torch.cat([emb, c])
        g = model.decoder
        wi, wh, bi, bh = g.weight_ih_l0, g.weight_hh_l0, g.bias_ih_l0, g.bias_hh_l0
        gi, gh = wi @ x + bi, wh @ s0 + bh
        r, z = torch.sigmoid(gi[:4] + gh[:4]), torch.sigmoid(gi[4:8] + gh[4:8])
        n = torch.tanh(gi[8:] + r * gh[8:])
        s1 = (1 - z) * n + z * s0
        want = model.out(torch.tanh(model.combine.weight @ torch.cat([c, s1, emb])))
        logits, after = model.decode_step(y0, state)
        weights = model.attention_weights(src, mask, y0[:, None])
    torch.testing.assert_close(weights[0, 0], alpha)
    torch.testing.assert_close(after["h"][0, -1], s1)
    torch.testing.assert_close(logits[0], want)


def test_recipe_and_bad_value():
    r = load_recipe("seq2seq-bahdanau-mini")
    assert r.model.decoder == "bahdanau" and r.model.attention == "additive"
    assert load_recipe("seq2seq-attn-mini").model.decoder == "luong"  # today's decoder stays the default
    with pytest.raises(PlmError, match="luong"):
        load_recipe("seq2seq-attn-mini", ["model.decoder=bengio"])


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (two threads on a busy 2-core machine spin)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_pretrain_generate_and_eval_ppl(tmp_path):
    """The recipe path end to end with Bahdanau's decoder: the loss falls and it learns the reversal task, then greedy and
    beam decoding and eval-ppl run on the run."""
    from plmcli.api import eval_ppl, pretrain
    from plmcli.generate import generate

    data = reverse_pairs(tmp_path / "rev.txt")
    summary = pretrain(str(tiny_s2s_recipe(tmp_path / "r.yaml", "seq2seq")), data=[str(data)], out=str(tmp_path / "run"),
                       overrides=["model.decoder=bahdanau"])
    assert summary["val_nll"] < 0.1
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert losses[-1] < 0.1 * losses[0], losses  # it trains: from ln |V| to near 0
    held = reverse_pairs(tmp_path / "held.txt", n=10, seed=99).read_text().splitlines()
    sources, targets = [h.split("\t")[0] for h in held], [h.split("\t")[1] for h in held]
    assert sum(o == t for o, t in zip(generate(str(tmp_path / "run"), sources), targets)) >= 8
    assert sum(o == t for o, t in zip(generate(str(tmp_path / "run"), sources, strategy="beam", num_beams=3), targets)) >= 8
    res = eval_ppl([str(tmp_path / "held.txt")], str(tmp_path / "run"))
    assert math.isfinite(res["ppl"]) and res["ppl"] < 1.3
