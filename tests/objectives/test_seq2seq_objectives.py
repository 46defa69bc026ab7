import math
from pathlib import Path

from plmcli.config import override_layers
import numpy as np
import pytest
import torch

from helpers import S2S_SPECIALS, reverse_pairs, tiny_corpus, tiny_s2s_recipe
from plmcli.errors import PlmError
from plmcli.objectives.seq2seq import (
    DenoisingConfig,
    Denoising,
    Translation,
    TranslationConfig,
    _mask,
    add_noise,
    collate,
)

IDS = {"pad": 0, "bos": 1, "eos": 2, "mask": 3}


class Fixed(torch.nn.Module):
    """A stand-in encoder-decoder that returns given logits."""

    def __init__(self, logits):
        super().__init__()
        self.out = logits

    def forward(self, src_ids, src_mask, tgt_in_ids):
        return self.out


def test_collate_shapes_and_truncation():
    b = collate([[5, 6, 7], [8]], [[9], [10, 11, 12, 13, 14]], pad=0, start=1, eos=2, max_len=4)
    assert b["src_ids"].tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert b["src_mask"].tolist() == [[True] * 4, [True, True, False, False]]
    assert b["tgt_in_ids"].tolist() == [[1, 9, 0, 0], [1, 10, 11, 12]]  # target cut to max_len-1 = 3
    assert b["labels"].tolist() == [[9, 2, -100, -100], [10, 11, 12, 2]]


def test_label_smoothing_loss_by_hand():
    torch.manual_seed(0)
    V, eps = 5, 0.1
    logits = torch.randn(1, 3, V)
    labels = torch.tensor([[2, 4, -100]])
    obj = Translation(TranslationConfig(label_smoothing=eps), None, IDS, 8)
    out = obj.step(Fixed(logits), {"src_ids": None, "src_mask": None, "tgt_in_ids": None, "labels": labels})
    logp = logits[0].log_softmax(-1)
    nll = [-logp[0, 2].item(), -logp[1, 4].item()]
    # smoothed target: (1-ε) on the label + ε/V on every token (the label included)
    smooth = [(1 - eps) * nll[i] + eps * -logp[i].mean().item() for i in range(2)]
    assert out.loss.item() == pytest.approx(sum(smooth) / 2, rel=1e-5)
    assert out.count.item() == 2
    assert out.metrics["nll"].item() / 2 == pytest.approx(sum(nll) / 2, rel=1e-5)
    assert out.metrics["loss"].item() / 2 == pytest.approx(sum(smooth) / 2, rel=1e-5)
    assert obj.ppl_metric == "nll"


def test_span_infilling_masks_the_right_share_with_one_mask_per_span():
    cfg = DenoisingConfig(mask_ratio=0.3, poisson_lambda=3.0, random_ratio=0.0, permute_sentences=0.0)
    x = np.arange(100, 200)
    rng = np.random.default_rng(0)
    n_masks = []
    for _ in range(200):
        out = _mask(x, cfg, rng, mask_id=3)
        kept = out[out != 3]
        assert np.all(np.diff(kept) > 0)  # survivors keep their order
        assert len(kept) == 70  # exactly ceil(100 · 0.3) tokens masked
        n_masks.append(np.sum(out == 3))
    # one mask per span (or per 0-length span): 30 tokens in spans of mean ≈ 3 (the last one cut to fit)
    assert 8 < np.mean(n_masks) < 13
    tok = _mask(x, DenoisingConfig(mask_ratio=0.3, mask_length="token"), rng, mask_id=3)
    assert len(tok) == 100 and np.sum(tok == 3) == 30  # token masking keeps the length


def test_sentence_permutation_and_deletion():
    cfg = DenoisingConfig(mask_ratio=0.0, permute_sentences=1.0)
    x = np.arange(10, 22)
    bounds = np.array([0, 3, 7, 9])
    seen = set()
    for s in range(20):
        out = add_noise(x, bounds, cfg, np.random.default_rng(s), 3, np.arange(5, 30))
        pieces = {tuple(p) for p in np.split(x, bounds[1:])}
        assert sorted(out.tolist()) == x.tolist()
        seen.add(tuple(out))
        # the output is the sentences in some order
        i, got = 0, set()
        while i < len(out):
            p = next(p for p in pieces if tuple(out[i:i + len(p)]) == p)
            got.add(p)
            i += len(p)
        assert got == pieces
    assert len(seen) > 5
    d = add_noise(x, bounds, DenoisingConfig(mask_ratio=0.0, permute_sentences=0.0, delete_ratio=0.5),
                  np.random.default_rng(0), 3, np.arange(5, 30))
    assert 0 < len(d) < len(x) and set(d.tolist()) <= set(x.tolist())


