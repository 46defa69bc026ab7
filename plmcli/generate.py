"""Text generation from a run: greedy, beam search and top-k / top-p sampling.

Serves encoder-decoder runs (`traits.seq2seq`: the prompt is the source, the output the decoded
target) and causal LMs (`traits.causal`: the prompt, after the tokenizer's bos (or eos), is continued).
All decoding strategies drive one small interface, a *session* over N rows:
`logits()` -> (N, V) next-token logits, `push(tokens)` appends one token per row, `select(index)`
keeps / duplicates rows (beam search reorders them). Sessions exist for
- encoder-decoders: `model.encode(src_ids, src_mask)` once, then `model.decode_step(tokens, state)`;
- stateful causal LMs (`traits.stateful`, forward(ids, state) -> (logits, state)): the state carried.
  Transformer-XL's state is its memory: each layer attends to the last mem_len (the recipe's training
  mem_len) states that entered it plus the new token, so with mem_len ≥ prompt + output a step's logits are
  those of one forward over the whole text. Past mem_len a step costs the same as before: older tokens reach
  it only through the states the higher layers keep (at most n_layer × mem_len tokens back, as in Dai et
  al.'s evaluation). With mem_len 0 nothing is kept: the first token generated sees the prompt, each later
  step its own input token alone;
- causal Transformers with a key/value cache (`CachesKeysValues`: GPT, GPT-2), `CachedSession`: the
  prompts read once, then one token per step, each row exactly what the recompute session below gives
  while prompt + output fit in max_positions. Past that the recompute session slides its window one
  token a step (a full forward each time: the cost generation without a cache pays at every step); the
  cached one instead keeps a row's window while it holds ≤ max_positions tokens and, when a token would
  overflow it, restarts it at the row's last max(1, max_positions // 2) tokens, read again in one prefill.
  A prediction then always sees between half and all of max_positions tokens, and a restart (a forward
  over P/2 tokens) comes once every P/2 steps: one more token read per token generated, where sliding
  reads P;
- other causal LMs: the forward recomputed over the context, cropped to the model's max_positions;
- a model with a `generation_session(prompt_ids)` of its own (`HasGenerationSession`; n-grams:
  log P(w | history) over its words), which also names its `eos` and `decode`s its tokens.
Generation stops at eos (which is not part of the output) or after max_new_tokens; with `stop` (a string, e.g.
"\n", or several), greedy and sampled rows also stop once their text holds one, and every output is cut before
the first it holds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError
from plmcli.models.base import CachesKeysValues, CarriesStateBatch, HasGenerationSession, HasPositionLimit
from plmcli.models.registry import families_that, named
from plmcli.kernels import packed_weights
from plmcli.train.progress import StageProgress

STRATEGIES = ("greedy", "beam", "sample")
PROGRESS_AFTER_S = 1.0
"""Decoding shorter than this shows no progress bar."""


# ---------------------------------------------------------------- filters


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits of each row (ties with the k-th kept too); the rest -> -inf. k=0: all."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2019): keep the smallest set of most likely tokens whose
    probability mass is ≥ p; the rest -> -inf. p=1: all."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.float().softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of the more likely tokens
    drop_sorted = before >= p  # the set before this token already has mass ≥ p (never the first token)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


# ---------------------------------------------------------------- sessions


def select_state(state, index: torch.Tensor, dim: int = 0):
    """Index every tensor of a nested dict / list / tuple state along `dim` (the batch)."""
    if torch.is_tensor(state):
        return state.index_select(dim, index.to(state.device))
    if isinstance(state, dict):
        return {k: select_state(v, index, dim) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(select_state(v, index, dim) for v in state)
    return state


class _Lazy:
    """Logits are computed when asked for, so the token pushed last (at max_new_tokens) costs nothing."""

    def logits(self) -> torch.Tensor:
        if self._logits is None:
            self._logits = self._advance(self._pending)
            self._pending = None
        return self._logits

    def push(self, tokens: torch.Tensor) -> None:
        self._pending, self._logits = tokens, None


class Seq2SeqSession(_Lazy):
    def __init__(self, model, sources: list[list[int]], pad: int, start: int, eos: int, device):
        S = max(map(len, sources))
        src = torch.full((len(sources), S), pad, dtype=torch.long)
        mask = torch.zeros((len(sources), S), dtype=torch.bool)
        for i, s in enumerate(sources):
            src[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = True
        self.model = model
        self.state = model.encode(src.to(device), mask.to(device))
        self._pending, self._logits = torch.full((len(sources),), start, dtype=torch.long, device=device), None

    def _advance(self, tokens):
        logits, self.state = self.model.decode_step(tokens, self.state)
        return logits

    def select(self, index):
        self.state = select_state(self.state, index)
        self._pending = None if self._pending is None else self._pending[index]
        self._logits = None if self._logits is None else self._logits[index]


def _token_buffer(contexts: list[list[int]], max_new: int, device) -> torch.Tensor:
    """(rows, room for the longest context and max_new more) of token ids, each context at its row's start."""
    buf = torch.zeros((len(contexts), max(map(len, contexts)) + max_new + 1), dtype=torch.long, device=device)
    for i, c in enumerate(contexts):
        buf[i, : len(c)] = torch.tensor(c)
    return buf


