"""model.pad_vocab_multiple: a vocabulary of 50 padded to 64 rows, the padding rows holding large random weights,
gives the logits, log-probabilities and losses of the same weights cut to 50 rows, in every family that pads; no
padded id is ever generated; the head sends the padding rows no gradient; exports and parameter counts speak of
the real vocabulary; runs saved before padding existed load unpadded."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers

from families import tiny_overrides
from plmcli.api import count_params
from plmcli.config import load_recipe
from plmcli.config_schema import build_section
from plmcli.errors import PlmError
from plmcli.generate import generate
from plmcli.models.lm_loss import linear_cross_entropy
from plmcli.models.registry import build_model, model_config_class
from plmcli.models.vocab import PadsVocab, mask_padding, without_padding

pytestmark = pytest.mark.usefixtures("one_thread")

V, PADDED = 50, 64


def _build(recipe: str, multiple: int, extra=()):
    family = load_recipe(recipe).family
    r = load_recipe(recipe, [*tiny_overrides(family), *extra, f"model.vocab_size={V}", f"model.pad_vocab_multiple={multiple}"])
    torch.manual_seed(0)
    return build_model(r.family, r.model).eval()


def _loud_and_cut(recipe: str, extra=()):
    """(a model padded to 64 rows whose padding rows are large and random, the same family at 50 rows holding the
    padded model's other weights): an output that let a padding row in would differ by orders of magnitude."""
    padded, plain = _build(recipe, PADDED, extra), _build(recipe, 1, extra)
    want = plain.state_dict()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in padded.named_parameters():
            if p.shape != want[name].shape:
                assert p.shape[0] == PADDED and want[name].shape[0] == V, name
                p[V:] = torch.randn(p[V:].shape, generator=g) * 10 + 50
    plain.load_state_dict({k: v[: want[k].shape[0]] for k, v in padded.state_dict().items()})
    return padded, plain


def _mlm(m, x):
    pos = torch.tensor([1, 5, 17, 30])
    return {"logits": m(x).mlm_logits, "masked": m(x, mlm_positions=pos).mlm_logits,
            "loss": m(x, mlm_positions=pos, mlm_labels=x.flatten()[pos]).mlm_loss}


def _s2s(m, x):
    mask = torch.ones_like(x, dtype=torch.bool)
    return {"logits": m(x, mask, x.flip(1)), "step": m.decode_step(x[:, 0], m.encode(x, mask))[0]}


OUTPUTS = {  # recipe: what the family's logits, log-probabilities and losses are, for (2, 16) ids x
    "gpt-mini": lambda m, x: {"logits": m(x), "loss": m(x, labels=x)},
    "bert-mini": _mlm,
    "roberta-mini": _mlm,
    "albert-mini": _mlm,
    "nezha-mini": _mlm,
    "spanbert-mini": lambda m, x: {**_mlm(m, x), "sbo": m(x, mlm_positions=torch.tensor([4, 5, 6, 20])).sbo_logits},
    "electra-mini": lambda m, x: {"logits": m(x).mlm_logits, "masked": m(x, mlm_positions=torch.tensor([3, 9])).mlm_logits},
    "xlnet-mini": lambda m, x: {"logits": m(x)[0], "left_to_right": m.next_token_logits(x)[0]},
    "transformer-mini": _s2s,
    "seq2seq-attn-mini": _s2s,
    "txl-mini": lambda m, x: {"log_probs": m(x)[0], "nll": m(x, labels=x)[0]},
    "rnn-ptb": lambda m, x: {"logits": m(x)[0], "nll": m(x, labels=x)[0]},
    "nnlm-ptb": lambda m, x: {"logits": m(x), "loss": m(x, labels=x)},
}


@pytest.mark.parametrize("recipe", sorted(OUTPUTS))
def test_padded_model_equals_the_model_with_the_rows_cut(recipe):
    padded, plain = _loud_and_cut(recipe)
    assert isinstance(padded.cfg, PadsVocab) and padded.cfg.vocab_size == V
    x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(2))
    got, want = OUTPUTS[recipe](padded, x), OUTPUTS[recipe](plain, x)
    for key in want:
        assert got[key].shape == want[key].shape, key  # logits are (…, 50): no padded column comes out
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=key)

    # Backward through every output: the padding rows get nothing from the head, nor from the embedding (no id
    # reads them). A gradient of None is a zero one.
    padded.zero_grad()
    sum(t.float().sum() for t in got.values()).backward()
    rows = {n for n, p in padded.named_parameters() if p.shape != plain.get_parameter(n).shape}
    assert rows  # the word embedding at least
    for name in rows:
        grad = padded.get_parameter(name).grad
        assert grad is None or not grad[V:].any(), name


