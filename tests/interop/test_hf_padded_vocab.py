"""`plm export --format hf` of a run whose vocabulary is padded (model.pad_vocab_multiple): transformers gets the
tokenizer's vocabulary (50 words, not the 64 rows), and its logits are ours; `plm import` brings it back unpadded,
every real row bitwise. The padding rows hold large random weights, so a row that leaked would show."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model
from tokenizers import Tokenizer, models, pre_tokenizers

from families import tiny_overrides
from plmcli import api
from plmcli.config import load_recipe
from plmcli.models.registry import build_model
from plmcli.models.vocab import without_padding

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

V, PADDED = 50, 64
SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4, "bos": 5, "eos": 5}

CASES = {  # recipe: (transformers Auto class, our logits, theirs) on (ids, types, mask)
    "gpt2-small": ("AutoModelForCausalLM", lambda m, x, t, k: m(x), lambda hf, x, t, k: hf(input_ids=x).logits),
    "bert-mini": ("AutoModelForPreTraining", lambda m, x, t, k: m(x, t, k).mlm_logits,
                  lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).prediction_logits),
    "albert-mini": ("AutoModelForPreTraining", lambda m, x, t, k: m(x, t, k).mlm_logits,
                    lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).prediction_logits),
    "electra-mini": ("AutoModelForPreTraining", lambda m, x, t, k: m(x, t, k, part="discriminator").rtd_logits,
                     lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).logits),
    "xlnet-mini": ("AutoModelForCausalLM", lambda m, x, t, k: m(x, t, attention_mask=k)[0],
                   lambda hf, x, t, k: hf(input_ids=x, token_type_ids=t, attention_mask=k).logits),
}


def _padded_run(path: Path, recipe: str):
    """A run directory of `recipe` at its tiny size, vocabulary 50 padded to 64 with loud padding rows: (dir, model)."""
    r = load_recipe(recipe, [*tiny_overrides(load_recipe(recipe).family), f"model.vocab_size={V}", "model.pad_vocab_multiple=64"])
    torch.manual_seed(0)
    model = build_model(r.family, r.model).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)  # biases and norms off their init values too
            if p.shape[0] == PADDED:
                p[V:] = torch.randn(p[V:].shape, generator=g) * 10 + 50
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    save_model(model, str(path / "model.safetensors"))
    meta = {"kind": "word", "vocab_size": V, "special_tokens": {r: f"t{i}" for r, i in SPECIALS.items()},
            "special_token_ids": SPECIALS}
    (path / "config.json").write_text(json.dumps({"family": r.family, "model": asdict(model.cfg), "tokenizer": meta}))
    return path, model


def _batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(6, V, (3, 12), generator=g)
    mask = torch.ones_like(x)
    mask[1, 8:] = 0
    x[mask == 0] = 0
    types = torch.zeros_like(x)
    types[0, 6:] = 1
    return x, types, mask


@pytest.mark.parametrize("recipe", sorted(CASES))
def test_padded_run_exports_at_the_tokenizer_vocabulary(recipe, tmp_path):
    auto, ours_logits, hf_logits = CASES[recipe]
    run, ours = _padded_run(tmp_path / "run", recipe)
    assert ours.wte.weight.shape[0] == PADDED
    api.export(str(run), "hf", str(tmp_path / "hf"))
    for d in [tmp_path / "hf", *([tmp_path / "hf" / "generator"] if recipe == "electra-mini" else [])]:
        assert json.loads((d / "config.json").read_text())["vocab_size"] == V
        words = [t for k, t in load_file(d / "model.safetensors").items() if k.endswith(("wte.weight", "word_embedding.weight",
                                                                                         "word_embeddings.weight"))]
        assert [t.shape[0] for t in words] == [V]
    hf = getattr(transformers, auto).from_pretrained(str(tmp_path / "hf")).eval()
    x, types, mask = _batch()
    keep = mask.bool()
    with torch.no_grad():
        theirs, mine = hf_logits(hf, x, types, mask), ours_logits(ours, x, types, mask)
    assert mine.shape == theirs.shape  # (…, 50) on both sides: our logits are the unpadded columns
    torch.testing.assert_close(mine[keep], theirs[keep], atol=1e-5, rtol=1e-5)
    if recipe == "electra-mini":  # the generator, exported beside the discriminator, is cut the same way
        gen = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf" / "generator")).eval()
        with torch.no_grad():
            theirs = gen(input_ids=x, token_type_ids=types, attention_mask=mask).logits
        torch.testing.assert_close(ours(x, types, mask).mlm_logits[keep], theirs[keep], atol=1e-5, rtol=1e-5)

    api.import_hf(str(tmp_path / "hf"), str(tmp_path / "back"))
    back, _, cfg = api.load_run(str(tmp_path / "back"))
    assert cfg["model"]["pad_vocab_multiple"] == 1 and cfg["model"]["vocab_size"] == V
    again = back.state_dict()
    for k, v in without_padding(ours).state_dict().items():
        if not k.startswith("summary."):  # XLNet's sequence summary: no transformers LM head has it
            assert torch.equal(again[k], v), k
