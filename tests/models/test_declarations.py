"""Every family declares what it is: a LanguageModel subclass with frozen Traits and a Config that names the
fields callers read without probing (vocab_size; max_positions where the family has learned positions)."""

from __future__ import annotations

import dataclasses

import pytest

from plmcli.models.base import LanguageModel, Traits
from plmcli.models.registry import FAMILIES, model_class

NO_PERPLEXITY = {"word2vec": "static word vectors: no distribution over the next word (scored by plm eval-vectors)"}
"""Families that are no language model in the perplexity sense, and why."""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_declares_traits_and_vocab_size(family):
    cls = model_class(family)
    assert issubclass(cls, LanguageModel) and isinstance(cls.traits, Traits)
    assert "vocab_size" in {f.name for f in dataclasses.fields(cls.Config)}
    t = cls.traits
    # What a family is decides how it is scored and how a pair is laid out.
    assert (t.scoring is not None) != (family in NO_PERPLEXITY)
    assert (t.pair_layout is not None) == (t.causal or t.bidirectional or t.pooling is not None)
    # A family that serves sequence task heads says how they read it (a Transformer's encoder: the mean).
    assert (t.pooling is not None) == (t.pair_layout is not None)


def test_traits_refuse_a_misspelt_trait():
    with pytest.raises(TypeError):
        Traits(casual=True)
