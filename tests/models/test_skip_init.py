"""Building a model to load its weights draws no random init, for every family, without patching torch for the
process: another thread initialises as always meanwhile."""

import threading

import pytest
import torch

from families import families, tiny_config
from plmcli.models.registry import build_model
from plmcli.models.skip_init import NoRandomInit


@pytest.mark.parametrize("family", families())
def test_a_build_without_init_draws_nothing_and_loads_exactly(family):
    cfg = tiny_config(family)
    torch.manual_seed(0)
    made = build_model(family, cfg)
    before = torch.get_rng_state()
    with NoRandomInit():
        bare = build_model(family, cfg)
    assert torch.equal(torch.get_rng_state(), before)
    bare.load_state_dict(made.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(made.state_dict().values(), bare.state_dict().values()))


def test_the_mode_is_this_thread_s_only():
    filled = {}

    def other():
        t = torch.zeros(1000)
        torch.nn.init.normal_(t)
        filled["std"] = float(t.std())

    with NoRandomInit():
        kept = torch.nn.init.normal_(torch.zeros(10))
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert torch.equal(kept, torch.zeros(10)) and filled["std"] > 0.5
