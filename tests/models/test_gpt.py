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


def _load_into_hf(ours: GPT, hf) -> dict:
    """Our weights into an HF model through GPT.to_hf (Linear (out, in) -> Conv1D (in, out); HF's LM head
    is tied to its token embeddings); returns the HF config to_hf wrote."""
    cfg, sd = ours.to_hf({"tokenizer": {"special_token_ids": {}}})
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and missing == ["lm_head.weight"], (missing, unexpected)
    built = hf.config.to_dict()  # every key to_hf writes is one the HF config reads, with the value built by hand
    assert all(built[k] == v for k, v in cfg.items() if k != "architectures" and not k.endswith("_token_id")), cfg
    return cfg


def test_parity_with_transformers_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = GPT(tiny(vocab_size=101, max_positions=40, n_layer=3, n_head=4, d_model=48)).eval()
    hf_cfg = transformers.GPT2Config(vocab_size=101, n_positions=40, n_embd=48, n_layer=3, n_head=4,
                                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    assert _load_into_hf(ours, hf)["architectures"] == ["GPT2LMHeadModel"]
    x = torch.randint(0, 101, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=1e-5)


def test_parity_with_transformers_openai_gpt():
    """GPT-1's post-LN blocks without a final LN; OpenAIGPT's "gelu" is the tanh approximation."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = GPT(tiny(vocab_size=101, max_positions=40, n_layer=2, n_head=4, d_model=48, norm_position="post",
                    final_norm=False, activation="gelu_tanh", scaled_residual_init=False)).eval()
    hf_cfg = transformers.OpenAIGPTConfig(vocab_size=101, n_positions=40, n_embd=48, n_layer=2, n_head=4, afn="gelu",
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    hf = transformers.OpenAIGPTLMHeadModel(hf_cfg).eval()
    assert _load_into_hf(ours, hf)["architectures"] == ["OpenAIGPTLMHeadModel"]
    x = torch.randint(0, 101, (3, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=1e-5)
