import json
import subprocess
import sys

import pytest

from plmcli import api, recipe_params
from plmcli.config import load_recipe, parse_overrides, raw_recipe, shipped_recipes
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


# ---------------------------------------------------------------- listing (`plm recipes`)


def test_listing_imports_no_torch_and_matches_the_validated_recipes():
    """`plm recipes` reads the YAML and the shipped table only; its rows are what loading each recipe says."""
    recipe_params.current_table()  # current as shipped: brought up to date here if the model code just changed
    code = ("import json, sys\nfrom plmcli import api\nrows = api.list_recipes()\n"
            "print(json.dumps([rows, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy') "
            "or m.startswith('plmcli.models'))]))")
    rows, heavy = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout)
    assert heavy == []
    table = recipe_params.read_table()
    assert [r["name"] for r in rows] == shipped_recipes()
    for row in rows:
        r = load_recipe(row["name"])
        assert list(row) == ["name", "family", "objective", "params", "description"]
        assert (row["family"], row["objective"], row["description"]) == (r.family, r.objective_name, r.description)
        assert row["params"] == table[row["name"]]["params"]
    by_name = {r["name"]: r for r in rows}
    # by hand: 12 × 12·768² + 13·768 per block (attention, MLP, 2 LayerNorms), wte, wpe, ln_f; head tied
    assert by_name["gpt2-small"]["params"] == 12 * (12 * 768 * 768 + 13 * 768) + 50257 * 768 + 1024 * 768 + 2 * 768


def test_a_stale_or_missing_table_entry_is_recounted(tmp_path, monkeypatch):
    """An edited recipe (its fingerprint changed) or a missing table is counted on the meta device, never
    listed with the old number."""
    shipped = recipe_params.current_table()
    table = {k: v for k, v in shipped.items() if k != "nnlm-ptb"}
    table["gpt-mini"] = {"params": 1, "fingerprint": "0" * 16}
    table["bert-mini"] = {"params": 1, "fingerprint": shipped["bert-mini"]["fingerprint"]}  # trusted while it matches
    recipe_params.write_table(table, tmp_path / "params.json")
    monkeypatch.setattr(recipe_params, "table_path", lambda: tmp_path / "params.json")
    rows = {r["name"]: r["params"] for r in api.list_recipes()}
    assert rows["gpt-mini"] == shipped["gpt-mini"]["params"] == api.count_params(load_recipe("gpt-mini"))
    assert rows["nnlm-ptb"] == shipped["nnlm-ptb"]["params"]
    assert rows["bert-mini"] == 1
    assert recipe_params.read_table() == {**table, "gpt-mini": shipped["gpt-mini"], "nnlm-ptb": shipped["nnlm-ptb"]}  # kept
    monkeypatch.setattr(recipe_params, "table_path", lambda: tmp_path / "absent.json")
    assert recipe_params.read_table() == {}
    assert recipe_params.recipe_params("ngram-kn5", raw_recipe("ngram-kn5"), {}) == shipped["ngram-kn5"]["params"]


def test_fingerprint_follows_what_the_count_depends_on(monkeypatch):
    raw = raw_recipe("bert-mini")
    fp = recipe_params.fingerprint(raw)
    assert recipe_params.fingerprint({**raw, "description": "other", "train": {"max_steps": 1}}) == fp
    assert recipe_params.fingerprint({**raw, "model": {**raw["model"], "n_layer": 3}}) != fp
    assert recipe_params.fingerprint({**raw, "tokenizer": {**raw["tokenizer"], "vocab_size": 7}}) != fp
    # the model code: a count can change with it alone
    monkeypatch.setattr(recipe_params, "code_fingerprint", lambda: "other code")
    assert recipe_params.fingerprint(raw) != fp


def test_yaml_no_is_the_word_no_where_a_choice_has_it():
    """YAML 1.1 reads `no` as False: `--set train.mixed_precision=no` (the hint of an fp16 stop) is the choice no."""
    assert load_recipe("gpt-mini", ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(PlmError, match="optim.schedule = False is not a string"):
        load_recipe("gpt-mini", ["optim.schedule=no"])


def test_extends_is_looked_up_from_the_recipe_s_own_folder_and_cycles_are_one_line(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "base.yaml").write_text("extends: gpt-mini\ntrain: {max_steps: 3}\n")
    (sub / "child.yaml").write_text("extends: base.yaml\n")
    (sub / "c.yaml").write_text("extends: ./c.yaml\n")
    (sub / "a.yaml").write_text("extends: b.yaml\n")
    (sub / "b.yaml").write_text("extends: ./a.yaml\n")
    (tmp_path / "base.yaml").write_text("extends: bert-mini\n")  # the folder plm runs in must not win
    monkeypatch.chdir(tmp_path)
    assert load_recipe("sub/child.yaml").train.max_steps == 3
    with pytest.raises(PlmError, match=r"recipe sub/c.yaml extends itself \(sub/c.yaml → sub/c.yaml\)"):
        load_recipe("sub/c.yaml")
    with pytest.raises(PlmError, match=r"extends itself \(sub/a.yaml → sub/b.yaml → sub/a.yaml\)"):
        load_recipe("sub/a.yaml")
    (sub / "d.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(PlmError, match=f"recipe file '{sub / 'missing.yaml'}' does not exist"):
        load_recipe(str(sub / "d.yaml"))
