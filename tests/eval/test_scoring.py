"""eval-ppl picks its scorer by the family's declared `traits.scoring`, from one table (plmcli.eval.scoring)."""

import importlib
import json
from typing import get_args

import pytest
from safetensors.torch import save_model

from families import families
from helpers import ToyEncoder, ToyEncoderConfig, assert_clean_error, run
from plmcli.errors import PlmError
from plmcli.eval import scoring
from plmcli.models.base import Scoring
from plmcli.models.registry import model_class

EXPECTED = {"gpt": "window", "bert": "pseudo", "spanbert": "pseudo", "albert": "pseudo", "nezha": "pseudo",
            "electra": "pseudo", "ngram": "counts", "seq2seq": "conditional", "transformer": "conditional",
            "nnlm": "fixed_context", "rnn": "state", "elmo": "bidirectional_lm", "transformer_xl": "memory",
            "xlnet": "left_to_right", "word2vec": None}
"""What each shipped family is scored by (the protocols' definitions are in plmcli.models.base.Scoring); None: it
has no perplexity (static word vectors), and eval-ppl refuses it in one line. A pin on the shipped families: every
registered family, these or new, is checked against the scorer table by its own declaration."""


def test_the_table_covers_every_protocol():
    assert set(scoring.SCORERS) == set(get_args(Scoring))
    for protocol, target in scoring.SCORERS.items():
        module, _, name = target.partition(":")
        assert module == f"plmcli.eval.{protocol}" and callable(getattr(importlib.import_module(module), name))


def test_the_shipped_families_keep_their_protocols():
    assert {family: model_class(family).traits.scoring for family in EXPECTED} == EXPECTED


@pytest.mark.parametrize("family", families())
def test_every_family_maps_to_a_scorer_that_imports(family):
    cls = model_class(family)
    if cls.traits.scoring is None:
        with pytest.raises(PlmError, match="is not a causal LM, so it has no left-to-right perplexity"):
            scoring.scorer(cls)
        return
    fn = scoring.scorer(cls)
    assert fn.__module__ == f"plmcli.eval.{cls.traits.scoring}" and fn.__name__ == "score"
    memory = cls.traits.scoring in ("memory", "left_to_right")
    assert cls.traits.has_memory == memory  # --mem-len / --tgt-len reach exactly the scorers that read them


def test_options_a_protocol_does_not_take_are_refused_by_family():
    scoring.check_options(model_class("xlnet"), "xlnet", "r", mem_len=4, tgt_len=8)
    scoring.check_options(model_class("bert"), "bert", "r", max_tokens_per_batch=64)
    with pytest.raises(PlmError, match="--mem-len / --tgt-len apply to models with memory"):
        scoring.check_options(model_class("gpt"), "gpt", "r", tgt_len=8)
    with pytest.raises(PlmError, match="--max-tokens-per-batch applies to masked LMs"):
        scoring.check_options(model_class("rnn"), "rnn", "r", max_tokens_per_batch=64)


def test_a_family_without_scoring_gets_the_one_line_error(tmp_path, monkeypatch):
    from plmcli.models import registry

    assert ToyEncoder.traits.scoring is None
    with pytest.raises(PlmError, match="ToyEncoder is not a causal LM, so it has no left-to-right perplexity"):
        scoring.score(ToyEncoder(ToyEncoderConfig(vocab_size=5)), [], None, {})
    with pytest.raises(PlmError, match=r"run r \(toyenc\) is not a causal LM"):
        scoring.check_options(ToyEncoder, "toyenc", "r")

    monkeypatch.setitem(registry.FAMILIES, "toyenc", "helpers:ToyEncoder")
    path = tmp_path / "enc"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"family": "toyenc", "model": {"vocab_size": 5}, "tokenizer": {}}))
    save_model(ToyEncoder(ToyEncoderConfig(vocab_size=5)), str(path / "model.safetensors"))
    (tmp_path / "t.txt").write_text("hello\n")
    res = run("eval-ppl", tmp_path / "t.txt", "--model", path)
    assert_clean_error(res, f"run {path} (toyenc) is not a causal LM, so it has no left-to-right perplexity, "
                            "nor a masked LM for pseudo-perplexity")
