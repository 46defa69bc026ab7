"""`plm finetune` end to end on tiny encoders: SST-2 from the shipped sample, MNLI / STS-B from tiny files."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_model
from torch import nn

from plmcli.config_sections import TokenizerConfig
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from plmcli.models.base import LanguageModel, Traits
from helpers import finetune
from plmcli.runs import load_encoder, load_finetuned

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


@dataclass
class ToyClsEncoderConfig:
    vocab_size: int = 0
    max_positions: int = 64
    d_model: int = 16
    dropout: float = 0.0


class ToyClsEncoder(LanguageModel):
    """A bag of words with segment embeddings and a pooler: learns SST-2 a little in a second."""

    Config = ToyClsEncoderConfig
    traits = Traits(bidirectional=True)
    causal = False
    encoder = True

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.types = nn.Embedding(2, cfg.d_model)
        self.pool = nn.Linear(cfg.d_model, cfg.d_model)
        self.unused = nn.Linear(cfg.d_model, 3)  # an MLM-style head that classification never reaches

    @property
    def max_positions(self):
        return self.cfg.max_positions

    def encode(self, input_ids, token_type_ids=None, attention_mask=None):
        h = self.emb(input_ids)  # (B, T, C)
        if token_type_ids is not None:
            h = h + self.types(token_type_ids)
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mean = (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)
        return h, torch.tanh(self.pool(mean))

    def forward(self, input_ids):
        return self.unused(self.emb(input_ids))


@dataclass
class ToyCausalConfig:
    vocab_size: int = 0
    max_positions: int = 64


class ToyCausal(LanguageModel):
    Config = ToyCausalConfig
    traits = Traits(causal=True)
    causal = True

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab_size, 4)


@pytest.fixture(scope="module")
def tokenizer():
    lines = (SAMPLE / "SST-2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1:]
    texts = [line.split("\t")[0] for line in lines if line] + ["a man is playing . a woman sings ."]
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=800, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "kind": "wordpiece", "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


@pytest.fixture
def families(monkeypatch):
    from plmcli.models import registry

    monkeypatch.setitem(registry.FAMILIES, "toycls", "test_finetune:ToyClsEncoder")
    monkeypatch.setitem(registry.FAMILIES, "toycausal", "test_finetune:ToyCausal")


def make_run(path: Path, family: str, model, tokenizer, tok_meta: dict) -> Path:
    path.mkdir(parents=True)
    tokenizer.save(str(path / "tokenizer.json"))
    save_model(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"family": family, "model": asdict(model.cfg), "objective": "mlm",
                                                  "tokenizer": tok_meta}))
    return path


@pytest.fixture
def toy_run(tmp_path, tokenizer, families):
    tok, meta = tokenizer
    torch.manual_seed(0)
    return make_run(tmp_path / "pre", "toycls", ToyClsEncoder(ToyClsEncoderConfig(vocab_size=tok.get_vocab_size())), tok, meta)


def test_sst2_end_to_end(toy_run, tmp_path):
    out = tmp_path / "ft"
    res = finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), train__epochs=3, optim__lr=3e-2, train__batch_size=64, out=str(out))
    saved = json.loads((out / "metrics.json").read_text())
    assert saved == json.loads(json.dumps(res))
    assert {"task", "from_run", "init", "dev", "history", "best_step", "settings", "examples", "test_predictions"} <= set(res)
    assert res["task"] == "sst2" and res["main_metric"] == "accuracy" and res["init"] == "pretrained"
    assert res["examples"] == {"train": 2000, "validation": 200, "test": 100}
    s = res["settings"]
    assert s["steps_per_epoch"] == 32 and s["total_steps"] == 96 and s["warmup_steps"] == 9 and s["max_seq_len"] == 64
    # One dev evaluation per epoch; the kept one is the best of them.
    hist = res["history"]
    assert [h["epoch"] for h in hist] == [1.0, 2.0, 3.0] and all({"loss", "accuracy"} <= set(h) for h in hist)
    best = max(hist, key=lambda h: h["accuracy"])
    assert res["dev"]["accuracy"] == best["accuracy"] and res["best_step"] == next(h["step"] for h in hist if h is best)
    assert res["dev"]["accuracy"] > 0.55  # a bag of words learns some sentiment from 2,000 sentences (chance: 0.5)
    # The submission file: GLUE's `index<TAB>prediction` for every test row.
    rows = (out / "SST-2.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 101
    assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in range(100)]
    assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    # OUT is a run dir: the classifier loads back and scores the dev set exactly as reported.
    model, tok, cfg = load_finetuned(str(out))
    assert cfg["finetune"]["task"] == "sst2" and cfg["family"] == "toycls"
    from plmcli.objectives.classify import Classify, ClassifyConfig

    obj = Classify(ClassifyConfig(task="sst2"), tok, cfg["tokenizer"]["special_token_ids"], 64)
    ids, preds = obj.predict(model, obj.stream(out / "data", "validation", 50, 0, 0, 1, shuffle=False))
    labels = np.load(out / "data" / "validation.npz")["labels"]
    assert len(ids) == 200 and (preds == labels).mean() == pytest.approx(res["dev"]["accuracy"])
    assert not (out / "checkpoints").exists()
    # --eval-only scores the kept weights again and predicts the test split, training nothing
    again = finetune("sst2", from_run=str(out), data_dir=str(SAMPLE), eval_only=True, out=str(out.parent / "again"))
    assert again["eval_only"] and again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])
    assert (out.parent / "again" / "SST-2.tsv").read_text() == (out / "SST-2.tsv").read_text()
    with pytest.raises(PlmError, match="--eval-only needs a run finetuned on mrpc"):
        finetune("mrpc", from_run=str(out), data_dir=str(SAMPLE), eval_only=True)


def test_random_init_and_from_a_finetuned_run(toy_run, tmp_path):
    cfg = json.loads((toy_run / "config.json").read_text())
    pre, rnd = load_encoder(toy_run, cfg, pretrained=True), load_encoder(toy_run, cfg, pretrained=False, seed=3)
    assert not torch.equal(pre.emb.weight, rnd.emb.weight)
    assert torch.equal(rnd.emb.weight, load_encoder(toy_run, cfg, pretrained=False, seed=3).emb.weight)
    res = finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), train__max_steps=3, model__init="random", out=str(tmp_path / "r"))
    assert res["init"] == "random" and res["steps"] == 3 and len(res["history"]) == 1
    # A finetuned directory is itself a valid --from (e.g. MNLI first, then RTE): its encoder part is taken.
    res2 = finetune("sst2", from_run=str(tmp_path / "r"), data_dir=str(SAMPLE), train__max_steps=2, out=str(tmp_path / "r2"))
    assert res2["steps"] == 2
    ft_cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    ft_model, _, _ = load_finetuned(str(tmp_path / "r"))
    torch.testing.assert_close(load_encoder(tmp_path / "r", ft_cfg).emb.weight, ft_model.encoder.emb.weight)


def test_unused_encoder_parameters_are_frozen(toy_run, tokenizer):
    from plmcli.objectives.classify import Classify, ClassifyConfig

    tok, meta = tokenizer
    enc = load_encoder(toy_run, json.loads((toy_run / "config.json").read_text()))
    model = Classify(ClassifyConfig(), tok, meta["special_token_ids"], 32).build_model(enc)
    assert model.frozen == ["encoder.unused.weight", "encoder.unused.bias"]
    assert all(p.requires_grad for n, p in model.named_parameters() if "unused" not in n)


def _write_mnli(root: Path):
    d = root / "MNLI"
    d.mkdir(parents=True)
    words = ["a man is playing", "a woman sings", "the cat sat", "nobody is here"]
    labels = ["entailment", "neutral", "contradiction"]
    head = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2"

    def rows(n, labeled, extra=""):
        for i in range(n):
            a, b = words[i % 4], words[(i * 3 + 1) % 4]
            cols = [str(i), "1", "1", "fiction", "(x)", "(y)", "(X)", "(Y)", a, b]
            yield "\t".join(cols + ([labels[i % 3], labels[i % 3]] if labeled else []))

    (d / "train.tsv").write_text("\n".join([head + "\tlabel1\tgold_label", *rows(40, True)]) + "\n")
    for name in ("dev_matched", "dev_mismatched"):
        (d / f"{name}.tsv").write_text("\n".join([head + "\tlabel1\tgold_label", *rows(9, True)]) + "\n")
    for name in ("test_matched", "test_mismatched"):
        (d / f"{name}.tsv").write_text("\n".join([head, *rows(7, False)]) + "\n")
    return root


def test_mnli_two_dev_sets_and_two_submissions(toy_run, tmp_path):
    data = _write_mnli(tmp_path / "glue")
    out = tmp_path / "mnli"
    res = finetune("MNLI", from_run=str(toy_run), data_dir=str(data), train__epochs=2, optim__lr=1e-2, train__batch_size=8, out=str(out))
    assert {"accuracy", "loss", "mismatched_accuracy", "mismatched_loss"} == set(res["dev"])
    assert res["examples"] == {"train": 40, "validation": 18, "test": 7, "test_mismatched": 7}
    assert res["test_predictions"] == {"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}
    for f in ("MNLI-m.tsv", "MNLI-mm.tsv"):
        rows = (out / f).read_text().splitlines()
        assert len(rows) == 8 and {r.split("\t")[1] for r in rows[1:]} <= {"entailment", "neutral", "contradiction"}


def test_stsb_regression(toy_run, tmp_path):
    d = tmp_path / "glue" / "STS-B"
    d.mkdir(parents=True)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    pairs = [("a man is playing", "a man is playing", "5.000"), ("a woman sings", "the cat sat", "0.400"),
             ("the cat sat", "the cat sat .", "4.600"), ("nobody is here", "a man is playing", "1.000")]
    lab = [head + "\tscore"] + [f"{i}\tx\tx\tx\tx\tnone\tnone\t{a}\t{b}\t{s}" for i, (a, b, s) in enumerate(pairs * 5)]
    (d / "train.tsv").write_text("\n".join(lab) + "\n")
    (d / "dev.tsv").write_text("\n".join(lab[:9]) + "\n")
    (d / "test.tsv").write_text("\n".join([head] + [f"{i}\tx\tx\tx\tx\tnone\tnone\t{a}\t{b}" for i, (a, b, _) in enumerate(pairs)]) + "\n")
    res = finetune("stsb", from_run=str(toy_run), data_dir=str(tmp_path / "glue"), train__epochs=2, optim__lr=1e-2,
                   train__batch_size=4, out=str(tmp_path / "sts"))
    assert res["main_metric"] == "spearman" and {"loss", "pearson", "spearman"} == set(res["dev"])
    preds = [float(r.split("\t")[1]) for r in (tmp_path / "sts" / "STS-B.tsv").read_text().splitlines()[1:]]
    assert len(preds) == 4 and all(0.0 <= p <= 5.0 for p in preds)


def test_runs_without_a_representation_to_transfer_are_refused(tmp_path, tokenizer, families):
    """Encoders, GPT-style causal LMs and families with per-token states are finetuned (tests/test_finetune_matrix.py).
    Refused: a causal LM without per-position hidden states (ToyCausal has none), an n-gram model (it counts), a
    feed-forward NNLM (it sees n-1 tokens)."""
    tok, meta = tokenizer
    make_run(tmp_path / "toycausal", "toycausal", ToyCausal(ToyCausalConfig(vocab_size=tok.get_vocab_size())), tok, meta)
    for family in ("ngram", "nnlm"):  # refused from config.json alone, before any weights are read
        (tmp_path / family).mkdir()
        (tmp_path / family / "config.json").write_text(json.dumps({"family": family, "model": {}, "tokenizer": meta}))
        (tmp_path / family / "model.safetensors").write_bytes(b"")
    why = {"toycausal": "is a causal LM without per-position hidden states to transfer",
           "ngram": "counts n-grams and has no learned states to finetune",
           "nnlm": "is a fixed-window LM: each prediction sees only its n-1 previous tokens, no state reads a whole example"}
    # named from the registry: the toy encoder the fixture registers is among them
    need = ("an encoder run (bert, spanbert, albert, nezha, elmo, electra, xlnet or toycls), a causal LM run (gpt, rnn or "
            "transformer_xl) or a seq2seq, transformer or word2vec run")
    for family, clause in why.items():
        with pytest.raises(PlmError) as e:
            finetune("sst2", from_run=str(tmp_path / family), data_dir=str(SAMPLE), out=str(tmp_path / "o"))
        assert f"{clause} ({family}); GLUE finetuning needs {need}" in str(e.value)
        assert "plm pretrain --recipe bert-mini" in str(e.value)
        assert not (tmp_path / "o").exists()


def test_bad_settings(toy_run, tmp_path, tokenizer):
    with pytest.raises(PlmError, match="max-seq-len 65 is outside 8..64"):
        finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), task__max_seq_len=65)
    with pytest.raises(PlmError, match="unknown task 'sst3'"):
        finetune("sst3", from_run=str(toy_run), data_dir=str(SAMPLE))
    with pytest.raises(PlmError, match="model.init 'scratch' is not one of pretrained, random"):
        finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), model__init="scratch")
    with pytest.raises(PlmError, match="no --data-dir given and the Hub is unreachable"):
        finetune("sst2", from_run=str(toy_run))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(PlmError, match="not empty"):
        finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE), out=str(busy))
    # A tokenizer without [CLS]/[SEP] (a GPT-style run under an encoder family) cannot build the input.
    tok, meta = tokenizer
    cfg = json.loads((toy_run / "config.json").read_text())
    cfg["tokenizer"]["special_token_ids"] = {"pad": 0}
    (toy_run / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlmError, match="no cls / sep token"):
        finetune("sst2", from_run=str(toy_run), data_dir=str(SAMPLE))


def test_from_runs_latest_by_default(toy_run, tmp_path, monkeypatch):
    from plmcli.runs import point_latest

    point_latest(toy_run)
    res = finetune("sst2", data_dir=str(SAMPLE), train__max_steps=1)
    assert res["from_run"] == str(toy_run.resolve()) and Path(res["out_dir"]).name.startswith("pre-sst2-")


@pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / "plmcli" / "models" / "bert.py").is_file(),
                    reason="plmcli/models/bert.py not written yet")
def test_from_a_tiny_bert(tmp_path, tokenizer):
    from plmcli.models.bert import Bert, BertConfig

    tok, meta = tokenizer
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), max_positions=48, n_layer=1, n_head=2, d_model=16)
    run = make_run(tmp_path / "bert", "bert", Bert(cfg), tok, meta)
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=4, train__batch_size=16, out=str(tmp_path / "o"))
    assert res["settings"]["max_seq_len"] == 48 and res["steps"] == 4 and 0 <= res["dev"]["accuracy"] <= 1
    model, _, _ = load_finetuned(str(tmp_path / "o"))
    assert isinstance(model.encoder, Bert)
    # Pretrained weights went in: the embedding rows of a token no example uses are unchanged.
    pre = load_encoder(run, json.loads((run / "config.json").read_text()))
    unused = tok.token_to_id("[MASK]")
    torch.testing.assert_close(model.encoder.wte.weight[unused], pre.wte.weight[unused])


def test_dropout_warmup_and_weight_decay_settings(tmp_path, tokenizer):
    from plmcli.models.bert import Bert, BertConfig

    tok, meta = tokenizer
    cfg = BertConfig(vocab_size=tok.get_vocab_size(), max_positions=48, n_layer=1, n_head=2, d_model=16,
                     dropout=0.0, attn_dropout=0.0)
    run = make_run(tmp_path / "bert", "bert", Bert(cfg), tok, meta)  # pretrained without dropout
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=10, train__batch_size=16,
                   out=str(tmp_path / "o"), model__dropout=0.2, model__classifier_dropout=0.3, optim__warmup_ratio=0.5,
                   optim__weight_decay=0.1)
    s = res["settings"]
    assert s["dropout"] == 0.2 and s["classifier_dropout"] == 0.3 and s["warmup_steps"] == 5 and s["weight_decay"] == 0.1
    model, _, run_cfg = load_finetuned(str(tmp_path / "o"))
    assert run_cfg["model"]["dropout"] == run_cfg["model"]["attn_dropout"] == 0.2  # the run records what it trained with
    assert model.encoder.blocks[0].attn.attn_dropout == 0.2 and model.encoder.drop.p == 0.2
    assert model.dropout.p == 0.3
    # the pretrained run itself is untouched
    assert json.loads((run / "config.json").read_text())["model"]["dropout"] == 0.0
    for kwargs, message in (({"model__dropout": 1.0}, r"model.dropout 1.0 must be in \[0, 1\)"),
                            ({"optim__warmup_ratio": 1.5}, r"optim.warmup_ratio 1.5 must be in \[0, 1\)"),
                            ({"optim__weight_decay": -1}, "optim.weight_decay -1.0 must be ≥ 0")):
        with pytest.raises(PlmError, match=message):
            finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), **kwargs)


def test_training_batches_are_grouped_by_length_and_evaluation_is_in_order(tokenizer, tmp_path):
    from plmcli.data.batching import EpochOrder
    from plmcli.data.tasks.registry import get_task
    from plmcli.runs import task_objective

    tok, meta = tokenizer
    task = get_task("sst2")
    obj = task_objective(task, tok, meta["special_token_ids"], 64, ToyClsEncoder)
    obj.encode_splits(task.load(str(SAMPLE / "SST-2")), tmp_path)
    B, n = 16, 2000
    train = obj.stream(tmp_path, "train", B, 5, 0, 1, shuffle=True)
    plain = obj.stream(tmp_path, "train", B, 5, 0, 1, shuffle=True)
    plain.order = EpochOrder(n, 5)  # what the stream read before grouping

    def epoch(s):  # (example indices, real tokens, padded positions) of epoch 0's batches (n % B == 0)
        batches = [s[k] for k in range(n // B)]
        return (np.concatenate([b["index"].numpy() for b in batches]), sum(b["num_tokens"] for b in batches),
                sum(b["input_ids"].numel() for b in batches))

    idx, real, total = epoch(train)
    plain_idx, plain_real, plain_total = epoch(plain)
    assert sorted(idx) == sorted(plain_idx) == list(range(n)) and real == plain_real
    # 2,000 sentences in 2.5 windows of 50 batches: padding share 62% -> 3.4%, 2.6× fewer positions
    assert 1 - real / total < 0.05 and 1 - plain_real / plain_total > 0.55 and plain_total > 2.5 * total
    # A batch is its rows, whatever order they come in: the same sentences, padded to their longest.
    b = train[3]
    lengths = b["attention_mask"].sum(1)
    assert b["input_ids"].shape[1] == lengths.max() and int(lengths.sum()) == b["num_tokens"]
    ev = obj.stream(tmp_path, "validation", B, 5, 0, 1, shuffle=False)
    assert np.concatenate([ev[k]["index"].numpy() for k in range(13)]).tolist() == list(range(200))
