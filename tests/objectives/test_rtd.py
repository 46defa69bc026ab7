import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_corpus
from plmcli.config_sections import TokenizerConfig
from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.electra import Electra, ElectraConfig
from plmcli.objectives.rtd import ReplacedTokenDetection, RTDConfig, sample

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
V = 40


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, max_positions=16, n_layer=1, n_head=2, d_model=16, d_ff=32, embedding_size=8,
               generator_size=0.5, dropout=0.0, attn_dropout=0.0)
    return Electra(ElectraConfig(**(cfg | kw)))


def _batch(sample_seed=5):
    """Two rows, the second padded; [MASK] (4) at three targets, one target kept as is (row 0, t=5)."""
    original = torch.tensor([[2, 10, 11, 12, 13, 14, 15, 3], [2, 20, 21, 22, 3, 0, 0, 0]])
    ids = original.clone()
    ids[0, 2] = ids[0, 4] = ids[1, 2] = 4
    positions = torch.tensor([2, 4, 5, 8 + 2])  # flat b·T + t
    return {"input_ids": ids, "attention_mask": (original != 0).long(), "mlm_positions": positions,
            "mlm_labels": original.flatten()[positions], "sample_seed": sample_seed}, original


def _objective(**kw):
    return ReplacedTokenDetection(RTDConfig(**kw), None, SPECIAL, 8)


def test_replaced_labels_are_exactly_the_changed_tokens():
    obj, model = _objective(), _model()
    b, original = _batch()
    logits = model(b["input_ids"], None, b["attention_mask"], b["mlm_positions"]).mlm_logits
    corrupted, replaced = obj.corrupt(logits, b)
    assert torch.equal(replaced, corrupted != original) and not corrupted.requires_grad
    assert not replaced[b["attention_mask"] == 0].any() and torch.equal(corrupted[1, 5:], original[1, 5:])
    unmasked = torch.ones(16, dtype=torch.bool)
    unmasked[b["mlm_positions"]] = False
    assert torch.equal(corrupted.flatten()[unmasked], original.flatten()[unmasked])  # only targets change
    assert not (corrupted == 4).any()  # the discriminator never sees [MASK]
    # Same seed, same samples (a resumed run replaces identically); another seed, other samples.
    again, _ = obj.corrupt(logits, dict(b))
    assert torch.equal(again, corrupted)
    others = {tuple(obj.corrupt(logits, {**b, "sample_seed": s})[0].flatten()[b["mlm_positions"]].tolist()) for s in range(8)}
    assert len(others) > 1


def test_a_sample_equal_to_the_original_counts_as_original():
    obj = _objective()
    b, original = _batch()
    n = len(b["mlm_labels"])
    right = torch.full((n, V), -1e4).scatter(1, b["mlm_labels"][:, None], 0.0)  # all mass on the original token
    corrupted, replaced = obj.corrupt(right, b)
    assert torch.equal(corrupted, original) and not replaced.any()
    wrong = torch.full((n, V), -1e4)
    wrong[:, 7] = 0.0
    corrupted, replaced = obj.corrupt(wrong, b)
    assert replaced.flatten()[b["mlm_positions"]].all() and replaced.sum() == n
    assert (corrupted.flatten()[b["mlm_positions"]] == 7).all()


def test_samples_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(20000, 4)
    draws = sample(logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.01, rtol=0)
    # Temperature sharpens: at 0.5 the first token's share rises from 0.64 to 0.87.
    obj = _objective(temperature=0.5)
    b, _ = _batch()
    n = len(b["mlm_labels"])
    many = [obj.corrupt(torch.tensor([2.0, 1.0, 0.0, -1.0] + [-1e4] * (V - 4)).expand(n, V), {**b, "sample_seed": s})[0]
            for s in range(300)]
    share = np.mean([(c.flatten()[b["mlm_positions"]] == 0).float().mean().item() for c in many])
    assert share == pytest.approx(0.867, abs=0.03)


def test_loss_equals_hand_computation():
    obj, model = _objective(disc_weight=50.0), _model()
    b, original = _batch()
    out = obj.step(model, b)
    with torch.no_grad():
        gen = model(b["input_ids"], None, b["attention_mask"]).mlm_logits  # (B, T, V) at every position
        mlm = F.cross_entropy(gen.flatten(0, 1)[b["mlm_positions"]], b["mlm_labels"])
        corrupted, replaced = obj.corrupt(gen.flatten(0, 1)[b["mlm_positions"]], b)
        disc = model(corrupted, None, b["attention_mask"], part="discriminator").rtd_logits
    real = b["attention_mask"].bool()  # 13 real tokens, [CLS]/[SEP] included
    rtd = F.binary_cross_entropy_with_logits(disc[real], replaced[real].float())
    acc = ((disc[real] > 0) == replaced[real]).float().mean()
    assert out.count.item() == 4
    torch.testing.assert_close(out.loss, mlm + 50 * rtd)
    torch.testing.assert_close(out.metrics["mlm_loss"], mlm * 4)
    torch.testing.assert_close(out.metrics["rtd_loss"], rtd * 4)
    torch.testing.assert_close(out.metrics["rtd_acc"], acc * 4)
    torch.testing.assert_close(out.metrics["loss"], (mlm + 50 * rtd) * 4)


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}


