"""plm generate: greedy / beam / sampling over encoder-decoder runs and causal LMs."""

import math

import pytest
import torch

from helpers import ToyEncoder, ToyEncoderConfig, reverse_pairs, tiny_corpus, tiny_recipe, tiny_s2s_recipe
from plmcli.errors import PlmError
from plmcli.generate import generate, top_k_filter, top_p_filter
from plmcli.models.base import LanguageModel, Traits


@pytest.fixture(scope="module")
def threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest (and far faster on a busy machine)
    yield
    torch.set_num_threads(n)


def _train(tmp, recipe, data):
    from plmcli.api import load_run, pretrain

    mp = pytest.MonkeyPatch()  # module-scoped: keep the runs and caches under this module's tmp dir
    mp.setenv("PLM_RUNS", str(tmp / "runs"))
    mp.setenv("PLM_CACHE", str(tmp / "cache"))
    try:
        pretrain(str(recipe), data=[str(data)], out=str(tmp / "run"))
    finally:
        mp.undo()
    return load_run(str(tmp / "run"))


@pytest.fixture(scope="module")
def s2s_run(tmp_path_factory, threads):
    tmp = tmp_path_factory.mktemp("s2s")
    return _train(tmp, tiny_s2s_recipe(tmp / "r.yaml", "seq2seq", max_steps=250), reverse_pairs(tmp / "rev.txt"))


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory, threads):
    tmp = tmp_path_factory.mktemp("gpt")
    return _train(tmp, tiny_recipe(tmp / "r.yaml"), tiny_corpus(tmp / "c.txt"))


SOURCES = ["a b c d", "h g f", "c c a b e", "d e f g h"]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = probs.log()[None]
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert kept(0.3) == [False, True, False, False]  # 0.5 alone already ≥ 0.3
    assert kept(0.7) == [False, True, False, True]  # 0.5 < 0.7 ≤ 0.5 + 0.3
    assert kept(0.81) == [True, True, False, True]
    assert kept(0.99) == [True, True, True, True]
    assert kept(1.0) == [True] * 4
    kept_logits = top_p_filter(logits, 0.7)[0]
    assert kept_logits[1] == logits[0, 1] and kept_logits[3] == logits[0, 3]  # survivors untouched


def test_top_k_filter():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0], [0.0, -1.0, 2.0, 1.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True], [False, False, True, True]]
    assert torch.equal(top_k_filter(logits, 0), logits)


def test_seq2seq_greedy_and_beam_reverse(s2s_run):
    expected = [" ".join(reversed(s.split())) for s in SOURCES]
    assert generate(s2s_run, SOURCES) == expected
    assert generate(s2s_run, SOURCES, strategy="beam", num_beams=4) == expected


def test_beam_of_one_and_top_k_of_one_equal_greedy(s2s_run, gpt_run):
    for run, prompts in ((s2s_run, SOURCES), (gpt_run, ["the cat", "dogs ran far", "a"])):
        greedy = generate(run, prompts, max_new_tokens=12)
        assert generate(run, prompts, max_new_tokens=12, strategy="beam", num_beams=1) == greedy
        assert generate(run, prompts, max_new_tokens=12, strategy="sample", top_k=1, temperature=0.7, seed=5) == greedy


def test_sampling_is_seeded(s2s_run):
    kw = dict(max_new_tokens=8, strategy="sample", temperature=3.0)
    a = generate(s2s_run, SOURCES * 3, seed=1, **kw)
    assert generate(s2s_run, SOURCES * 3, seed=1, **kw) == a
    assert generate(s2s_run, SOURCES * 3, seed=2, **kw) != a


def test_gpt_continues_prompts_like_a_manual_greedy_loop(gpt_run):
    model, tok, cfg = gpt_run
    eos = cfg["tokenizer"]["special_token_ids"]["eos"]
    prompts = ["the cat sat", "home and", "x" * 40]  # the last one is longer than the 32 positions: cropped
    outs = generate(gpt_run, prompts, max_new_tokens=10)
    for p, out in zip(prompts, outs):
        ids = [eos] + tok.encode(p).ids
        new = []
        with torch.no_grad():
            for _ in range(10):
                nxt = int(model(torch.tensor([ids[-32:]]))[0, -1].argmax())
                if nxt == eos:
                    break
                new.append(nxt)
                ids.append(nxt)
        assert out == tok.decode(new) and len(out) <= 10
    # batching (right padding, rows of different lengths) changes nothing
    assert [generate(gpt_run, [p], max_new_tokens=10)[0] for p in prompts] == outs
    assert generate(gpt_run, prompts, max_new_tokens=10, batch_size=2) == outs


