import math

from plmcli.config import override_layers
import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli import api
from plmcli.config import load_recipe
from plmcli.errors import PlmError
from plmcli.eval.bidirectional_lm import window_nll
from plmcli.models.elmo import ELMo, ELMoConfig, ScalarMix, reverse_padded
from plmcli.objectives.bilm import BidirectionalLM
from plmcli.objectives.clm import CausalLM


pytestmark = pytest.mark.usefixtures("one_thread")


V = 41


def tiny(**kw):
    return ELMoConfig(**(dict(vocab_size=V, d_proj=8, n_layer=2, d_hidden=12, d_char=4, max_chars=8,
                              filters=[[1, 4], [2, 4], [3, 6]], n_highway=1, dropout=0.0) | kw))


ENCODERS = ["char", "word"]


@pytest.mark.parametrize("enc", ENCODERS)
def test_forward_never_sees_the_future_and_backward_never_the_past(enc):
    torch.manual_seed(0)
    m = ELMo(tiny(token_encoder=enc)).eval()
    x = torch.randint(0, V, (2, 10))
    f, b = m(x)
    assert f.shape == b.shape == (2, 10, V)
    t = 5
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % V  # change token t only
    f2, b2 = m(y)
    torch.testing.assert_close(f2[:, :t], f[:, :t])  # forward before t: unchanged
    assert not torch.allclose(f2[:, t:], f[:, t:])
    torch.testing.assert_close(b2[:, t + 1:], b[:, t + 1:])  # backward after t: unchanged
    assert not torch.allclose(b2[:, : t + 1], b[:, : t + 1])


@pytest.mark.parametrize("enc", ENCODERS)
def test_layers_shapes(enc):
    torch.manual_seed(0)
    for L in (1, 3):
        m = ELMo(tiny(token_encoder=enc, n_layer=L)).eval()
        x = torch.randint(0, V, (3, 7))
        hs = m.layers(x)
        assert len(hs) == L + 1  # the 2L+1 representations: [x; x] and L × [fwd; bwd]
        assert all(h.shape == (3, 7, 16) for h in hs)
        torch.testing.assert_close(hs[0][..., :8], hs[0][..., 8:])
        hidden, pooled = m.encode(x)
        assert hidden.shape == (3, 7, 16) and pooled.shape == (3, 16)


def test_padding_does_not_reach_the_backward_lm():
    """With an attention mask, the backward LM starts at each row's last real token, not at the padding."""
    torch.manual_seed(0)
    m = ELMo(tiny()).eval()
    x = torch.randint(0, V, (1, 5))
    padded = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    alone = m.layers(x)
    with_pad = m.layers(padded, mask.sum(1))
    for a, p in zip(alone, with_pad):
        torch.testing.assert_close(p[:, :5], a)
    h, pooled = m.encode(padded, None, mask)
    torch.testing.assert_close(pooled, h[:, :5].mean(1))
    r = reverse_padded(torch.arange(6.0).view(1, 6, 1).repeat(2, 1, 1), torch.tensor([6, 4]))
    assert r[:, :, 0].tolist() == [[5, 4, 3, 2, 1, 0], [3, 2, 1, 0, 4, 5]]


def test_scalar_mix_with_zero_scalars_is_the_mean():
    mix = ScalarMix(3)
    hs = [torch.randn(2, 4, 6) for _ in range(3)]
    torch.testing.assert_close(mix(hs), sum(hs) / 3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.0, 100.0, 0.0]))
        mix.gamma.fill_(2.0)
    torch.testing.assert_close(mix(hs), 2 * hs[1])


def test_char_table_from_token_strings():
    m = ELMo(tiny(vocab_size=3))
    m.set_token_strings(["a", "héllo!", "<eos>"])
    t = m.char_ids.tolist()
    assert t[0] == [1, 3 + ord("a"), 2, 0, 0, 0, 0, 0]
    assert t[1][0] == 1 and t[1][-1] == 2 and t[1][1:3] == [3 + ord("h"), 3 + 0xC3]  # bytes, cut to 6
    # the stand-in table (no tokenizer yet) tells every id apart
    fresh = ELMo(tiny(vocab_size=120)).char_ids
    assert len({tuple(r) for r in fresh.tolist()}) == 120


def test_loss_is_forward_plus_backward_by_hand():
    torch.manual_seed(0)
    m = ELMo(tiny(token_encoder="word")).eval()
    obj = BidirectionalLM(BidirectionalLM.Config(), None, {}, 3)
    obj.check_model(m)
    x = torch.tensor([[3, 7, 1, 9]])
    out = obj.step(m, {"input_ids": x[:, :-1], "labels": x[:, 1:]})
    f, b = m(x)
    lf, lb = f.log_softmax(-1)[0], b.log_softmax(-1)[0]
    fwd = -(lf[0, 7] + lf[1, 1] + lf[2, 9]) / 3  # t predicts t+1
    bwd = -(lb[1, 3] + lb[2, 7] + lb[3, 1]) / 3  # t predicts t-1
    torch.testing.assert_close(out.loss, fwd + bwd)
    assert out.count.item() == 3
    torch.testing.assert_close(out.metrics["fwd_loss"] / 3, fwd)
    torch.testing.assert_close(out.metrics["bwd_loss"] / 3, bwd)
    torch.testing.assert_close(out.metrics["avg_loss"] / 3, (fwd + bwd) / 2)
    assert obj.ppl_metric == "avg_loss"


