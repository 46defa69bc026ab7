import math

from plmcli.config import override_layers
import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli import api
from plmcli.api import count_params
from plmcli.config import load_recipe
from plmcli.config_sections import TokenizerConfig
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.eval.scoring import score
from plmcli.models.nnlm import NNLM, NNLMConfig
from plmcli.objectives.clm import CausalLM


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw):
    return NNLMConfig(**(dict(vocab_size=41, order=4, d_embed=6, d_hidden=10) | kw))


def _model(**kw):
    torch.manual_seed(0)
    m = NNLM(tiny(**kw)).eval()
    if m.direct is not None:  # zero at init: make the shortcut count in the tests
        torch.nn.init.normal_(m.direct.weight, 0, 0.1)
    return m


def test_matches_the_papers_formula_position_by_position():
    """y = b + W·x + U·tanh(d + H·x), x = [C(w_{t-n+2}) .. C(w_t)], zero vectors before the start."""
    m = _model()
    ids = torch.randint(0, 41, (2, 9))
    got = m(ids)
    C = m.wte.weight
    for t in range(9):
        ctx = [C[ids[:, j]] if j >= 0 else torch.zeros(2, 6) for j in range(t - 2, t + 1)]  # n-1 = 3 words
        x = torch.cat(ctx, -1)
        y = m.lm_head(torch.tanh(m.hidden(x))) + x @ m.direct.weight.T
        torch.testing.assert_close(got[:, t], y, atol=1e-6, rtol=1e-5)


def test_sees_exactly_its_window():
    m = _model()
    x = torch.randint(0, 41, (1, 12))
    base = m(x)
    for j in range(12):
        y = x.clone()
        y[0, j] = (y[0, j] + 1) % 41
        changed = (m(y) - base).abs().amax(-1)[0] > 0
        # token j feeds the predictions at positions j .. j+2 (order 4: three words of context), nothing else
        assert changed.nonzero().flatten().tolist() == list(range(j, min(j + 3, 12))), j


def test_direct_connections_and_sizes():
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    with_w, without = NNLM(tiny()), NNLM(tiny(direct=False))
    assert without.direct is None and n(with_w) - n(without) == 3 * 6 * 41
    assert n(without) == 41 * 6 + (18 * 10 + 10) + (10 * 41 + 41)  # C, (H, d), (U, b)
    assert count_params(load_recipe("nnlm-ptb")) == 10000 * 60 + (240 * 50 + 50) + (50 * 10000 + 10000) + 240 * 10000
    with pytest.raises(ValueError, match="order"):
        NNLM(tiny(order=1))
    CausalLM(CausalLM.Config(), None, {}, 8).check_model(with_w)


def test_eval_ppl_equals_one_pass_over_the_text(tmp_path):
    text = tiny_corpus(tmp_path / "t.txt", n_docs=5).read_text()
    lines = [x for x in text.splitlines() if x.strip()]
    tcfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})
    tok = train_tokenizer(iter(lines), tcfg)
    cfg = {"tokenizer": {"special_token_ids": special_token_ids(tok, resolve_special_tokens(tcfg))}}
    m = _model(vocab_size=tok.get_vocab_size())
    eos = tok.token_to_id("<eos>")
    ids = [eos] + [i for line in lines for i in tok.encode(line, add_special_tokens=False).ids + [eos]]
    seq = torch.tensor(ids)
    with torch.no_grad():
        nll = F.cross_entropy(m(seq[None, :-1])[0], seq[1:], reduction="sum").item()
    for L in (3, 8, 1000):  # windows overlap by n-2 tokens: every scored token keeps its full context
        res = score(m, [str(tmp_path / "t.txt")], tok, cfg, max_length=L, batch_size=3)
        assert res["tokens"] == len(ids) - 1
        assert res["nll"] * res["tokens"] == pytest.approx(nll, rel=1e-5), L
        assert res["stride"] == L - 2
    assert res["context"] == "the 3 previous tokens"


def test_recipe_trains_and_scores(tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    over = ["model.d_embed=8", "model.d_hidden=16", "train.global_batch_size=4", "train.seq_len=16",
            "data.val_fraction=0.2", "train.eval_every=10", "train.log_every=5", "optim.lr=3e-2", "optim.warmup_steps=0"]
    s = api.pretrain("nnlm-ptb", [str(corpus)], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 40}))
    assert s["val_loss"] < 2.0 < math.log(18)
    res = api.eval_ppl([str(corpus)], str(tmp_path / "run"))
    assert math.isfinite(res["ppl"]) and res["ppl"] < 8 and res["first_token"] == "conditioned on eos"
