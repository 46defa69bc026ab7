"""plm <-> transformers for BERT, RoBERTa, SpanBERT, ERNIE, GPT-2 and GPT: `plm export --format hf` loads in
AutoModelFor… / AutoTokenizer with our logits and ids; HF checkpoints `plm import` with HF's logits; round
trips are bitwise; bad input is one clean error. Tiny models, seeded, built from the shipped recipes."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import ToyEncoder, finetune, tiny_corpus, tiny_recipe
from test_cli import assert_clean_error, run
from test_finetune import SAMPLE, make_run
from families import tiny_overrides
from plmcli import api
from plmcli.config import load_recipe
from plmcli.data.corpus import tokenizer_entry
from plmcli.errors import PlmError
from plmcli.models.registry import build_model
from plmcli.models.vocab import without_padding

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = ["the cat sat on a mat", "dogs ran far away", "the cat ran back home again", "a mat"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "c.txt")


def _randomize(model, seed=1):
    """Non-trivial values everywhere (init leaves biases at 0 and norms at 1, which would hide mix-ups)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _recipe_run(path: Path, corpus: Path, recipe: str, extra=()):
    """A run dir of `recipe` at its tiny size with random weights and a tokenizer trained on the tiny corpus."""
    r = load_recipe(recipe, tiny_overrides(load_recipe(recipe).family) + list(extra))
    lines = lambda: corpus.read_text().splitlines()  # noqa: E731
    tok, meta = tokenizer_entry(replace(r.tokenizer, vocab_size=300, min_frequency=1), lines)
    torch.manual_seed(0)
    model = _randomize(build_model(r.family, replace(r.model, vocab_size=tok.get_vocab_size()))).eval()
    return make_run(path, r.family, model, tok, meta), model, tok, meta


