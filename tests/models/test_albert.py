import json
from plmcli.config import override_layers
import math
from pathlib import Path

import pytest
import torch

from helpers import tiny_corpus
from plmcli.config import load_recipe
from plmcli.errors import PlmError
from plmcli.models.albert import Albert, AlbertConfig

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, n_layer=3, n_head=4, d_model=32, d_ff=48, embedding_size=8,
                dropout=0.0, attn_dropout=0.0)
    return AlbertConfig(**(base | kw))


def _padded_batch(V, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, V, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, T - 9:] = 0
    mask[2, 6:] = 0
    x[mask == 0] = 0
    types = torch.zeros(3, T, dtype=torch.long)
    types[0, T // 2:] = 1
    types[1, 3: T - 9] = 1
    return x, types, mask


# ---------------------------------------------------------------- parity with transformers


def _hf_albert(transformers, V, T, **kw):
    cfg = transformers.AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=80, max_position_embeddings=T,
                                    type_vocab_size=2, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
                                    layer_norm_eps=1e-12, **kw)
    hf = transformers.AlbertForPreTraining(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial values everywhere: zero biases and unit norms would hide mix-ups
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return hf


def test_parity_with_transformers_albert_for_pretraining():
    transformers = pytest.importorskip("transformers")
    V, T = 101, 40
    hf = _hf_albert(transformers, V, T)
    cfg, sd = Albert.from_hf(hf.config.to_dict(), hf.state_dict())
    assert cfg == tiny(vocab_size=V, max_positions=T, n_layer=3, n_head=4, d_model=48, d_ff=80, embedding_size=16)
    ours = Albert(cfg).eval()
    ours.load_state_dict(sd)  # strict: every weight mapped, nothing left over
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    x, types, mask = _padded_batch(V, T)
    with torch.no_grad():
        a = ours(x, types, mask)
        b = hf(input_ids=x, token_type_ids=types, attention_mask=mask)
        at = ours(x, types, mask, mlm_positions=torch.tensor([1, T + 5, 2 * T + 3]))
    torch.testing.assert_close(a.mlm_logits, b.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.nsp_logits, b.sop_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(at.mlm_logits, b.prediction_logits.flatten(0, 1)[[1, T + 5, 2 * T + 3]], atol=1e-5, rtol=1e-5)
    assert ours.mlm.decoder.weight is ours.wte.weight  # tied after loading, as in HF


def test_from_hf_refuses_layer_groups_it_cannot_share():
    transformers = pytest.importorskip("transformers")
    hf = _hf_albert(transformers, 50, 16, inner_group_num=2)
    with pytest.raises(PlmError, match="inner_group_num = 2"):
        Albert.from_hf(hf.config.to_dict(), hf.state_dict())


# ---------------------------------------------------------------- sharing


@pytest.mark.parametrize("share", ["all", "attention", "ffn", "none"])
def test_parameter_counts_by_sharing(share):
    V, P, E, H, F, L = 97, 32, 8, 32, 48, 3
    m = Albert(tiny(share=share))
    emb = V * E + P * E + 2 * E + 2 * E + (E * H + H)  # word, position, segment, LayerNorm, E -> H
    attn = 3 * (H * H + H) + (H * H + H) + 2 * H  # qkv, output, LayerNorm
    ffn = (H * F + F) + (F * H + H) + 2 * H
    heads = (H * H + H) + (2 * H + 2) + (H * E + E) + 2 * E + V  # pooler, SOP, MLM transform + LN + bias (decoder tied)
    n_attn = 1 if share in ("all", "attention") else L
    n_ffn = 1 if share in ("all", "ffn") else L
    assert (len(m.attention), len(m.ffn)) == (n_attn, n_ffn)
    assert sum(p.numel() for p in m.parameters()) == emb + n_attn * attn + n_ffn * ffn + heads


def test_distinct_layers_differ_and_shared_ones_are_one_module():
    torch.manual_seed(0)
    none = Albert(tiny(share="none"))
    qkv = [a.fn.qkv.weight for a in none.attention]
    fc = [f.fn.fc.weight for f in none.ffn]
    assert not torch.equal(qkv[0], qkv[1]) and not torch.equal(fc[1], fc[2])  # independently initialised
    att = Albert(tiny(share="attention"))
    assert len(att.attention) == 1 and not torch.equal(att.ffn[0].fn.fc.weight, att.ffn[1].fn.fc.weight)
    ffn = Albert(tiny(share="ffn"))
    assert len(ffn.ffn) == 1 and not torch.equal(ffn.attention[0].fn.qkv.weight, ffn.attention[2].fn.qkv.weight)


def test_share_all_reuses_one_layer_at_every_depth():
    """With share=all the depth is a loop count: 2 and 5 layers hold the same weights, and the
    5-layer model equals the one layer applied five times."""
    torch.manual_seed(0)
    two, five = Albert(tiny(n_layer=2)).eval(), Albert(tiny(n_layer=5)).eval()
    five.load_state_dict(two.state_dict())
    x = torch.randint(5, 97, (2, 9))
    with torch.no_grad():
        h = five.emb_proj(five.ln_emb(five.wte(x) + five.wpe.weight[:9] + five.wtt.weight[0]))
        for _ in range(5):
            h = five.ffn[0](five.attention[0](h, False, None))
        torch.testing.assert_close(five.encode(x)[0], h)
        assert not torch.allclose(two.encode(x)[0], h, atol=1e-3)


def test_bad_share_is_a_clean_error():
    with pytest.raises(PlmError) as e:
        tiny(share="layers")
    assert "model.share 'layers'" in e.value.message and "--set model.share=all" in e.value.hint
    with pytest.raises(PlmError, match="all, attention, ffn, none"):
        load_recipe("albert-mini", ["model.share=bogus"])


# ---------------------------------------------------------------- the rest of the interface


def test_factorised_embedding_tied_decoder_and_interface():
    m = Albert(tiny())
    assert m.wte.weight.shape == (97, 8) and m.emb_proj.weight.shape == (32, 8)
    assert m.mlm.decoder.weight is m.wte.weight and m.mlm.dense.weight.shape == (8, 32)
    assert m.traits.bidirectional and not m.traits.causal and m.max_positions == 32
    h, pooled = m.encode(torch.randint(0, 97, (2, 5)))
    assert h.shape == (2, 5, 32) and pooled.shape == (2, 32)
    with pytest.raises(ValueError, match="max_positions"):
        m(torch.zeros(1, 33, dtype=torch.long))


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(0)
    m = Albert(tiny()).eval()
    x = torch.randint(5, 97, (1, 7))
    with torch.no_grad():
        alone = m(x)
        padded = m(torch.cat([x, torch.full((1, 4), 42)], 1), attention_mask=torch.tensor([[1] * 7 + [0] * 4]))
    torch.testing.assert_close(padded.hidden[:, :7], alone.hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.nsp_logits, alone.nsp_logits, atol=1e-5, rtol=1e-5)


def test_flops_count_one_layer_at_every_depth():
    m = Albert(tiny(vocab_size=1000))
    layer = sum(p.numel() for p in m.attention[0].parameters()) + sum(p.numel() for p in m.ffn[0].parameters())
    expect = 6 * (3 * layer + 8 * 32 + 0.15 * (32 * 8 + 8 * 1000)) + 12 * 3 * 64 * 32
    assert m.flops_per_token(64) == pytest.approx(expect)
    assert Albert(tiny(vocab_size=1000, share="none")).flops_per_token(64) == pytest.approx(expect)


# ---------------------------------------------------------------- end to end


def test_albert_mini_pretrains_with_sop_and_ngrams_then_finetunes_sst2(tmp_path):
    from safetensors.torch import load_file

    from plmcli import api
    from helpers import finetune
    from plmcli.runs import load_finetuned

    r = load_recipe("albert-mini")
    assert (r.objective.pairs, r.objective.masking, r.objective.dynamic) == ("sop", "ngram", False)
    over = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.d_ff=64", "model.embedding_size=16",
            "model.max_positions=32", "tokenizer.vocab_size=120", "data.val_fraction=0.2", "objective.dupe_factor=1",
            "train.seq_len=32", "train.global_batch_size=8", "train.eval_every=3", "train.eval_batches=2",
            "train.save_every=0", "train.log_every=1"]
    s = api.pretrain("albert-mini", [str(tiny_corpus(tmp_path / "c.txt", 40))], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 4}))
    assert s["steps"] == 4 and math.isfinite(s["val_mlm_loss"]) and 0 <= s["val_nsp_acc"] <= 1  # SOP labels reached the head
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["family"] == "albert" and cfg["model"]["share"] == "all" and cfg["model"]["embedding_size"] == 16
    res = finetune("sst2", from_run=str(tmp_path / "run"), data_dir=str(SAMPLE), train__max_steps=3,
                   train__batch_size=8, task__max_seq_len=32, out=str(tmp_path / "ft"))
    assert res["steps"] == 3 and math.isfinite(res["train_loss"]) and 0 <= res["dev"]["accuracy"] <= 1
    model, _, _ = load_finetuned(str(tmp_path / "ft"))
    assert isinstance(model.encoder, Albert)
    pre, tuned = load_file(str(tmp_path / "run" / "model.safetensors")), load_file(str(tmp_path / "ft" / "model.safetensors"))
    assert not torch.equal(pre["emb_proj.weight"], tuned["encoder.emb_proj.weight"])  # the encoder trained
    assert torch.equal(pre["mlm.dense.weight"], tuned["encoder.mlm.dense.weight"])  # the MLM head is frozen
