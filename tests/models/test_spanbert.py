import pytest
import torch

from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.spanbert import SpanBert, SpanBertConfig, span_boundaries


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, n_layer=2, n_head=4, d_model=32, dropout=0.0, attn_dropout=0.0,
                sbo_d_position=8, sbo_max_span=4)
    return SpanBertConfig(**(base | kw))


def test_span_boundaries_on_a_hand_made_batch():
    T = 10
    # row 0: masked 2..4 and 6 -> two spans, boundaries (1, 5) and (5, 7).
    # row 1: masked 1..2 and 3..7 touch: one run, as SpanBERT's code merges them, boundaries [CLS] and 8;
    #        masked 9 is the row's last column: no right boundary, no SBO target.
    row1 = [1, 2, 3, 4, 5, 6, 7, 9]
    positions = torch.tensor([4, 2, 6, 3] + [T + t for t in row1])  # in any order
    index, left, right, offset = span_boundaries(positions, T, max_span=20)
    got = {int(positions[i]): (int(lo), int(hi), int(o)) for i, lo, hi, o in zip(index, left, right, offset)}
    assert got == {2: (1, 5, 0), 3: (1, 5, 1), 4: (1, 5, 2), 6: (5, 7, 0),
                   **{T + t: (T + 0, T + 8, t - 1) for t in range(1, 8)}}
    # Offsets of max_span or more get no SBO target (the released code truncates its pair targets too).
    index, _, _, offset = span_boundaries(positions, T, max_span=3)
    assert sorted(int(positions[i]) for i in index) == [2, 3, 4, 6, T + 1, T + 2, T + 3]
    assert int(offset.max()) == 2


def test_heads_run_only_with_masked_positions():
    torch.manual_seed(0)
    m = SpanBert(tiny()).eval()
    x = torch.randint(5, 97, (2, 12))
    with torch.no_grad():
        full = m(x)
        part = m(x, mlm_positions=torch.tensor([3, 4, 12 + 7]))
    assert full.mlm_logits.shape == (2, 12, 97) and full.sbo_logits is None and full.sbo_index is None
    assert part.mlm_logits.shape == (3, 97) and part.sbo_logits.shape == (3, 97)
    assert part.sbo_index.tolist() == [0, 1, 2]
    assert full.nsp_logits is None and full.pooled is None  # single segments, no NSP (§3.3)


def test_encoder_and_mlm_head_are_berts():
    """SpanBERT is BERT plus one head: with BERT's weights it computes BERT's outputs (BERT itself has a
    parity test against transformers in test_bert.py)."""
    torch.manual_seed(0)
    span = SpanBert(tiny(nsp_head=True)).eval()
    bert = Bert(BertConfig(**{k: v for k, v in vars(span.cfg).items() if not k.startswith("sbo")})).eval()
    missing, unexpected = span.load_state_dict(bert.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("sbo.") for k in missing)
    x = torch.randint(5, 97, (3, 10))
    pos = torch.tensor([1, 2, 13, 25])
    with torch.no_grad():
        a, b = span(x, mlm_positions=pos), bert(x, mlm_positions=pos)
    for name in ("hidden", "pooled", "mlm_logits", "nsp_logits"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name))


def _reference_sbo(model, hidden, pairs, max_targets):
    """The released head (SpanBERT's pair_bert.py, BertPairTargetPredictionHead) in its padded layout:
    pairs (B, P, 2) boundary positions -> (B, P, max_targets, V) logits for every offset."""
    head = model.sbo
    B, P, _ = pairs.shape
    C = hidden.shape[-1]
    left = torch.gather(hidden, 1, pairs[:, :, 0:1].repeat(1, 1, C)).view(B * P, 1, C).repeat(1, max_targets, 1)
    right = torch.gather(hidden, 1, pairs[:, :, 1:2].repeat(1, 1, C)).view(B * P, 1, C).repeat(1, max_targets, 1)
    pos = head.position.weight[:max_targets].unsqueeze(0).repeat(B * P, 1, 1)
    h = torch.cat((left, right, pos), -1)
    h = head.ln2(torch.nn.functional.gelu(head.fc2(head.ln1(torch.nn.functional.gelu(head.fc1(h))))))
    return (h @ model.wte.weight.T + head.bias).view(B, P, max_targets, -1)


def test_sbo_matches_the_released_head():
    torch.manual_seed(0)
    m = SpanBert(tiny()).eval()
    with torch.no_grad():
        for p in m.sbo.parameters():  # non-trivial LayerNorms and biases
            p.add_(torch.randn_like(p) * 0.1)
    T = 12
    x = torch.randint(5, 97, (2, T))
    spans = [(0, 2, 4), (0, 7, 7), (1, 3, 6)]  # (row, first, last) masked position
    positions = torch.tensor([r * T + t for r, s, e in spans for t in range(s, e + 1)])
    with torch.no_grad():
        out = m(x, mlm_positions=positions)
        ref = _reference_sbo(m, out.hidden, torch.tensor([[[1, 5], [6, 8]], [[2, 7], [2, 7]]]), 4)
    expect = [ref[0, 0, 0], ref[0, 0, 1], ref[0, 0, 2], ref[0, 1, 0], ref[1, 0, 0], ref[1, 0, 1], ref[1, 0, 2], ref[1, 0, 3]]
    assert out.sbo_index.tolist() == list(range(8))
    torch.testing.assert_close(out.sbo_logits, torch.stack(expect), atol=1e-5, rtol=1e-5)


def test_decoder_weight_shared_bias_own_and_flops():
    torch.manual_seed(0)
    m = SpanBert(tiny())
    assert m.mlm.decoder.weight is m.wte.weight
    assert m.sbo.bias is not m.mlm.decoder.bias and m.sbo.position.weight.shape == (4, 8)
    c = m.cfg
    sbo = (2 * 32 + 8) * 32 + 32 * 32 + 32 * 97
    bert = Bert(BertConfig(**{k: v for k, v in vars(c).items() if not k.startswith("sbo")}))
    assert m.flops_per_token(64) == pytest.approx(bert.flops_per_token(64) + 6 * 0.15 * sbo)
    with pytest.raises(PlmError, match="sbo_max_span"):
        SpanBert(tiny(sbo_max_span=0))
