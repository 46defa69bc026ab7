import pytest
import torch

from helpers import reverse_pairs, tiny_s2s_recipe
from plmcli.models.seq2seq import Attention, Seq2Seq, Seq2SeqConfig


def tiny(**kw):
    base = dict(vocab_size=40, d_embed=16, d_hidden=24, dropout=0.0, max_positions=32)
    return Seq2SeqConfig(**(base | kw))


def padded_batch():
    """Two sources, the second one padded (3 real tokens of 6)."""
    torch.manual_seed(1)
    src = torch.randint(5, 40, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    src[1, 3:] = 0
    return src, mask, torch.randint(5, 40, (2, 5))


@pytest.mark.parametrize("score", ["dot", "general", "additive"])
def test_attention_weights_sum_to_one_and_skip_padding(score):
    torch.manual_seed(0)
    att = Attention(score, 8, 8)
    memory, query = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    ctx, w = att(query, att.keys(memory), memory, mask)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
    assert (w[1, :, 2:] == 0).all() and (w[1, :, :2] > 0).all()
    torch.testing.assert_close(ctx, w @ memory)
    if score == "dot":  # the plain score, by hand
        s = query[0] @ memory[0].T
        torch.testing.assert_close(w[0], s.softmax(-1))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("score", ["dot", "general", "additive"])
def test_model_attention_ignores_source_padding(cell, score):
    torch.manual_seed(0)
    model = Seq2Seq(tiny(cell=cell, attention=score)).eval()
    src, mask, tgt = padded_batch()
    w = model.attention_weights(src, mask, tgt)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5))
    assert (w[1, :, 3:] == 0).all()
    # Padding changes nothing: the padded row scores as the same source alone (packed bidirectional encoder).
    alone = model(src[1:, :3], mask[1:, :3], tgt[1:])
    torch.testing.assert_close(model(src, mask, tgt)[1:], alone, atol=1e-5, rtol=1e-5)
    src2 = src.clone()
    src2[1, 3:] = 7  # other ids under the padding
    torch.testing.assert_close(model(src2, mask, tgt), model(src, mask, tgt))


@pytest.mark.parametrize("input_feeding", [True, False])
def test_decoder_is_causal_and_incremental_matches_teacher_forcing(input_feeding):
    torch.manual_seed(0)
    model = Seq2Seq(tiny(cell="lstm", n_layer=2, input_feeding=input_feeding)).eval()
    src, mask, tgt = padded_batch()
    full = model(src, mask, tgt)
    changed = tgt.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % 40
    other = model(src, mask, changed)
    torch.testing.assert_close(full[:, :3], other[:, :3])
    assert not torch.allclose(full[:, 3:], other[:, 3:])
    state = model.encode(src, mask)
    steps = []
    for t in range(tgt.shape[1]):
        logits, state = model.decode_step(tgt[:, t], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_tied_output_and_config_errors():
    m = Seq2Seq(tiny(tie_embeddings=True))
    assert m.traits.seq2seq and m.max_positions == 32
    assert m.logits(torch.zeros(1, 24)).shape == (1, 40)
    with pytest.raises(ValueError, match="dot attention"):
        Attention("dot", 8, 6)
    with pytest.raises(ValueError, match="odd"):
        Seq2Seq(tiny(d_hidden=25))


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine spin ~50× slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_learns_to_reverse(tmp_path, one_thread):
    """The recipe path end to end: pretrain on a word-reversal task, then greedy-decode held-out sources."""
    from plmcli.api import eval_ppl, pretrain
    from plmcli.generate import generate

    data = reverse_pairs(tmp_path / "rev.txt")
    summary = pretrain(str(tiny_s2s_recipe(tmp_path / "r.yaml", "seq2seq")), data=[str(data)], out=str(tmp_path / "run"))
    assert summary["val_nll"] < 0.1 and summary["val_loss"] == summary["val_nll"]  # no label smoothing here
    held = reverse_pairs(tmp_path / "held.txt", n=10, seed=99).read_text().splitlines()
    outs = generate(str(tmp_path / "run"), [h.split("\t")[0] for h in held])
    assert sum(o == h.split("\t")[1] for o, h in zip(outs, held)) >= 8, list(zip(outs, held))
    res = eval_ppl([str(tmp_path / "held.txt")], str(tmp_path / "run"))
    assert res["ppl"] < 1.3 and res["scores"] == "target given source"
    assert res["tokens"] == sum(len(h.split("\t")[1].split()) + 1 for h in held)  # target words + eos
