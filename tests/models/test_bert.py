import pytest
import torch

from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, n_layer=2, n_head=4, d_model=32, dropout=0.0, attn_dropout=0.0)
    return BertConfig(**(base | kw))


def _padded_batch(V, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, V, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    x[mask == 0] = 0  # pad id 0
    types = torch.zeros(3, T, dtype=torch.long)
    types[0, 6:] = 1
    types[1, 4:8] = 1
    return x, types, mask


def test_masked_only_logits_equal_gathered_all_positions():
    torch.manual_seed(0)
    m = Bert(tiny()).eval()
    x, types, mask = _padded_batch(97)
    positions = torch.tensor([1, 7, 12 + 3, 24 + 0, 24 + 4])
    with torch.no_grad():
        full = m(x, types, mask)
        part = m(x, types, mask, mlm_positions=positions)
    assert full.mlm_logits.shape == (3, 12, 97) and part.mlm_logits.shape == (5, 97)
    torch.testing.assert_close(part.mlm_logits, full.mlm_logits.flatten(0, 1)[positions])
    torch.testing.assert_close(part.nsp_logits, full.nsp_logits)
    assert full.hidden.shape == (3, 12, 32) and full.pooled.shape == (3, 32) and full.nsp_logits.shape == (3, 2)


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(0)
    m = Bert(tiny()).eval()
    x = torch.randint(5, 97, (1, 7))
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        alone = m(x, types)
        for filler in (0, 42):  # whatever sits in the padding, it is never attended to
            xp = torch.cat([x, torch.full((1, 5), filler)], 1)
            tp = torch.cat([types, torch.zeros(1, 5, dtype=torch.long)], 1)
            mp = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
            padded = m(xp, tp, mp)
            torch.testing.assert_close(padded.hidden[:, :7], alone.hidden, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(padded.nsp_logits, alone.nsp_logits, atol=1e-5, rtol=1e-5)


def test_all_ones_mask_is_the_unmasked_fast_path():
    torch.manual_seed(0)
    m = Bert(tiny()).eval()
    x = torch.randint(5, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(m(x, attention_mask=torch.ones(2, 9)).hidden, m(x).hidden)


def test_bidirectional():
    torch.manual_seed(0)
    m = Bert(tiny()).eval()
    x = torch.randint(5, 97, (1, 10))
    y = x.clone()
    y[0, 9] = (x[0, 9] + 1 - 5) % 92 + 5  # change only the last token
    with torch.no_grad():
        assert not torch.allclose(m(x).hidden[0, 0], m(y).hidden[0, 0])


def test_tied_decoder_and_heads():
    m = Bert(tiny())
    assert m.mlm.decoder.weight is m.wte.weight and m.mlm.decoder.bias is not None
    assert Bert(tiny(tie_embeddings=False)).mlm.decoder.weight is not Bert(tiny()).wte.weight
    r = Bert(tiny(nsp_head=False, type_vocab_size=0, position_offset=2, max_positions=34))
    assert r.pooler is None and r.nsp is None and r.wtt is None and r.max_positions == 32
    out = r(torch.randint(0, 97, (2, 32)))
    assert out.pooled is None and out.nsp_logits is None
    h, pooled = r.encode(torch.randint(0, 97, (2, 5)))
    assert h.shape == (2, 5, 32) and pooled is None
    assert m.traits.bidirectional and not m.traits.causal


def test_positions_limit():
    with pytest.raises(ValueError, match="max_positions"):
        Bert(tiny())(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="max_positions"):
        Bert(tiny(position_offset=2))(torch.zeros(1, 31, dtype=torch.long))


def test_flops_count_the_mlm_head_at_the_masked_share():
    m = Bert(tiny(vocab_size=1000))
    body = sum(p.numel() for p in m.blocks.parameters())
    expect = 6 * (body + 0.15 * (32 * 32 + 32 * 1000)) + 12 * 2 * 64 * 32
    assert m.flops_per_token(64) == pytest.approx(expect)


# ---------------------------------------------------------------- parity with transformers


def _load_into_hf(ours: Bert, hf, pad_id: int = 0) -> dict:
    """Our weights into an HF model through Bert.to_hf (HF's decoder is tied to its word embeddings, so
    loading those fills it); returns the HF config to_hf wrote."""
    cfg, sd = ours.to_hf({"tokenizer": {"special_token_ids": {"pad": pad_id}}})
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith(("decoder.weight", "decoder.bias")) for k in missing), missing
    built = hf.config.to_dict()  # every key to_hf writes is one the HF config reads, with the value built by hand
    assert all(built[k] == v for k, v in cfg.items() if k != "architectures" and not k.endswith("_token_id")), cfg
    return cfg


def _randomize(model, seed=1):
    """Non-trivial values everywhere (init leaves biases at 0 and norms at 1, which would hide mix-ups)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_parity_with_transformers_bert_for_pretraining():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = Bert(tiny(vocab_size=101, max_positions=40, n_layer=3, n_head=4, d_model=48, d_ff=80)).eval()
    _randomize(ours)
    hf_cfg = transformers.BertConfig(vocab_size=101, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=40, type_vocab_size=2,
                                     hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     layer_norm_eps=1e-12, tie_word_embeddings=True)
    hf = transformers.BertForPreTraining(hf_cfg).eval()
    assert _load_into_hf(ours, hf)["architectures"] == ["BertForPreTraining"]
    x, types, mask = _padded_batch(101, T=40)
    with torch.no_grad():
        a = ours(x, types, mask)
        b = hf(input_ids=x, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(a.mlm_logits, b.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.nsp_logits, b.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_parity_with_transformers_roberta_for_masked_lm():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    T = 24
    ours = Bert(tiny(vocab_size=103, max_positions=T + 2, position_offset=2, type_vocab_size=1, nsp_head=False,
                     n_layer=2, n_head=4, d_model=32, layer_norm_eps=1e-5)).eval()
    _randomize(ours)
    hf_cfg = transformers.RobertaConfig(vocab_size=103, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=T + 2, type_vocab_size=1,
                                        pad_token_id=1, hidden_act="gelu", hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5, tie_word_embeddings=True)
    hf = transformers.RobertaForMaskedLM(hf_cfg).eval()
    assert _load_into_hf(ours, hf, pad_id=1)["architectures"] == ["RobertaForMaskedLM"]
    x = torch.randint(3, 103, (3, T))  # no padding token (id 1): RoBERTa's positions are then 2..T+1
    with torch.no_grad():
        torch.testing.assert_close(ours(x).mlm_logits, hf(input_ids=x).logits, atol=1e-5, rtol=1e-5)


def test_pre_ln_variant_normalizes_once_before_the_heads():
    torch.manual_seed(0)
    m = Bert(tiny(norm_position="pre", dropout=0.0, attn_dropout=0.0)).eval()
    x = torch.randint(0, m.cfg.vocab_size, (2, 9))
    h, _ = m.encode(x)
    e = m.ln_emb(m.wte(x) + m.wpe(torch.arange(9)) + m.wtt.weight[0])
    for b in m.blocks:  # pre-LN: x + f(LN(x))
        e = e + b.attn(b.ln_1(e))
        e = e + b.mlp(b.ln_2(e))
    torch.testing.assert_close(h, m.ln_f(e))
    with pytest.raises(PlmError, match="post-LN"):
        m.to_hf({})
