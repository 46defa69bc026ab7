"""Feature-based use: --freeze, --features scalar_mix | concat_last_four, ELMo at the output.

Hand computations: the scalar mix is γ·Σ softmax(s)_j h_j; concat-last-four is torch.cat of the layer outputs
taken with forward hooks on the blocks (not through layer_states); layer_states' last entry is exactly the
hidden state the heads read by default. A frozen finetune leaves every backbone weight bitwise as pretrained.
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from families import tiny_model
from helpers import assert_clean_error, run as cli
from plmcli.errors import PlmError
from plmcli.models.base import HasLayerStates
from plmcli.models.layers import ScalarMix
from plmcli.models.registry import model_class
from plmcli.objectives.classify import CausalTransfer, SequenceClassifier
from plmcli.objectives.heads import configure_features
from plmcli.objectives.tagging import TokenClassifier
from helpers import finetune
from plmcli.runs import load_finetuned
from test_finetune_matrix import SAMPLE, TINY, tiny_run, tokenizer  # noqa: F401 (tokenizer: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

DEEPER = ("model.n_layer=3",)  # over a family's tiny size: concat_last_four needs 4 states
VARIANTS = {"bert-pre-ln": ("bert", ("model.norm_position=pre",))}
DEEP = {"bert3": ("bert", {"max_positions": 32, "n_layer": 3, "n_head": 2, "d_model": 16}),
        "gpt3": ("gpt", {"max_positions": 32, "n_layer": 3, "n_head": 2, "d_model": 16})}


def deep_run(path: Path, name: str, tok) -> Path:
    """tiny_run of a 3-layer bert or gpt (DEEP) instead of the matrix's 1-layer ones."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(TINY, name, DEEP[name])
        return tiny_run(path, name, tok)


def build(name: str, seed: int = 0):
    """A registered family (or a VARIANTS entry) at its tiny size with 3 layers, in eval mode."""
    family, extra = VARIANTS.get(name, (name, ()))
    return tiny_model(family, (*DEEPER, *extra), seed)


def batch(B: int = 3, T: int = 7):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0  # a padded row
    mask[2, 3:] = 0
    return ids, torch.zeros_like(ids), mask


# ------------------------------------------------------------------ hand computations


def test_scalar_mix_is_gamma_times_softmax_weighted_sum():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    hs = [torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(j)) for j in range(3)]
    e = [torch.exp(torch.tensor(s)) for s in (0.5, -1.0, 2.0)]
    by_hand = 1.7 * sum(ej / sum(e) * h for ej, h in zip(e, hs))
    torch.testing.assert_close(mix(hs), by_hand)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_layer_states_last_entry_is_the_hidden_heads_read(name):
    """Every registered family's last layer state is checked in test_conformance; here its variants'."""
    model = build(name)
    ids, types, mask = batch()
    assert isinstance(model, HasLayerStates)
    with torch.no_grad():
        states = model.layer_states(ids, types, mask)
        hidden = model.encode(ids, types, mask)[0]
    assert len(states) == 4  # embeddings + 3 layers
    assert all(s.shape == hidden.shape for s in states)
    assert torch.equal(states[-1], hidden)


STATEFUL = {  # families whose heads read `token_states`: a 3-layer tiny config each
    "lstm": ("rnn", {"cell": "lstm", "n_layer": 3, "d_embed": 12, "d_hidden": 16}),
    "gru": ("rnn", {"cell": "gru", "n_layer": 2, "d_embed": 16, "d_hidden": 16}),
    "transformer_xl": ("transformer_xl", {"n_layer": 3, "n_head": 2, "d_model": 16, "d_ff": 32, "mem_len": 4,
                                          "eval_tgt_len": 3, "dropout": 0.0}),
    "transformer": ("transformer", {"max_positions": 32, "n_encoder_layers": 3, "n_decoder_layers": 1, "d_model": 16,
                                    "d_ff": 32, "n_head": 2}),
    "xlnet": ("xlnet", {"max_positions": 32, "n_layer": 3, "n_head": 2, "d_model": 16, "d_ff": 32}),
}


@pytest.mark.parametrize("name", list(STATEFUL))
def test_layer_states_of_per_row_families_end_with_token_states(name):
    family, section = STATEFUL[name]
    cls = model_class(family)
    torch.manual_seed(0)
    model = cls(cls.Config(vocab_size=50, **section)).eval()
    ids, types, mask = batch()
    with torch.no_grad():
        states = model.layer_states(ids, None, mask)
        hidden = model.encode(ids, None, mask)[0] if name == "xlnet" else model.token_states(ids, mask)
    # an RNN lists its layers' outputs (its embeddings have another width); the rest embeddings + layers
    assert len(states) == section.get("n_layer", section.get("n_encoder_layers")) + (name not in ("lstm", "gru"))
    assert torch.equal(states[-1], hidden)


