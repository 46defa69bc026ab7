"""HF interop of ALBERT, ELECTRA and XLNet (the `to_hf` / `from_hf` / `hf_model_types` seam): our tiny model
-> to_hf -> the transformers model built from that config gives our logits; transformers -> from_hf -> ours
gives theirs; from_hf(to_hf(m)) is m; configs with no equivalent are clean errors; a pretrained run goes
through `plm export --format hf`, AutoModel….from_pretrained and `plm import`. HF -> ours for the released
layouts (AlbertForPreTraining, ELECTRA's two networks, XLNet's LM and classifier) is in
tests/models/test_{albert,electra,xlnet}.py; here the others (bare models, one ALBERT group per layer)."""

from plmcli.config import override_layers
import json

import pytest
import torch
from safetensors.torch import save_file

from plmcli.errors import PlmError
from plmcli.models.albert import Albert, AlbertConfig
from plmcli.models.electra import Electra, ElectraConfig
from plmcli.models.registry import FAMILIES, model_class
from plmcli.models.xlnet import XLNet, XLNetConfig

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

V, T = 53, 12
RUN = {"tokenizer": {"special_token_ids": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4, "eos": 5}}}
"""The part of a run's config.json that to_hf reads."""


def _randomize(model, seed=1):
    """Non-trivial values everywhere: init leaves biases at 0 and LayerNorms at 1, which would hide mix-ups."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def _batch(vocab=V, seed=0):
    """(ids, token types, attention mask) of 3 rows, two of them right-padded with id 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(6, vocab, (3, T), generator=g)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    x[mask == 0] = 0
    types = torch.zeros(3, T, dtype=torch.long)
    types[0, 6:] = 1
    types[1, 3:8] = 1
    return x, types, mask


AUTO = {"AlbertForPreTraining": "AutoModelForPreTraining", "AlbertForMaskedLM": "AutoModelForMaskedLM",
        "ElectraForPreTraining": "AutoModelForPreTraining", "ElectraForMaskedLM": "AutoModelForMaskedLM",
        "XLNetLMHeadModel": "AutoModelForCausalLM"}


def _hf_model(config: dict, sd: dict):
    """The transformers model an export describes, with its weights; checks what a writer needs of the export."""
    json.dumps(config)  # plain JSON: config.json is written by hand
    assert all(v.is_contiguous() for v in sd.values())
    assert len({v.untyped_storage().data_ptr() for v in sd.values()}) == len(sd)  # no shared storage
    save_file(sd, "/dev/null")  # what safetensors would refuse (shared or non-contiguous tensors) fails here
    auto = getattr(transformers, AUTO[config["architectures"][0]])
    hf = auto.from_config(transformers.AutoConfig.for_model(**config)).eval()
    assert type(hf).__name__ == config["architectures"][0]
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    full = hf.state_dict()
    loaded = {full[k].data_ptr() for k in sd}
    # Everything is loaded except what HF ties to a loaded tensor (and re-ties itself from_pretrained).
    assert not unexpected and all(full[k].data_ptr() in loaded for k in missing), (missing, unexpected)
    return hf, set(missing)


def _assert_round_trip(model, config: dict, sd: dict, **extras):
    cfg, back = type(model).from_hf(config, sd, **extras)
    ours = model.state_dict()
    assert cfg == model.cfg
    assert set(back) == set(ours)
    for k, v in ours.items():
        assert torch.equal(back[k], v), k


def test_the_driver_finds_each_family_by_its_model_type():
    """The scan the driver does over the registry: each model_type names exactly one family."""
    claims = [(t, name) for name in FAMILIES for t in getattr(model_class(name), "hf_model_types", ())]
    found = dict(claims)
    assert len(found) == len(claims)
    assert {t: found[t] for t in ("albert", "electra", "xlnet")} == {"albert": "albert", "electra": "electra", "xlnet": "xlnet"}


# ---------------------------------------------------------------- ALBERT


def albert(**kw):
    base = dict(vocab_size=V, max_positions=16, n_layer=3, n_head=4, d_model=32, d_ff=40, embedding_size=8,
                dropout=0.1, attn_dropout=0.1)
    torch.manual_seed(0)
    return _randomize(Albert(AlbertConfig(**(base | kw))))


