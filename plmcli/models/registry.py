"""Model families: one line each. A family's class carries its `Config` dataclass."""

from __future__ import annotations

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
