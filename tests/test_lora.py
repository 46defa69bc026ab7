"""LoRA finetuning (plmcli.train.lora, `plm finetune --lora-r`): only the adapters and the head train, the merged
weights are base + (alpha / r) B A and give the unmerged model's logits, the merged run exports to transformers,
families without plm's self-attention are refused, and the flags set the config's lora section."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from helpers import dirs_under, finetune, run
from test_finetune import SAMPLE, make_run, tokenizer  # noqa: F401 (a fixture)
from plmcli.config_sections import FinetuneLoraConfig
from plmcli.errors import PlmError
from plmcli.runs import finetuned_model, load_encoder, load_finetuned, run_config

pytest.importorskip("peft")

R, ALPHA = 4, 8.0


def merge_recorder(merge):
    """(held, a save_merged that first keeps in `held` every backbone tensor and the names of the parameters that
    required a gradient, then merges as `merge` does)."""
    held = {}

    def recording(model, backbone, names, lora, out_dir):
        held["backbone"] = {k: v.detach().clone() for k, v in backbone.state_dict().items()}
        held["trainable"] = [n for n, p in model.named_parameters() if p.requires_grad]
        return merge(model, backbone, names, lora, out_dir)

    return held, recording


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tokenizer):  # noqa: F811
    """A tiny BERT pretrained run and its LoRA finetune, with what the finetune held just before merging:
    every backbone tensor, and the names of the parameters that required a gradient."""
    import plmcli.pipelines.finetune as ft
    from plmcli.models.bert import Bert, BertConfig

    root = tmp_path_factory.mktemp("lora")
    tok, meta = tokenizer
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), max_positions=48, n_layer=2, n_head=2, d_model=16)
    pre = make_run(root / "bert", "bert", Bert(cfg), tok, meta)
    held, recording = merge_recorder(ft.save_merged)
    with dirs_under(root), pytest.MonkeyPatch.context() as mp:
        mp.setattr(ft, "save_merged", recording)
        res = finetune("sst2", from_run=str(pre), data_dir=str(SAMPLE), out=str(root / "ft"), train__max_steps=3,
                       train__batch_size=16, optim__lr=1e-2, lora__r=R, lora__alpha=ALPHA)
    return pre, root / "ft", res, held


def test_only_adapters_and_head_train(lora_run):
    pre, out, res, held = lora_run
    base = load_file(str(pre / "model.safetensors"))
    seen = {k.replace(".base_layer.", "."): v for k, v in held["backbone"].items() if "lora_" not in k}
    assert set(base) <= set(seen)
    for k, v in base.items():  # bitwise the pretrained run's, after training and before the merge
        assert torch.equal(seen[k], v), k
    adapters = {k: v for k, v in held["backbone"].items() if "lora_" in k}
    assert adapters and all(torch.count_nonzero(v) for k, v in adapters.items() if "lora_B" in k)  # B starts at 0
    trainable = held["trainable"]
    assert all("lora_" in n or not n.startswith("encoder.") for n in trainable)
    assert "head.weight" in trainable and sum("lora_" in n for n in trainable) == 2 * 2 * 2  # A, B × qkv, proj × 2 layers
    assert res["steps"] == 3 and res["settings"]["lora"] == {"r": R, "alpha": ALPHA, "dropout": 0.0, "targets": []}
    assert "lora:\n  r: 4\n  alpha: 8.0" in (out / "finetune.yaml").read_text()


def test_merged_weights_are_base_plus_scaled_BA_and_give_the_unmerged_logits(lora_run):
    pre, out, _, _ = lora_run
    base, merged = load_file(str(pre / "model.safetensors")), load_file(str(out / "model.safetensors"))
    with safe_open(str(out / "adapter.safetensors"), "pt") as f:
        meta, adapters = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    names = json.loads(meta["target_modules"])
    assert names == [f"blocks.{i}.attn.{p}" for i in range(2) for p in ("qkv", "proj")]
    assert float(meta["scale"]) == ALPHA / R and not any("lora_" in k or "base_layer" in k for k in merged)
    for k, w in base.items():
        name = k.rpartition(".")[0]
        want = w + (adapters[f"{name}.lora_B.weight"] @ adapters[f"{name}.lora_A.weight"]) * (ALPHA / R) \
            if name in names and k.endswith(".weight") else w
        assert torch.equal(merged[f"encoder.{k}"], want), k

    model = load_finetuned(str(out))[0]
    # the unmerged model: the pretrained backbone with the adapters, under the finetuned head
    import peft

    from plmcli.train.lora import add_adapters

    cfg = run_config(out)
    backbone = load_encoder(pre, run_config(pre))
    unmerged = finetuned_model(out, cfg, backbone=backbone)[0]
    unmerged.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("encoder.")}, strict=False)
    assert add_adapters(backbone, FinetuneLoraConfig(r=R, alpha=ALPHA), "bert") == names
    peft.set_peft_model_state_dict(backbone, adapters)
    ids = torch.randint(5, model.encoder.cfg.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids, torch.zeros_like(ids), mask), unmerged.eval()(ids, torch.zeros_like(ids), mask),
                                   atol=1e-5, rtol=1e-5)


def test_merged_run_exports_to_transformers_with_equal_logits(lora_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, out, _, _ = lora_run
    res = run("export", out, "--format", "hf", "--out", tmp_path / "hf")
    assert res.exit_code == 0, res.output
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    ours = load_finetuned(str(out))[0]
    ids = torch.randint(5, ours.encoder.cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, torch.zeros_like(ids), mask),
                                   hf(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)


def test_a_family_without_self_attention_is_one_line(tmp_path, tokenizer):  # noqa: F811
    from plmcli.models.rnn import RNNConfig, RNNLM

    tok, meta = tokenizer
    pre = make_run(tmp_path / "lstm", "rnn", RNNLM(RNNConfig(vocab_size=tok.get_vocab_size(), d_embed=8, d_hidden=8,
                                                                n_layer=1)), tok, meta)
    with pytest.raises(PlmError) as e:
        finetune("sst2", from_run=str(pre), data_dir=str(SAMPLE), out=str(tmp_path / "o"), train__max_steps=1, lora__r=4)
    assert "LoRA adapts the Linear layers of plm's Transformer self-attention" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()


def test_bad_targets_and_freeze_are_refused(lora_run, tmp_path):
    pre = lora_run[0]
    with pytest.raises(PlmError, match="--lora-targets nope names no Linear layer of the bert model"):
        finetune("sst2", from_run=str(pre), data_dir=str(SAMPLE), out=str(tmp_path / "o"), lora__r=4, lora__targets=["nope"])
    with pytest.raises(PlmError, match="--lora-r with --freeze"):
        finetune("sst2", from_run=str(pre), data_dir=str(SAMPLE), out=str(tmp_path / "o"), lora__r=4, model__freeze=True)
    assert not (tmp_path / "o").exists()


def test_explicit_targets_adapt_those_layers_only(lora_run, tmp_path):
    from plmcli.train.lora import target_modules

    backbone = load_encoder(lora_run[0], run_config(lora_run[0]))
    assert target_modules(backbone, ["mlp.fc", "attn.qkv"]) == [
        "blocks.0.mlp.fc", "blocks.1.mlp.fc", "blocks.0.attn.qkv", "blocks.1.attn.qkv"]


@pytest.fixture
def handed(monkeypatch):
    import plmcli.pipelines.finetune as ft

    got = {}

    def one(cfg, out=None, eval_only=False, console=None):
        got["cfg"] = cfg
        return {"out_dir": "x", "task": "t", "dev": {}, "test_predictions": {}}

    monkeypatch.setattr(ft, "run_finetune", one)
    return got


def test_flags_set_the_lora_section(handed):
    res = run("finetune", "--task", "sst2", "--lora-r", "8", "--lora-alpha", "32", "--lora-dropout", "0.1",
              "--lora-targets", "qkv,attn.proj")
    assert res.exit_code == 0, res.output
    assert handed["cfg"].lora == FinetuneLoraConfig(r=8, alpha=32.0, dropout=0.1, targets=["qkv", "attn.proj"])
    res = run("finetune", "--task", "sst2", "--set", "lora.targets=[q, v]", "--lora-r", "2")
    assert res.exit_code == 0, res.output
    assert handed["cfg"].lora.targets == ["q", "v"] and handed["cfg"].lora.r == 2
    for args, says in ((["--lora-r", "-1"], "--lora-r -1 is out of range"),
                       (["--lora-dropout", "1"], "--lora-dropout 1.0 is out of range"),
                       (["--lora-targets", "q,q"], "must be distinct module names")):
        res = run("finetune", "--task", "sst2", *args)
        assert res.exit_code == 2 and says in res.output, res.output


@pytest.fixture(scope="module")
def causal_tokenizer():
    """test_finetune_matrix's tokenizer: with <s> and </s>, which a causal family's finetuning inputs need."""
    from dataclasses import asdict

    from test_finetune_matrix import SPECIALS
    from plmcli.config_sections import TokenizerConfig
    from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer

    lines = (SAMPLE / "SST-2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1:]
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=600, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer([line.split("\t")[0] for line in lines if line], cfg)
    return tok, {**asdict(cfg), "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


@pytest.mark.parametrize("family", ["transformer_xl", "xlnet", "transformer"])
def test_transformer_xl_xlnet_and_the_transformer_adapt_their_own_attention(family, tmp_path, causal_tokenizer):
    """Their attention is their own (relative positions, memory, two streams, attention over the source), and calls
    its Linear layers as modules: the adapters train alone, the base stays bitwise, and the merged run is
    base + (α/r)BA."""
    import plmcli.pipelines.finetune as ft
    from plmcli.models.transformer import Transformer, TransformerConfig
    from plmcli.models.transformer_xl import TransformerXL, TransformerXLConfig
    from plmcli.models.xlnet import XLNet, XLNetConfig

    tok, meta = causal_tokenizer
    V = tok.get_vocab_size()
    torch.manual_seed(0)
    model = {"transformer_xl": lambda: TransformerXL(TransformerXLConfig(vocab_size=V, n_layer=2, d_model=16, n_head=2,
                                                                         d_ff=32, mem_len=8)),
             "xlnet": lambda: XLNet(XLNetConfig(vocab_size=V, n_layer=2, d_model=16, n_head=2, d_ff=32, mem_len=8,
                                                max_positions=64)),
             "transformer": lambda: Transformer(TransformerConfig(vocab_size=V, n_encoder_layers=1, n_decoder_layers=1,
                                                                  d_model=16, n_head=2, d_ff=32, max_positions=64))}[family]()
    pre = make_run(tmp_path / family, family, model, tok, meta)
    held, recording = merge_recorder(ft.save_merged)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ft, "save_merged", recording)
        finetune("sst2", from_run=str(pre), data_dir=str(SAMPLE), out=str(tmp_path / "ft"), train__max_steps=3,
                 train__batch_size=16, optim__lr=1e-2, task__max_seq_len=32, lora__r=R, lora__alpha=ALPHA)
    per_layer = {"transformer_xl": ("qkv", "r_net", "o"), "xlnet": ("q", "k", "v", "r", "o"),
                 "transformer": ("qkv", "proj")}[family]  # the encoder's: a task reads the encoder alone
    layers = 1 if family == "transformer" else 2
    base = load_file(str(pre / "model.safetensors"))
    seen = {k.replace(".base_layer.", "."): v for k, v in held["backbone"].items() if "lora_" not in k}
    for k, v in base.items():
        assert torch.equal(seen[k], v), k
    merged = load_file(str(tmp_path / "ft" / "model.safetensors"))
    prefix = "encoder." if family == "xlnet" else "backbone."  # a causal or seq2seq family's transfer model: GPT's names
    adapters = [n for n in held["trainable"] if "lora_" in n]
    assert len(adapters) == 2 * len(per_layer) * layers and all("lora_" in n or not n.startswith(prefix)
                                                            for n in held["trainable"])
    with safe_open(str(tmp_path / "ft" / "adapter.safetensors"), "pt") as f:
        lora = {k: f.get_tensor(k) for k in f.keys()}
    assert all(torch.count_nonzero(v) for k, v in lora.items() if "lora_B" in k)  # B starts at 0: each one ran and learnt
    changed = 0
    for k, w in base.items():
        name = k.rpartition(".")[0]
        if f"{name}.lora_A.weight" in lora and k.endswith(".weight"):
            w = w + (lora[f"{name}.lora_B.weight"] @ lora[f"{name}.lora_A.weight"]) * (ALPHA / R)
            changed += 1
        assert torch.equal(merged[prefix + k], w), k
    assert changed == len(per_layer) * layers


def test_transformer_xl_calls_its_qkv_module_when_one_is_put_in_its_place():
    """A module swapped in for qkv (an adapter, a quantised linear) runs, and gives plm's own layer's result."""
    from plmcli.models.transformer_xl import TransformerXL, TransformerXLConfig

    torch.manual_seed(0)
    model = TransformerXL(TransformerXLConfig(vocab_size=40, n_layer=1, d_model=16, n_head=2, d_ff=32,
                                              mem_len=4)).eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        _, mems = model.hidden(ids)
        want = model.hidden(ids, mems)[0]
    attn, calls = model.layers[0].attn, []

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            calls.append(x.shape)
            return self.inner(x)

    attn.qkv = Wrapped(attn.qkv)
    with torch.no_grad():
        got = model.hidden(ids, mems)[0]
    assert calls == [(2, 10, 16)]  # memory and segment rows, through the module
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
