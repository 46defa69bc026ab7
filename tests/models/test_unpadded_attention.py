"""Unpadded (jagged) encoder batches: `unpad`, the shared Blocks on nested tensors, `repad`, against the padded
path with an attention mask. On a CPU jagged SDPA runs its math kernel; on CUDA the same calls reach the
flash / memory-efficient variable-length kernels (checked on a GPU by the numbers, not here)."""

import pytest
import torch

from plmcli.models.bert import Bert, BertConfig
from plmcli.models.layers import Block, MultiHeadAttention, record_attention, repad, unpad, unpadded_attention

pytestmark = [pytest.mark.usefixtures("one_thread"),
              # torch's CPU math kernel for jagged SDPA goes through its older strided nested tensors
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]

LENGTHS = [9, 4, 1, 7]  # a full row, a short one, a lone [CLS]-like token; T = 9


def _mask(lengths=LENGTHS) -> torch.Tensor:
    T = max(lengths)
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T), right-padded


def test_unpad_keeps_each_rows_tokens_and_repad_restores_them():
    mask = _mask([3, 1, 2])
    x = torch.arange(3 * 3 * 2, dtype=torch.float32).view(3, 3, 2)
    nt = unpad(x, mask)
    assert nt.is_nested and nt.offsets().tolist() == [0, 3, 4, 6]
    assert torch.equal(nt.values(), torch.stack([x[0, 0], x[0, 1], x[0, 2], x[1, 0], x[2, 0], x[2, 1]]))
    assert torch.equal(repad(nt, mask), x * mask[..., None])


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_blocks_on_jagged_input_equal_the_padded_path_with_its_mask(norm_position):
    torch.manual_seed(0)
    C, H = 16, 4
    blocks = torch.nn.ModuleList(Block(C, H, 40, "gelu", True, 0.0, 0.0, norm_position, 1e-12) for _ in range(2))
    mask = _mask()
    x = torch.randn(len(LENGTHS), max(LENGTHS), C, requires_grad=True)
    keep = mask.bool()

    padded = x
    for b in blocks:
        padded = b(padded, causal=False, attn_mask=keep[:, None, None, :])
    grads_padded = torch.autograd.grad((padded[keep] ** 2).sum(), [x, *blocks.parameters()])

    h = unpad(x, mask)
    for b in blocks:
        h = b(h)
    out = repad(h, mask)
    grads_jagged = torch.autograd.grad((out[keep] ** 2).sum(), [x, *blocks.parameters()])

    torch.testing.assert_close(out[keep], padded[keep], rtol=0, atol=1e-5)
    assert torch.equal(out[~keep], torch.zeros_like(out[~keep]))
    # every parameter's gradient, and the input's at real tokens (padding gets none either way)
    for gp, gj in zip(grads_padded, grads_jagged):
        torch.testing.assert_close(gj, gp, rtol=0, atol=1e-5)


def _encoders():
    from plmcli.models.albert import Albert, AlbertConfig

    small = dict(vocab_size=50, max_positions=16, n_layer=2, n_head=2, d_model=16, d_ff=32, dropout=0.0,
                 attn_dropout=0.0)
    return [Bert(BertConfig(**small)), Bert(BertConfig(**small, norm_position="pre")),
            Albert(AlbertConfig(**small, embedding_size=8))]


