import json

import torch
from safetensors.torch import load_file

from helpers import TINY_RECIPE, tiny_corpus
from plmcli import api

PHASES = TINY_RECIPE + """\
phases:
  - {name: short, max_steps: 4, set: {train.seq_len: 8, optim.lr: 5.0e-3}}
  - {name: long, max_steps: 3, set: {train.seq_len: 16, train.global_batch_size: 2}}
"""


def test_two_phases_continue_weights_and_resume(tmp_path):
    recipe = tmp_path / "phased.yaml"
    recipe.write_text(PHASES)
    corpus = tiny_corpus(tmp_path / "c.txt")
    s = api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "full"))
    run = tmp_path / "full"
    a = json.loads((run / "phases" / "short" / "summary.json").read_text())
    b = json.loads((run / "phases" / "long" / "summary.json").read_text())
    assert (a["steps"], a["tokens"]) == (4, 4 * 4 * 8)
    assert (b["steps"], b["tokens"]) == (3, 3 * 2 * 16)
    assert s["steps"] == 3 and (run / "model.safetensors").is_file()
    final = load_file(str(run / "model.safetensors"))
    assert all(torch.equal(final[k], v) for k, v in load_file(str(run / "phases" / "long" / "model.safetensors")).items())

    # Interrupted inside phase 1, resumed: identical to the uninterrupted run.
    api.pretrain(str(recipe), [str(corpus)], str(tmp_path / "cut"), stop_after=2)
    assert not (tmp_path / "cut" / "phases" / "long").exists()
    api.pretrain(out=str(tmp_path / "cut"), resume=True)
    resumed = load_file(str(tmp_path / "cut" / "model.safetensors"))
    for k in final:
        assert torch.equal(final[k], resumed[k]), k
