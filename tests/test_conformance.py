"""What every registered family promises, checked on each one at its tiny size (`LanguageModel.tiny`).

In the spirit of transformers' ModelTesterMixin, but each check is chosen by what the family declares — its
traits and the Protocols of plmcli.models.base it satisfies — rather than listed per family, so a family added
to plmcli.models.registry is checked with no edit here:

causal (with a forward)  changing the tokens after t leaves the logits at positions <= t unchanged
bidirectional Encodes,   right padding under attention_mask leaves the real positions' states unchanged, whatever
  HasTokenStates           the padding holds (each row read as if alone)
HasLayerStates           the last layer state is what the family's task heads read by default
ExportsHF                to_hf then from_hf gives back every weight exactly
CountsFlops              FLOPs per token are positive and do not fall as the sequence grows
RecordsAttention         reading the states heads read records one map per run of a declared attention module
"""

import typing

import pytest
import torch

from families import families, tiny_model
from plmcli.config_schema import Count, Divides, Heads, Probability, Size
from plmcli.models.base import (CountsFlops, Encodes, ExportsHF, ExportsHFExtras, Fits, HasHFExportNotes, HasHidden,
                                HasLayerStates, HasTaskHead, HasTokenStates, RecordsAttention, traits_of)
from plmcli.models.layers import record_attention
from plmcli.models.registry import model_class

pytestmark = pytest.mark.usefixtures("one_thread")

V, T = 50, 12  # the tiny sizes' vocabulary; fewer tokens than any tiny max_positions


def ids_of(B: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(5, V, (B, T), generator=torch.Generator().manual_seed(seed))


def logits_of(model, ids):
    """A causal family's next-token logits (B, T, V): forward(ids), a stateful family's (logits, state)."""
    out = model(ids)
    return out[0] if isinstance(out, tuple) else out


def is_encoder(model) -> bool:
    """A bidirectional `Encodes`: an encoder–decoder's `encode(src, mask)` shares the name, not the contract."""
    return isinstance(model, Encodes) and traits_of(model).bidirectional


def default_states(model, ids, mask):
    """The states a family's task heads read by default (HasLayerStates' contract): an encoder's `encode`, else
    per-row `token_states`, else a causal LM's `hidden`."""
    if is_encoder(model):
        return model.encode(ids, None, mask)[0]
    if isinstance(model, HasTokenStates):
        return model.token_states(ids, mask)
    assert isinstance(model, HasHidden), f"{type(model).__name__} has layer states but no states a head reads"
    return model.hidden(ids)


def applies(family: str, check: str) -> bool:
    model = tiny_model(family)
    return {"causal": traits_of(model).causal and not isinstance(model, Fits),
            "padding": is_encoder(model) or isinstance(model, HasTokenStates),
            # a family with a task head of its own (ELMo's) has its heads read a mix of the layers, not the last
            "layer_states": isinstance(model, HasLayerStates) and not isinstance(model, HasTaskHead),
            "hf": isinstance(model, ExportsHF),
            "flops": isinstance(model, CountsFlops),
            "attention": isinstance(model, RecordsAttention)}[check]


def checked(check: str) -> list:
    """Every registered family, those the check does not apply to marked as skipped (so each family shows)."""
    return [pytest.param(f, marks=() if applies(f, check) else pytest.mark.skip(reason=f"{f}: not a {check} check's family"))
            for f in families()]


@pytest.mark.parametrize("family", families())
def test_the_tiny_size_builds_small_and_finite(family):
    model = tiny_model(family)
    assert sum(p.numel() for p in model.parameters()) < 100_000
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("family", checked("causal"))
def test_causal_logits_do_not_see_the_future(family):
    model = tiny_model(family)
    ids = ids_of()
    with torch.no_grad():
        before = logits_of(model, ids)
        for t in (0, T // 2, T - 2):
            changed = ids.clone()
            changed[:, t + 1:] = ids_of(seed=1)[:, t + 1:]
            after = logits_of(model, changed)
            torch.testing.assert_close(after[:, :t + 1], before[:, :t + 1], rtol=0, atol=1e-5)
            assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])  # the later positions did read them


