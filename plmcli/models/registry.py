"""Model families: one line each. A family's class carries its `Config` dataclass."""

from __future__ import annotations

import contextlib

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


def build_model(family: str, cfg, init: bool = True):
    """The family's model from its config; `init=False` leaves the parameters that torch.nn.init would
    fill as they were allocated, for a caller that loads every one of them next (a run's weights):
    drawing 110M random numbers takes a bert-base about a second."""
    with contextlib.nullcontext() if init else _no_init():
        return model_class(family)(cfg)


@contextlib.contextmanager
def _no_init():
    """Every torch.nn.init filler a no-op: torch's own modules and plm's models initialise through them.
    Buffers computed otherwise (sinusoid tables, masks) are built as always. The patch is process-wide while
    it lasts, which is safe because plm builds its models on one thread; a parameter the weights file lacks
    cannot slip through uninitialised: the loads are strict."""
    from torch.nn import init

    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}
    try:
        for n in names:
            setattr(init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)