def test_config_checks():
    with pytest.raises(PlmError, match="label_smoothing"):
        Translation(TranslationConfig(label_smoothing=1.5), None, {}, 8)
    with pytest.raises(PlmError, match="mask_length"):
        Denoising(DenoisingConfig(mask_length="words"), None, {}, 8)
    with pytest.raises(PlmError, match="mask_ratio"):
        Denoising(DenoisingConfig(mask_ratio=1.5), None, {}, 8)
    with pytest.raises(PlmError, match="encoder-decoder"):
        from plmcli.models.gpt import GPT, GPTConfig

        Translation(TranslationConfig(), None, {}, 8).check_model(GPT(GPTConfig(vocab_size=10, n_layer=1, n_head=1, d_model=8)))


def test_denoising_pretrain_and_autoencoding_ppl(tmp_path):
    """transformer-mini-denoising at tiny size on plain documents; eval-ppl scores each line given itself."""
    from plmcli.api import eval_ppl, pretrain

    corpus = tiny_corpus(tmp_path / "docs.txt")
    summary = pretrain("transformer-mini-denoising", data=[str(corpus)], out=str(tmp_path / "run"), overrides=override_layers([
        "model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_head=2",
        "model.max_positions=32", "tokenizer.kind=char", "tokenizer.min_frequency=1", f"tokenizer.special_tokens={S2S_SPECIALS}",
        "data.val_fraction=0.2", "train.seq_len=24", "train.global_batch_size=8", "train.eval_every=0", "train.save_every=0",
        "train.log_every=2", "optim.warmup_steps=2"], {"train.max_steps": 4}))
    assert summary["steps"] == 4 and math.isfinite(summary["val_nll"])
    text = tmp_path / "eval.txt"
    text.write_text("the cat sat on a mat\n\nhome and back again, far away from home and back again and again\n")
    res = eval_ppl([str(text)], str(tmp_path / "run"))
    assert res["scores"].startswith("each line given itself")
    # char tokens of both lines + one eos per scored piece: the long line (64 chars) is cut into pieces of 31
    assert res["tokens"] == 20 + 1 + 64 + 3
    assert res["words"] == 6 + 13 and math.isfinite(res["ppl"])


def test_translation_eval_ppl_rejects_a_line_without_tab(tmp_path):
    from plmcli.api import eval_ppl, pretrain

    data = reverse_pairs(tmp_path / "rev.txt", n=40)
    pretrain(str(tiny_s2s_recipe(tmp_path / "r.yaml", "transformer", max_steps=2)), data=[str(data)], out=str(tmp_path / "run"))
    bad = tmp_path / "bad.txt"
    bad.write_text("a b\tb a\nc d e\n")
    with pytest.raises(PlmError, match="line 2 has no tab"):
        eval_ppl([str(bad)], str(tmp_path / "run"))
    good = tmp_path / "good.txt"
    good.write_text("a b\tb a\nc d e\te d c\n")
    res = eval_ppl([str(good)], str(tmp_path / "run"))
    assert res["tokens"] == 2 + 1 + 3 + 1 and res["words"] == 5 and res["bpb"] > 0
    assert res["ppl"] == pytest.approx(math.exp(res["nll"]))


@pytest.mark.parametrize("recipe", ["seq2seq-attn-mini", "transformer-mini"])
def test_mini_recipes_train_on_the_shipped_parallel_sample(recipe, tmp_path):
    """With no --data a translation recipe trains on the shipped sample (lines paired with their words reversed)."""
    from plmcli.api import eval_ppl, pretrain
    from plmcli.generate import generate

    tiny = {"seq2seq-attn-mini": ["model.d_embed=16", "model.d_hidden=16"],
            "transformer-mini": ["model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_model=16",
                                 "model.d_ff=32", "model.n_head=2"]}[recipe]
    summary = pretrain(recipe, out=str(tmp_path / "run"),
                       overrides=override_layers(tiny + ["train.eval_batches=2", "train.global_batch_size=4", "train.log_every=1"], {"train.max_steps": 2}))
    assert summary["steps"] == 2 and math.isfinite(summary["val_ppl"])
    from plmcli.api import default_corpus

    sample = tmp_path / "few.txt"
    lines = (Path(default_corpus()).parent / "reverse-sample.txt").read_text(encoding="utf-8").splitlines()[:3]
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert math.isfinite(eval_ppl([str(sample)], str(tmp_path / "run"))["ppl"])
    assert len(generate(str(tmp_path / "run"), ["Speak, speak."], max_new_tokens=3)) == 1
