import pytest
import torch

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
    assert m.encoder and not m.causal


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


def _block_to_hf(b, prefix: str, d: int) -> dict:
    """Our fused QKV (3d, d) -> HF query / key / value; post-LN ln_1 / ln_2 -> attention / output LayerNorm."""
    q, k, v = b.attn.qkv.weight.split(d, 0)
    qb, kb, vb = b.attn.qkv.bias.split(d, 0)
    return {
        prefix + "attention.self.query.weight": q, prefix + "attention.self.query.bias": qb,
        prefix + "attention.self.key.weight": k, prefix + "attention.self.key.bias": kb,
        prefix + "attention.self.value.weight": v, prefix + "attention.self.value.bias": vb,
        prefix + "attention.output.dense.weight": b.attn.proj.weight, prefix + "attention.output.dense.bias": b.attn.proj.bias,
        prefix + "attention.output.LayerNorm.weight": b.ln_1.weight, prefix + "attention.output.LayerNorm.bias": b.ln_1.bias,
        prefix + "intermediate.dense.weight": b.mlp.fc.weight, prefix + "intermediate.dense.bias": b.mlp.fc.bias,
        prefix + "output.dense.weight": b.mlp.proj.weight, prefix + "output.dense.bias": b.mlp.proj.bias,
        prefix + "output.LayerNorm.weight": b.ln_2.weight, prefix + "output.LayerNorm.bias": b.ln_2.bias,
    }


def _encoder_to_hf(ours: Bert, base: str) -> dict:
    d = ours.cfg.d_model
    sd = {base + "embeddings.word_embeddings.weight": ours.wte.weight,
          base + "embeddings.position_embeddings.weight": ours.wpe.weight,
          base + "embeddings.token_type_embeddings.weight": ours.wtt.weight,
          base + "embeddings.LayerNorm.weight": ours.ln_emb.weight, base + "embeddings.LayerNorm.bias": ours.ln_emb.bias}
    for i, b in enumerate(ours.blocks):
        sd |= _block_to_hf(b, f"{base}encoder.layer.{i}.", d)
    return sd


def _load(hf, sd):
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith("decoder.weight") or k.endswith("position_ids") for k in missing), missing


def bert_to_hf(ours: Bert, hf) -> None:
    """Our Bert -> transformers.BertForPreTraining (the decoder weight is tied to the word embeddings there too)."""
    m = ours.mlm
    sd = _encoder_to_hf(ours, "bert.") | {
        "bert.pooler.dense.weight": ours.pooler.weight, "bert.pooler.dense.bias": ours.pooler.bias,
        "cls.predictions.transform.dense.weight": m.dense.weight, "cls.predictions.transform.dense.bias": m.dense.bias,
        "cls.predictions.transform.LayerNorm.weight": m.ln.weight, "cls.predictions.transform.LayerNorm.bias": m.ln.bias,
        "cls.predictions.bias": m.decoder.bias, "cls.predictions.decoder.bias": m.decoder.bias,
        "cls.seq_relationship.weight": ours.nsp.weight, "cls.seq_relationship.bias": ours.nsp.bias,
    }
    _load(hf, sd)


def roberta_to_hf(ours: Bert, hf) -> None:
    m = ours.mlm
    sd = _encoder_to_hf(ours, "roberta.") | {
        "lm_head.dense.weight": m.dense.weight, "lm_head.dense.bias": m.dense.bias,
        "lm_head.layer_norm.weight": m.ln.weight, "lm_head.layer_norm.bias": m.ln.bias,
        "lm_head.bias": m.decoder.bias, "lm_head.decoder.bias": m.decoder.bias,
    }
    _load(hf, sd)


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
    bert_to_hf(ours, hf)
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
    roberta_to_hf(ours, hf)
    x = torch.randint(3, 103, (3, T))  # no padding token (id 1): RoBERTa's positions are then 2..T+1
    with torch.no_grad():
        torch.testing.assert_close(ours(x).mlm_logits, hf(input_ids=x).logits, atol=1e-5, rtol=1e-5)
