"""Every shipped recipe loads, counts its parameters at full size, and builds and runs at tiny size."""

import pytest
import torch

from plmcli.api import count_params
from plmcli.config import load_recipe, shipped_recipes
from plmcli.models.registry import build_model
from plmcli.objectives.registry import objective_class

# Per family: the keys that shrink a recipe to a seconds-sized model, everything else kept as shipped.
TINY = {
    "gpt": ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.max_positions=16", "model.vocab_size=50"],
    # 18 rows: RoBERTa's table starts 2 rows in (position_offset), leaving the 16 the test reads.
    "bert": ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=18",
             "model.vocab_size=50"],
}

EXPECTED_PARAMS = {"gpt2-small": 124.4e6, "gpt2-medium": 354.8e6, "gpt": 116.5e6,
                   # As transformers' BertForPreTraining (bert-base-uncased) and RobertaForMaskedLM (roberta-base).
                   "bert-base": 110.1e6, "bert-large": 336.2e6, "roberta-base": 124.7e6}


@pytest.mark.parametrize("name", shipped_recipes())
def test_recipe_loads_and_builds(name):
    r = load_recipe(name)
    n = count_params(r)
    assert n > 0
    if name in EXPECTED_PARAMS:
        assert n == pytest.approx(EXPECTED_PARAMS[name], rel=0.005)
    tiny = load_recipe(name, TINY[r.family] + ["train.seq_len=16"])
    torch.manual_seed(0)
    model = build_model(tiny.family, tiny.model)
    objective_class(tiny.objective_name)(tiny.objective, None, {}, 16).check_model(model)
    out = model(torch.randint(0, 50, (2, 16)))
    logits = out.mlm_logits if hasattr(out, "mlm_logits") else out  # encoders return a BertOutput
    assert logits.shape == (2, 16, 50) and torch.isfinite(logits).all()
