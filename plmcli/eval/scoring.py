"""eval-ppl's one entry point: the scorer named by a family's `traits.scoring`, from one table.

Each protocol (plmcli.models.base.Scoring) is one module of plmcli.eval with a
`score(model, files, tok, cfg, *, max_length, stride, batch_size, device, ...) -> report` function,
imported only when a run asks for it. Options only some protocols take (mem_len and tgt_len for memory,
max_tokens_per_batch for pseudo-perplexity) are checked against the family before its weights load.
"""

from __future__ import annotations

from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.kernels import packed_weights
from plmcli.registry_util import resolve

SCORERS: dict[str, str] = {
    "window": "plmcli.eval.window:score",
    "fixed_context": "plmcli.eval.fixed_context:score",
    "state": "plmcli.eval.state:score",
    "memory": "plmcli.eval.memory:score",
    "counts": "plmcli.eval.counts:score",
    "conditional": "plmcli.eval.conditional:score",
    "pseudo": "plmcli.eval.pseudo:score",
    "left_to_right": "plmcli.eval.left_to_right:score",
    "bidirectional_lm": "plmcli.eval.bidirectional_lm:score",
}
"""Scoring protocol -> its scorer ("module:function")."""


LEFT_TO_RIGHT: dict[str, str] = {p: f"plmcli.eval.{p}:token_logprobs"
                                 for p in ("window", "fixed_context", "state", "memory", "counts", "left_to_right")}
"""The protocols that score a text left to right, token by token -> their per-token scorer
(`token_logprobs(model, ids, cfg, *, batch_size, device, tail) -> (log-probabilities, argmax hits)`, one each
per token of `ids`), which lm-eval's requests and eval-ppl read alike."""


def scores_left_to_right(model_or_cls) -> bool:
    """Whether a model's (or model class's) protocol gives every token's log p(token | the tokens before it)."""
    return traits_of(model_or_cls).scoring in LEFT_TO_RIGHT


def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """(log p(token | the tokens before it), whether the token is the argmax) for each of the text `ids`
    (tokenizer ids), by the per-token scorer of the model's protocol (`LEFT_TO_RIGHT`) with eval-ppl's
    defaults; a first token with nothing to condition on reads nan. tail: only the last `tail` tokens are
    wanted (the others may read nan). A model without such a protocol: PlmError."""
    protocol = traits_of(model).scoring
    if protocol not in LEFT_TO_RIGHT:
        raise PlmError(f"a {type(model).__name__} model does not score text left to right (its perplexity protocol "
                       f"is {protocol or 'none'})", "use a causal LM run (gpt, rnn, nnlm, transformer_xl, xlnet, ngram)")
    with packed_weights():
        return resolve(LEFT_TO_RIGHT, protocol, "scoring protocol")(model, ids, cfg, batch_size=batch_size,
                                                                     device=device, tail=tail)


def scorer(model_or_cls):
    """The score function of a model's (or model class's) protocol; PlmError when it has none."""
    protocol = traits_of(model_or_cls).scoring
    if protocol is None:
        raise no_perplexity((model_or_cls if isinstance(model_or_cls, type) else type(model_or_cls)).__name__)
    return resolve(SCORERS, protocol, "scoring protocol")


def no_perplexity(what: str) -> PlmError:
    """The error for a family whose `traits.scoring` is None."""
    return PlmError(f"{what} is not a causal LM, so it has no left-to-right perplexity, nor a masked LM for "
                    "pseudo-perplexity", "evaluate a causal (gpt) or masked-LM (bert) run instead (word vectors: plm eval-vectors)")


def check_options(cls, family: str, run: str, *, mem_len: int | None = None, tgt_len: int | None = None,
                  max_tokens_per_batch: int | None = None) -> None:
    """Refuse, from the run's family alone, a run without perplexity and options its protocol does not take.
    `run`: how the user named the run, for the messages."""
    traits = traits_of(cls)
    if traits.scoring is None:
        raise no_perplexity(f"run {run} ({family})")
    if max_tokens_per_batch is not None and traits.scoring != "pseudo":
        raise PlmError(f"--max-tokens-per-batch applies to masked LMs (pseudo-perplexity), and run {run} "
                       f"is {family}", "leave it out; --batch-size sets the windows per forward pass")
    if (mem_len is not None or tgt_len is not None) and not traits.has_memory:
        raise PlmError(f"--mem-len / --tgt-len apply to models with memory (transformer_xl, xlnet), and run "
                       f"{run} is {family}", "leave them out; use --max-length / --stride for windows")


def score(model, files: list[str], tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu", **options) -> dict:
    """eval-ppl's report of `model` over `files` (plmcli.eval.perplexity.report keys, plus what its protocol
    adds). `options`: mem_len / tgt_len (memory, left_to_right), max_tokens_per_batch (pseudo); None ones
    are left out, so a protocol only ever receives the options it takes."""
    given = {k: v for k, v in options.items() if v is not None}
    with packed_weights():  # the weights stay as they are for the whole pass
        res = scorer(model)(model, files, tok, cfg, max_length=max_length, stride=stride, batch_size=batch_size,
                            device=device, **given)
    if res.get("words") == 0:  # only whitespace: a "perplexity" of the end-of-text tokens alone means nothing
        raise PlmError(f"{', '.join(map(str, files))}: no words to score (the text is empty or only whitespace)",
                       "pass a file with text in it")
    return res