@pytest.mark.parametrize("index", range(3), ids=["bert", "bert-pre-ln", "albert"])
def test_an_encoder_run_unpadded_equals_its_padded_forward_and_gradients(index, monkeypatch):
    # unpadded_attention is CUDA-only; forcing it here runs the same unpad / jagged blocks / repad path on a CPU.
    from plmcli.models import layers

    torch.manual_seed(0)
    m = _encoders()[index].train()  # no dropout in these configs: train mode is deterministic
    mask = _mask()
    ids = torch.randint(5, 50, mask.shape) * mask
    keep = mask.bool()
    pos = torch.nonzero(keep.flatten()).flatten()[::2]  # some real tokens as MLM targets

    def run():
        out = m(ids, attention_mask=mask, mlm_positions=pos)
        loss = out.mlm_logits.square().mean() + out.nsp_logits.square().mean()
        return out, torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)

    padded, grads_padded = run()
    monkeypatch.setattr(layers, "unpadded_attention", lambda device: True)
    unpadded, grads_unpadded = run()
    torch.testing.assert_close(unpadded.hidden[keep], padded.hidden[keep], rtol=0, atol=1e-5)
    assert not unpadded.hidden[~keep].any()  # padding comes back as zeros
    torch.testing.assert_close(unpadded.mlm_logits, padded.mlm_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(unpadded.nsp_logits, padded.nsp_logits, rtol=0, atol=1e-5)
    for gp, gu in zip(grads_padded, grads_unpadded):
        if gp is not None:
            torch.testing.assert_close(gu, gp, rtol=0, atol=1e-5)


def test_electra_runs_unpadded_as_padded(monkeypatch):
    from plmcli.models import layers
    from plmcli.models.electra import Electra, ElectraConfig

    torch.manual_seed(0)
    m = Electra(ElectraConfig(vocab_size=50, max_positions=16, n_layer=2, n_head=2, d_model=16, d_ff=32,
                              embedding_size=8, dropout=0.0, attn_dropout=0.0)).train()
    mask = _mask()
    ids = torch.randint(5, 50, mask.shape) * mask
    keep = mask.bool()

    def run():
        gen = m(ids, attention_mask=mask).hidden
        disc = m(ids, attention_mask=mask, part="discriminator").rtd_logits
        return gen, disc, torch.autograd.grad((gen[keep] ** 2).sum() + (disc[keep] ** 2).sum(), list(m.parameters()),
                                              allow_unused=True)

    gen_p, disc_p, grads_p = run()
    monkeypatch.setattr(layers, "unpadded_attention", lambda device: True)
    gen_u, disc_u, grads_u = run()
    torch.testing.assert_close(gen_u[keep], gen_p[keep], rtol=0, atol=1e-5)
    torch.testing.assert_close(disc_u[keep], disc_p[keep], rtol=0, atol=1e-5)
    for gp, gu in zip(grads_p, grads_u):
        if gp is not None:
            torch.testing.assert_close(gu, gp, rtol=0, atol=1e-5)


def test_unpadded_training_with_dropout_trains(monkeypatch):
    from plmcli.models import layers

    monkeypatch.setattr(layers, "unpadded_attention", lambda device: True)
    torch.manual_seed(0)
    m = Bert(BertConfig(vocab_size=50, max_positions=16, n_layer=2, n_head=2, d_model=16, d_ff=32,
                        dropout=0.1, attn_dropout=0.1)).train()
    mask = _mask()
    ids = torch.randint(5, 50, mask.shape) * mask
    pos = torch.nonzero(mask.flatten()).flatten()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(m(ids, attention_mask=mask, mlm_positions=pos).mlm_logits,
                                                 ids.flatten()[pos])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_jagged_blocks_run_under_bf16_autocast():
    torch.manual_seed(0)
    b = Block(16, 2, 32, "gelu", True, 0.0, 0.0, "post", 1e-12)
    mask = _mask()
    x = torch.randn(len(LENGTHS), max(LENGTHS), 16)
    keep = mask.bool()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded = b(x, attn_mask=keep[:, None, None, :])
        jagged = repad(b(unpad(x, mask)), mask)
    torch.testing.assert_close(jagged[keep].float(), padded[keep].float(), rtol=0, atol=0.05)  # bf16: ~3 digits


def test_jagged_input_refuses_causal_masked_and_recorded_attention():
    attn = MultiHeadAttention(16, 2)
    mask = _mask()
    x = unpad(torch.randn(len(LENGTHS), max(LENGTHS), 16), mask)
    for kwargs in ({"causal": True}, {"attn_mask": mask.bool()[:, None, None, :]}):
        with pytest.raises(ValueError, match="unpadded"):
            attn(x, **kwargs)
    with record_attention(), pytest.raises(ValueError, match="record_attention"):
        attn(x)


def test_unpadded_attention_is_for_cuda_devices_while_nothing_records():
    assert not unpadded_attention(torch.device("cpu"))
    assert unpadded_attention(torch.device("cuda", 0))
    with record_attention():
        assert not unpadded_attention(torch.device("cuda", 0))