class CausalSession(_Lazy):
    """Right-padded token buffer; each step reruns the model over each row's last max_positions tokens."""

    def __init__(self, model, contexts: list[list[int]], max_new: int, max_positions: int | None, device):
        self.model, self.P = model, max_positions
        self.buf = _token_buffer(contexts, max_new, device)
        self.len = torch.tensor([len(c) for c in contexts], device=device)
        self._pending, self._logits = None, None

    def _forward(self, x):
        out = self.model(x)
        return out[0] if isinstance(out, tuple) else out

    def _advance(self, tokens):
        if tokens is not None:
            self.buf[torch.arange(len(self.len), device=self.buf.device), self.len] = tokens
            self.len = self.len + 1
        n = self.len if self.P is None else self.len.clamp(max=self.P)
        w = int(n.max())
        # A causal model's position t sees positions ≤ t only, so whatever lies right of a row's end is harmless.
        cols = (self.len - n)[:, None] + torch.arange(w, device=self.buf.device)
        x = self.buf.gather(1, cols.clamp(max=self.buf.shape[1] - 1))
        logits = self._forward(x)
        return logits[torch.arange(len(n), device=logits.device), n - 1]

    def select(self, index):
        self.buf, self.len = self.buf[index], self.len[index]
        self._pending = None if self._pending is None else self._pending[index]
        self._logits = None if self._logits is None else self._logits[index]