def test_scoring_paths_equal_the_model_with_the_rows_cut():
    """eval-ppl's sliding windows (the loss without a gradient, context positions not scored) and zero-shot's
    log P(continuation | context) through the LM head, on a padded GPT."""
    from plmcli.eval.zero_shot import score_continuations

    padded, plain = _loud_and_cut("gpt-mini")
    x = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(2))
    labels = x.clone()
    labels[:, :9] = -100  # a window's context: only its last positions are scored
    with torch.no_grad():
        torch.testing.assert_close(padded(x, labels=labels), plain(x, labels=labels), rtol=1e-5, atol=1e-5)
    rows = [([3, 8, 20, 7], [41, 9]), ([5], [49, 48, 2])]
    got, want = score_continuations(padded, rows, window=8), score_continuations(plain, rows, window=8)
    assert [s.tokens for s in got] == [s.tokens for s in want] and [s.greedy for s in got] == [s.greedy for s in want]
    assert [s.loglik for s in got] == pytest.approx([s.loglik for s in want], abs=1e-4)


@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("chunk", [5, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_loss_masks_every_chunk(vocab_major, chunk, bias):
    """The chunked LM-head cross-entropy over a padded weight: the loss and gradients of the rows cut, with and without
    a gradient (training, scoring), in the (V, n) and (n, V) layouts, one chunk or many."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(23, 16, generator=g, dtype=torch.float64)
    w = torch.randn(PADDED, 16, generator=g, dtype=torch.float64) * 0.5
    w[V:] = w[V:] * 20 + 5  # padding rows that would win every softmax
    b = torch.linspace(-1, 1, PADDED, dtype=w.dtype) * 10 if bias else None
    y = torch.randint(0, V, (23,), generator=g)
    y[::4] = -100
    h1, w1 = h.clone().requires_grad_(), w[:V].clone().requires_grad_()
    b1 = b[:V].clone().requires_grad_() if bias else None
    ref = F.cross_entropy(F.linear(h1, w1, b1), y, ignore_index=-100)
    ref.backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    b2 = b.clone().requires_grad_() if bias else None
    got = linear_cross_entropy(h2, w2, y, chunk=chunk, bias=b2, vocab_major=vocab_major, vocab_size=V)
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(w2.grad[:V], w1.grad, rtol=1e-9, atol=1e-12)
    assert not w2.grad[V:].any() and (not bias or not b2.grad[V:].any())
    with torch.no_grad():
        scored = linear_cross_entropy(h, w, y, chunk=chunk, bias=b, vocab_major=vocab_major, vocab_size=V)
    torch.testing.assert_close(scored, ref.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("vocab_major", [True, False])
def test_fused_loss_masks_under_bf16_autocast(vocab_major):
    """bf16 logits (the dtype's minimum, not −inf, in the padding), fp32 softmax: as the unpadded head under autocast."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(300, 16, generator=g)
    w = torch.randn(PADDED, 16, generator=g) * 0.5
    w[V:] += 30
    y = torch.randint(0, V, (300,), generator=g)
    losses, grads = [], []
    for weight, vocab in ((w[:V], None), (w, V)):
        wc, hc = weight.clone().requires_grad_(), h.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(hc, wc, y, chunk=128, vocab_major=vocab_major, vocab_size=vocab)
        loss.backward()
        losses.append(loss)
        grads.append((hc.grad, wc.grad))
    assert torch.isfinite(losses[1])
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(grads[1][0], grads[0][0])
    torch.testing.assert_close(grads[1][1][:V], grads[0][1])
    assert not grads[1][1][V:].any()


def test_mask_padding_fills_the_dtype_minimum_in_place():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.zeros(3, PADDED, dtype=dtype)
        assert mask_padding(t, V) is t
        assert (t[:, :V] == 0).all() and (t[:, V:] == torch.finfo(dtype).min).all()
        assert torch.softmax(t.float(), -1)[:, V:].eq(0).all() and not t.float().softmax(-1).isnan().any()
    cols = torch.zeros(PADDED, 3)
    assert mask_padding(cols, V, dim=0)[V:].eq(torch.finfo(torch.float32).min).all()


def _tokenizer(n: int = PADDED) -> Tokenizer:
    """Words t0 … t63: a padded id that came out would be decoded (and caught) rather than dropped."""
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(n)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.mark.parametrize("recipe", ["gpt-mini", "transformer-mini", "rnn-ptb"])
@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_generation_never_emits_a_padded_id(recipe, strategy):
    padded, _ = _loud_and_cut(recipe)
    tok = _tokenizer()
    ids = {"pad": 0, "bos": 2} if padded.traits.causal else {"pad": 0, "bos": 2, "eos": 3}
    cfg = {"family": load_recipe(recipe).family, "tokenizer": {"special_token_ids": ids}}
    prompts = ["t5 t9 t13", "t40 t41", "t7"]
    texts = generate((padded, tok, cfg), prompts, max_new_tokens=10, strategy=strategy, num_beams=2, seed=3)
    out = [tok.token_to_id(w) for t in texts for w in t.split()]
    assert out and all(i is not None and i < V for i in out), texts


def test_without_padding_cuts_rows_keeps_ties_and_buffers():
    padded, plain = _loud_and_cut("gpt-mini")
    cut = without_padding(padded)
    assert cut.cfg.pad_vocab_multiple == 1 and cut.cfg.vocab_size == V and not cut.training
    assert cut.lm_head.weight is cut.wte.weight  # tied as in the padded model
    for k, v in plain.state_dict().items():
        assert torch.equal(cut.state_dict()[k], v), k
    x = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(cut(x), padded(x))
    assert without_padding(plain) is plain

    s2s, _ = _loud_and_cut("transformer-mini", ["model.tie_output=false", "model.share_embeddings=false"])
    cut = without_padding(s2s)
    assert not cut.pe.is_meta and torch.equal(cut.pe, s2s.pe)  # unsaved buffers come from the padded model
    assert cut.out.weight.shape == (V, 32) and cut.src_embed.weight.shape == (V, 32)


def test_recipe_counts_are_at_the_tokenizer_vocabulary():
    """`plm recipes` compares with the papers: gpt2-small's 47 padding rows (50,257 -> 50,304) are not counted."""
    r = load_recipe("gpt2-small")
    assert r.model.pad_vocab_multiple == 64
    with torch.device("meta"):
        cfg = build_section(model_config_class("gpt"), {**asdict(r.model), "vocab_size": 50257}, "model")
        on_device = sum(p.numel() for p in build_model("gpt", cfg).parameters())
    assert cfg.padded_vocab == 50304
    assert count_params(r) == on_device - 47 * 768


def test_settings_are_checked_at_load():
    with pytest.raises(PlmError, match="pad_vocab_multiple"):
        load_recipe("gpt-mini", ["model.pad_vocab_multiple=0"])
    # Transformer-XL pads its full softmax only: an adaptive one's clusters are sized by the words
    assert load_recipe("txl-mini").model.pad_vocab_multiple == 64
    adaptive = _build("txl-mini", PADDED, ["model.cutoffs=[20,35]", "model.div_val=2"])
    assert adaptive.cfg.padded_vocab == V and adaptive.softmax.bounds[-1] == V
    assert sum(e.weight.shape[0] for e in adaptive.emb.layers) == V


def test_a_run_saved_before_padding_loads_unpadded(tmp_path):
    """A run's config.json from before this setting has no pad_vocab_multiple: it builds at 1 and its weights load."""
    from safetensors.torch import save_model

    from plmcli.runs import load_run_model, run_config

    old = _build("gpt2-small", 1)
    section = {k: v for k, v in asdict(old.cfg).items() if k != "pad_vocab_multiple"}
    (tmp_path / "config.json").write_text(json.dumps({"family": "gpt", "model": section}))
    save_model(old, str(tmp_path / "model.safetensors"))
    loaded = load_run_model(tmp_path, run_config(tmp_path))
    assert loaded.cfg.pad_vocab_multiple == 1 and loaded.wte.weight.shape == (V, 32)
    x = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(loaded(x), old(x))
