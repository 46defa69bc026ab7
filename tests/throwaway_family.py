"""A pytest plugin (`-p throwaway_family`, tests/ on PYTHONPATH) registering a family that no test names: GPT under
"gpt_copy". tests/test_family_pickup.py runs the family-wide suites with it, to show that a registered family
reaches each of them with no other edit. Registered in pytest_configure: before any suite is collected, since the
suites read the registry to parametrize."""

from plmcli.models.gpt import GPT
from plmcli.models.registry import FAMILIES

NAME = "gpt_copy"


class GPTCopy(GPT):
    """GPT, declarations and tiny size inherited, under a name of its own."""


def pytest_configure(config):
    FAMILIES[NAME] = f"{__name__}:GPTCopy"
