"""`plm recipes`: one line per recipe, names whole at any width."""

import json

import pytest
from typer.testing import CliRunner

from plmcli.cli import app

runner = CliRunner()


@pytest.mark.parametrize("width", [80, 200])
def test_one_line_per_recipe_and_names_whole(width):
    names = [r["name"] for r in json.loads(runner.invoke(app, ["recipes", "--json"]).stdout)]
    res = runner.invoke(app, ["recipes"], env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    lines = res.stdout.rstrip("\n").split("\n")
    assert len(lines) == len(names) + 2  # header, rule, one row each
    assert lines[0].split()[:4] == ["recipe", "family", "objective", "params"]
    assert [line.split()[0] for line in lines[2:]] == names  # every name whole, in order
    assert all(len(line) <= width for line in lines)
    assert "ernie-chinese-base" in names and "gpt-char-shakespeare" in names


def test_the_description_is_its_first_sentence():
    res = runner.invoke(app, ["recipes"], env={"COLUMNS": "400"})
    rows = {line.split()[0]: line.rstrip() for line in res.stdout.splitlines()[2:]}
    # "Lewis et al. 2019" does not end the sentence; the next one is left to `recipes show`
    assert rows["transformer-mini-denoising"].endswith("each span one <mask>) and the model restores it.")
    assert rows["bert-base"].endswith("MLM + NSP; 900k steps at 128 tokens, then 100k at 512.")
    assert rows["gpt-mini"].split()[1:4] == ["gpt", "clm", "4.3M"]
