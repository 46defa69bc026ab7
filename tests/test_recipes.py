"""Every shipped recipe loads, counts its parameters at full size, and builds and runs at tiny size
(a family without gradients, the n-gram, is fitted on a few sentences instead)."""

import math

import pytest
import torch

from families import tiny_overrides
from helpers import tiny_corpus
from plmcli.api import count_params, pretrain
from plmcli.config import load_recipe, raw_recipe, shipped_recipes
from plmcli.models.registry import build_model, model_class
from plmcli.objectives.registry import objective_class
from plmcli.recipe_params import REGENERATE, current_table, fingerprint, read_table

EXPECTED_PARAMS = {"gpt2-small": 124.4e6, "gpt2-medium": 354.8e6, "gpt": 116.5e6,
                   # GPT-2's published sizes, exactly as transformers' GPT2LMHeadModel counts gpt2-large and gpt2-xl
                   "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
                   # As transformers' BertForPreTraining (bert-base-uncased) and RobertaForMaskedLM (roberta-base).
                   "bert-base": 110.1e6, "bert-large": 336.2e6, "roberta-base": 124.7e6,
                   # transformers' AlbertForPreTraining at vocab 30000 (Table 1: 12M, 18M, 235M — HF and plm: 223M)
                   "albert-base": 11.81e6, "albert-large": 17.85e6, "albert-xxlarge": 223.16e6,
                   # 6+6 layers, 512/2048/8, one shared 37k embedding (by hand in tests/models/test_transformer.py)
                   "transformer-base": 63.08e6,
                   # Dai et al. 2019, Table 1: 151M (16 layers, adaptive input and softmax tied, 267,735 words)
                   "txl-wt103-base": 151.1e6,
                   # transformers' ElectraForPreTraining + ElectraForMaskedLM, the shared embeddings once; the
                   # paper's 14M / 110M are the discriminators alone (HF: 13.5M / 109.5M)
                   "electra-small": 14.196e6, "electra-base": 119.39e6,
                   # transformers' XLNetLMHeadModel (116,750,336 / 360,300,800 at vocab 32000) + the sequence
                   # summary finetuning pools with (d² + d), which XLNetForSequenceClassification adds
                   "xlnet-base": 117_340_928, "xlnet-large": 361_350_400}


@pytest.fixture(scope="module")
def table():
    """The shipped parameter table, brought up to date as `plm recipes` does (and written back)."""
    return current_table()


def test_params_table_keeps_itself_current(table):
    assert sorted(table) == shipped_recipes() and read_table() == table


@pytest.mark.parametrize("name", shipped_recipes())
def test_recipe_loads_and_builds(name, tmp_path, table):
    r = load_recipe(name)
    n = count_params(r)
    fits = hasattr(model_class(r.family), "fit")  # no gradient: fitted by counting, no parameters
    assert n > 0 or fits
    if name in EXPECTED_PARAMS:
        assert n == pytest.approx(EXPECTED_PARAMS[name], rel=0.005)
    # `plm recipes` lists the shipped table's count: it must be this one
    # (an entry trusted by its fingerprint yet wrong: the count moved with something the fingerprint does not read)
    assert table[name] == {"params": n, "fingerprint": fingerprint(raw_recipe(name))}, \
        f"plmcli/recipes/params.json is wrong for {name}: rewrite it with `{REGENERATE}`"
    tiny = load_recipe(name, tiny_overrides(r.family) + ["train.seq_len=16"])
    torch.manual_seed(0)
    model = build_model(tiny.family, tiny.model)
    objective_class(tiny.objective_name)(tiny.objective, None, {}, 16).check_model(model)
    if fits:
        summary = pretrain(name, data=[str(tiny_corpus(tmp_path / "c.txt"))], out=str(tmp_path / "run"),
                           overrides=tiny_overrides(r.family))
        assert summary["stop_reason"] == "fit"
        # a family with a perplexity scores the held-out text; word vectors (no scoring) report their training loss
        assert math.isfinite(summary["val_ppl"] if model_class(r.family).traits.scoring else summary["loss"])
        return
    x = torch.randint(0, 50, (2, 16))
    # encoder-decoders take (source, source mask, decoder input)
    out = model(x, torch.ones_like(x, dtype=torch.bool), x.flip(1)) if model.traits.seq2seq else model(x)
    if isinstance(out, tuple):  # stateful models return (logits, state)
        out = out[0]
    logits = out.mlm_logits if hasattr(out, "mlm_logits") else out  # encoders return a BertOutput
    assert logits.shape == (2, 16, 50) and torch.isfinite(logits).all()
