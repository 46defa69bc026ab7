import pytest
import torch
import torch.nn.functional as F

from plmcli.models.gpt import GPT, GPTConfig
from plmcli.models.lm_loss import chunk_rows, linear_cross_entropy


def _inputs(N=37, C=16, V=53, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, C, generator=g, dtype=torch.float64)
    w = torch.randn(V, C, generator=g, dtype=torch.float64) * 0.5
    y = torch.randint(0, V, (N,), generator=g)
    if ignore:
        y[::5] = -100
    return h, w, y


@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("ignore", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 16, 1000])
def test_loss_and_gradients_equal_the_plain_cross_entropy(chunk, ignore, bias, vocab_major):
    h, w, y = _inputs(ignore=ignore)
    b = torch.linspace(-1, 1, w.shape[0], dtype=w.dtype) if bias else None
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    b1 = b.clone().requires_grad_() if bias else None
    ref = F.cross_entropy(F.linear(h1, w1, b1), y, ignore_index=-100)
    (ref * 3.0).backward()  # a non-unit incoming gradient must scale every result
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    b2 = b.clone().requires_grad_() if bias else None
    got = linear_cross_entropy(h2, w2, y, chunk=chunk, bias=b2, vocab_major=vocab_major)
    (got * 3.0).backward()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-10, atol=1e-12)
    if bias:
        torch.testing.assert_close(b2.grad, b1.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_confidently_wrong_rows_keep_their_exact_loss_in_fp32(vocab_major):
    """The loss is −log softmax[y]; where softmax[y] underflows (a target ~100 nats below the best logit)
    those rows take logsumexp − logit[y], so a diverging model's loss stays finite and exact."""
    h, w, y = (t.float() if t.is_floating_point() else t for t in _inputs(ignore=False))
    h[::3] *= 80.0  # every third row: logits spread over hundreds of nats, p[y] below 2⁻¹⁰⁰ or 0
    h1, w1, h2, w2 = (t.clone().requires_grad_() for t in (h, w, h, w))
    ref = F.cross_entropy(F.linear(h1, w1), y)
    ref.backward()
    got = linear_cross_entropy(h2, w2, y, chunk=16, vocab_major=vocab_major)
    got.backward()
    assert ref.item() > 30 and torch.isfinite(got)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_under_bf16_autocast_the_matmuls_run_in_bf16_and_the_softmax_in_fp32(vocab_major):
    """As nn.Linear + cross-entropy under CPU autocast: bf16 logits, fp32 loss; gradients in the inputs' dtype."""
    h, w, y = (t.float() if t.is_floating_point() else t for t in _inputs(N=300, C=32, V=97))
    h1, w1, h2, w2 = (t.clone().requires_grad_() for t in (h, w, h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h1, w1).float(), y, ignore_index=-100)
        got = linear_cross_entropy(h2, w2, y, chunk=128, vocab_major=vocab_major)  # 3 chunks, the last short
    ref.backward()
    got.backward()
    assert got.dtype == torch.float32 and h2.grad.dtype == w2.grad.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=0.05, atol=2e-3)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=0.05, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU branch (no host check per chunk) needs CUDA")
@pytest.mark.parametrize("vocab_major", [True, False])
def test_on_a_gpu_the_loss_is_cross_entropys_own_formula(vocab_major):
    h, w, y = (t.cuda() for t in _inputs(ignore=True))
    h[::3] *= 80.0  # rows hundreds of nats wrong stay exact without the CPU's fallback
    h1, w1, h2, w2 = (t.clone().requires_grad_() for t in (h, w, h, w))
    ref = F.cross_entropy(F.linear(h1, w1), y, ignore_index=-100)
    ref.backward()
    got = linear_cross_entropy(h2, w2, y, chunk=8, vocab_major=vocab_major)
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("vocab", [68, 4096, 30522, 50257])
def test_cpu_chunks_are_powers_of_two_of_at_least_128_rows(vocab):
    rows = chunk_rows(vocab, torch.device("cpu"))
    assert rows >= 128 and rows & (rows - 1) == 0
    assert rows * vocab <= 2**20 or rows == 128  # ~4 MB of fp32 logits unless the floor applies


