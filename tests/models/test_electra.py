import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import tiny_corpus
from plmcli.errors import PlmError
from plmcli.models.electra import Electra, ElectraConfig

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, n_layer=2, n_head=4, d_model=32, d_ff=64, embedding_size=16,
                generator_size=0.25, dropout=0.0, attn_dropout=0.0)
    return ElectraConfig(**(base | kw))


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


def test_two_networks_share_the_embeddings_and_nothing_else():
    m = Electra(tiny())
    assert m.cfg.generator_dims() == (8, 1, 16)  # 1/4 of hidden 32, heads 4, FFN 64
    assert m.generator.blocks[0].attn.qkv.weight.shape == (24, 8) and m.generator.blocks[0].mlp.fc.weight.shape == (16, 8)
    assert m.discriminator.blocks[0].attn.qkv.weight.shape == (96, 32) and len(m.generator.blocks) == 2
    # Each network projects the 16-wide shared embeddings to its own width.
    assert m.generator.embeddings_project.weight.shape == (8, 16)
    assert m.discriminator.embeddings_project.weight.shape == (32, 16)
    assert m.mlm.decoder.weight is m.wte.weight and m.mlm.dense.weight.shape == (16, 8)
    assert m.rtd.dense.weight.shape == (32, 32) and m.rtd.dense_prediction.weight.shape == (1, 32)
    gen, disc = ({id(p) for p in net.parameters()} for net in (m.generator, m.discriminator))
    assert not gen & disc
    # Without a narrower embedding the discriminator reads the embeddings directly.
    wide = Electra(tiny(embedding_size=0))
    assert wide.discriminator.embeddings_project is None and wide.generator.embeddings_project.weight.shape == (8, 32)
    assert m.traits.bidirectional and not m.traits.causal and m.max_positions == 32


def test_forward_parts_and_masked_positions():
    torch.manual_seed(0)
    m = Electra(tiny()).eval()
    x, types, mask = _padded_batch(97)
    positions = torch.tensor([1, 7, 12 + 3, 24 + 0, 24 + 4])
    with torch.no_grad():
        full = m(x, types, mask)  # the default part is the generator: a masked LM
        part = m(x, types, mask, positions, part="generator")
        disc = m(x, types, mask, part="discriminator")
        h, pooled = m.encode(x, types, mask)
    assert full.mlm_logits.shape == (3, 12, 97) and full.rtd_logits is None and full.hidden.shape == (3, 12, 8)
    torch.testing.assert_close(part.mlm_logits, full.mlm_logits.flatten(0, 1)[positions])
    assert disc.rtd_logits.shape == (3, 12) and disc.mlm_logits is None and disc.hidden.shape == (3, 12, 32)
    assert pooled is None
    torch.testing.assert_close(h, disc.hidden)  # finetuning reads the discriminator
    with pytest.raises(ValueError, match="part"):
        m(x, part="both")
    with pytest.raises(ValueError, match="max_positions"):
        m(torch.zeros(1, 33, dtype=torch.long))