def test_rnn_layer_states_are_each_layer_of_the_fused_module():
    family, section = STATEFUL["lstm"]
    cls = model_class(family)
    torch.manual_seed(0)
    model = cls(cls.Config(vocab_size=50, **section)).eval()
    ids = batch()[0]
    with torch.no_grad():
        states = model.layer_states(ids)
        for k in range(1, 4):  # the first k layers of the stack, fused, end with layer k's output
            first_k = torch.nn.LSTM(12, 16, num_layers=k, batch_first=True)
            first_k.load_state_dict({n: p for n, p in model.rnn.state_dict().items() if int(n[-1]) < k})
            torch.testing.assert_close(states[k - 1], first_k(model.wte(ids))[0], rtol=0, atol=1e-6)


def test_elmo_layer_states_are_its_layers_and_encode_mixes_them():
    family, section = TINY["elmo"]
    cls = model_class(family)
    torch.manual_seed(0)
    elmo = cls(cls.Config(vocab_size=50, **section)).eval()
    ids, types, mask = batch()
    with torch.no_grad():
        states = elmo.layer_states(ids, types, mask)
        assert len(states) == section["n_layer"] + 1
        assert torch.equal(elmo.mix(states), elmo.encode(ids, types, mask)[0])


def hooked_layers(model, ids, types, mask, blocks):
    """Each block's output, taken by forward hooks (not through layer_states)."""
    got = []
    handles = [b.register_forward_hook(lambda m, i, o: got.append(o)) for b in blocks]
    try:
        with torch.no_grad():
            model.hidden(ids) if isinstance(model, model_class("gpt")) else model.encode(ids, types, mask)
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_concat_last_four_is_the_hand_taken_layers_concatenated(name):
    model = build(name)
    ids, types, mask = batch()
    layers = hooked_layers(model, ids, types, mask, model.blocks)  # 3 blocks
    if name == "gpt":
        layers[-1] = model.ln_f(layers[-1]).detach()  # the last state is the normalized one
        emb = model.drop(model.wte(ids) + model.wpe(torch.arange(ids.shape[1]))).detach()
        head = CausalTransfer(model, 2)
    else:
        emb = model.drop(model.ln_emb(model.wte(ids) + model.wpe(torch.arange(ids.shape[1])) + model.wtt(types))).detach()
        head = SequenceClassifier(model, 2)
    by_hand = torch.cat([emb, *layers], -1)  # (B, T, 4C)
    configure_features(head, "concat_last_four")
    head.eval()
    with torch.no_grad():
        feats = head.layer_features(ids, types, mask)
        torch.testing.assert_close(feats, by_hand, rtol=0, atol=1e-6)
        assert head.head.in_features == 4 * model.cfg.d_model
        if name == "bert":  # [CLS]'s concatenated state, not the pooler
            torch.testing.assert_close(head(ids, types, mask), head.head(by_hand[:, 0]))


def test_scalar_mix_head_reads_the_mix_of_every_layer():
    model = build("bert")
    ids, types, mask = batch()
    head = TokenClassifier(model, 3)
    configure_features(head, "scalar_mix")
    with torch.no_grad():
        head.mix.scalars.copy_(torch.tensor([0.1, 0.2, -0.3, 0.4]))
        head.mix.gamma.fill_(0.5)
    head.eval()
    with torch.no_grad():
        states = model.layer_states(ids, types, mask)
        w = torch.softmax(torch.tensor([0.1, 0.2, -0.3, 0.4]), 0)
        by_hand = 0.5 * sum(wj * h for wj, h in zip(w, states))
        torch.testing.assert_close(head.states(ids, None, mask)[0], by_hand)


# ------------------------------------------------------------------ freezing


@pytest.mark.parametrize("features", ["last", "scalar_mix"])
def test_frozen_backbone_gets_no_grad_and_runs_in_eval_mode(features):
    model = build("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    head = SequenceClassifier(model, 2)
    configure_features(head, features, freeze=True)
    head.train()
    assert not model.training and head.head.training  # no dropout in the frozen features
    trainable = [p for p in head.parameters() if p.requires_grad]
    assert trainable and all(not p.requires_grad for p in model.parameters())
    opt = torch.optim.AdamW(trainable, lr=0.1)
    ids, types, mask = batch()
    head_before = head.head.weight.detach().clone()
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(ids, types, mask), torch.tensor([0, 1, 0])).backward()
        assert all(p.grad is None for p in model.parameters())
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(head.head.weight, head_before)
    assert sorted(head.frozen) == sorted(f"encoder.{n}" for n, _ in model.named_parameters())