@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_without_gradients_only_the_loss_is_computed(vocab_major, bias):
    h, w, y = _inputs(ignore=False)
    b = torch.linspace(-1, 1, w.shape[0], dtype=w.dtype) if bias else None
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, chunk=8, bias=b, vocab_major=vocab_major)
    torch.testing.assert_close(got, F.cross_entropy(F.linear(h, w, b), y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk", [8, 64])  # several chunks; one
@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("ignore", [True, False])
def test_without_gradients_in_a_traced_graph_every_row_stays_and_the_loss_is_the_same(vocab_major, ignore, chunk):
    """Inside torch.compile the ignored rows are kept and masked out (no data-sized selection): same loss; padded
    vocabulary rows (vocab_size < V) masked as in eager."""
    h, w, y = _inputs(ignore=ignore)
    y = torch.where(y >= 0, y % 50, y)  # the real vocabulary's 50 rows; w's last 3 pad it
    b = torch.linspace(-1, 1, w.shape[0], dtype=w.dtype)
    torch._dynamo.reset()
    with torch.no_grad():
        fn = lambda: linear_cross_entropy(h, w, y, chunk=chunk, bias=b, vocab_major=vocab_major, vocab_size=50)
        got = torch.compile(fn, backend="eager", fullgraph=True)()
        ref = F.cross_entropy(F.linear(h, w[:50], b[:50]), y, ignore_index=-100)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_a_traced_evaluation_loss_is_not_compiled_again_for_each_row_count():
    """A masked LM's validation batches score a different number of rows each: once Dynamo has seen two counts the
    graph is dynamic in them, not compiled again for a third (the rows fit one chunk: no loop over their count)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    loss = torch.compile(lambda h, w, y: linear_cross_entropy(h, w, y, chunk=64), backend=counter)
    with torch.no_grad():
        for n in (20, 23, 29, 41):
            h, w, y = _inputs(N=n)
            torch.testing.assert_close(loss(h, w, y), F.cross_entropy(F.linear(h, w), y), rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 2  # static, then dynamic in the row count


@pytest.mark.parametrize("vocab_major", [True, False])
def test_without_gradients_under_bf16_autocast_the_loss_is_nn_linears(vocab_major):
    h, w, y = (t.float() if t.is_floating_point() else t for t in _inputs(N=300, C=32, V=97))
    b = torch.linspace(-1, 1, 97)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h, w, b).float(), y, ignore_index=-100)
        got = linear_cross_entropy(h, w, y, chunk=128, bias=b, vocab_major=vocab_major)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)


def test_no_rows_give_zero_loss_and_zero_gradients():
    h, w, y = _inputs(N=0)
    h, w = h.requires_grad_(), w.requires_grad_()
    loss = linear_cross_entropy(h, w, y, chunk=8, vocab_major=True)
    loss.backward()
    assert loss.item() == 0.0 and w.grad.abs().max().item() == 0.0


def test_all_targets_ignored_gives_zero_not_nan():
    h, w, y = _inputs()
    y[:] = -100
    h = h.requires_grad_()
    loss = linear_cross_entropy(h, w, y, chunk=8)
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0


def test_gpt_with_labels_returns_the_loss_of_its_logits():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=61, max_positions=16, n_layer=2, n_head=2, d_model=16, dropout=0.0, attn_dropout=0.0)
    model = GPT(cfg)
    x = torch.randint(0, 61, (3, 10))
    y = torch.randint(0, 61, (3, 10))
    y[0, :4] = -100
    ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    ref.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss = model(x, labels=y)
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():  # the tied embedding gets both of its gradients
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("vocab_major", [False, True])
def test_without_gradients_logits_are_computed_for_scored_rows_only(monkeypatch, vocab_major):
    h, w, y = _inputs(N=40)
    y[: 30] = -100  # eval-ppl's later windows: the context positions are not scored
    rows = []
    if vocab_major:  # (V, n) = w · hᵀ: n columns a chunk
        matmul = torch.Tensor.__matmul__
        monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: rows.append(b.shape[1]) or matmul(a, b))
    else:
        linear = F.linear
        monkeypatch.setattr(F, "linear", lambda a, b, *r: rows.append(a.shape[0]) or linear(a, b, *r))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, chunk=4, vocab_major=vocab_major)
    monkeypatch.undo()
    assert sum(rows) == int((y != -100).sum()) == 8
    torch.testing.assert_close(got, F.cross_entropy(h @ w.t(), y, ignore_index=-100), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_scoring_computes_the_last_block_at_scored_positions_only(norm):
    """eval-ppl's windows: no gradient, context columns unscored; the loss is that of the full logits."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=61, max_positions=16, n_layer=3, n_head=2, d_model=16, norm_position=norm,
                    final_norm=norm == "pre")
    model = GPT(cfg).eval()
    x = torch.randint(0, 61, (3, 12))
    y = torch.randint(0, 61, (3, 12))
    y[:, :5] = -100  # every window's context
    y[1, 5:7] = -100  # a row scored from later on
    y[2, 10:] = -100  # a shorter (right-padded) last window
    with torch.no_grad():
        ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        got = model(x, labels=y)
        none = model(x, labels=torch.full_like(y, -100))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert none.item() == 0.0


def test_bert_with_mlm_labels_returns_the_loss_of_its_mlm_logits():
    """objective mlm's path: the decoder (with its bias and the tied embedding) fused with the loss."""
    from plmcli.models.bert import Bert, BertConfig

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=301, max_positions=16, n_layer=2, n_head=2, d_model=16, dropout=0.0,
                     attn_dropout=0.0)
    model = Bert(cfg)
    with torch.no_grad():
        model.mlm.decoder.bias.normal_()  # zero at init: make its gradient's share visible
    x = torch.randint(0, 301, (3, 12))
    pos = torch.tensor([1, 4, 13, 20, 30, 35])
    y = torch.randint(0, 301, (6,))
    ref = F.cross_entropy(model(x, mlm_positions=pos).mlm_logits, y)
    ref.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    out = model(x, mlm_positions=pos, mlm_labels=y)
    assert out.mlm_logits is None
    out.mlm_loss.backward()
    torch.testing.assert_close(out.mlm_loss, ref, rtol=1e-5, atol=1e-6)
    assert set(grads) == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