@pytest.mark.parametrize("kw, arch, tied", [
    (dict(), "AlbertForPreTraining", {"predictions.decoder.weight", "predictions.decoder.bias"}),
    (dict(share="none", nsp_head=False, tie_embeddings=False, activation="gelu"), "AlbertForMaskedLM", set()),
])
def test_albert_export_gives_our_logits(kw, arch, tied):
    m = albert(**kw)
    config, sd = m.to_hf(RUN)
    assert config["architectures"] == [arch] and config["num_hidden_groups"] == (1 if m.cfg.share == "all" else 3)
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, 2, 3)
    hf, missing = _hf_model(config, sd)
    assert missing == tied
    x, types, mask = _batch()
    with torch.no_grad():
        ours, ref = m(x, types, mask), hf(input_ids=x, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(ours.mlm_logits, ref.prediction_logits if m.cfg.nsp_head else ref.logits, atol=1e-5, rtol=1e-5)
    if m.cfg.nsp_head:
        torch.testing.assert_close(ours.nsp_logits, ref.sop_logits, atol=1e-5, rtol=1e-5)
    _assert_round_trip(m, config, sd)


def test_albert_imports_a_bare_model_with_a_group_per_layer():
    """AlbertModel (no "albert." prefix, no heads) with num_hidden_groups = layers is share=none; the missing
    MLM and SOP heads are left out for the driver to initialise."""
    hf_cfg = transformers.AlbertConfig(vocab_size=V, embedding_size=8, hidden_size=32, num_hidden_layers=2,
                                       num_hidden_groups=2, num_attention_heads=4, intermediate_size=40,
                                       max_position_embeddings=16, hidden_act="relu")
    torch.manual_seed(0)
    hf = _randomize(transformers.AlbertModel(hf_cfg))
    cfg, sd = Albert.from_hf(hf_cfg.to_dict(), hf.state_dict())
    assert (cfg.share, cfg.activation, cfg.nsp_head) == ("none", "relu", True)
    ours = Albert(cfg).eval()
    missing, unexpected = ours.load_state_dict(sd, strict=False)
    assert not unexpected and {k.split(".")[0] for k in missing} == {"mlm", "nsp"}
    x, types, mask = _batch()
    with torch.no_grad():
        h, pooled = ours.encode(x, types, mask)
        ref = hf(input_ids=x, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(h, ref.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, ref.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("field, value, match", [
    ("num_hidden_groups", 2, "num_hidden_groups = 2"), ("inner_group_num", 2, "inner_group_num = 2"),
    ("hidden_act", "gelu_10", "hidden_act 'gelu_10'"), ("position_embedding_type", "relative_key", "position_embedding_type"),
])
def test_albert_configs_without_an_equivalent_are_refused(field, value, match):
    config = transformers.AlbertConfig(vocab_size=V, num_hidden_layers=4).to_dict() | {field: value}
    with pytest.raises(PlmError, match=match) as e:
        Albert.from_hf(config, {})
    assert e.value.hint


@pytest.mark.parametrize("kw, match", [(dict(share="attention"), "model.share 'attention'"),
                                       (dict(position_offset=2, max_positions=18), "position_offset 2"),
                                       (dict(type_vocab_size=0), "type_vocab_size 0")])
def test_albert_runs_without_an_equivalent_are_not_exported(kw, match):
    with pytest.raises(PlmError, match=match):
        albert(**kw).to_hf(RUN)


# ---------------------------------------------------------------- ELECTRA


def electra(**kw):
    base = dict(vocab_size=V, max_positions=16, n_layer=2, n_head=4, d_model=32, d_ff=48, embedding_size=16,
                generator_size=0.25, dropout=0.1, attn_dropout=0.1)
    torch.manual_seed(0)
    return _randomize(Electra(ElectraConfig(**(base | kw))))


def test_electra_exports_discriminator_and_generator_with_our_logits():
    m = electra()
    config, sd = m.to_hf(RUN)
    extra = m.hf_extra_exports(RUN)
    assert set(extra) == {"generator"}
    g_config, g_sd = extra["generator"]
    assert config["architectures"] == ["ElectraForPreTraining"] and g_config["architectures"] == ["ElectraForMaskedLM"]
    assert (g_config["hidden_size"], g_config["num_attention_heads"], g_config["intermediate_size"]) == (8, 1, 12)
    disc, missing = _hf_model(config, sd)
    gen, g_missing = _hf_model(g_config, g_sd)
    assert not missing and g_missing == {"generator_lm_head.weight"}  # tied to the word embedding
    x, types, mask = _batch()
    with torch.no_grad():
        torch.testing.assert_close(m(x, types, mask, part="discriminator").rtd_logits,
                                   disc(input_ids=x, token_type_ids=types, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m(x, types, mask).mlm_logits,
                                   gen(input_ids=x, token_type_ids=types, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
    _assert_round_trip(m, config, sd, extras=extra)


def test_electra_imports_a_bare_discriminator_without_its_generator():
    """ElectraModel (no prefix, no head) of as wide an embedding as its hidden size: the discriminator only;
    the generator (at 1/4 width), its MLM head and the RTD head are left out for the driver to initialise."""
    hf_cfg = transformers.ElectraConfig(vocab_size=V, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=48, max_position_embeddings=16)
    torch.manual_seed(0)
    hf = _randomize(transformers.ElectraModel(hf_cfg))
    cfg, sd = Electra.from_hf(hf_cfg.to_dict(), hf.state_dict())
    assert cfg.generator_dims() == (8, 1, 12)
    ours = Electra(cfg).eval()
    missing, unexpected = ours.load_state_dict(sd, strict=False)
    assert not unexpected and {k.split(".")[0] for k in missing} == {"generator", "mlm", "rtd"}
    assert ours.discriminator.embeddings_project is None
    x, types, mask = _batch()
    with torch.no_grad():
        h, _ = ours.encode(x, types, mask)
        ref = hf(input_ids=x, token_type_ids=types, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(h, ref, atol=1e-5, rtol=1e-5)


def test_electra_configs_without_an_equivalent_are_refused():
    m = electra()
    config, sd = m.to_hf(RUN)
    g_config, g_sd = m.hf_extra_exports(RUN)["generator"]
    with pytest.raises(PlmError, match="generator's num_attention_heads 2"):
        Electra.from_hf(config, sd, extras={"generator": (g_config | {"num_attention_heads": 2}, g_sd)})
    with pytest.raises(PlmError, match="generator's hidden_size 32 is not below"):
        Electra.from_hf(config, sd, extras={"generator": (g_config | {"hidden_size": 32}, g_sd)})
    with pytest.raises(PlmError, match="is an ELECTRA generator"):
        Electra.from_hf(g_config, g_sd)
    with pytest.raises(PlmError, match="model.activation 'relu'"):  # HF's generator head is always gelu
        electra(activation="relu").hf_extra_exports(RUN)


# ---------------------------------------------------------------- XLNet


def xlnet(**kw):
    base = dict(vocab_size=V, n_layer=2, n_head=4, d_model=32, d_ff=48, dropout=0.1, attn_dropout=0.1, mem_len=4)
    torch.manual_seed(0)
    return _randomize(XLNet(XLNetConfig(**(base | kw))))


def test_xlnet_export_gives_our_logits_for_both_streams():
    m = xlnet()
    config, sd = m.to_hf(RUN)
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (0, None, 5)
    hf, missing = _hf_model(config, sd)
    assert missing == {"lm_loss.weight"}  # tied to the word embedding
    x, types, mask = _batch()
    g = torch.Generator().manual_seed(3)
    perm = (torch.rand(3, T, T, generator=g) > 0.5).float()
    targets = torch.zeros(3, 2, T)
    targets[:, 0, 4], targets[:, 1, 1] = 1.0, 1.0
    perm[:, [4, 1], [4, 1]] = 1.0  # a target never sees itself
    with torch.no_grad():
        content = m(x, types, attention_mask=mask)[0]  # every position, padding masked
        query = m(x, types, perm, targets)[0]  # the query stream at the targets
        ref_content = hf(x, token_type_ids=types, attention_mask=mask).logits
        ref_query = hf(x, token_type_ids=types, perm_mask=perm, target_mapping=targets).logits
    torch.testing.assert_close(content, ref_content, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(query, ref_query, atol=1e-5, rtol=1e-5)
    # The summary stays behind (untrained in pretraining; XLNetLMHeadModel has none): the rest comes back exactly.
    cfg, back = XLNet.from_hf(config, sd)
    ours = m.state_dict()
    assert cfg == m.cfg and set(back) == set(ours) - {"summary.weight", "summary.bias"}
    for k, v in back.items():
        assert torch.equal(v, ours[k]), k


@pytest.mark.parametrize("field, value", [("attn_type", "uni"), ("same_length", True), ("clamp_len", 8),
                                          ("ff_activation", "tanh")])
def test_xlnet_configs_without_an_equivalent_are_refused(field, value):
    config = transformers.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4).to_dict() | {field: value}
    with pytest.raises(PlmError, match=field) as e:
        XLNet.from_hf(config, {})
    assert e.value.hint



# ---------------------------------------------------------------- end to end: plm export --format hf / plm import


def _albert_logits(out):
    return torch.cat([out.mlm_logits.flatten(1), out.nsp_logits], 1)


E2E = {  # family: (recipe, transformers Auto class, our logits, HF's logits) on (ids, types, mask)
    "albert": ("albert-mini", "AutoModelForPreTraining", lambda m, x, t, k: _albert_logits(m(x, t, k)),
               lambda hf, x, t, k: torch.cat([(o := hf(input_ids=x, token_type_ids=t, attention_mask=k))
                                              .prediction_logits.flatten(1), o.sop_logits], 1)),
    "electra": ("electra-mini", "AutoModelForPreTraining", lambda m, x, t, k: m(x, t, k, part="discriminator").rtd_logits,
                lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).logits),
    "xlnet": ("xlnet-mini", "AutoModelForCausalLM", lambda m, x, t, k: m(x, t, attention_mask=k)[0],
              lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).logits),
}
LEFT_BEHIND = {"albert": (), "electra": (), "xlnet": ("summary.",)}
"""What the main export directory lacks, so that importing it initialises these afresh."""


@pytest.mark.parametrize("family", sorted(E2E))
def test_pretrained_run_exports_loads_in_transformers_and_imports_back(family, tmp_path):
    from helpers import tiny_corpus
    from families import tiny_overrides

    from plmcli import api

    recipe, auto, ours_logits, hf_logits = E2E[family]
    over = tiny_overrides(family) + ["model.vocab_size=0", "tokenizer.vocab_size=100", "data.val_fraction=0.2", "train.seq_len=16",
                           "train.global_batch_size=4", "train.eval_every=0", "train.save_every=0"]
    over += ["objective.dupe_factor=1"] if family == "albert" else []  # static SOP data: one pass is plenty
    api.pretrain(recipe, [str(tiny_corpus(tmp_path / "c.txt", 20))], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 1}))
    report = api.export(str(tmp_path / "run"), "hf", str(tmp_path / "hf"))
    hf = getattr(transformers, auto).from_pretrained(str(tmp_path / "hf")).eval()
    model, tok, _ = api.load_run(str(tmp_path / "run"))
    assert type(hf).__name__ == report["architecture"]
    assert any("summary" in note for note in report["notes"]) == (family == "xlnet")
    x, types, mask = _batch(tok.get_vocab_size())
    with torch.no_grad():
        torch.testing.assert_close(ours_logits(model, x, types, mask), hf_logits(hf, x, types, mask), atol=1e-5, rtol=1e-5)

    assert report["extra"] == (["generator"] if family == "electra" else [])
    if family == "electra":  # the generator, in its own directory, is a plain ElectraForMaskedLM
        gen = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf" / "generator")).eval()
        assert type(gen).__name__ == "ElectraForMaskedLM"
        with torch.no_grad():
            ours_gen = model(x, types, mask).mlm_logits  # part="generator": MLM logits at every position
            theirs = gen(input_ids=x, token_type_ids=types, attention_mask=mask).logits
        keep = mask.bool()
        torch.testing.assert_close(ours_gen[keep], theirs[keep], atol=1e-5, rtol=1e-5)

    back = api.import_hf(str(tmp_path / "hf"), str(tmp_path / "back"))
    ours, again = model.state_dict(), api.load_run(str(tmp_path / "back"))[0].state_dict()
    behind = {k for k in ours if k.startswith(LEFT_BEHIND[family])}
    assert set(back["fresh"]) == {k.rsplit(".", 1)[0] for k in behind}
    for k in set(ours) - behind:
        assert torch.equal(again[k], ours[k]), k
