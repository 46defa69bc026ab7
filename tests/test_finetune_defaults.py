"""Finetuning's lr and epochs, when not set, come from the backbone's size
(pipelines.finetune.size_defaults), so that a small encoder learns from a small labelled set with no tuning
flags; a value the user sets always wins."""

import json
import random

import pytest
import torch
import yaml

from plmcli.models.bert import Bert, BertConfig
from helpers import finetune
from plmcli.config import load_finetune_config
from plmcli.pipelines.finetune import backbone_size, size_defaults
from test_finetune import make_run, tokenizer  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = dict(n_layer=12, n_head=12, d_model=768, d_ff=3072, vocab_size=30522, max_positions=512)
"""BERT-base (Devlin et al.)."""
MINI = dict(n_layer=4, n_head=4, d_model=256, d_ff=1024, vocab_size=8192, max_positions=512)
"""bert-mini (plmcli/recipes/bert-mini.yaml; Turc et al.'s BERT-Mini)."""
SMALL = dict(n_layer=4, n_head=8, d_model=512, d_ff=2048, vocab_size=30522, max_positions=512)
"""Turc et al.'s BERT-Small."""


def bert_on_meta(**cfg) -> Bert:
    with torch.device("meta"):  # shapes only: BERT-base's 110M weights are never allocated
        return Bert(BertConfig(**cfg))


def test_backbone_size_counts_the_weights_outside_the_embeddings():
    # per layer 4·C² + 2·C·F weights and 4·C + F + 4·C biases/gains; pooler C² + C, NSP 2C + 2,
    # MLM transform C² + C + 2C, its decoder bias V (the decoder weight is the tied word embedding)
    C, F, L, V = 256, 1024, 4, 8192
    per_layer = 4 * C * C + 2 * C * F + 4 * C + F + C + 4 * C
    want = L * per_layer + 2 * C + (C * C + C) + (2 * C + 2) + (C * C + C + 2 * C) + V
    assert backbone_size(bert_on_meta(**MINI)) == want
    assert 80e6 < backbone_size(bert_on_meta(**BASE)) < 90e6  # BERT-base: 85M outside its 24M of embeddings


@pytest.mark.parametrize("size, lr", [(BASE, 2e-5), (SMALL, 1e-4), (MINI, 3e-4)])
def test_size_defaults_keep_bert_base_on_the_paper_and_raise_the_lr_of_small_models(size, lr):
    model = bert_on_meta(**size)
    # full SST-2 (2,105 steps an epoch): Devlin et al.'s 3 epochs for every size
    cfg, note = size_defaults(load_finetune_config(None, {"task.name": "sst2"}), model, 2105)
    assert (cfg.optim.lr, cfg.train.epochs) == (lr, 3)
    assert note.split(":")[1].startswith(f" lr {lr:g}, 3 epochs;") and "--lr / --epochs override" in note
    # 2,000 rows (63 steps an epoch): the small models train for at least 600 steps, BERT-base stays at 3 epochs
    cfg, note = size_defaults(load_finetune_config(None, {"task.name": "sst2"}), model, 63)
    assert cfg.train.epochs == (3 if size is BASE else 10)
    if size is not BASE:
        assert "10 epochs (at least 600 steps at 63 an epoch)" in note
    # --max-steps fixes the step count: no epochs are added
    cfg, _ = size_defaults(load_finetune_config(None, {"task.name": "sst2", "train.max_steps": 50}), model, 63)
    assert cfg.train.epochs == 3 and cfg.optim.lr == lr


def test_a_bag_of_words_counts_no_weights_outside_its_tables_and_takes_a_linear_models_rate():
    from plmcli.models.word2vec import Word2Vec, Word2VecConfig

    w2v = Word2Vec(Word2VecConfig(vocab_size=500, dim=16))
    assert backbone_size(w2v) == 0
    cfg, note = size_defaults(load_finetune_config(None, {"task.name": "sst2"}), w2v, 32)
    assert (cfg.optim.lr, cfg.train.epochs) == (3e-3, 19) and "0.00M-weight backbone" in note


def test_a_value_the_user_sets_wins_over_the_size_default():
    mini = bert_on_meta(**MINI)
    cfg, note = size_defaults(load_finetune_config(None, {"task.name": "sst2", "optim.lr": 3e-5}), mini, 63)  # a flag
    assert cfg.optim.lr == 3e-5 and cfg.train.epochs == 10
    assert note.split(":")[1].startswith(" 10 epochs")  # only what it chose
    cfg, note = size_defaults(load_finetune_config(None, ["task.name=sst2", "train.epochs=7"]), mini, 63)  # --set
    assert cfg.train.epochs == 7 and cfg.optim.lr == 3e-4 and note.split(":")[1].startswith(" lr 0.0003;")
    for given in (load_finetune_config(None, {"task.name": "sst2", "optim.lr": 5e-5, "train.epochs": 2}),
                  load_finetune_config(None, {"task": {"name": "sst2"}, "optim": {"lr": 1e-3}, "train": {"epochs": 4}})):
        assert size_defaults(given, mini, 63) == (given, None)  # nothing chosen, nothing said
        assert size_defaults(given, bert_on_meta(**BASE), 63) == (given, None)


def synthetic_sentiment(path, n: int, seed: int) -> None:
    """`n` sentences of filler words with one 'good' (label 1) or 'bad' (label 0) somewhere in each."""
    filler = "the a film movie story plot is was it and of to this that with as for its".split()
    rng = random.Random(seed)
    rows = ["sentence\tlabel"]
    for _ in range(n):
        words = rng.choices(filler, k=rng.randint(4, 12))
        label = rng.randint(0, 1)
        words.insert(rng.randint(0, len(words)), "good" if label else "bad")
        rows.append(f"{' '.join(words)}\t{label}")
    path.write_text("\n".join(rows) + "\n")


def test_a_tiny_random_bert_learns_a_separable_task_at_the_default_lr(tmp_path, tokenizer, capfd):  # noqa: F811
    """The guard against the failure this replaced (a classifier left on the majority class by too few, too small
    updates): a random 2-layer BERT, 640 sentences, the lr it gets by default. With no --max-steps it would train
    30 epochs (600 steps; it is at 1.0 from the sixth); 240 steps keep the test short."""
    tok, meta = tokenizer
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), max_positions=32, n_layer=2, n_head=2, d_model=32, d_ff=64)
    run = make_run(tmp_path / "bert", "bert", Bert(cfg), tok, meta)
    synthetic_sentiment(tmp_path / "train.tsv", 640, 0)
    synthetic_sentiment(tmp_path / "dev.tsv", 200, 1)
    out = tmp_path / "ft"
    res = finetune("classification", from_run=str(run), model__init="random", out=str(out), train__max_steps=240,
                   options={"train": str(tmp_path / "train.tsv"), "dev": str(tmp_path / "dev.tsv")})
    assert res["settings"]["lr"] == 3e-4 and res["steps"] == 240
    assert res["dev"]["accuracy"] > 0.9, res["history"]
    # what was chosen: said once on stderr, kept in metrics.json and in finetune.yaml (which repeats the run)
    assert res["size_defaults"] in capfd.readouterr().err
    saved = json.loads((out / "metrics.json").read_text())["size_defaults"]
    assert saved.startswith("finetune defaults for a 0.0") and ": lr 0.0003, 3 epochs;" in saved
    resolved = yaml.safe_load((out / "finetune.yaml").read_text())
    assert resolved["optim"]["lr"] == 3e-4 and resolved["train"]["epochs"] == 3
