import math

from plmcli.config import override_layers
import pytest
import torch

from helpers import tiny_corpus
from plmcli import api
from plmcli.errors import PlmError
from plmcli.models.adaptive import AdaptiveEmbedding, AdaptiveSoftmax
from plmcli.models.layers import sinusoid_table
from plmcli.models.transformer_xl import TransformerXL, TransformerXLConfig, rel_shift


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw):
    base = dict(vocab_size=40, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0, mem_len=6)
    return TransformerXLConfig(**(base | kw))


def naive_attention(attn, x, mem, u, v, clamp_len=0, blocked=None):
    """The paper's A_rel term by term, one (i, j) pair at a time; post-LN output."""
    B, T, C = x.shape
    H, D = attn.n_head, attn.d_head
    cat = x if mem is None else torch.cat([mem, x], 1)
    K = cat.shape[1]
    M = K - T
    W_q, W_k, W_v = attn.qkv.weight.split(H * D)
    q = (x @ W_q.T).view(B, T, H, D)
    k = (cat @ W_k.T).view(B, K, H, D)
    val = (cat @ W_v.T).view(B, K, H, D)
    out = torch.zeros(B, T, H, D)
    for i in range(T):
        scores = torch.full((B, H, K), float("-inf"))
        for j in range(K):
            dist = M + i - j
            if dist < 0 or (blocked is not None and blocked[i, j]):
                continue
            R = sinusoid_table(torch.tensor([min(dist, clamp_len) if clamp_len else dist]), C)[0]
            WR = (R @ attn.r_net.weight.T).view(H, D)
            a = (q[:, i] * k[:, j]).sum(-1)
            b = (q[:, i] * WR).sum(-1)
            c = (u * k[:, j]).sum(-1)
            d = (v * WR).sum(-1)
            scores[:, :, j] = (a + b + c + d) / math.sqrt(D)
        p = scores.softmax(-1)  # (B, H, K)
        out[:, i] = torch.einsum("bhk,bkhd->bhd", p, val)
    y = attn.o(out.reshape(B, T, H * D))
    return attn.ln(x + y)


def test_rel_shift_aligns_distances():
    T, K = 3, 5  # M = 2 memory slots: query i sits at key index 2 + i
    dist_of_column = torch.arange(K - 1, -1, -1).float()  # the columns hold distances K-1 .. 0
    x = dist_of_column.expand(T, K).clone()
    got = rel_shift(x)
    for i in range(T):
        for j in range(K):
            if j <= 2 + i:
                assert got[i, j] == 2 + i - j


@pytest.mark.parametrize("with_memory", [False, True])
def test_attention_is_the_papers_a_rel(with_memory):
    torch.manual_seed(0)
    m = TransformerXL(tiny(clamp_len=3 if with_memory else 0)).eval()
    attn = m.layers[0].attn
    x = torch.randn(2, 4, 16)
    mem = torch.randn(2, 3, 16) if with_memory else None
    K = 4 + (3 if with_memory else 0)
    pos = torch.arange(K - 1, -1, -1)
    if with_memory:
        pos = pos.clamp(max=3)
    r = sinusoid_table(pos, 16)
    blocked = torch.ones(4, K, dtype=torch.bool).triu(1 + K - 4)
    got = attn(x, mem, r, blocked, m.u, m.v)
    want = naive_attention(attn, x, mem, m.u, m.v, clamp_len=3 if with_memory else 0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_without_memory_it_is_a_causal_lm():
    torch.manual_seed(0)
    m = TransformerXL(tiny(mem_len=0)).eval()
    x = torch.randint(0, 40, (2, 8))
    logp, state = m(x)
    assert state is None and logp.shape == (2, 8, 40)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 8))
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 1) % 40  # changing the future leaves the past alone …
    logp2, _ = m(y)
    torch.testing.assert_close(logp2[:, :5], logp[:, :5])
    assert not torch.allclose(logp2[:, 5:], logp[:, 5:])
    # … and only relative positions exist: a token's output depends on what precedes it, not where it sits
    z = torch.cat([x[:, :1], x], 1)
    logp3, _ = m(z[:, 1:])
    torch.testing.assert_close(logp3, logp)