def test_frozen_finetune_keeps_the_backbone_bitwise_and_loads_back(tmp_path, tokenizer):  # noqa: F811
    run = deep_run(tmp_path / "bert", "bert3", tokenizer)
    out = tmp_path / "ft"
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=3, train__batch_size=8,
                   optim__lr=1e-2, out=str(out), model__freeze=True, model__features="scalar_mix")
    assert res["settings"]["freeze"] is True and res["settings"]["features"] == "scalar_mix"
    pre, got = load_file(str(run / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(pre[k], got[f"encoder.{k}"]) for k in pre)  # frozen weights still saved whole
    assert not torch.equal(got["mix.scalars"], torch.zeros(4))  # the mix trained
    model, _, cfg = load_finetuned(str(out))
    assert cfg["finetune"]["features"] == "scalar_mix" and model.features == "scalar_mix"
    assert torch.equal(model.mix.scalars, got["mix.scalars"])
    from plmcli.interop.hf import export_hf  # a head over mixed layers has no transformers class: the network alone

    report = export_hf(str(out), str(tmp_path / "hf"))
    assert any("head not exported" in n for n in report["notes"]), report


# ------------------------------------------------------------------ ELMo at the output


def test_elmo_at_output_adds_a_second_mix_and_widens_the_classifier(tmp_path, tokenizer):  # noqa: F811
    family, section = TINY["elmo"]
    cls = model_class(family)
    torch.manual_seed(0)
    elmo = cls(cls.Config(vocab_size=50, **section))
    head = SequenceClassifier(elmo, 3)
    width = head.head.out.in_features
    configure_features(head, elmo_at_output=True)
    assert head.head.mix_out is not None and len(head.head.mix_out.scalars) == section["n_layer"] + 1
    assert head.head.out.in_features == width + 2 * (2 * section["d_proj"])
    ids, types, mask = batch()
    head(ids, types, mask).sum().backward()
    assert head.head.mix_out.scalars.grad is not None
    assert head(ids, types, mask).shape == (3, 3)

    run = tiny_run(tmp_path / "elmo", "elmo", tokenizer)
    out = tmp_path / "ft"
    finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=2, train__batch_size=8, out=str(out), model__elmo_at_output=True)
    model, _, _ = load_finetuned(str(out))
    assert model.head.mix_out is not None


# ------------------------------------------------------------------ the CLI


def test_cli_flags_reach_the_config_and_the_run(tmp_path, tokenizer):  # noqa: F811
    run = deep_run(tmp_path / "gpt", "gpt3", tokenizer)
    out = tmp_path / "ft"
    res = cli("finetune", "--task", "sst2", "--from", run, "--data-dir", SAMPLE, "--max-steps", 2, "--batch-size", 8,
              "--freeze", "--features", "concat_last_four", "--out", out, "--json")
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["freeze"] is True and metrics["settings"]["features"] == "concat_last_four"
    assert "freeze: true" in (out / "finetune.yaml").read_text()
    pre, got = load_file(str(run / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(pre[k], got[f"backbone.{k}"]) for k in pre)
    assert got["head.weight"].shape == (2, 4 * 16)
    model, _, _ = load_finetuned(str(out))
    assert model.features == "concat_last_four"


@pytest.mark.parametrize("args,needles", [
    (["--features", "everything"], ["--features 'everything'", "scalar_mix"]),
    (["--features", "concat_last_four"], ["RNNLM has 2 layer states", "fewer than 4"]),
    (["--elmo-at-output"], ["--elmo-at-output", "not ELMo"]),
])
def test_refusals_are_one_line(tmp_path, tokenizer, args, needles):  # noqa: F811
    run = tiny_run(tmp_path / "lstm", "lstm", tokenizer)
    out = tmp_path / "ft"
    res = cli("finetune", "--task", "sst2", "--from", run, "--data-dir", SAMPLE, "--max-steps", 1, "--out", out, *args)
    assert_clean_error(res, *needles)
    assert not out.exists()


def test_a_family_without_layer_states_is_refused():
    from helpers import ToyEncoder, ToyEncoderConfig
    from plmcli.objectives.heads import features_problem

    what, fix = features_problem(ToyEncoder(ToyEncoderConfig(vocab_size=5)), "scalar_mix")
    assert what == "--features scalar_mix: ToyEncoder gives no per-layer states" and "leave --features out" in fix
    assert features_problem(ToyEncoder(ToyEncoderConfig(vocab_size=5)), "last") is None


def test_concat_last_four_needs_four_layer_states(tmp_path, tokenizer):  # noqa: F811
    run = tiny_run(tmp_path / "bert", "bert", tokenizer)  # 1 layer: 2 states
    with pytest.raises(PlmError, match="fewer than 4"):
        finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=1, out=str(tmp_path / "ft"), model__features="concat_last_four")
    assert not (tmp_path / "ft").exists()


