"""Generation with a key/value cache (GPT, GPT-2) and Transformer-XL's memory, against full recomputation;
the progress bar of long generations."""

import io

import pytest
import torch
from rich.console import Console

from plmcli.generate import CachedSession, CausalSession, StatefulSession, _beam, _per_row, _Plan, generate
from plmcli.models.base import CachesKeysValues, LanguageModel
from plmcli.models.gpt import GPT, GPTConfig
from plmcli.models.transformer_xl import TransformerXL, TransformerXLConfig

pytestmark = pytest.mark.usefixtures("one_thread")

STYLES = {"gpt1": {"norm_position": "post", "final_norm": False, "activation": "gelu_tanh"}, "gpt2": {}}
V, EOS = 50, 0


def gpt(style: str, max_positions: int = 40, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=V, n_layer=2, n_head=2, d_model=16, max_positions=max_positions, dropout=0.1,
                    attn_dropout=0.1, **STYLES[style])
    return GPT(cfg).eval()  # dropout configured, and off in eval


class Recompute(LanguageModel):
    """The same network without the cache: generation falls back to CausalSession's full forward each step."""

    traits = GPT.traits

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    def forward(self, ids):
        return self.model(ids)


class Tok:
    """Prompts are space-separated token ids."""

    def encode_batch(self, texts, add_special_tokens=False):
        return [type("E", (), {"ids": [int(c) for c in t.split()]}) for t in texts]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


CFG = {"tokenizer": {"special_token_ids": {"eos": EOS}}}
# With the eos prefix: 2, 9, 1 and 14 tokens of context.
PROMPTS = ["3 4", "7 8 9 10 11 12 13 14", "", "5 " * 13]


def contexts(prompts=PROMPTS):
    return [[EOS] + [int(c) for c in p.split()] for p in prompts]


def test_the_plan_picks_the_cache_for_gpt_and_not_for_the_wrapper():
    model = gpt("gpt2")
    assert isinstance(model, CachesKeysValues) and not isinstance(Recompute(model), CachesKeysValues)
    plan = _Plan.of(model, CFG, 5, "cpu")
    assert type(plan.session(model, Tok(), [[3]])[0]) is CachedSession
    assert type(plan.session(Recompute(model), Tok(), [[3]])[0]) is CausalSession


@pytest.mark.parametrize("style", STYLES)
def test_cached_logits_equal_recompute_within_max_positions(style):
    model = gpt(style)
    ctx = contexts()
    steps = 40 - max(map(len, ctx))  # the longest row's last logits read exactly max_positions tokens
    with torch.no_grad():
        cached, full = CachedSession(model, ctx, steps, 40, "cpu"), CausalSession(model, ctx, steps, 40, "cpu")
        for step in range(steps + 1):
            a, b = cached.logits(), full.logits()
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
            if step == steps:
                break
            tokens = torch.distributions.Categorical(logits=b).sample()  # any tokens: the rows diverge
            if step == steps // 2:  # beam search's reordering, rows duplicated and dropped
                index = torch.tensor([3, 3, 0, 2, 1])
                cached.select(index), full.select(index)
                tokens = tokens[index]
            cached.push(tokens), full.push(tokens)
        assert cached.cache[0][0].shape[2] == 40  # the longest window filled every position, no restart


@pytest.mark.parametrize("style", STYLES)
def test_greedy_beam_and_sampling_equal_recompute(style):
    model = gpt(style, seed=1)
    runs = (model, Tok(), CFG), (Recompute(model), Tok(), CFG)
    for kw in ({}, {"strategy": "beam", "num_beams": 3}, {"strategy": "sample", "seed": 3},
               {"strategy": "sample", "top_p": 0.9, "temperature": 1.5, "seed": 4}, {"batch_size": 2}):
        a, b = (generate(run, PROMPTS, max_new_tokens=40 - 14, **kw) for run in runs)
        assert a == b and len(a) == len(PROMPTS)
        assert max(map(len, (o.split() for o in a))) > 5  # something was generated


# ---------------------------------------------------------------- past max_positions


