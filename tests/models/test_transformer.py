import math

import pytest
import torch

from helpers import reverse_pairs, tiny_s2s_recipe
from plmcli.models.layers import CrossAttention
from plmcli.models.transformer import Transformer, TransformerConfig, sinusoids


def tiny(**kw):
    base = dict(vocab_size=40, max_positions=32, n_encoder_layers=2, n_decoder_layers=2, d_model=16, d_ff=32, n_head=2,
                dropout=0.0)
    return TransformerConfig(**(base | kw))


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_sinusoid_values():
    pe = sinusoids(50, 8)
    assert pe.shape == (50, 8)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 4))
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-6)
    assert pe[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-6)
    # dims 2i, 2i+1 have wavelength 2π · 10000^(2i/d)
    assert pe[7, 2].item() == pytest.approx(math.sin(7 / 10000 ** (2 / 8)), abs=1e-6)
    assert pe[7, 3].item() == pytest.approx(math.cos(7 / 10000 ** (2 / 8)), abs=1e-6)
    assert pe[42, 6].item() == pytest.approx(math.sin(42 / 10000 ** (6 / 8)), abs=1e-6)


def test_embeddings_scaled_shared_and_tied():
    torch.manual_seed(0)
    m = Transformer(tiny()).eval()
    ids = torch.tensor([[3, 9, 4]])
    expected = m.embed.weight[ids] * 4.0 + sinusoids(32, 16)[:3]  # √16 = 4
    torch.testing.assert_close(m.embed_tokens(m.embed, ids), expected)
    assert m.src_embed is m.embed and m.out is None  # one matrix: source, target, softmax
    h = torch.randn(1, 2, 16)
    torch.testing.assert_close(m.logits(h), h @ m.embed.weight.T)
    assert m.embed.weight.std().item() == pytest.approx(16 ** -0.5, rel=0.15)
    unshared = Transformer(tiny(share_embeddings=False, tie_output=False, scale_embeddings=False))
    assert unshared.src_embed is not unshared.embed and unshared.out is not None and unshared.scale == 1.0


def test_base_size():
    """6+6 layers, 512/2048/8, shared 37k vocabulary: 63.08M parameters (the paper's Table 3 says 65M)."""
    with torch.device("meta"):
        m = Transformer(TransformerConfig(vocab_size=37000))
    n = sum(p.numel() for p in m.parameters())
    enc = 4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 2 * 2 * 512
    dec = enc + 4 * (512 * 512 + 512) + 2 * 512
    assert n == 6 * enc + 6 * dec + 37000 * 512 == 63_082_496
    assert len(m.encoder) == 6 and not m.encoder[0].pre_norm and m.cfg.dropout == 0.1


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_causal_source_padding_masked_and_incremental_matches(norm):
    torch.manual_seed(0)
    m = Transformer(tiny(norm_position=norm)).eval()
    src = torch.randint(5, 40, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    tgt = torch.randint(5, 40, (2, 7))
    full = m(src, mask, tgt)
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 1) % 40
    other = m(src, mask, changed)
    torch.testing.assert_close(full[:, :4], other[:, :4])
    assert not torch.allclose(full[:, 4:], other[:, 4:])
    src2 = src.clone()
    src2[1, 4:] = 1  # different ids under the padding
    torch.testing.assert_close(m(src2, mask, tgt), full)
    torch.testing.assert_close(m(src[1:, :4], mask[1:, :4], tgt[1:]), full[1:], atol=1e-5, rtol=1e-5)
    state = m.encode(src, mask)
    steps = []
    for t in range(tgt.shape[1]):
        logits, state = m.decode_step(tgt[:, t], state)
        steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_by_hand():
    torch.manual_seed(0)
    att = CrossAttention(8, 2).eval()
    x, mem = torch.randn(1, 3, 8), torch.randn(1, 4, 8)
    mask = torch.tensor([[True, True, True, False]])
    y = att(x, att.memory_kv(mem), mask)
    q = att.q(x).view(1, 3, 2, 4).transpose(1, 2)
    k, v = att.kv(mem).view(1, 4, 2, 2, 4).permute(2, 0, 3, 1, 4)
    w = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    expected = att.proj((w @ v).transpose(1, 2).reshape(1, 3, 8))
    torch.testing.assert_close(y, expected)
    assert (w[..., 3] == 0).all()


def test_positions_limit():
    m = Transformer(tiny())
    with pytest.raises(ValueError, match="max_positions"):
        m(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 33, dtype=torch.long))


def test_learns_to_reverse(tmp_path, one_thread):
    from plmcli.api import pretrain
    from plmcli.generate import generate

    data = reverse_pairs(tmp_path / "rev.txt")
    summary = pretrain(str(tiny_s2s_recipe(tmp_path / "r.yaml", "transformer", max_steps=350)), data=[str(data)],
                       out=str(tmp_path / "run"))
    assert summary["val_nll"] < 0.2
    held = reverse_pairs(tmp_path / "held.txt", n=10, seed=99).read_text().splitlines()
    outs = generate(str(tmp_path / "run"), [h.split("\t")[0] for h in held], strategy="beam", num_beams=3)
    assert sum(o == h.split("\t")[1] for o, h in zip(outs, held)) >= 8, list(zip(outs, held))