def test_objectives_reject_the_wrong_model():
    m = ELMo(tiny())
    with pytest.raises(PlmError, match="not a causal LM"):
        CausalLM(CausalLM.Config(), None, {}, 8).check_model(m)
    with pytest.raises(PlmError, match="bidirectional"):
        BidirectionalLM(BidirectionalLM.Config(), None, {}, 8).check_model(torch.nn.Linear(2, 2))


def test_paper_recipe_size():
    """ELMo's 93.6M parameters outside the 793k-word softmax (Peters et al. 2018, bilm-tf)."""
    r = load_recipe("elmo")
    n = api.count_params(r)
    softmax = 793471 * (512 + 1)
    assert (n - softmax) == pytest.approx(93.6e6, rel=0.01)


def test_pretrain_then_eval_ppl(tmp_path):
    corpus = str(tiny_corpus(tmp_path / "c.txt"))
    over = ["model.d_proj=16", "model.d_hidden=32", "model.max_chars=10", "model.filters=[[1,8],[2,8],[3,8]]",
            "tokenizer.vocab_size=100", "data.val_fraction=0.2", "train.seq_len=8", "train.global_batch_size=4",
            "train.eval_every=4", "train.eval_batches=2", "train.save_every=4", "train.log_every=2"]
    summary = api.pretrain("elmo-mini", data=[corpus], out=str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 4}))
    assert summary["stop_reason"] == "max_steps"
    m, _, _ = api.load_run(str(tmp_path / "run"))
    assert (m.char_ids[:, 0] == 1).all() and m.char_ids.max() > 3 + ord("a")  # the tokenizer's strings were saved
    res = api.eval_ppl([corpus], model=str(tmp_path / "run"), max_length=8, batch_size=3)
    for k in ("ppl", "fwd_ppl", "bwd_ppl", "avg_ppl", "bpb", "word_ppl"):
        assert math.isfinite(res[k]) and res[k] > 0, k
    assert res["ppl"] == res["avg_ppl"]
    assert math.isclose(math.log(res["ppl"]), (math.log(res["fwd_ppl"]) + math.log(res["bwd_ppl"])) / 2, rel_tol=1e-6)
    assert res["files"][0]["fwd_ppl"] == pytest.approx(res["fwd_ppl"])
    # the windows do not change how many tokens are scored
    res2 = api.eval_ppl([corpus], model=str(tmp_path / "run"), max_length=5, batch_size=2)
    assert res2["tokens"] == res["tokens"]


def test_window_nll_scores_each_token_once_per_direction():
    torch.manual_seed(0)
    m = ELMo(tiny(token_encoder="word")).eval()
    seq = torch.randint(0, V, (13,)).numpy()
    f, b, n = window_nll(m, seq, 100, 4)
    x = torch.as_tensor(seq)[None]
    lf, lb = m(x)
    assert n == 12
    assert f == pytest.approx(F.cross_entropy(lf[0, :-1], x[0, 1:], reduction="sum").item(), rel=1e-5)
    assert b == pytest.approx(F.cross_entropy(lb[0, 1:], x[0, :-1], reduction="sum").item(), rel=1e-5)
    f4, b4, n4 = window_nll(m, seq, 4, 2)  # windows 0..4, 4..8, 8..12: still 12 predictions each way
    assert n4 == 12 and math.isfinite(f4) and math.isfinite(b4)


def test_finetune_runs_from_an_elmo_run(tmp_path):
    """Feature-based transfer: the biLM stays frozen, the task's own scalar mix and BiLSTM head train."""
    from pathlib import Path

    from helpers import finetune

    corpus = str(tiny_corpus(tmp_path / "c.txt"))
    over = ["model.d_proj=8", "model.d_hidden=16", "model.max_chars=8", "model.filters=[[1,4],[2,4]]",
            "tokenizer.vocab_size=100", "data.val_fraction=0.2", "train.seq_len=8", "train.global_batch_size=4",
            "train.eval_every=2", "train.eval_batches=1", "train.save_every=2"]
    api.pretrain("elmo-mini", data=[corpus], out=str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 2}))
    sample = Path(__file__).resolve().parents[2] / "data" / "glue-sample"
    res = finetune("sst2", from_run=str(tmp_path / "run"), data_dir=str(sample), train__max_steps=2,
                   train__batch_size=8, task__max_seq_len=16, out=str(tmp_path / "ft"))
    assert res["steps"] == 2 and math.isfinite(res["train_loss"])
    import torch
    from safetensors.torch import load_file

    from plmcli.runs import load_finetuned

    pre, tuned = load_file(str(tmp_path / "run" / "model.safetensors")), load_file(str(tmp_path / "ft" / "model.safetensors"))
    assert all(torch.equal(v, tuned[f"encoder.{k}"]) for k, v in pre.items())  # frozen biLM
    assert {"head.mix.scalars", "head.mix.gamma", "head.out.weight"} <= set(tuned)
    model, _, _ = load_finetuned(str(tmp_path / "ft"))
    assert model.feature_based and model(torch.tensor([[2, 5, 6, 3]])).shape == (1, 2)


def test_flops_count_a_shared_softmax_once_per_direction():
    shared, own = ELMo(tiny(token_encoder="word")), ELMo(tiny(token_encoder="word", share_softmax=False))
    softmax = sum(p.numel() for p in shared.softmax.parameters())
    # two softmax passes per token either way: one shared matrix used twice = two matrices used once each
    assert shared.flops_per_token(8) == own.flops_per_token(8)
    body = sum(p.numel() for n, p in shared.named_parameters() if not n.startswith(("wte.", "softmax.")))
    assert shared.flops_per_token(8) == 6 * (body + 2 * softmax)
