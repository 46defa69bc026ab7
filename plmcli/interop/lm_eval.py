"""plm runs as an lm-evaluation-harness model (`lm_eval.api.model.LM`, registered as "plm").

The harness asks three things of a model, and each is answered by what plm already has:

loglikelihood          log P(continuation | context), summed over the continuation's tokens, and whether
                       greedy decoding gives it (every continuation token the argmax): the per-token scorer
                       of the run's perplexity protocol (plmcli.eval.scoring.token_logprobs, by the family's
                       `traits.scoring`) over context + continuation, its last tokens summed.
loglikelihood_rolling  the whole text's log-likelihood, by the same scorer: the number `plm eval-ppl` charges
                       the text (its sum, not its mean), every token scored once after the run's bos/eos.
generate_until         greedy plmcli.generate.generate, each row ending at its first stop string (or after
                       max_gen_toks tokens) and cut before it.

So each family reads the text as eval-ppl reads it: causal Transformers (GPT, GPT-2) in sliding windows of the
training seq_len moving by half of it, RNN/LSTM/GRU LMs with their state carried over the whole text, the NNLM
with its n-1 words of context, Transformer-XL in segments with memory, XLNet left to right (the identity
factorisation order), n-grams by their counts (the text read as one sentence). Masked LMs, encoder-decoders
and other runs without a left-to-right protocol are refused in one line.

Tokenization follows the harness' own models: a context's trailing spaces move to the continuation, then
context + continuation is encoded whole and the continuation's tokens are those after the context's.
"""

from __future__ import annotations

import numpy as np

from plmcli.errors import PlmError, needs
from plmcli.eval.scoring import scores_left_to_right, token_logprobs
from plmcli.kernels import packed_weights

NAME = "plm"
"""The harness' name for plm runs: `lm_eval.simple_evaluate(model="plm", model_args="run=runs/gpt")`."""

FEATURE = "plm lm-eval"
"""How the missing-harness error names what needs it."""

LM = needs("lm_eval.api.model", "lm-eval", FEATURE).LM
register_model = needs("lm_eval.api.registry", "lm-eval", FEATURE).register_model

MAX_GEN_TOKS = 256
"""Tokens a generation request gets when its task sets no max_gen_toks (the harness' HF default)."""


def refusal(family: str, what: str) -> PlmError:
    """The one-line error for a run whose family does not score text left to right."""
    return PlmError(f"lm-eval scores text left to right, and {what} is a {family} model, which does not (no causal "
                    "LM likelihood)", "pass a causal LM run: gpt, rnn (LSTM/GRU), nnlm, transformer_xl, xlnet or ngram")


def load_causal_run(run: str | None):
    """(model, tokenizer, run config) of a run with a left-to-right protocol; other families are refused from
    config.json, before their weights load."""
    from plmcli.models.registry import model_class
    from plmcli.runs import load_run_at, resolve_run, run_config, run_label

    path = resolve_run(run, "RUN")
    cfg = run_config(path)
    if not scores_left_to_right(model_class(cfg["family"])):
        raise refusal(cfg["family"], f"run {run_label(run, path)}")
    return load_run_at(path, cfg, run, "RUN", "evaluate it with lm-eval")


def split_request(encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as the harness' models split them: the context's trailing spaces go to
    the continuation, context + continuation is encoded whole, the continuation is the tokens after the
    context's (so a continuation starting with a space gets the tokens the text would have)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx):]


@register_model(NAME)
class PlmLM(LM):
    """A plm run for lm-evaluation-harness. `run`: a run directory (None: runs/latest) or a loaded
    (model, tokenizer, run config) triple, as plmcli.api.load_run returns. `batch_size`: windows per forward
    pass (and prompts per generation batch); "auto" reads as 8. `device`: default cuda when available."""

    def __init__(self, run=None, batch_size: int | str = 8, device: str | None = None, max_gen_toks: int = MAX_GEN_TOKS,
                 **_harness_options):
        import torch

        super().__init__()
        if isinstance(run, tuple):
            self.model, self.tok, self.cfg = run
            if not scores_left_to_right(self.model):
                raise refusal(self.cfg.get("family", type(self.model).__name__), "the given run")
        else:
            self.model, self.tok, self.cfg = load_causal_run(run)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.max_gen_toks = int(max_gen_toks)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def token_scores(self, ids: list[int], tail: int | None = None):
        """(log-probability, argmax hit) of each of `ids` given the tokens before it (plmcli.eval.scoring)."""
        return token_logprobs(self.model, ids, self.cfg, batch_size=self.batch_size, device=self._device, tail=tail)

    def continuation(self, context: str, continuation: str) -> tuple[float, bool]:
        """(log P(continuation | context), whether every continuation token is the argmax)."""
        ctx, cont = split_request(self.encode, context, continuation)
        if not cont:
            return 0.0, True
        lp, hit = self.token_scores(ctx + cont, tail=len(cont))
        lp, hit = lp[-len(cont):], hit[-len(cont):]
        if np.isnan(lp).any():
            raise PlmError("an empty context, and the run's tokenizer has no bos or eos to condition the "
                           "continuation's first token on", "give every request a context")
        return float(lp.sum()), bool(hit.all())

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        with packed_weights():
            for req in requests:
                res = self.continuation(*req.args)
                self.cache_hook.add_partial("loglikelihood", req.args, res)
                out.append(res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood, every token given all before it as eval-ppl scores it (a first token with
        no bos/eos to follow is context only, as there)."""
        out = []
        with packed_weights():
            for req in requests:
                (text,) = req.args[:1]
                ids = self.encode(text)
                res = float(np.nansum(self.token_scores(ids)[0])) if ids else 0.0
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), res)
                out.append(res)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut before the first of each request's `until` strings, at most max_gen_toks
        tokens; requests with the same budget and stop strings are decoded batch_size at a time, each row ending
        once its text holds one of them."""
        from plmcli.generate import generate, stop_strings

        asks = [(context, dict(kwargs or {})) for context, kwargs in (req.args[:2] for req in requests)]
        keys = [(int(kw.get("max_gen_toks", self.max_gen_toks)), tuple(stop_strings(kw.get("until"))))
                for _, kw in asks]
        out: list[str] = [""] * len(asks)
        for budget, until in sorted(set(keys)):
            idx = [i for i, k in enumerate(keys) if k == (budget, until)]
            texts = generate((self.model, self.tok, self.cfg), [asks[i][0] for i in idx], max_new_tokens=budget,
                             strategy="greedy", batch_size=self.batch_size, device=self._device, stop=list(until))
            for i, text in zip(idx, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out