def _ours(model, batch):
    """Our logits (B, T, V) (+ NSP logits) for an HF tokenizer batch."""
    with torch.no_grad():
        if model.traits.causal:
            return model(batch["input_ids"]), None
        out = model(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
        return out.mlm_logits, out.nsp_logits


def _close(a, b, mask):
    """Equal to 1e-5 at the real (unpadded) positions."""
    m = mask.bool()
    torch.testing.assert_close(a[m], b[m], atol=1e-5, rtol=1e-5)


CASES = {  # recipe, overrides, Auto class, architecture
    "bert": ("bert-mini", [], "AutoModelForPreTraining", "BertForPreTraining"),
    "bert-untied": ("bert-mini", ["model.tie_embeddings=false", "model.nsp_head=false"], "AutoModelForMaskedLM",
                    "BertForMaskedLM"),
    "roberta": ("roberta-base", [], "AutoModelForMaskedLM", "RobertaForMaskedLM"),
    "spanbert": ("spanbert-mini", [], "AutoModelForMaskedLM", "BertForMaskedLM"),
    "ernie": ("ernie-chinese-mini", [], "AutoModelForPreTraining", "BertForPreTraining"),
    "gpt2": ("gpt2-small", [], "AutoModelForCausalLM", "GPT2LMHeadModel"),
    # GPT-1 as transformers has it: the tanh GELU (OpenAIGPT's "gelu") and a 4 × d_model feed-forward
    "openai-gpt": ("gpt", ["model.activation=gelu_tanh", "model.d_ff=0"], "AutoModelForCausalLM", "OpenAIGPTLMHeadModel"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_loads_in_transformers_and_round_trips(case, corpus, tmp_path):
    recipe, extra, auto, arch = CASES[case]
    run_dir, ours, tok, meta = _recipe_run(tmp_path / "run", corpus, recipe, extra)
    res = api.export(str(run_dir), "hf", str(tmp_path / "hf"))
    assert res["architecture"] == arch and res["format"] == "hf"
    assert any("SBO" in n for n in res["notes"]) == (case == "spanbert")
    hf = getattr(transformers, auto).from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == arch

    # AutoTokenizer: our ids; encoders get [CLS] … [SEP] as plm's finetuning lays them out
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = meta["special_token_ids"]
    for s in SENTENCES:
        plain = tok.encode(s).ids
        assert hf_tok(s, add_special_tokens=False)["input_ids"] == plain
        assert hf_tok(s)["input_ids"] == (plain if ours.traits.causal else [ids["cls"], *plain, ids["sep"]])
    if not ours.traits.causal:
        pair = hf_tok("the cat", "a mat")
        a, b = tok.encode("the cat").ids, tok.encode("a mat").ids
        assert pair["input_ids"] == [ids["cls"], *a, ids["sep"], *b, ids["sep"]]
        assert pair.get("token_type_ids", [0])[-1] == (1 if ours.cfg.type_vocab_size >= 2 else 0)

    # logits on a padded batch (pairs for encoders, so segment embeddings count)
    if hf_tok.pad_token is None:  # as for GPT-2 itself: causal runs have no pad token
        hf_tok.pad_token = hf_tok.eos_token
    batch = hf_tok(SENTENCES, SENTENCES[::-1], padding=True, return_tensors="pt") if not ours.traits.causal \
        else hf_tok(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0 and batch["input_ids"].shape[1] <= ours.max_positions
    with torch.no_grad():
        theirs = hf(**batch)
    logits, nsp = _ours(ours, batch)
    _close(logits, theirs.prediction_logits if arch == "BertForPreTraining" else theirs.logits, batch["attention_mask"])
    if nsp is not None:
        torch.testing.assert_close(nsp, theirs.seq_relationship_logits, atol=1e-5, rtol=1e-5)

    # back: from_hf(to_hf(model)) and export -> import reproduce our weights bitwise. What does not survive:
    # SpanBERT's SBO head (no HF class), RoBERTa position rows before pad id + 1 (never read: our pad is 0), and the
    # rows a padded vocabulary (the BPE recipes' pad_vocab_multiple) adds past the tokenizer's: no token reads them
    plain = without_padding(ours)
    expected = {k: v for k, v in plain.state_dict().items() if not k.startswith("sbo.")}
    if getattr(ours.cfg, "position_offset", 0):
        expected["wpe.weight"] = expected["wpe.weight"][ours.cfg.position_offset - ids["pad"] - 1:]
    cfg, sd = type(ours).from_hf(*plain.to_hf(json.loads((run_dir / "config.json").read_text())))
    direct = type(ours)(cfg)
    assert direct.load_state_dict(sd, strict=False).unexpected_keys == []
    back = api.import_hf(str(tmp_path / "hf"), str(tmp_path / "back"))
    assert back["fresh"] == [] and back["family"] == ("bert" if case == "spanbert" else load_recipe(recipe).family)
    loaded = api.load_run(str(tmp_path / "back"))[0].state_dict()
    assert set(loaded) == set(expected)
    for k, v in expected.items():
        assert torch.equal(loaded[k], v) and torch.equal(direct.state_dict()[k], v), k
    again = api.load_run(str(tmp_path / "back"))[1]  # the export's [CLS]/[SEP] template is not brought back
    assert json.loads(again.to_str())["model"] == json.loads(tok.to_str())["model"]
    assert [again.encode(s).ids for s in SENTENCES] == [tok.encode(s).ids for s in SENTENCES]


# ---------------------------------------------------------------- transformers -> plm


HF_TINY = {
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    # fairseq's layout: <s> 0, <pad> 1, </s> 2, positions from pad + 1 = 2
    "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=26, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                    layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=24, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                 bos_token_id=0, eos_token_id=0),
    "openai-gpt": dict(n_embd=32, n_layer=2, n_head=4, n_positions=24, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}
HF_CLASS = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM", "gpt2": "GPT2LMHeadModel",
            "openai-gpt": "OpenAIGPTLMHeadModel"}
TOKENIZERS = {  # the tokenizer each checkpoint ships, in the files transformers users have for it
    "bert": ("wordpiece", {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}),
    "roberta": ("bytelevel-bpe", {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}),
    "gpt2": ("bytelevel-bpe", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}),
    "openai-gpt": ("bpe", {"unk": "<unk>"}),
}


def _hf_checkpoint(path: Path, model_type: str, corpus: Path, arch: str | None = None):
    """A randomised tiny HF model saved as a transformers user has it, with the tokenizer files of its kind:
    bert vocab.txt, roberta vocab.json + merges.txt (ids permuted to fairseq's order), gpt2 tokenizer.json +
    pytorch_model.bin, openai-gpt vocab.json + merges.txt with </w>. Returns (model, encode: text -> ids)."""
    from plmcli.config_sections import TokenizerConfig

    kind, specials = TOKENIZERS[model_type]
    cfg = TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1, lowercase=kind != "bytelevel-bpe",
                          special_tokens=specials)
    tok, _ = tokenizer_entry(cfg, lambda: corpus.read_text().splitlines())
    spec = json.loads(tok.to_str())
    order = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    if model_type == "roberta":
        first = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        order = first + [t for t in order if t not in first]
    new_id = {t: i for i, t in enumerate(order)}
    torch.manual_seed(0)
    hf_cfg = transformers.AutoConfig.for_model(model_type, vocab_size=len(order), **HF_TINY[model_type])
    model = _randomize(getattr(transformers, arch or HF_CLASS[model_type])(hf_cfg)).eval()
    path.mkdir()
    model.save_pretrained(path)
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"].get("merges", [])]
    if model_type == "bert":
        (path / "vocab.txt").write_text("\n".join(order) + "\n")
        (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    elif model_type in ("roberta", "openai-gpt"):
        (path / "vocab.json").write_text(json.dumps(new_id))
        (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        names = {f"{r}_token": {"content": t, "lstrip": r == "mask"} for r, t in specials.items()}
        (path / "special_tokens_map.json").write_text(json.dumps(names))
    else:
        tok.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(json.dumps({f"{r}_token": t for r, t in specials.items()}))
        torch.save(model.state_dict(), path / "pytorch_model.bin")
        (path / "model.safetensors").unlink()
    return model, lambda text: [new_id[tok.id_to_token(i)] for i in tok.encode(text).ids]


def _batch(encode, cls=None, sep=None, pad=0):
    """SENTENCES as [CLS] x [SEP] (encoders) or x, right-padded with `pad`: (ids, attention mask)."""
    rows = [([cls] if cls is not None else []) + encode(s) + ([sep] if sep is not None else []) for s in SENTENCES]
    T = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    return ids, torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])


@pytest.mark.parametrize("model_type", list(HF_TINY))
def test_hf_checkpoint_imports_with_equal_logits_and_exports_back_bitwise(model_type, corpus, tmp_path):
    hf, encode = _hf_checkpoint(tmp_path / "hf", model_type, corpus)
    res = api.import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    assert res["model_type"] == model_type and res["fresh"] == []
    model, tok, cfg = api.load_run(str(tmp_path / "run"))
    for s in SENTENCES:
        assert tok.encode(s).ids == encode(s)
    ids = cfg["tokenizer"]["special_token_ids"]
    if model.traits.causal:
        x, mask = _batch(encode)
        with torch.no_grad():
            ours, theirs = model(x), hf(input_ids=x, attention_mask=mask).logits
    else:
        x, mask = _batch(encode, ids["cls"], ids["sep"], ids["pad"])
        with torch.no_grad():
            ours, theirs = model(x, None, mask).mlm_logits, hf(input_ids=x, attention_mask=mask)
        theirs = theirs.prediction_logits if model_type == "bert" else theirs.logits
    _close(ours, theirs, mask)

    api.export(str(tmp_path / "run"), "hf", str(tmp_path / "again"))
    written, original = load_file(tmp_path / "again" / "model.safetensors"), hf.state_dict()
    for k, v in written.items():
        assert torch.equal(v, original[k]), k
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "lm_head.decoder.weight",
            "lm_head.decoder.bias", "lm_head.weight"}
    assert set(original) - set(written) <= tied
    assert json.loads((tmp_path / "again" / "config.json").read_text())["architectures"] == [HF_CLASS[model_type]]


def test_imported_gpt2_perplexity_is_transformers_cross_entropy(corpus, tmp_path):
    hf, encode = _hf_checkpoint(tmp_path / "hf", "gpt2", corpus)
    api.import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat while dogs ran\n")  # one window: every token scored with all before it
    res = api.eval_ppl([str(text)], model=str(tmp_path / "run"), max_length=24, stride=24)
    seq = torch.tensor([[0] + encode(text.read_text())])  # <|endoftext|> (id 0) first, as GPT-2 scores text
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(hf(seq).logits[0, :-1], seq[0, 1:])
    assert res["tokens"] == seq.shape[1] - 1
    assert res["nll"] == pytest.approx(nll.item(), abs=1e-5)


def test_imported_bert_finetunes_and_the_classifier_exports(corpus, tmp_path):
    """HF BERT -> plm import -> plm finetune sst2 -> export: BertForSequenceClassification gives our logits."""
    _hf_checkpoint(tmp_path / "hf", "bert", corpus)
    api.import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    res = finetune("sst2", from_run=str(tmp_path / "run"), data_dir=str(SAMPLE), train__max_steps=2,
                   train__batch_size=8, task__max_seq_len=16, out=str(tmp_path / "ft"))
    assert res["steps"] == 2 and 0 <= res["dev"]["accuracy"] <= 1
    rep = api.export(str(tmp_path / "ft"), "hf", str(tmp_path / "cls"))
    assert rep["architecture"] == "BertForSequenceClassification" and rep["notes"] == []
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    from plmcli.runs import load_finetuned

    ours = load_finetuned(str(tmp_path / "ft"))[0]
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path / "cls")(SENTENCES, SENTENCES[::-1], padding=True,
                                                                          return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch), hf(**batch).logits, atol=1e-5, rtol=1e-5)