def test_stateful_causal_lm_matches_recompute():
    class GRULM(LanguageModel):
        traits = Traits(causal=True, stateful=True)

        def __init__(self):
            super().__init__()
            self.emb, self.rnn, self.out = torch.nn.Embedding(20, 8), torch.nn.GRU(8, 8, batch_first=True), torch.nn.Linear(8, 20)

        def forward(self, ids, state=None):
            h, state = self.rnn(self.emb(ids), state)
            return self.out(h), state

    class Recompute(GRULM):
        traits = Traits(causal=True)

        def forward(self, ids):
            return super().forward(ids)[0]

    class Tok:
        def encode_batch(self, texts, add_special_tokens=False):
            return [type("E", (), {"ids": [int(c) for c in t.split()]}) for t in texts]

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    torch.manual_seed(0)
    a, b = GRULM(), Recompute()
    b.load_state_dict(a.state_dict())
    cfg = {"tokenizer": {"special_token_ids": {"eos": 0}}}
    prompts = ["3 4 5", "7", "9 9 1 2 3"]
    for kw in ({}, {"strategy": "beam", "num_beams": 3}, {"strategy": "sample", "top_p": 0.9, "seed": 3}):
        assert generate((a, Tok(), cfg), prompts, max_new_tokens=6, **kw) == generate((b, Tok(), cfg), prompts, max_new_tokens=6, **kw)


def test_bad_arguments_and_non_generative_runs(s2s_run):
    with pytest.raises(PlmError, match="strategy"):
        generate(s2s_run, ["a"], strategy="nucleus")
    with pytest.raises(PlmError, match="top-p"):
        generate(s2s_run, ["a"], strategy="sample", top_p=0.0)
    with pytest.raises(PlmError, match="temperature"):
        generate(s2s_run, ["a"], strategy="sample", temperature=0.0)
    with pytest.raises(PlmError, match="num-beams"):
        generate(s2s_run, ["a"], strategy="beam", num_beams=0)
    enc = ToyEncoder(ToyEncoderConfig(vocab_size=10))
    with pytest.raises(PlmError, match="cannot generate"):
        generate((enc, None, {"family": "bert"}), ["a"])
    assert generate(s2s_run, ["a b"], max_new_tokens=0) == [""]
    assert generate(s2s_run, []) == []


def test_beam_search_scores_by_hand():
    """A scripted decoder: beam search must prefer the higher length-normalized hypothesis."""
    from plmcli.generate import _beam

    eos = 0
    # Greedy takes token 1 (p=0.6) and then must pay; beam finds 2 -> eos (0.4 · 0.9).
    table = {(): [0.0, 0.6, 0.4, 0.0], (1,): [0.3, 0.35, 0.35, 0.0], (2,): [0.9, 0.05, 0.05, 0.0]}

    class Scripted:
        def __init__(self):
            self.rows = [()]

        def logits(self):
            return torch.tensor([table.get(r, [1.0, 0, 0, 0]) for r in self.rows]).clamp_min(1e-9).log()

        def select(self, idx):
            self.rows = [self.rows[i] for i in idx.tolist()]

        def push(self, tokens):
            self.rows = [r + (t,) for r, t in zip(self.rows, tokens.tolist())]

    best = _beam(Scripted(), 1, 2, 5, eos, length_penalty=1.0)[0]
    assert best == [2]  # 2 -> eos: log(0.4·0.9)/2 = -0.511 beats the greedy path 1 -> 1 -> eos: log(0.6·0.35)/3 = -0.520
    greedy_like = _beam(Scripted(), 1, 1, 5, eos, length_penalty=1.0)[0]
    assert greedy_like[:1] == [1]
    assert math.isclose(math.log(0.4 * 0.9) / 2, -0.5108, abs_tol=1e-3)
