import pytest
import torch

from plmcli.models.gpt import GPT, GPTConfig


def tiny(**kw):
    base = dict(vocab_size=97, max_positions=32, n_layer=2, n_head=4, d_model=32, dropout=0.0, attn_dropout=0.0)
    return GPTConfig(**(base | kw))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_no_future_leak(norm):
    torch.manual_seed(0)
    model = GPT(tiny(norm_position=norm, final_norm=norm == "pre")).eval()
    x = torch.randint(0, 97, (2, 16))
    y = x.clone()
    y[:, 9:] = torch.randint(0, 97, (2, 7))  # change only the future of position 8
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_gradient_of_early_logit_ignores_later_tokens():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    emb = model.wte.weight
    x = torch.randint(0, 97, (1, 12))
    inputs = model.wte(x).detach().requires_grad_(True)
    model.wte = torch.nn.Identity()  # feed embeddings directly to read gradients per position
    pos = model.wpe(torch.arange(12))
    h = inputs + pos
    for blk in model.blocks:
        h = blk(h, causal=True)
    out = torch.nn.functional.linear(model.ln_f(h), emb)
    out[0, 4].sum().backward()
    assert inputs.grad[0, 5:].abs().sum() == 0 and inputs.grad[0, :5].abs().sum() > 0


def test_tied_embeddings_and_scaled_init():
    torch.manual_seed(0)
    m = GPT(tiny(n_layer=8, d_model=64))
    assert m.lm_head.weight is m.wte.weight
    std = m.blocks[0].attn.proj.weight.std().item()
    assert std == pytest.approx(0.02 / 4, rel=0.15)  # 0.02 / sqrt(2 * 8)
    assert m.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_positions_limit():
    m = GPT(tiny())
    with pytest.raises(ValueError, match="max_positions"):
        m(torch.zeros(1, 33, dtype=torch.long))


def _copy_to_hf(ours: GPT, hf):
    """Our Linear (out, in) weights into HF GPT-2's Conv1D (in, out)."""
    sd = {"transformer.wte.weight": ours.wte.weight, "transformer.wpe.weight": ours.wpe.weight,
          "transformer.ln_f.weight": ours.ln_f.weight, "transformer.ln_f.bias": ours.ln_f.bias}
    for i, b in enumerate(ours.blocks):
        p = f"transformer.h.{i}."
        sd |= {p + "ln_1.weight": b.ln_1.weight, p + "ln_1.bias": b.ln_1.bias,
               p + "ln_2.weight": b.ln_2.weight, p + "ln_2.bias": b.ln_2.bias,
               p + "attn.c_attn.weight": b.attn.qkv.weight.T, p + "attn.c_attn.bias": b.attn.qkv.bias,
               p + "attn.c_proj.weight": b.attn.proj.weight.T, p + "attn.c_proj.bias": b.attn.proj.bias,
               p + "mlp.c_fc.weight": b.mlp.fc.weight.T, p + "mlp.c_fc.bias": b.mlp.fc.bias,
               p + "mlp.c_proj.weight": b.mlp.proj.weight.T, p + "mlp.c_proj.bias": b.mlp.proj.bias}
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all(k == "lm_head.weight" or k.endswith("attn.bias") for k in missing), missing


def test_parity_with_transformers_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = GPT(tiny(vocab_size=101, max_positions=40, n_layer=3, n_head=4, d_model=48)).eval()
    hf_cfg = transformers.GPT2Config(vocab_size=101, n_positions=40, n_embd=48, n_layer=3, n_head=4,
                                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    _copy_to_hf(ours, hf)
    x = torch.randint(0, 101, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=1e-5)
