"""Objective `choice` (SWAG) on encoders: input layout, softmax across choices, end to end on a tiny BERT.

No SWAG data is available offline, so `write_swag` writes SWAG-format CSVs from hand-written, clearly
synthetic scenes (each scene's right ending fits its first sentence; the distractors are other scenes'
endings). tests/objectives/test_gpt_transfer.py uses it too.
"""

import csv
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_model

from plmcli.config_sections import TokenizerConfig
from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from helpers import finetune
from plmcli.runs import load_finetuned
from plmcli.objectives.choice import Choice, ChoiceConfig

SCENES = [  # (sent1, sent2, the ending that fits) — synthetic, written for these tests
    ("A chef slices onions on a wooden board.", "She", "drops the onions into a hot pan."),
    ("A man kneels beside a flat bicycle tyre.", "He", "pumps air into the tyre."),
    ("Two kids build a sandcastle on the beach.", "They", "pour water into the moat."),
    ("A woman lifts the lid of a piano.", "She", "plays a slow song on the keys."),
    ("A dog waits by the door with a leash.", "The dog", "runs outside with its owner."),
    ("A boy climbs a ladder to the roof.", "He", "clears the leaves from the gutter."),
    ("A girl dips a brush in blue paint.", "She", "paints the sky on the canvas."),
    ("A gardener kneels in a bed of tulips.", "He", "pulls the weeds from the soil."),
]
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


def write_swag(path: Path, n: int, k: int = 4, labeled: bool = True, seed: int = 0, start: int = 0) -> Path:
    """n rows in swagaf's layout (leading unnamed index column; no label column when not `labeled`)."""
    rng = np.random.default_rng(seed)
    head = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source"]
    head += [f"ending{j}" for j in range(k)] + (["label"] if labeled else [])
    rows = []
    for i in range(start, start + n):
        s = i % len(SCENES)
        sent1, sent2, right = SCENES[s]
        others = [SCENES[j][2] for j in rng.permutation(len(SCENES)) if j != s][:k - 1]
        label = int(rng.integers(k))
        endings = others[:label] + [right] + others[label:]
        rows.append([str(i), f"synthetic-{s}", str(i), f"{sent1} {sent2}", sent1, sent2, "gold", *endings]
                    + ([str(label)] if labeled else []))
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([head, *rows])
    return path


def swag_files(root: Path, n_train=48, n_dev=16, n_test=8, k=4) -> TaskOptions:
    root.mkdir(parents=True, exist_ok=True)
    return TaskOptions(train=str(write_swag(root / "train.csv", n_train, k, seed=0)),
                       dev=str(write_swag(root / "val.csv", n_dev, k, seed=1, start=1000)),
                       test=str(write_swag(root / "test.csv", n_test, k, labeled=False, seed=2, start=2000)) if n_test else None)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [t for s in SCENES for t in s]
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=300, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("layout", ["cls_first", "cls_last"])
def test_encoder_rows_per_choice(tmp_path, tokenizer, layout):
    tok, meta = tokenizer
    ids = meta["special_token_ids"]
    cls, sep = ids["cls"], ids["sep"]
    task = get_task("swag", swag_files(tmp_path / "swag", 6, 3, 2))
    splits = task.load(None)
    obj = Choice(ChoiceConfig(num_labels=task.num_labels), tok, ids, 64, task=task, layout=layout)
    meta_out = obj.encode_splits(splits, tmp_path / "data")
    assert {s: c["documents"] for s, c in meta_out["counts"].items()} == {"train": 6, "validation": 3, "test": 2}
    d = np.load(tmp_path / "data" / "train.npz")
    assert int(d["rows"]) == 4 and len(d["offsets"]) == 6 * 4 + 1
    assert list(d["labels"]) == [e.label for e in splits["train"]]
    for i, e in enumerate(splits["train"]):
        for k, ending in enumerate(e.endings):
            r = i * 4 + k
            got = d["ids"][d["offsets"][r]:d["offsets"][r + 1]].tolist()
            a, b = enc(tok, e.context), enc(tok, ending)  # ending = sent2 + " " + ending<k>
            assert got == ([*a, sep, *b, sep, cls] if layout == "cls_last" else [cls, *a, sep, *b, sep])