@pytest.mark.parametrize("family", checked("padding"))
def test_right_padding_leaves_the_real_positions_states(family):
    model = tiny_model(family)
    ids = ids_of(B=3)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    with torch.no_grad():
        padded = default_states(model, ids, mask)
        for row, n in ((1, 7), (2, 4)):
            alone = default_states(model, ids[row:row + 1, :n], mask[row:row + 1, :n])
            torch.testing.assert_close(padded[row, :n], alone[0], rtol=0, atol=1e-5)
            other = ids.clone()
            other[row, n:] = (ids[row, n:] + 1) % V  # nor does what the padding holds
            torch.testing.assert_close(default_states(model, other, mask)[row, :n], padded[row, :n], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", checked("layer_states"))
def test_the_last_layer_state_is_what_heads_read(family):
    model = tiny_model(family)
    ids = ids_of(B=3)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[2, 5:] = 0
    with torch.no_grad():
        states = model.layer_states(ids, None, mask)
        heads_read = default_states(model, ids, mask)
    assert len(states) >= 2 and all(s.shape == heads_read.shape for s in states)
    assert torch.equal(states[-1], heads_read)


@pytest.mark.parametrize("family", checked("hf"))
def test_hf_export_round_trips_every_weight(family):
    model = tiny_model(family)
    hf_config, hf_state = model.to_hf({"family": family, "tokenizer": {"special_token_ids": {}}})
    cfg, state = type(model).from_hf(hf_config, hf_state)
    ours = model.state_dict()
    assert state and set(state) <= set(ours)
    assert all(torch.equal(v, ours[k]) for k, v in state.items())
    back = type(model)(cfg)
    missing, unexpected = back.load_state_dict(state, strict=False)
    assert not unexpected
    if not isinstance(model, (HasHFExportNotes, ExportsHFExtras)):
        # nothing said to be left behind: the weights not exported are tied to exported ones, and come back too
        assert cfg == model.cfg
        assert all(torch.equal(v, ours[k]) for k, v in back.state_dict().items()), missing


@pytest.mark.parametrize("family", checked("flops"))
def test_flops_per_token_are_positive_and_grow_with_length(family):
    # with memory the mem_len cached rows' keys are paid once per segment, a per-token cost that falls with length
    model = tiny_model(family, ["model.mem_len=0"] if traits_of(tiny_model(family)).has_memory else [])
    counts = [model.flops_per_token(n) for n in (1, 8, 16, 64, 512)]
    assert counts[0] > 0 and all(a <= b for a, b in zip(counts, counts[1:])), counts


@pytest.mark.parametrize("family", checked("attention"))
def test_declared_attention_is_what_gets_recorded(family):
    model = tiny_model(family)
    ids = ids_of(B=3)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[2, 5:] = 0
    modules, runs = model.attention_modules(), []
    hooks = [m.register_forward_hook(lambda *_: runs.append(1)) for m in modules]
    try:
        with torch.no_grad(), record_attention() as maps:
            default_states(model, ids, mask)
    finally:
        for h in hooks:
            h.remove()
    assert modules and len(maps) == len(runs) >= len(modules)  # a shared module records once per run
    for p in maps:
        assert p.shape[0] == 3 and p.shape[-2:] == (T, T)
        torch.testing.assert_close(p.sum(-1), torch.ones_like(p[..., 0]))


DIMENSIONS = {"vocab_size": Count, "max_positions": Size, "n_layer": Size, "n_head": Heads, "d_model": Size,
              "dropout": Probability, "attn_dropout": Probability}
"""The Transformer dimensions' types, each written once in plmcli.config_schema; a Config that copies a field keeps
its constraints (it may add its own: NEZHA's even head size)."""


def constraints(hint) -> list:
    """A field's checks, a Divides by what it divides alone (Transformer-XL's holds unless d_head is set)."""
    return [("divides", m.other) if isinstance(m, Divides) else m for m in getattr(hint, "__metadata__", ())]


@pytest.mark.parametrize("family", families())
def test_copied_transformer_dimensions_keep_their_constraints(family):
    hints = typing.get_type_hints(model_class(family).Config, include_extras=True)
    for name, canonical in DIMENSIONS.items():
        if name in hints:
            have = constraints(hints[name])
            assert typing.get_args(hints[name])[0] is typing.get_args(canonical)[0], name
            assert all(c in have for c in constraints(canonical)), f"{family}: model.{name} drops a check of its type"
