"""torch.compile (train.compile) traces a training step's forward and loss as one graph: no graph break.

A host read (`.item()`, `bool(t)`, a boolean mask's nonzero) breaks Dynamo's graph in two, and on a GPU it also
stops the host (tests/train/test_host_syncs.py). plm's CPU-only kernels read the host freely, so inside a compiled
graph the models take the device-generic path (plmcli/kernels: enabled). `torch._dynamo.explain` traces
without compiling: the check costs a trace, not Inductor's code generation.
"""

import pytest
import torch

from families import tiny_overrides
from plmcli.config import load_recipe
from plmcli.models.registry import build_model
from plmcli.objectives.registry import objective_class

SPECIAL = {"pad": 0, "cls": 1, "sep": 2, "mask": 3}


def _model_and_objective(recipe: str, family: str):
    r = load_recipe(recipe, [*tiny_overrides(family), "train.seq_len=16"])
    torch.manual_seed(0)
    return build_model(r.family, r.model).train(), objective_class(r.objective_name)(r.objective, None, SPECIAL, 16)


def _breaks(objective, model, batch) -> list[str]:
    torch._dynamo.reset()
    out = torch._dynamo.explain(lambda: objective.step(model, batch).loss)()
    return [str(b.reason).split("\n")[0] for b in out.break_reasons]


def test_gpt_step_compiles_to_one_graph(monkeypatch):
    from plmcli.models import lm_loss

    # several chunks: the fused head-and-loss's chunked path (one chunk takes F.cross_entropy)
    monkeypatch.setattr(lm_loss, "chunk_rows", lambda vocab_size, device: 8)
    model, objective = _model_and_objective("gpt-mini", "gpt")
    x = torch.randint(0, 50, (2, 17))
    assert _breaks(objective, model, {"input_ids": x[:, :-1], "labels": x[:, 1:]}) == []


@pytest.mark.parametrize("padded", [False, True])
def test_bert_step_compiles_to_one_graph(padded):
    """MLM + NSP on a batch with and without padding (the host's row lengths come with a padded one)."""
    model, objective = _model_and_objective("bert-mini", "bert")
    ids = torch.randint(4, 50, (2, 16))
    positions = torch.tensor([3, 5, 17, 20])
    batch = {"input_ids": ids, "token_type_ids": (torch.arange(16) >= 8).long().expand(2, 16).contiguous(),
             "mlm_positions": positions, "mlm_labels": ids.flatten()[positions], "nsp_labels": torch.tensor([0, 1])}
    if padded:
        batch |= {"attention_mask": (torch.arange(16) < torch.tensor([[16], [10]])).long(), "lengths": [16, 10]}
    assert _breaks(objective, model, batch) == []


@pytest.mark.parametrize("recipe, family", [("gpt-mini", "gpt"), ("bert-mini", "bert")])
def test_evaluation_steps_compile_to_one_graph_and_the_same_loss(recipe, family, monkeypatch):
    """The validation pass (no gradient) of a compiled model: eager scoring keeps only the scored rows (a boolean
    mask, sized by the data), a traced graph keeps them all and ignores the rest; the loss is the same."""
    from plmcli.models import lm_loss

    monkeypatch.setattr(lm_loss, "chunk_rows", lambda vocab_size, device: 8)
    model, objective = _model_and_objective(recipe, family)
    model.eval()
    torch.manual_seed(1)
    if family == "gpt":
        x = torch.randint(0, 50, (2, 17))
        labels = x[:, 1:].clone()
        labels[:, :5] = -100  # context only, as eval-ppl's windows and a short last row have
        batch = {"input_ids": x[:, :-1], "labels": labels}
    else:
        ids = torch.randint(4, 50, (2, 16))
        positions = torch.tensor([3, 5, 17, 20])
        batch = {"input_ids": ids, "token_type_ids": torch.zeros(2, 16, dtype=torch.long),
                 "mlm_positions": positions, "mlm_labels": ids.flatten()[positions], "nsp_labels": torch.tensor([0, 1])}
    with torch.no_grad():
        assert _breaks(objective, model, batch) == []
        eager = objective.step(model, batch).loss
        torch._dynamo.reset()
        traced = torch.compile(lambda: objective.step(model, batch).loss, backend="eager")()
    assert torch.allclose(traced, eager, atol=1e-5), (traced, eager)
