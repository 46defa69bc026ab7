"""SpanBERT's span boundary objective through objective `mlm`: the loss, a tiny overfit, the recipe end to end."""

from plmcli.config import override_layers
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import finetune, tiny_corpus
from plmcli.errors import PlmError
from plmcli.models.bert import Bert, BertConfig
from plmcli.models.spanbert import SpanBert, SpanBertConfig
from plmcli.objectives.mlm import MaskedLM, MLMConfig

SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
SST2 = Path(__file__).resolve().parents[2] / "data" / "glue-sample"


def _spanbert(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, max_positions=16, n_layer=1, n_head=2, d_model=32, dropout=0.0, attn_dropout=0.0,
               sbo_d_position=8)
    return SpanBert(SpanBertConfig(**(cfg | kw)))


def _batch(seed=0, B=4, T=16):
    """Random text, [CLS] ... [SEP], with two masked spans per row (one of them cut at max_span below)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = SPECIAL["cls"], SPECIAL["sep"]
    cols = [2, 3, 4, 8, 9, 10, 11, 12, 13]
    pos = torch.tensor([b * T + c for b in range(B) for c in cols])
    labels = ids.flatten()[pos].clone()
    masked = ids.flatten().index_fill(0, pos, SPECIAL["mask"]).view(B, T)
    return {"input_ids": masked, "mlm_positions": pos, "mlm_labels": labels}


def test_loss_is_mlm_plus_weighted_sbo():
    model = _spanbert(sbo_max_span=4).eval()
    b = _batch()
    obj = MaskedLM(MLMConfig(pairs="none", masking="span", sbo_weight=0.5), None, SPECIAL, 16)
    with torch.no_grad():
        out = obj.step(model, b)
        ref = model(b["input_ids"], mlm_positions=b["mlm_positions"])
    mlm = F.cross_entropy(ref.mlm_logits, b["mlm_labels"])
    # Spans 2..4 (3 tokens) and 8..13 (6 tokens, the last 2 past sbo_max_span 4): 7 SBO targets per row.
    assert ref.sbo_logits.shape == (4 * 7, 50)
    keep = [r * 9 + k for r in range(4) for k in (0, 1, 2, 3, 4, 5, 6)]
    assert ref.sbo_index.tolist() == keep
    # Per masked token, as SpanBERT's criterion divides the summed SBO losses: 28 targets over 36 masked.
    sbo = F.cross_entropy(ref.sbo_logits, b["mlm_labels"][keep], reduction="sum") / 36
    torch.testing.assert_close(out.loss, mlm + 0.5 * sbo)
    torch.testing.assert_close(out.parts["mlm"], mlm + 0.5 * sbo)
    n = torch.tensor(36.0)
    torch.testing.assert_close(out.metrics["mlm_loss"], mlm * n)
    torch.testing.assert_close(out.metrics["sbo_loss"], sbo * n)
    assert out.count.item() == 36 and set(out.metrics) == {"loss", "mlm_loss", "sbo_loss"}


def test_a_model_without_the_head_trains_span_masking_on_mlm_alone():
    """SpanBERT's ablation "span masking, no SBO" is BERT with masking: span (decided by what the model returns)."""
    torch.manual_seed(0)
    bert = Bert(BertConfig(vocab_size=50, max_positions=16, n_layer=1, n_head=2, d_model=32, nsp_head=False))
    out = MaskedLM(MLMConfig(pairs="none", masking="span"), None, SPECIAL, 16).step(bert, _batch())
    assert set(out.metrics) == {"loss", "mlm_loss"} and torch.isfinite(out.loss)


def test_sbo_loss_falls_on_a_tiny_overfit():
    model = _spanbert()
    obj = MaskedLM(MLMConfig(pairs="none", masking="span"), None, SPECIAL, 16)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    b = _batch(1)
    sbo = []
    for _ in range(40):
        out = obj.step(model, b)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        sbo.append(out.metrics["sbo_loss"].item() / out.count.item())
    assert all(np.isfinite(sbo)) and sbo[0] > 3.0  # ~ln(50) at the start
    assert sbo[-1] < 0.5 * sbo[0] and sbo[-1] < min(sbo[:10])
    assert model.sbo.fc1.weight.grad is not None and model.sbo.position.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kw, pattern", [
    ({"span_max": 0}, "objective.span_max 0 must be"), ({"span_p": 0.0}, r"objective.span_p 0.0 must be in \(0, 1\]"),
    ({"span_p": 1.5}, "objective.span_p 1.5"), ({"sbo_weight": -1.0}, "sbo_weight"),
])
def test_bad_span_settings(kw, pattern):
    with pytest.raises(PlmError, match=pattern) as e:
        MaskedLM(MLMConfig(pairs="none", masking="span", **kw), None, SPECIAL, 16)
    assert e.value.hint.startswith("use e.g.") or "sbo_weight" in e.value.hint


TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "model.max_positions=48",
        "model.sbo_d_position=8", "tokenizer.vocab_size=200", "tokenizer.min_frequency=1", "data.val_fraction=0.2",
        "train.seq_len=32", "train.global_batch_size=4", "train.eval_every=2", "train.eval_batches=2",
        "train.save_every=0", "train.log_every=1"]


def test_spanbert_mini_pretrains_and_finetunes_sst2(tmp_path):
    from plmcli import api
    from plmcli.runs import load_finetuned

    run = tmp_path / "run"
    s = api.pretrain("spanbert-mini", [str(tiny_corpus(tmp_path / "c.txt", 40))], str(run), overrides=override_layers(TINY, {"train.max_steps": 4}))
    assert s["steps"] == 4 and np.isfinite(s["val_sbo_loss"]) and np.isfinite(s["val_mlm_loss"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert len(train) == 4 and all(np.isfinite(r["sbo_loss"]) for r in train)
    assert all(r["loss"] == pytest.approx(r["mlm_loss"] + r["sbo_loss"], rel=1e-5) for r in train)  # a plain sum
    res = finetune("sst2", from_run=str(run), data_dir=str(SST2), train__max_steps=4, train__batch_size=16, out=str(tmp_path / "ft"))
    assert res["steps"] == 4 and 0 <= res["dev"]["accuracy"] <= 1
    model, _, _ = load_finetuned(str(tmp_path / "ft"))
    assert isinstance(model.encoder, SpanBert)
