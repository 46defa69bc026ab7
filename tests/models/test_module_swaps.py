"""Linears are called as modules: a hook on one runs, and a module put in its place (as PEFT's LoRA, float8 or a
quantised linear do) is what computes, in training, in evaluation and in the causal tail that scoring takes."""

import pytest
import torch
from torch import nn

from plmcli.config import load_recipe
from plmcli.models.registry import build_model


class Wrapped(nn.Module):
    """What PEFT puts in a linear's place: the original layer inside, called by the wrapper; counts its calls."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base_layer, self.calls = base, 0

    def forward(self, x):
        self.calls += 1
        return self.base_layer(x)


def _tiny(family_recipe: str):
    torch.manual_seed(0)
    over = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.vocab_size=50", "model.max_positions=16"]
    if family_recipe == "bert-mini":
        over.append("model.d_ff=64")
    return build_model(load_recipe(family_recipe).family, load_recipe(family_recipe, over).model).eval()


# The final hidden states of each kind of Transformer: a causal LM's and an encoder's.
STATES = {"gpt-mini": lambda m, ids: m.hidden(ids), "bert-mini": lambda m, ids: m.encode(ids)[0]}


@pytest.mark.parametrize("recipe", sorted(STATES))
def test_a_wrapper_in_place_of_mlp_fc_is_called_and_changes_nothing(recipe):
    model, states = _tiny(recipe), STATES[recipe]
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want = states(model, ids)
    fc = Wrapped(model.blocks[0].mlp.fc)
    model.blocks[0].mlp.fc = fc
    with torch.no_grad():  # evaluation: plm's own Linear would fuse the activation here
        got = states(model, ids)
    assert fc.calls == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model.train()
    states(model, ids).sum().backward()  # training, with a gradient
    assert fc.calls == 2 and fc.base_layer.weight.grad is not None


def test_a_hook_on_plm_s_own_linear_runs():
    model = _tiny("gpt-mini")
    seen = []
    model.blocks[1].mlp.fc.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        model.hidden(torch.randint(0, 50, (2, 12)))
    assert seen == [torch.Size([2, 12, 4 * 32])]


def test_the_causal_tail_calls_a_wrapped_qkv():
    """Scoring reads a GPT's last block at the window's new positions only (`start`); a wrapped qkv there
    computes every row, and the tail is what the whole block gives at those positions."""
    model = _tiny("gpt-mini")
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        want = model.hidden(ids)[:, 8:]
        qkv = Wrapped(model.blocks[-1].attn.qkv)
        model.blocks[-1].attn.qkv = qkv
        got = model.hidden(ids, start=8)
    assert qkv.calls == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
