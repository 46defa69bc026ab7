"""Model families: one line each. A family's class carries its `Config` dataclass."""

from __future__ import annotations

from typing import Callable

from plmcli.registry_util import resolve

FAMILIES: dict[str, str] = {
    "gpt": "plmcli.models.gpt:GPT",
    "bert": "plmcli.models.bert:Bert",
    "spanbert": "plmcli.models.spanbert:SpanBert",
    "albert": "plmcli.models.albert:Albert",
    "nezha": "plmcli.models.nezha:Nezha",
    "ngram": "plmcli.models.ngram:NGramLM",
    "seq2seq": "plmcli.models.seq2seq:Seq2Seq",
    "transformer": "plmcli.models.transformer:Transformer",
    "nnlm": "plmcli.models.nnlm:NNLM",
    "rnn": "plmcli.models.rnn:RNNLM",
    "elmo": "plmcli.models.elmo:ELMo",
    "transformer_xl": "plmcli.models.transformer_xl:TransformerXL",
    "electra": "plmcli.models.electra:Electra",
    "xlnet": "plmcli.models.xlnet:XLNet",
    "word2vec": "plmcli.models.word2vec:Word2Vec",
}


def model_class(family: str):
    return resolve(FAMILIES, family, "model family")


def model_config_class(family: str):
    return model_class(family).Config


def build_model(family: str, cfg):
    """The family's model from its config, initialised (under models.skip_init.NoRandomInit: not, for a caller
    that loads every parameter next)."""
    return model_class(family)(cfg)


def families_that(test: Callable[[type], bool]) -> list[str]:
    """The registered families whose model class passes `test`, in registration order: what help and error texts
    name, so that a family registered here is named wherever it serves (imports every family's module)."""
    return [f for f in FAMILIES if test(model_class(f))]


def named(families: list[str], last: str = "or") -> str:
    """"a, b or c": a list of families for a sentence."""
    return f"{', '.join(families[:-1])} {last} {families[-1]}" if len(families) > 1 else "".join(families)