def test_memory_continues_the_sequence_exactly_and_changes_predictions():
    torch.manual_seed(0)
    m = TransformerXL(tiny(mem_len=12)).eval()
    x = torch.randint(0, 40, (2, 10))
    full, _ = m(x)
    first, mems = m(x[:, :6])
    assert [t.shape for t in mems] == [(2, 6, 16)] * 2
    second, mems2 = m(x[:, 6:], mems)
    # segment 2 with the memory of segment 1 = the second part of one pass over both (mem_len ≥ 6)
    torch.testing.assert_close(second, full[:, 6:], atol=1e-5, rtol=1e-5)
    assert [t.shape for t in mems2] == [(2, 10, 16)] * 2
    alone, _ = m(x[:, 6:])
    assert (second[:, 0] - alone[:, 0]).abs().max() > 1e-3  # memory changes the first tokens' predictions
    # the memory keeps the last mem_len states only
    _, mems3 = m(x[:, :8], mems2)
    assert mems3[0].shape == (2, 12, 16)


def test_gradients_never_flow_into_memory():
    torch.manual_seed(0)
    m = TransformerXL(tiny(tie_embeddings=False)).train()
    seg1 = torch.randint(0, 20, (2, 5))  # tokens 0..19 only in the first segment
    seg2 = torch.randint(20, 40, (2, 5))
    _, mems = m(seg1)
    assert all(not t.requires_grad for t in mems)
    nll, _ = m(seg2, mems, labels=torch.randint(20, 40, (2, 5)))
    nll.mean().backward()
    g = m.emb.layers[0].weight.grad
    assert g[:20].abs().sum() == 0 and g[20:].abs().sum() > 0


def test_same_length_gives_every_query_the_same_span():
    torch.manual_seed(0)
    m = TransformerXL(tiny(mem_len=4, same_length=True)).eval()
    x = torch.randint(0, 40, (1, 4))
    _, mems = m(x)
    seen = {}

    def spy(mod, args, out):
        seen["blocked"] = args[3]

    m.layers[0].attn.register_forward_hook(spy)
    m(x, mems)
    visible = (~seen["blocked"]).sum(1)
    assert visible.tolist() == [4, 4, 4, 4]  # the last 4 distances (0..3) for every query


def test_adaptive_softmax_is_normalised_and_scores_targets():
    torch.manual_seed(0)
    emb = AdaptiveEmbedding(30, 16, 8, cutoffs=[10, 20], div_val=2)
    sm = AdaptiveSoftmax(30, 16, 8, cutoffs=[10, 20], div_val=2, tie_to=emb)
    assert [tuple(layer.weight.shape) for layer in emb.layers] == [(10, 16), (10, 8), (10, 4)]
    assert sm.weights[2] is emb.layers[2].weight and sm.projs[2] is emb.projs[2] and sm.projs[1].numel() == 0  # d_1 = d_proj: none
    h = torch.randn(7, 8)
    logp = sm.log_prob(h)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(7))
    t = torch.tensor([0, 9, 10, 15, 20, 29, 3])
    torch.testing.assert_close(sm.nll(h, t), -logp.gather(1, t[:, None]).squeeze(1))
    ids = torch.tensor([[0, 12, 25]])
    e = emb(ids)
    torch.testing.assert_close(e[0, 1], emb.layers[1].weight[2] * 8**0.5)
    torch.testing.assert_close(e[0, 2], (emb.layers[2].weight[5] @ emb.projs[2].T) * 8**0.5)