def test_finetuned_gpt_exports_its_backbone_and_says_so(corpus, tmp_path):
    run_dir = _recipe_run(tmp_path / "run", corpus, "gpt2-small")[0]
    finetune("sst2", from_run=str(run_dir), data_dir=str(SAMPLE), train__max_steps=1, train__batch_size=8, task__max_seq_len=16, out=str(tmp_path / "ft"))
    rep = api.export(str(tmp_path / "ft"), "hf", str(tmp_path / "hf"))
    assert rep["architecture"] == "GPT2LMHeadModel" and rep["notes"] == [
        "sst2 head not exported, only the network it finetuned (transformers has no class for the head)"]
    from plmcli.runs import load_finetuned

    backbone = load_finetuned(str(tmp_path / "ft"))[0].backbone
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.tensor([[1, 5, 9, 3, 12, 7]])
    with torch.no_grad():
        torch.testing.assert_close(backbone(x), hf(x).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooler", [True, False])
def test_roberta_classifier_exports_when_transformers_has_its_head(pooler):
    """RobertaClassificationHead is dense -> tanh -> out_proj on <s>: our pooler + linear head. Without a
    pooler our classifier is one linear layer on <s>, which no HF class computes: refused with the reason."""
    from plmcli.models.bert import Bert, BertConfig
    from plmcli.objectives.classify import SequenceClassifier

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, max_positions=18, position_offset=2, type_vocab_size=1, nsp_head=pooler,
                     n_layer=1, n_head=2, d_model=16, dropout=0.0, attn_dropout=0.0, layer_norm_eps=1e-5)
    ours = SequenceClassifier(_randomize(Bert(cfg)), 3).eval()
    run_cfg = {"tokenizer": {"special_token_ids": {"pad": 1}}, "finetune": {"label_names": ["a", "b", "c"]}}
    if not pooler:
        with pytest.raises(PlmError, match="tanh pooler"):
            ours.encoder.to_hf_sequence_classification(run_cfg, ours.head)
        return
    hf_cfg, sd = ours.encoder.to_hf_sequence_classification(run_cfg, ours.head)
    hf = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(**hf_cfg)).eval()
    hf.load_state_dict(sd, strict=True)
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    x = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(input_ids=x).logits, atol=1e-5, rtol=1e-5)


