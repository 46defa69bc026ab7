import pytest

from plmcli.config import load_recipe, parse_overrides, shipped_recipes
from plmcli.errors import PlmError


def test_shipped_recipes_listed():
    names = shipped_recipes()
    for n in ("gpt-mini", "gpt", "gpt2-small", "gpt2-medium", "gpt-char-shakespeare"):
        assert n in names


def test_overrides_are_typed():
    r = load_recipe("gpt-mini", ["train.max_steps=7", "optim.lr=3e-4", "model.bias=false", "optim.betas=[0.8, 0.9]"])
    assert r.train.max_steps == 7 and isinstance(r.train.max_steps, int)
    assert r.optim.lr == pytest.approx(3e-4) and isinstance(r.optim.lr, float)
    assert r.model.bias is False
    assert r.optim.betas == [0.8, 0.9]


def test_unknown_key_did_you_mean():
    with pytest.raises(PlmError) as e:
        load_recipe("gpt-mini", ["optim.lrr=1"])
    assert "unknown key 'lrr'" in e.value.message and "did you mean 'lr'" in e.value.hint


def test_unknown_section_and_family_key():
    with pytest.raises(PlmError, match="unknown key 'trian'"):
        load_recipe("gpt-mini", ["trian.max_steps=1"])
    with pytest.raises(PlmError, match="unknown key 'n_layers'"):
        load_recipe("gpt-mini", ["model.n_layers=2"])


def test_wrong_type_rejected():
    with pytest.raises(PlmError, match="train.max_steps = 'many' is not an integer"):
        load_recipe("gpt-mini", ["train.max_steps=many"])
    with pytest.raises(PlmError, match="is not true or false"):
        load_recipe("gpt-mini", ["model.bias=3"])


def test_unknown_recipe_lists_close_names():
    with pytest.raises(PlmError) as e:
        load_recipe("gpt-mni")
    assert "unknown recipe 'gpt-mni'" in e.value.message and "gpt-mini" in e.value.hint


def test_recipe_from_path_and_extends(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("extends: gpt-mini\nmodel: {n_layer: 2}\ntrain: {max_steps: 3}\n")
    r = load_recipe(str(p))
    assert r.name == "mine" and r.model.n_layer == 2 and r.model.d_model == 256 and r.train.max_steps == 3


def test_gpt2_medium_extends_small():
    r = load_recipe("gpt2-medium")
    assert (r.model.n_layer, r.model.d_model, r.model.n_head, r.model.max_positions) == (24, 1024, 16, 1024)


def test_bad_set_syntax():
    with pytest.raises(PlmError, match="section.key=value"):
        parse_overrides(["max_steps=3"])


def test_yaml_round_trip(tmp_path):
    r = load_recipe("gpt-char-shakespeare")
    p = tmp_path / "r.yaml"
    p.write_text(r.to_yaml())
    assert load_recipe(str(p)).to_dict() == r.to_dict()


def test_phases_resolve_in_order(tmp_path):
    p = tmp_path / "ph.yaml"
    p.write_text("extends: gpt-mini\nphases:\n  - {name: short, max_steps: 5, set: {train.seq_len: 64, optim.lr: 1.0e-3}}\n"
                 "  - {name: long, max_steps: 2, set: {train.seq_len: 128}}\n")
    r = load_recipe(str(p), ["optim.warmup_steps=1"])
    a, b = r.phase(0), r.phase(1)
    assert (a.train.seq_len, a.train.max_steps, a.optim.lr, a.optim.warmup_steps) == (64, 5, 1e-3, 1)
    assert (b.train.seq_len, b.train.max_steps, b.optim.warmup_steps) == (128, 2, 1)
    assert b.optim.lr == r.optim.lr


def test_bad_phase_rejected(tmp_path):
    p = tmp_path / "ph.yaml"
    p.write_text("extends: gpt-mini\nphases:\n  - {name: a, max_steps: 5, set: {train.seq_lenn: 64}}\n")
    with pytest.raises(PlmError, match="unknown key 'seq_lenn'"):
        load_recipe(str(p))
    p.write_text("extends: gpt-mini\nphases:\n  - {name: a, set: {}}\n")
    with pytest.raises(PlmError, match="max_steps"):
        load_recipe(str(p))