class CachedSession(_Lazy):
    """Causal Transformers that cache keys and values (`CachesKeysValues`): each row's window is read once (a
    prefill), then one token per step. Rows are left-padded to the longest window, so every step appends at the
    same cache slot; padding keys are masked and each row counts positions from its own first token, so a row
    decodes as it would alone. A window holds at most max_positions tokens (the prompt cropped as CausalSession
    crops it); a step that would make it longer restarts it at the row's last max(1, max_positions // 2) tokens,
    read again as a new prefill (see the module docstring)."""

    def __init__(self, model, contexts: list[list[int]], max_new: int, max_positions: int | None, device):
        self.model, self.P = model, max_positions
        self.buf = _token_buffer(contexts, max_new, device)
        # Lengths and window starts live on the host: every step adds one token to every row, nothing is read back.
        self.len = [len(c) for c in contexts]
        self.start = [max(0, n - self.P) if self.P else 0 for n in self.len]
        self.cache, self.keep = None, None
        self._pending, self._logits = None, None

    def _advance(self, tokens):
        if tokens is not None:
            rows = torch.arange(len(self.len), device=self.buf.device)
            self.buf[rows, torch.tensor(self.len, device=self.buf.device)] = tokens
            self.len = [n + 1 for n in self.len]
            if self.P and any(n - s > self.P for n, s in zip(self.len, self.start)):
                last = max(1, self.P // 2)
                self.start = [n - last if n - s > self.P else s for n, s in zip(self.len, self.start)]
                self.cache = None
        if self.cache is None:
            return self._prefill()
        positions = torch.tensor([n - 1 - s for n, s in zip(self.len, self.start)], device=self.buf.device)
        if self.keep is not None:
            self.keep = torch.cat([self.keep, self.keep.new_ones(len(self.len), 1)], 1)
        logits, self.cache = self.model.decode_cached(tokens[:, None], positions[:, None], self.cache, self.keep)
        return logits

    def _prefill(self) -> torch.Tensor:
        """Every row's window [start, len), left-padded to the longest, read into an empty cache."""
        device = self.buf.device
        widths = [n - s for n, s in zip(self.len, self.start)]
        W = max(widths)
        slots = torch.arange(W, device=device)
        pad = W - torch.tensor(widths, device=device)[:, None]  # (N, 1) padding slots before each row's window
        positions = (slots - pad).clamp(min=0)
        ids = self.buf.gather(1, (torch.tensor(self.start, device=device)[:, None] + slots - pad).clamp(min=0))
        self.keep = None if min(widths) == W else slots >= pad
        logits, self.cache = self.model.decode_cached(ids, positions, self.model.empty_cache(len(widths)), self.keep)
        return logits

    def select(self, index):
        rows = index.tolist()
        self.buf = self.buf[index]
        self.len, self.start = [self.len[i] for i in rows], [self.start[i] for i in rows]
        self.cache = select_state(self.cache, index)
        self.keep = None if self.keep is None else self.keep[index]
        self._pending = None if self._pending is None else self._pending[index]
        self._logits = None if self._logits is None else self._logits[index]


class StatefulSession(_Lazy):
    """Causal LMs that carry a recurrent state: read each context once, then one token per step."""

    def __init__(self, model, contexts: list[list[int]], device):
        self.model = model
        logits, states = [], []
        for c in contexts:  # one at a time: padding would run into a shorter row's final state
            out, st = model(torch.tensor([c], device=device))
            logits.append(out[:, -1])
            states.append(st)
        self.batch_dim = model.state_batch_dim if isinstance(model, CarriesStateBatch) else 1
        self.state = _cat_states(states, self.batch_dim)
        self._pending, self._logits = None, torch.cat(logits)

    def _advance(self, tokens):
        out, self.state = self.model(tokens[:, None], self.state)
        return out[:, -1]

    def select(self, index):
        self.state = select_state(self.state, index, dim=self.batch_dim)  # RNN states are (layers, B, H)
        self._pending = None if self._pending is None else self._pending[index]
        self._logits = None if self._logits is None else self._logits[index]


def _cat_states(states, dim: int = 1):
    first = states[0]
    if torch.is_tensor(first):
        return torch.cat(states, dim=dim)
    return type(first)(_cat_states([s[i] for s in states], dim) for i in range(len(first)))


# ---------------------------------------------------------------- strategies


def _per_row(session, n: int, max_new: int, eos: int | None, pick, tick=None, ended=None) -> list[list[int]]:
    """Greedy or sampling: each row picks its next token from its own logits; finished rows leave.
    `tick()`: called once a step (the progress bar); `ended(row, its tokens)`: True once a row is done (a stop string)."""
    out = [[] for _ in range(n)]
    alive = list(range(n))
    for step in range(max_new):
        tokens = pick(session.logits().float())
        if tick:
            tick()
        keep = []
        for j, (row, t) in enumerate(zip(alive, tokens.tolist())):
            if t == eos:
                continue
            out[row].append(t)
            if ended is None or not ended(row, out[row]):
                keep.append(j)
        if not keep or step == max_new - 1:
            break
        if len(keep) < len(alive):
            idx = torch.tensor(keep, device=tokens.device)
            session.select(idx)
            tokens = tokens[idx]
            alive = [alive[j] for j in keep]
        session.push(tokens)
    return out


def _beam(session, n: int, K: int, max_new: int, eos: int | None, length_penalty: float, tick=None) -> list[list[int]]:
    """Beam search with K beams per input. A hypothesis ending in eos (among the top K candidates of a
    step) is finished with score logp / length^length_penalty (length counts the eos); an input stops
    once it has K finished hypotheses; at max_new_tokens the live beams join the finished ones.
    `tick()`: called once a step (the progress bar)."""
    device = session.logits().device
    session.select(torch.arange(n, device=device).repeat_interleave(K))
    scores = torch.full((n, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all K rows start identical: only one may expand
    history = torch.zeros((n * K, 0), dtype=torch.long, device=device)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(n)]
    done = [False] * n
    for step in range(max_new):
        logp = F.log_softmax(session.logits().float(), -1)
        V = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(n, K, V)).view(n, K * V)
        if tick:
            tick()
        top_s, top_i = cand.topk(min(2 * K, K * V), dim=-1)
        new_scores = torch.full((n, K), float("-inf"), device=device)
        new_src = torch.zeros((n, K), dtype=torch.long, device=device)
        new_tok = torch.zeros((n, K), dtype=torch.long, device=device)
        for b in range(n):
            if done[b]:
                continue
            j = 0
            for rank, (s, i) in enumerate(zip(top_s[b].tolist(), top_i[b].tolist())):
                if s == float("-inf"):
                    break
                src, tok = divmod(i, V)
                if tok == eos:
                    if rank < K:
                        finished[b].append((s / (step + 1) ** length_penalty, history[b * K + src].tolist()))
                    continue
                new_scores[b, j], new_src[b, j], new_tok[b, j] = s, src, tok
                j += 1
                if j == K:
                    break
            done[b] = len(finished[b]) >= K
        if all(done):
            break
        rows = (torch.arange(n, device=device)[:, None] * K + new_src).view(-1)
        history = torch.cat([history[rows], new_tok.view(-1, 1)], 1)
        scores = new_scores
        if step == max_new - 1:
            break
        session.select(rows)
        session.push(new_tok.view(-1))
    results = []
    for b in range(n):
        pool = list(finished[b])
        if not done[b]:  # out of steps: live beams compete, normalized by their length
            length = max(history.shape[1], 1)
            pool += [(scores[b, k].item() / length ** length_penalty, history[b * K + k].tolist())
                     for k in range(K) if scores[b, k].item() > float("-inf")]
        results.append(max(pool, key=lambda h: h[0])[1] if pool else [])
    return results


# ---------------------------------------------------------------- entry point


def _check(strategy, max_new_tokens, num_beams, top_k, top_p, temperature, length_penalty):
    if strategy not in STRATEGIES:
        raise PlmError(f"unknown decoding strategy '{strategy}'", f"use one of: {', '.join(STRATEGIES)}")
    check_option("--max-new-tokens", max_new_tokens, Range(0), "e.g. --max-new-tokens 50")
    check_option("--num-beams", num_beams, Range(1), "e.g. --num-beams 4")
    if top_k < 0:
        raise PlmError(f"--top-k {top_k} must be ≥ 0 (0 = no top-k filter)", "e.g. --top-k 50")
    if not 0 < top_p <= 1:
        raise PlmError(f"--top-p {top_p} must be in (0, 1] (1 = no nucleus filter)", "e.g. --top-p 0.9")
    if not temperature > 0 or math.isinf(temperature):
        raise PlmError(f"--temperature {temperature} must be a positive number", "e.g. --temperature 0.8 (greedy: --strategy greedy)")
    if math.isnan(length_penalty):
        raise PlmError("length_penalty is not a number", "e.g. 1.0")


@torch.no_grad()
def generate(run, prompts: list[str], max_new_tokens: int = 50, strategy: str = "greedy", num_beams: int = 4,
             top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0, seed: int = 0, length_penalty: float = 1.0,
             batch_size: int = 16, device=None, console=None, stop: str | Sequence[str] | None = None) -> list[str]:
    """Generate text for each prompt; returns the generated text only (a causal LM's continuation
    without the prompt, an encoder-decoder's output for the prompt as source).

    `run`: a run directory (None = runs/latest) or a loaded (model, tokenizer, run config) triple as
    plmcli.api.load_run returns. strategy: greedy | beam (num_beams, length_penalty: hypotheses
    ranked by logp / length^length_penalty) | sample (temperature, then top_k, then top_p; seeded, so
    the same call gives the same text). Prompts are decoded batch_size at a time. `console` (rich, stderr):
    where a transient bar counts each batch's tokens, shown on a terminal once decoding has run PROGRESS_AFTER_S.
    `stop` (e.g. "\n", or several such strings): a greedy or sampled row ends once its text holds one; every output
    is cut before the first it holds.
    """
    _check(strategy, max_new_tokens, num_beams, top_k, top_p, temperature, length_penalty)
    stops = stop_strings(stop)
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(run, tuple):
        model, tok, cfg = run
    else:
        from plmcli.runs import load_run

        model, tok, cfg = load_run(run, "plm generate RUN", "generate")
    plan = _Plan.of(model, cfg, max_new_tokens, device)
    generator = torch.Generator(device=plan.device).manual_seed(seed)

    def pick(logits):
        if strategy == "greedy":
            return logits.argmax(-1)
        logits = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
        return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]

    if model.traits.has_memory:
        batch_size = 1  # memories of prompts of different lengths differ in length: each prompt decodes alone
    texts: list[str] = []
    with StageProgress(console, delay=PROGRESS_AFTER_S) as bar:
        for b in range(0, len(prompts), batch_size):
            batch = [str(p).rstrip("\n") for p in prompts[b : b + batch_size]]
            encoded = [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]
            if plan.max_new_tokens == 0:
                texts.extend("" for _ in batch)
                continue
            which = ("" if len(batch) == len(prompts) else f", prompt {b + 1} of {len(prompts)}" if len(batch) == 1
                     else f", prompts {b + 1}-{b + len(batch)} of {len(prompts)}")
            bar.start(f"generating{which}: tokens", plan.max_new_tokens)
            with packed_weights():  # one step at a time: each weight laid out for oneDNN once, not every step
                session, eos, decode = plan.session(model, tok, encoded)
                if strategy == "beam":
                    outs = _beam(session, len(batch), num_beams, plan.max_new_tokens, eos, length_penalty, bar.advance)
                else:
                    ended = (lambda row, out: any(s in decode(encoded[row], out) for s in stops)) if stops else None
                    outs = _per_row(session, len(batch), plan.max_new_tokens, eos, pick, bar.advance, ended)
            texts.extend(decode(e, out) for e, out in zip(encoded, outs))
    return [cut_at_stop(t, stops) for t in texts]