def test_adaptive_softmax_flops_count_tails_at_their_zipf_share():
    sm = AdaptiveSoftmax(30, 16, 8, cutoffs=[10, 20], div_val=2)
    h = lambda n: math.log(n) + 0.5772156649 + 1 / (2 * n)  # noqa: E731
    head = 8 * 16 + 16 * (10 + 2)  # projection 8→16, then 10 words + 2 cluster logits, for every token
    # Cluster 1 (d 8 = d_proj: no projection) and cluster 2 (projection 8→4), each at its Zipf share of tokens.
    tails = [8 * 10 * (h(20) - h(10)) / h(30), (8 * 4 + 4 * 10) * (h(30) - h(20)) / h(30)]
    assert sm.flops_per_token() == pytest.approx(6 * (head + sum(tails)))
    assert AdaptiveSoftmax(30, 8, 8).flops_per_token() == 6 * 8 * 30  # no clusters: the full softmax


def test_adaptive_model_trains_on_its_own_nll():
    torch.manual_seed(0)
    m = TransformerXL(tiny(cutoffs=[10, 25], div_val=2, d_embed=16)).train()
    x = torch.randint(0, 40, (2, 6))
    nll, _ = m(x, labels=x)
    nll.mean().backward()
    assert torch.isfinite(nll).all() and m.emb.layers[2].weight.grad is not None


def test_pretrain_and_eval_ppl_with_memory(tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus.txt")
    over = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.mem_len=16",
            "tokenizer.kind=char", "tokenizer.vocab_size=200", "tokenizer.special_tokens={eos: '<eos>', unk: '<unk>'}",
            "train.global_batch_size=4", "train.seq_len=16", "data.val_fraction=0.2", "train.eval_every=5",
            "train.save_every=10", "train.log_every=5", "optim.warmup_steps=2"]
    s = api.pretrain("txl-mini", [str(corpus)], str(tmp_path / "run"), overrides=override_layers(over, {"train.max_steps": 30}))
    assert s["steps"] == 30 and s["val_loss"] < math.log(30)
    run = str(tmp_path / "run")
    (tmp_path / "eval.txt").write_text("the cat sat on a mat\nwhile dogs ran far away\n")
    a = api.eval_ppl([str(tmp_path / "eval.txt")], run, mem_len=1000, tgt_len=5)
    b = api.eval_ppl([str(tmp_path / "eval.txt")], run, mem_len=0, tgt_len=1000)
    # with a memory longer than the text, segments of 5 see exactly what one pass over everything sees
    assert a["tokens"] == b["tokens"] == 47 and a["nll"] == pytest.approx(b["nll"], rel=1e-5)
    assert a["mem_len"] == 1000 and a["tgt_len"] == 5 and a["line_end"].startswith("<eos>")  # chars: no newline token
    short = api.eval_ppl([str(tmp_path / "eval.txt")], run, mem_len=0, tgt_len=5)
    assert short["nll"] != pytest.approx(a["nll"], rel=1e-4)  # less context, another result
    with pytest.raises(PlmError, match="--tgt-len"):
        api.eval_ppl([str(tmp_path / "eval.txt")], run, max_length=8)
    # generation carries the memory one token at a time; prompts of different lengths decode alone
    both = api.generate(run, prompts=["the cat", "a mat while"], max_new_tokens=6)
    assert both == [api.generate(run, prompts=[p], max_new_tokens=6)[0] for p in ("the cat", "a mat while")]
    assert all(len(o["output"]) > 0 for o in both)
    assert len(api.generate(run, prompts=["the cat"], max_new_tokens=4, strategy="beam", num_beams=3)) == 1


def test_mem_len_on_a_model_without_memory_is_refused(tmp_path):
    from helpers import tiny_recipe

    corpus = tiny_corpus(tmp_path / "corpus.txt")
    api.pretrain(str(tiny_recipe(tmp_path / "r.yaml")), [str(corpus)], str(tmp_path / "gpt"), overrides={"train.max_steps": 2})
    with pytest.raises(PlmError, match="apply to models with memory"):
        api.eval_ppl([str(corpus)], str(tmp_path / "gpt"), mem_len=16)