class RowScore(torch.nn.Module):
    """Scores a row by the sum of its real token ids / 100: a known function of each choice's input."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(0.01))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        return (self.w * (input_ids * attention_mask).sum(-1, keepdim=True).float())  # (B·K, 1)


def test_step_is_cross_entropy_of_the_softmax_across_choices(tmp_path, tokenizer):
    tok, meta = tokenizer
    task = get_task("swag", swag_files(tmp_path / "swag", 6, 3, 2))
    obj = Choice(ChoiceConfig(num_labels=4), tok, meta["special_token_ids"], 64, task=task)
    obj.encode_splits(task.load(None), tmp_path / "data")
    batch = obj.stream(tmp_path / "data", "train", 5, 0, 0, 1, shuffle=False)[0]
    assert batch["input_ids"].shape[0] == 20 and batch["rows"] == 4  # 5 examples × 4 choices, flat
    out = obj.step(RowScore(), batch)
    d = np.load(tmp_path / "data" / "train.npz")
    scores = np.array([[d["ids"][d["offsets"][r]:d["offsets"][r + 1]].sum() / 100 for r in range(i * 4, i * 4 + 4)]
                       for i in range(5)])
    labels = d["labels"][:5]
    logp = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    assert out.loss.item() == pytest.approx(-logp[np.arange(5), labels].mean(), rel=1e-5)
    assert out.metrics["accuracy"].item() == (scores.argmax(1) == labels).sum() and out.count.item() == 5
    torch.testing.assert_close(out.loss, F.cross_entropy(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels)))


def make_run(path: Path, family: str, model, tokenizer, tok_meta: dict) -> Path:
    path.mkdir(parents=True)
    tokenizer.save(str(path / "tokenizer.json"))
    save_model(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"family": family, "model": asdict(model.cfg), "objective": "mlm",
                                                  "tokenizer": tok_meta}))
    return path


def test_swag_end_to_end_on_a_tiny_bert(tmp_path, tokenizer):
    from plmcli.models.bert import Bert, BertConfig
    from plmcli.objectives.classify import SequenceClassifier

    tok, meta = tokenizer
    torch.manual_seed(0)
    run = make_run(tmp_path / "bert", "bert", Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=40,
                                                              n_layer=1, n_head=2, d_model=16)), tok, meta)
    opts = swag_files(tmp_path / "swag")
    out = tmp_path / "ft"
    res = finetune("swag", from_run=str(run), options=opts, train__epochs=2, optim__lr=1e-3, train__batch_size=8, out=str(out))
    assert res["task"] == "swag" and res["main_metric"] == "accuracy" and set(res["dev"]) == {"loss", "accuracy"}
    assert res["examples"] == {"train": 48, "validation": 16, "test": 8} and res["steps"] == 12
    assert [h["epoch"] for h in res["history"]] == [1.0, 2.0]
    rows = (out / "SWAG.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and [r.split("\t")[0] for r in rows[1:]] == [str(2000 + i) for i in range(8)]
    # The finetuned model scores each choice with one output; accuracy over the dev set is as reported.
    model, tok2, cfg = load_finetuned(str(out))
    assert isinstance(model, SequenceClassifier) and model.head.out_features == 1
    assert cfg["finetune"]["task_state"] == {"choices": 4} and cfg["finetune"]["objective"] == "choice"
    obj = Choice(ChoiceConfig(num_labels=4), tok2, cfg["tokenizer"]["special_token_ids"], 40, task=get_task("swag"))
    ids, preds = obj.predict(model, obj.stream(out / "data", "validation", 5, 0, 0, 1, shuffle=False))
    labels = np.load(out / "data" / "validation.npz")["labels"]
    assert list(ids) == [str(1000 + i) for i in range(16)]
    assert (preds == labels).mean() == pytest.approx(res["dev"]["accuracy"])
    _, test_preds = obj.predict(model, obj.stream(out / "data", "test", 3, 0, 0, 1, shuffle=False))
    assert [r.split("\t")[1] for r in rows[1:]] == [str(p) for p in test_preds]
    # --eval-only: the same dev numbers and test predictions from the saved weights
    again = finetune("swag", from_run=str(out), options=opts, eval_only=True, out=str(tmp_path / "again"))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])
    assert again["dev"]["loss"] == pytest.approx(res["dev"]["loss"], rel=1e-5)
    assert (tmp_path / "again" / "SWAG.tsv").read_text() == (out / "SWAG.tsv").read_text()


def test_varying_choice_count_stops_before_any_output(tmp_path, tokenizer):
    from plmcli.models.bert import Bert, BertConfig

    tok, meta = tokenizer
    run = make_run(tmp_path / "bert", "bert", Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=40,
                                                              n_layer=1, n_head=2, d_model=16)), tok, meta)
    opts = swag_files(tmp_path / "swag", 6, 3, 0)
    lines = Path(opts.dev).read_text().splitlines()
    fields = next(csv.reader([lines[2]]))
    fields[9] = ""  # the second row's ending2
    lines[2] = ",".join(f'"{f}"' for f in fields)
    Path(opts.dev).write_text("\n".join(lines) + "\n")
    with pytest.raises(PlmError) as e:
        finetune("swag", from_run=str(run), options=opts, out=str(tmp_path / "o"))
    assert str(e.value).startswith(f"{opts.dev}:3: 3 of 4 endings filled (ending2 is empty or missing)")
    assert not (tmp_path / "o").exists()