def stop_strings(stop: str | Sequence[str] | None) -> list[str]:
    """The non-empty stop strings of `stop`: one string, several, or None."""
    return [s for s in ([stop] if isinstance(stop, str) else list(stop or [])) if s]


def cut_at_stop(text: str, stop: str | Sequence[str] | None) -> str:
    """`text` up to the first occurrence of any of the stop strings."""
    ends = [text.find(s) for s in stop_strings(stop) if s in text]
    return text[:min(ends)] if ends else text


@dataclass
class _Plan:
    """How a model generates: which session, on which device, with which special tokens and bounds."""

    seq2seq: bool
    own: bool
    """The model gives its own session (`HasGenerationSession`)."""
    device: torch.device
    ids: dict
    """The tokenizer's special token ids by role."""
    eos: int | None
    P: int | None
    """The model's max_positions, None when it reads any length."""
    start: int | None
    """An encoder–decoder's first decoder token."""
    max_new_tokens: int
    prefix: list[int]
    """What a causal LM's context starts with: the bos (or eos) token."""

    @classmethod
    def of(cls, model, cfg: dict, max_new_tokens: int, device) -> "_Plan":
        seq2seq, causal = model.traits.seq2seq, model.traits.causal
        if not (seq2seq or causal):
            raise PlmError(f"a {cfg.get('family', type(model).__name__)} run cannot generate text (it is neither causal nor encoder-decoder)",
                           f"generate from a causal LM ({named(families_that(lambda c: c.traits.causal))}) or an "
                           f"encoder-decoder ({named(families_that(lambda c: c.traits.seq2seq))}) run")
        # A model that decodes in a vocabulary of its own (n-gram words, counted on the CPU) gives its own session.
        own = isinstance(model, HasGenerationSession)
        device = torch.device("cpu" if own else device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model.to(device).eval()
        ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
        eos, start = ids.get("eos"), None
        P = model.max_positions if isinstance(model, HasPositionLimit) else None
        if seq2seq:
            if "pad" not in ids or "eos" not in ids:
                raise PlmError("the run's tokenizer has no pad/eos special tokens", "train it with a seq2seq recipe's tokenizer settings")
            start = ids.get("bos", eos)
            max_new_tokens = min(max_new_tokens, P - 1) if P else max_new_tokens  # the decoder's positions
        prefix = [ids[r] for r in ("bos", "eos") if r in ids][:1]
        return cls(seq2seq, own, device, ids, eos, P, start, max_new_tokens, prefix)

    def session(self, model, tok, encoded: list[list[int]]):
        """(session, eos, decode(prompt ids, new ids) -> text) for one batch of encoded prompts."""
        if self.own:
            session = model.generation_session(encoded)
            return session, session.eos, lambda _, out: session.decode(out)
        decode = functools.partial(_decode, tok, continuation=not self.seq2seq)
        if self.seq2seq:
            keep = (self.P - 1) if self.P else None
            sources = [e[:keep] + [self.eos] for e in encoded]
            return Seq2SeqSession(model, sources, self.ids["pad"], self.start, self.eos, self.device), self.eos, decode
        contexts = [self.prefix + e for e in encoded]
        if any(not c for c in contexts):
            raise PlmError("an empty prompt, and the run's tokenizer has no bos/eos to start from", "give every prompt some text")
        if model.traits.stateful:
            return StatefulSession(model, contexts, self.device), self.eos, decode
        if isinstance(model, CachesKeysValues):
            return CachedSession(model, contexts, self.max_new_tokens, self.P, self.device), self.eos, decode
        return CausalSession(model, contexts, self.max_new_tokens, self.P, self.device), self.eos, decode


def _decode(tok, prompt_ids: list[int], new_ids: list[int], continuation: bool) -> str:
    if not continuation:
        return tok.decode(new_ids, skip_special_tokens=True)
    # Decode prompt + continuation together (so word joins come out right), then drop the prompt's text.
    head = tok.decode(prompt_ids, skip_special_tokens=True)
    full = tok.decode(prompt_ids + new_ids, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tok.decode(new_ids, skip_special_tokens=True)