def test_each_network_learns_from_its_own_loss_and_the_embeddings_from_both():
    obj, model = _objective(), _model()
    b, _ = _batch()
    parts = obj.losses(model, b)
    gen_params = [p for n, p in model.named_parameters() if n.startswith(("generator.", "mlm."))]
    disc_params = [p for n, p in model.named_parameters() if n.startswith(("discriminator.", "rtd."))]
    # No path from the RTD loss back into the generator: sampling is not differentiated.
    assert all(g is None for g in torch.autograd.grad(parts["rtd"], gen_params, retain_graph=True, allow_unused=True))
    assert all(g is None for g in torch.autograd.grad(parts["mlm"], disc_params, retain_graph=True, allow_unused=True))

    mlm_only = _grads(model, _objective(disc_weight=0.0).step(model, b).loss)
    rtd_only = _grads(model, _objective(gen_weight=0.0).step(model, b).loss)
    both = _grads(model, obj.step(model, b).loss)
    for name in both:
        on_gen, on_disc = mlm_only[name].abs().sum() > 0, rtd_only[name].abs().sum() > 0
        if name.startswith(("generator.", "mlm.")):
            assert on_gen and not on_disc, name
        elif name.startswith(("discriminator.", "rtd.")):
            assert on_disc and not on_gen, name
        else:  # shared embeddings (wte also decodes the generator): both losses, summed
            assert on_gen and on_disc, name
        torch.testing.assert_close(both[name], mlm_only[name] + rtd_only[name], atol=1e-6, rtol=1e-4)


def _tokenized(tmp_path):
    from plmcli.data.corpus import tokenize_corpus

    tok = TokenizerConfig(kind="wordpiece", vocab_size=200, min_frequency=1, lowercase=True,
                          special_tokens={"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"})
    meta = tokenize_corpus([str(tiny_corpus(tmp_path / "c.txt", 40))], tmp_path / "tok", tok, val_fraction=0.1)
    return tmp_path / "tok", meta["tokenizer"]["special_token_ids"]


def test_stream_masks_as_electra_and_seeds_every_batch(tmp_path):
    d, ids = _tokenized(tmp_path)
    obj = ReplacedTokenDetection(RTDConfig(max_predictions=0), None, ids, 16)
    s = obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)
    b = s[3]
    assert torch.equal(b["input_ids"], obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)[3]["input_ids"])
    seeds = [s[k]["sample_seed"] for k in range(6)]
    assert seeds == [obj.stream(d, "train", 4, 7, 0, 1, shuffle=True)[k]["sample_seed"] for k in range(6)]
    assert len(set(seeds)) == 6 and s.batches_per_epoch() > 0
    # Rank 1 of 2 at step k reads global micro-batch 2k + 1: its own seed.
    r1 = obj.stream(d, "train", 2, 7, 1, 2, shuffle=True)
    assert r1[1]["sample_seed"] == obj.stream(d, "train", 2, 7, 0, 1, shuffle=True)[3]["sample_seed"]
    assert obj.stream(d, "validation", 4, 7, 0, 1, shuffle=False)[0]["sample_seed"] != seeds[0]
    # ELECTRA's 85/0/15: targets are [MASK] or unchanged, never a random token.
    kept = masked = 0
    wide = obj.stream(d, "train", 16, 7, 0, 1, shuffle=True)
    for k in range(40):  # ~640 targets: 15% ± 1.4%
        b = wide[k]
        shown = b["input_ids"].flatten()[b["mlm_positions"]]
        masked += int((shown == ids["mask"]).sum())
        kept += int((shown == b["mlm_labels"]).sum())
        assert ((shown == ids["mask"]) | (shown == b["mlm_labels"])).all()
    assert 0.1 < kept / (kept + masked) < 0.2


def test_check_model_and_bad_config():
    obj = _objective()
    obj.check_model(_model())
    with pytest.raises(PlmError, match="no generator and discriminator") as e:
        obj.check_model(Bert(BertConfig(vocab_size=V, max_positions=16, n_layer=1, n_head=2, d_model=16)))
    assert "electra" in e.value.hint
    with pytest.raises(PlmError, match="exceeds"):
        ReplacedTokenDetection(RTDConfig(), None, SPECIAL, 32).check_model(_model())
    with pytest.raises(PlmError, match="sentence-pair"):
        _objective(pairs="nsp", dynamic=False)
    with pytest.raises(PlmError, match="disc_weight"):
        _objective(disc_weight=-1.0)
    with pytest.raises(PlmError, match="temperature"):
        _objective(temperature=0.0)


RESUME = """\
extends: electra-mini
model: {n_layer: 1, n_head: 2, d_model: 16, d_ff: 32, embedding_size: 8, generator_size: 0.5, max_positions: 16}
tokenizer: {vocab_size: 200, min_frequency: 1}
data: {val_fraction: 0.2}
train: {seq_len: 16, global_batch_size: 4, max_steps: 4, eval_every: 0, eval_batches: 1, save_every: 2, log_every: 1}
"""


def test_resume_replaces_the_same_tokens_bitwise(tmp_path):
    from safetensors.torch import load_file

    from plmcli import api

    (tmp_path / "r.yaml").write_text(RESUME)
    corpus = [str(tiny_corpus(tmp_path / "c.txt", 30))]
    api.pretrain(str(tmp_path / "r.yaml"), corpus, str(tmp_path / "full"))
    api.pretrain(str(tmp_path / "r.yaml"), corpus, str(tmp_path / "half"), stop_after=2)
    first = load_file(str(tmp_path / "half" / "model.safetensors"))
    api.pretrain(out=str(tmp_path / "half"), resume=True)
    a, b = (load_file(str(tmp_path / r / "model.safetensors")) for r in ("full", "half"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(first[k], b[k]) for k in a)  # the resumed half really trained
    rows = [[json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in ("full", "half")]
    assert [r["rtd_loss"] for r in rows[0] if "loss" in r] == [r["rtd_loss"] for r in rows[1] if "loss" in r]