def test_unfrozen_scalar_mix_trains_the_backbone_too(tmp_path, tokenizer):  # noqa: F811
    run = deep_run(tmp_path / "bert", "bert3", tokenizer)
    out = tmp_path / "ft"
    finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=2, train__batch_size=8, optim__lr=1e-2,
             out=str(out), model__features="scalar_mix")
    pre, got = load_file(str(run / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert not torch.equal(pre["blocks.0.attn.qkv.weight"], got["encoder.blocks.0.attn.qkv.weight"])


def test_xlnet_reads_its_last_real_token_of_the_mixed_states():
    family, section = STATEFUL["xlnet"]
    cls = model_class(family)
    torch.manual_seed(0)
    head = SequenceClassifier(cls(cls.Config(vocab_size=50, **section)), 2)
    configure_features(head, "scalar_mix")
    head.eval()
    ids, types, mask = batch()
    with torch.no_grad():
        mixed = head.layer_features(ids, types, mask)
        last = mixed[torch.arange(3), mask.sum(1) - 1]  # XLNet's <cls> ends each row
        torch.testing.assert_close(head(ids, types, mask), head.head(last))


@pytest.mark.parametrize("name,kind,features", [
    ("xlnet", "classification", "scalar_mix"), ("lstm", "classification", "scalar_mix"),
    ("transformer_xl", "tagging", "scalar_mix"), ("transformer", "classification", "scalar_mix"),
    ("elmo", "tagging", "scalar_mix"), ("gpt", "multiple_choice", "scalar_mix"),
])
def test_other_families_finetune_with_mixed_features(tmp_path, tokenizer, name, kind, features):  # noqa: F811
    from test_finetune_matrix import TASKS, write_data

    task, metric = TASKS[kind]
    run = tiny_run(tmp_path / name, name, tokenizer)
    data_dir, options = write_data(tmp_path / "data", kind)
    res = finetune(task, from_run=str(run), data_dir=data_dir, options=options, train__max_steps=2,
                   train__batch_size=8, optim__lr=1e-2, out=str(tmp_path / "ft"), model__features=features,
                   model__freeze=True)
    assert metric in res["dev"]
    assert load_finetuned(str(tmp_path / "ft"))[0].features == features


@pytest.mark.parametrize("name", ["bert", "electra"])
def test_layer_states_unpadded_match_padded_at_the_real_tokens(name, monkeypatch):
    from plmcli.models import layers

    model = build(name)
    ids, types, mask = batch()
    with torch.no_grad():
        padded = model.layer_states(ids, types, mask)
        # the CUDA path (unpad, jagged blocks, repad), forced on the CPU as test_unpadded_attention does
        monkeypatch.setattr(layers, "unpadded_attention", lambda device: True)
        unpadded = model.layer_states(ids, types, mask)
        hidden = model.encode(ids, types, mask)[0]
    real = mask.bool()
    assert len(unpadded) == len(padded) == 4 and torch.equal(unpadded[-1], hidden)
    for p, u in zip(padded, unpadded):
        assert u.shape == p.shape and not u.is_nested
        torch.testing.assert_close(u[real], p[real], rtol=0, atol=1e-5)
    assert all(torch.equal(u[~real], torch.zeros_like(u[~real])) for u in unpadded[1:])


def test_elmo_at_output_on_a_tagging_task_is_refused_and_leaves_nothing(tmp_path, tokenizer):  # noqa: F811
    from test_finetune_matrix import write_data

    run = tiny_run(tmp_path / "elmo", "elmo", tokenizer)
    data_dir, _ = write_data(tmp_path / "data", "tagging")
    with pytest.raises(PlmError, match="not ELMo's BiLSTM classifier"):
        finetune("conll2003", from_run=str(run), data_dir=data_dir, train__max_steps=1, out=str(tmp_path / "ft"), model__elmo_at_output=True)
    assert not (tmp_path / "ft").exists()