def test_padding_does_not_change_real_tokens():
    torch.manual_seed(0)
    m = Electra(tiny()).eval()
    x = torch.randint(5, 97, (1, 7))
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        alone_g, alone_d = m(x, types), m(x, types, part="discriminator")
        for filler in (0, 42):
            xp = torch.cat([x, torch.full((1, 5), filler)], 1)
            tp = torch.cat([types, torch.zeros(1, 5, dtype=torch.long)], 1)
            mp = torch.cat([torch.ones(1, 7), torch.zeros(1, 5)], 1).long()
            torch.testing.assert_close(m(xp, tp, mp).mlm_logits[:, :7], alone_g.mlm_logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(m(xp, tp, mp, part="discriminator").rtd_logits[:, :7], alone_d.rtd_logits,
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("size", [0.0, 1.0, 1.5, -0.25])
def test_generator_size_must_be_a_fraction(size):
    with pytest.raises(PlmError, match="generator_size") as e:
        tiny(generator_size=size)
    assert "0.25" in e.value.hint


def test_bad_sizes_are_clean_errors():
    from plmcli.config import load_recipe

    with pytest.raises(PlmError, match="generator_size 1"):
        load_recipe("electra-mini", ["model.generator_size=1"])
    with pytest.raises(PlmError, match="does not split into its 5 heads"):
        tiny(d_model=64, n_head=16, generator_size=0.3)  # generator: 19 wide, 5 heads
    with pytest.raises(PlmError, match="not divisible"):
        tiny(d_model=30)


def test_flops_count_both_networks():
    m = Electra(tiny(vocab_size=1000))
    per_token = sum(p.numel() for net in (m.generator, m.discriminator, m.rtd) for p in net.parameters())
    expect = 6 * (per_token + 0.15 * (8 * 16 + 16 * 1000)) + 12 * 2 * 64 * (32 + 8)
    assert m.flops_per_token(64) == pytest.approx(expect)


# ---------------------------------------------------------------- parity with transformers


def _randomize(model, seed):
    """Non-trivial values everywhere (init leaves biases at 0 and norms at 1, which would hide mix-ups)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_parity_with_transformers_generator_and_discriminator():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(vocab_size=101, embedding_size=24, num_hidden_layers=3, max_position_embeddings=40, type_vocab_size=2,
                  hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        hidden_size=48, num_attention_heads=4, intermediate_size=80, **common)).eval()
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        hidden_size=12, num_attention_heads=1, intermediate_size=20, **common)).eval()
    _randomize(disc, 1)
    _randomize(gen, 2)
    # ELECTRA's two networks read one set of embeddings (and the generator decodes with it).
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    cfg = ElectraConfig(vocab_size=101, max_positions=40, n_layer=3, n_head=4, d_model=48, d_ff=80, embedding_size=24,
                        generator_size=0.25, dropout=0.0, attn_dropout=0.0)
    assert cfg.generator_dims() == (12, 1, 20)
    got, sd = Electra.from_hf(disc.config.to_dict(), disc.state_dict(), {"generator": (gen.config.to_dict(), gen.state_dict())})
    assert got == cfg
    ours = Electra(cfg).eval()
    ours.load_state_dict(sd)  # strict, and in place: the tie stays
    assert ours.mlm.decoder.weight is ours.wte.weight
    x, types, mask = _padded_batch(101, T=40)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, types, mask).mlm_logits,
                                   gen(input_ids=x, token_type_ids=types, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(x, types, mask, part="discriminator").rtd_logits,
                                   disc(input_ids=x, token_type_ids=types, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- pretrain, then finetune


TINY_ELECTRA = """\
extends: electra-mini
model: {n_layer: 1, n_head: 2, d_model: 16, d_ff: 32, embedding_size: 8, generator_size: 0.5, max_positions: 32}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 32, global_batch_size: 4, max_steps: 4, eval_every: 2, eval_batches: 2, save_every: 0, log_every: 1}
"""


def test_pretrain_tiny_electra_then_finetune_sst2(tmp_path):
    from plmcli import api
    from helpers import finetune
    from plmcli.runs import load_encoder, load_finetuned

    (tmp_path / "r.yaml").write_text(TINY_ELECTRA)
    s = api.pretrain(str(tmp_path / "r.yaml"), [str(tiny_corpus(tmp_path / "c.txt", 40))], str(tmp_path / "run"))
    assert s["steps"] == 4 and np.isfinite(s["train_loss"]) and {"val_mlm_loss", "val_rtd_loss", "val_rtd_acc"} <= set(s)
    assert s["val_ppl"] == pytest.approx(np.exp(s["val_mlm_loss"]))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert len(train_rows) == 4
    for r in train_rows:  # loss = MLM + 50 · RTD, averaged with the same weights
        assert r["loss"] == pytest.approx(r["mlm_loss"] + 50 * r["rtd_loss"], rel=1e-5) and 0 <= r["rtd_acc"] <= 1

    run = tmp_path / "run"
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=3, train__batch_size=16, out=str(tmp_path / "ft"))
    assert res["steps"] == 3 and res["settings"]["max_seq_len"] == 32 and 0 <= res["dev"]["accuracy"] <= 1
    model, _, _ = load_finetuned(str(tmp_path / "ft"))
    pre = load_encoder(run, json.loads((run / "config.json").read_text()))
    assert isinstance(model.encoder, Electra)
    # The generator is never reached by a classification pass: frozen, and its weights come back unchanged.
    for name, p in model.encoder.generator.named_parameters():
        torch.testing.assert_close(p, pre.generator.get_parameter(name))
    # The discriminator was pretrained and then finetuned.
    assert not torch.equal(model.encoder.discriminator.blocks[0].attn.qkv.weight, pre.discriminator.blocks[0].attn.qkv.weight)


def test_classifier_freezes_the_generator_and_the_rtd_head():
    from plmcli.objectives.classify import SequenceClassifier

    torch.manual_seed(0)
    clf = SequenceClassifier(Electra(tiny()), 2)
    frozen = clf.freeze_unused(cls_id=2, sep_id=3)
    names = {n for n, _ in clf.named_parameters()}
    expect = {n for n in names if n.startswith(("encoder.generator.", "encoder.mlm.", "encoder.rtd."))}
    assert set(frozen) == expect and "encoder.mlm.dense.weight" in expect
    # Everything the discriminator path uses trains, the shared (and tied) word embeddings included.
    trainable = {n for n, p in clf.named_parameters() if p.requires_grad}
    assert trainable == names - expect and "encoder.wte.weight" in trainable and "encoder.ln_emb.weight" in trainable