def test_bare_base_model_imports_with_fresh_heads(corpus, tmp_path):
    hf, _ = _hf_checkpoint(tmp_path / "hf", "bert", corpus, arch="BertModel")
    (tmp_path / "hf" / "model.safetensors").unlink()  # sharded instead: model.safetensors.index.json + shards
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    res = api.import_hf(str(tmp_path / "hf"), str(tmp_path / "run"))
    assert torch.equal(api.load_run(str(tmp_path / "run"))[0].wte.weight, hf.embeddings.word_embeddings.weight)
    assert res["fresh"] == ["nsp", "mlm.dense", "mlm.ln", "mlm.decoder"]  # the decoder's bias; its weight is wte
    res = run("import", tmp_path / "hf", "--out", tmp_path / "run2")
    assert res.exit_code == 0 and res.stdout.strip().endswith("fresh (not in the checkpoint): nsp, mlm.dense, mlm.ln, "
                                                              "mlm.decoder"), res.output


# ---------------------------------------------------------------- the command line and bad input


def test_cli_export_import_of_a_pretrained_run(corpus, tmp_path):
    summary = api.pretrain(str(tiny_recipe(tmp_path / "tiny.yaml")), [str(corpus)], str(tmp_path / "gpt"), overrides={"train.max_steps": 2})
    res = run("export", summary["run_dir"], "--format", "hf", "--out", tmp_path / "hf")
    assert res.exit_code == 0 and res.stdout.startswith(f"{tmp_path / 'hf'}: GPT2LMHeadModel (gpt2)"), res.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours = api.load_run(summary["run_dir"])[0]
    x = torch.tensor([[0, 5, 9, 3, 12, 7]])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=1e-5)
    res = run("import", tmp_path / "hf", "--out", tmp_path / "back", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["fresh"] == [], res.output
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat\n")
    # One window for both: an imported checkpoint records no training seq_len, so its default window differs.
    window = dict(max_length=32, stride=16)
    assert api.eval_ppl([str(text)], str(tmp_path / "back"), **window) == api.eval_ppl([str(text)], summary["run_dir"], **window)
    assert_clean_error(run("export", summary["run_dir"], "--format", "hf", "--out", tmp_path / "hf"),
                       "already exists and is not empty", "--force")
    assert run("export", summary["run_dir"], "--format", "hf", "--out", tmp_path / "hf", "--force").exit_code == 0
    assert_clean_error(run("export", summary["run_dir"], "--format", "hf", "--out", summary["run_dir"], "--force"),
                       "holds the input")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp dirs left


def test_bad_input_is_one_clean_error(corpus, tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from plmcli.models import registry

    with pytest.raises(PlmError, match="not a plm run directory"):
        api.export(str(tmp_path), "hf", str(tmp_path / "x"))
    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    toy = ToyEncoder(ToyEncoder.Config(vocab_size=5))
    enc = make_run(tmp_path / "toy", "toyenc", toy, *_recipe_run(tmp_path / "g", corpus, "gpt2-small")[2:])
    with pytest.raises(PlmError, match=r"cannot be exported for transformers — families that can: gpt, bert"):
        api.export(str(enc), "hf", str(tmp_path / "x"))
    # GPT-1 with the exact GELU: OpenAIGPT computes the tanh approximation, so no exact export
    gpt1 = _recipe_run(tmp_path / "gpt1", corpus, "gpt", ["model.d_ff=0", "model.activation=gelu"])[0]
    assert_clean_error(run("export", gpt1, "--format", "hf", "--out", tmp_path / "x"), "tanh", "model.activation=gelu_tanh")
    assert not (tmp_path / "x").exists()

    hf = tmp_path / "hf"
    hf.mkdir()
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "no config.json")
    (hf / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "model_type 't5'", "bert", "gpt2, openai-gpt, roberta")
    cfg = {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 16, "max_position_embeddings": 16}
    (hf / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "no weights file", "model.safetensors")
    model = _randomize(transformers.BertForMaskedLM(transformers.BertConfig(**cfg)))
    tf_names = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v.clone()
                for k, v in model.state_dict().items()}  # as TF-converted checkpoints name them
    save_file(tf_names, str(hf / "model.safetensors"))
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "no tokenizer files", "vocab.txt", "merges.txt")
    (hf / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
    (hf / "config.json").write_text(json.dumps(cfg | {"position_embedding_type": "relative_key"}))
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "position_embedding_type")
    assert not (tmp_path / "r").exists()
    (hf / "config.json").write_text(json.dumps(cfg | {"hidden_act": "gelu_fast"}))
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "hidden_act 'gelu_fast'")
    (hf / "config.json").write_text(json.dumps(cfg))
    assert run("import", hf, "--out", tmp_path / "r").exit_code == 0
    ln = model.bert.embeddings.LayerNorm.bias
    assert torch.equal(api.load_run(str(tmp_path / "r"))[0].ln_emb.bias, ln) and "bert.embeddings.LayerNorm.beta" in tf_names
    assert_clean_error(run("import", hf, "--out", tmp_path / "r"), "already exists", "--force")


def test_help_has_examples():
    for cmd in ("export", "import"):
        res = run(cmd, "--help")
        assert res.exit_code == 0 and "Example" in res.output


def test_import_refuses_truncated_weights_and_another_model_s_tensors(corpus, tmp_path):
    """A truncated model.safetensors (was: SafetensorError: incomplete metadata) and a GPT-2's weights under a BERT
    config.json (was: exit 0, every tensor fresh, a random model) are one line each."""
    from helpers import assert_clean_error, run

    _hf_checkpoint(tmp_path / "bert", "bert", corpus)
    gpt2, _ = _hf_checkpoint(tmp_path / "gpt2", "gpt2", corpus)
    weights = tmp_path / "bert" / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:40])
    assert_clean_error(run("import", tmp_path / "bert", "--out", tmp_path / "a"), f"{weights} could not be read as "
                       "safetensors", "truncated or damaged")
    from safetensors.torch import save_file

    save_file({k: v.contiguous().clone() for k, v in gpt2.state_dict().items()}, str(weights))
    assert_clean_error(run("import", tmp_path / "bert", "--out", tmp_path / "b"), "are not a", "found no match")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