class Windowed:
    """The documented rule, recomputed: a row's context is its tokens from `start`; a row longer than P at first
    starts P from its end, and one that would exceed P restarts at its last max(1, P // 2) tokens."""

    def __init__(self, model, ctx, P):
        self.model, self.P = model, P
        self.rows = [list(c) for c in ctx]
        self.start = [max(0, len(c) - P) for c in ctx]

    def logits(self):
        return torch.cat([self.model(torch.tensor([r[s:]]))[:, -1] for r, s in zip(self.rows, self.start)])

    def push(self, tokens):
        for i, t in enumerate(tokens.tolist()):
            self.rows[i].append(t)
            if len(self.rows[i]) - self.start[i] > self.P:
                self.start[i] = len(self.rows[i]) - max(1, self.P // 2)

    def select(self, index):
        self.rows = [list(self.rows[i]) for i in index.tolist()]
        self.start = [self.start[i] for i in index.tolist()]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("P", [9, 8, 1])
def test_past_max_positions_the_window_restarts_at_half(style, P):
    model = gpt(style, max_positions=P)
    ctx = contexts()
    with torch.no_grad():
        cached, ref = CachedSession(model, ctx, 30, P, "cpu"), Windowed(model, ctx, P)
        assert cached.start == ref.start == [max(0, len(c) - P) for c in ctx]
        for step in range(30):
            a, b = cached.logits(), ref.logits()
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
            assert cached.start == ref.start
            tokens = b.argmax(-1)
            cached.push(tokens), ref.push(tokens)
        cached.logits()  # a push takes effect when the logits after it are read
    if P == 9:  # each row overflows at 10 tokens after its start and keeps its last 4: "eos 3 4" at 10, 16, 22 and 28
        # tokens (start 6, 12, 18, 24); the 14-token prompt starts at 5, then 11, 17, ..., 35
        assert cached.start == [24, 30, 24, 35] and cached.len == [33, 39, 31, 44]


@pytest.mark.parametrize("style", STYLES)
def test_beam_and_sampling_past_max_positions_follow_the_rule(style):
    model = gpt(style, max_positions=8, seed=2)
    ctx = contexts()
    with torch.no_grad():
        for K in (1, 3):
            assert _beam(CachedSession(model, ctx, 25, 8, "cpu"), len(ctx), K, 25, None, 1.0) == \
                _beam(Windowed(model, ctx, 8), len(ctx), K, 25, None, 1.0)
        gens = [torch.Generator().manual_seed(5) for _ in range(2)]
        picks = [lambda x, g=g: torch.multinomial(x.softmax(-1), 1, generator=g)[:, 0] for g in gens]
        a = _per_row(CachedSession(model, ctx, 25, 8, "cpu"), len(ctx), 25, EOS, picks[0])
        b = _per_row(Windowed(model, ctx, 8), len(ctx), 25, EOS, picks[1])
        assert a == b


# ---------------------------------------------------------------- Transformer-XL: the memory is the cache


def txl(mem_len: int, seed: int = 0, **kw) -> TransformerXL:
    torch.manual_seed(seed)
    cfg = TransformerXLConfig(vocab_size=V, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.1, mem_len=mem_len, **kw)
    return TransformerXL(cfg).eval()


@pytest.mark.parametrize("kw", [{}, {"norm_position": "pre"}, {"cutoffs": [10, 30]}, {"clamp_len": 4}])
def test_txl_step_by_step_equals_one_forward_when_the_memory_holds_everything(kw):
    model = txl(mem_len=24, **kw)
    ids = torch.randint(1, V, (1, 24))
    with torch.no_grad():
        full = model(ids)[0][0]  # (24, V)
        session = StatefulSession(model, [ids[0, :5].tolist()], "cpu")
        steps = [session.logits()]
        for t in range(5, 24):
            session.push(ids[0, t:t + 1])
            steps.append(session.logits())
    torch.testing.assert_close(torch.cat(steps), full[4:], atol=2e-5, rtol=1e-5)


def test_txl_generation_equals_recompute_through_generate():
    model = txl(mem_len=40, seed=3)

    class Whole(LanguageModel):
        """Transformer-XL without its state: every step one forward over the whole text."""

        traits = GPT.traits

        def forward(self, ids):
            return model(ids)[0]

    # A model with memory decodes one prompt at a time: so does the reference, drawing its samples in that order.
    for kw in ({}, {"strategy": "beam", "num_beams": 3}, {"strategy": "sample", "seed": 1}):
        a = generate((model, Tok(), CFG), PROMPTS, max_new_tokens=20, **kw)
        assert a == generate((Whole(), Tok(), CFG), PROMPTS, max_new_tokens=20, batch_size=1, **kw)


def test_txl_past_mem_len_sees_at_most_n_layer_times_mem_len_back():
    """Documented: a step attends to mem_len states per layer; older tokens reach it only through the higher
    layers' states, so a token more than n_layer × mem_len back changes nothing, one within it does."""
    model, L, M = txl(mem_len=3, seed=4, init_std=0.3), 2, 3  # weights large enough for far tokens to matter

    def last_logits(ids):
        session = StatefulSession(model, [ids[:1]], "cpu")
        for t in ids[1:]:
            session.logits()
            session.push(torch.tensor([t]))
        return session.logits()

    ids = torch.randint(1, V, (20,)).tolist()
    with torch.no_grad():
        base = last_logits(ids)
        far, near = list(ids), list(ids)
        far[19 - L * M - 1] = far[19 - L * M - 1] % (V - 1) + 1  # one beyond reach
        near[19 - L * M] = near[19 - L * M] % (V - 1) + 1  # n_layer × mem_len before the last token: the farthest seen
        assert torch.equal(last_logits(far), base)
        assert (last_logits(near) - base).abs().max() > 1e-4


# ---------------------------------------------------------------- progress


def terminal():
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100), out


def test_long_generation_shows_a_bar_on_a_terminal_only(monkeypatch):
    import plmcli.generate as gen

    model = gpt("gpt2")
    run = (model, Tok(), CFG)
    quiet = generate(run, PROMPTS, max_new_tokens=20)
    console, out = terminal()
    monkeypatch.setattr(gen, "PROGRESS_AFTER_S", 0.0)
    assert generate(run, PROMPTS, max_new_tokens=20, batch_size=2, console=console) == quiet
    text = out.getvalue()
    assert "generating, prompts 1-2 of 4: tokens" in text and "prompts 3-4 of 4" in text and "/20" in text
    off = Console(file=io.StringIO(), force_terminal=False)
    assert generate(run, PROMPTS, max_new_tokens=20, console=off) == quiet
    assert off.file.getvalue() == ""  # a log, a pipe, CI: nothing
