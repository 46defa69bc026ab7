"""GPT-style transfer from causal runs (Radford et al. 2018, §3.3): input transforms, the extract token's
state under right padding, the auxiliary LM loss, and `plm finetune` end to end from a tiny GPT run."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_RECIPE
from plmcli import api
from plmcli.config_sections import TokenizerConfig
from plmcli.data.tasks import Example, TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from helpers import finetune
from plmcli.runs import load_encoder, load_finetuned
from plmcli.models.gpt import GPT, GPTConfig
from plmcli.objectives.choice import Choice, ChoiceConfig
from plmcli.objectives.classify import (CAUSAL, CausalTransfer, Classify, ClassifyConfig, TransferTokens, encoder_problem,
                                        transfer_tokens)
from test_choice import SCENES, swag_files

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "glue-sample"
TEXTS = [t for s in SCENES for t in s] + ["a man is playing a guitar .", "the film is dull and far too long ."]


def make_tok(kind="word", specials=None, texts=TEXTS):
    specials = specials or {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
    cfg = TokenizerConfig(kind=kind, vocab_size=400, min_frequency=1, lowercase=True, special_tokens=specials)
    tok = train_tokenizer(texts, cfg)
    return tok, special_token_ids(tok, resolve_special_tokens(cfg))


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def test_start_delimiter_extract_tokens():
    tok, ids = make_tok(specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>"})
    assert transfer_tokens(tok, ids) == TransferTokens(ids["bos"], (ids["sep"],), ids["eos"])
    # GPT-2 style: one <|endoftext|> for bos and eos, no sep: "$" as the tokenizer spells " $"
    tok, ids = make_tok("bytelevel-bpe", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}, TEXTS + ["costs $ 5"])
    t = transfer_tokens(tok, ids)
    assert t.start == t.extract == ids["eos"] and tok.decode(list(t.delimiter)) == " $"
    # a character vocabulary that cannot spell "$": eos (a document boundary) separates the texts
    tok, ids = make_tok("char", {"eos": "<eos>", "unk": "<unk>"})
    assert transfer_tokens(tok, ids) == TransferTokens(ids["eos"], (ids["eos"],), ids["eos"])
    tok, ids = make_tok("char", {"unk": "<unk>"})
    with pytest.raises(PlmError, match="no bos or eos token"):
        transfer_tokens(tok, ids)


def _encode(tmp_path, obj, splits):
    obj.encode_splits(splits, tmp_path)
    d = np.load(tmp_path / "train.npz")
    return int(d["rows"]), [d["ids"][d["offsets"][r]:d["offsets"][r + 1]].tolist() for r in range(len(d["offsets"]) - 1)]


def test_input_transforms(tmp_path):
    tok, ids = make_tok(specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>", "sep": "<sep>"})
    s, d, e = ids["bos"], ids["sep"], ids["eos"]
    a, b = "a man is playing a guitar .", "the film is dull and far too long ."
    A, B = enc(tok, a), enc(tok, b)

    def objective(name, num_labels, seq_len=64):
        return Classify(ClassifyConfig(task=name, num_labels=num_labels), tok, ids, seq_len, task=get_task(name), layout=CAUSAL)

    # classification: <s> x <e>
    rows, got = _encode(tmp_path / "c", objective("sst2", 2), {"train": [Example(a, None, 1)], "dev": [Example(b, None, 0)]})
    assert rows == 1 and got == [[s, *A, e]]
    # entailment / pairs: <s> x1 $ x2 <e>
    rows, got = _encode(tmp_path / "p", objective("rte", 2), {"train": [Example(a, b, 0)], "dev": [Example(b, a, 1)]})
    assert rows == 1 and got == [[s, *A, d, *B, e]]
    # similarity (a regression on pairs): both orders, two rows per example
    rows, got = _encode(tmp_path / "s", objective("stsb", 1), {"train": [Example(a, b, 3.2), Example(b, b, 5.0)],
                                                             "dev": [Example(b, a, 1.0)]})
    assert rows == 2 and got == [[s, *A, d, *B, e], [s, *B, d, *A, e], [s, *B, d, *B, e], [s, *B, d, *B, e]]
    # paraphrase (MRPC, QQP: Task.symmetric_pair) too; entailment keeps its order (the rte case above)
    for name in ("mrpc", "qqp"):
        rows, got = _encode(tmp_path / name, objective(name, 2), {"train": [Example(a, b, 1)], "dev": [Example(b, a, 0)]})
        assert rows == 2 and got == [[s, *A, d, *B, e], [s, *B, d, *A, e]]
    assert not any(get_task(n).symmetric_pair for n in ("mnli", "rte", "qnli", "wnli"))
    # longest-first truncation to max_seq_len, <e> kept last
    rows, got = _encode(tmp_path / "t", objective("rte", 2, seq_len=9), {"train": [Example(a, b, 0)], "dev": [Example(a, b, 0)]})
    assert got == [[s, *A[:3], d, *B[:3], e]] and json.loads((tmp_path / "t" / "meta.json").read_text())["counts"]["train"]["truncated"] == 1
    # multiple choice: <s> context $ ending_k <e>, one sequence per choice
    task = get_task("swag", swag_files(tmp_path / "swag", 3, 2, 0))
    splits = task.load(None)
    obj = Choice(ChoiceConfig(num_labels=4), tok, ids, 64, task=task, layout=CAUSAL)
    rows, got = _encode(tmp_path / "m", obj, splits)
    assert rows == 4 and got == [[s, *enc(tok, x.context), d, *enc(tok, end), e] for x in splits["train"] for end in x.endings]
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["transfer_tokens"] == {"start": s, "delimiter": [d], "extract": e}


def tiny_gpt(vocab, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, max_positions=64, n_layer=2, n_head=2, d_model=16, dropout=0.0, attn_dropout=0.0))


def _stsb_and_sst2(tmp_path, tok, ids, name, aux=0.5):
    texts = TEXTS[:8]
    num = 1 if name == "stsb" else 2
    ex = [Example(t, texts[(i + 3) % 8] if num == 1 else None, float(i % 5) if num == 1 else i % 2) for i, t in enumerate(texts)]
    task = get_task(name, TaskOptions(aux_lm_weight=aux))
    obj = Classify(ClassifyConfig(task=name, num_labels=num, classifier_dropout=0.0), tok, ids, 64, task=task, layout=CAUSAL)
    obj.encode_splits({"train": ex, "dev": ex[:2]}, tmp_path)
    return obj, obj.stream(tmp_path, "train", 8, 0, 0, 1, shuffle=False)[0]


@pytest.mark.parametrize("name", ["sst2", "stsb"])
def test_head_reads_each_rows_last_real_token(tmp_path, name):
    tok, ids = make_tok()
    obj, batch = _stsb_and_sst2(tmp_path, tok, ids, name)
    model = obj.build_model(tiny_gpt(tok.get_vocab_size())).eval()
    lens = batch["attention_mask"].sum(-1)
    assert len(set(lens.flatten().tolist())) > 2  # rows of different lengths, right-padded
    assert (batch["input_ids"][batch["attention_mask"] == 0] == ids["pad"]).all()
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        rows = batch["input_ids"].reshape(-1, batch["input_ids"].shape[-1])
        alone = torch.stack([model.backbone.hidden(r[None, :n])[0, -1] for r, n in zip(rows, lens.flatten())])
        assert (rows[torch.arange(len(rows)), lens.flatten() - 1] == ids["eos"]).all()  # the last real token is <e>
    if name == "stsb":  # the two orders' final states added before the head
        assert batch["input_ids"].dim() == 3 and batch["input_ids"].shape[:2] == (8, 2)
        alone = alone.reshape(8, 2, -1).sum(1)
    torch.testing.assert_close(logits, model.head(alone))


@pytest.mark.parametrize("name, aux", [("sst2", 0.5), ("sst2", 0.0), ("stsb", 0.25), ("swag", 0.5)])
def test_aux_lm_loss_by_hand(tmp_path, name, aux):
    tok, ids = make_tok()
    if name == "swag":
        task = get_task("swag", swag_files(tmp_path / "swag", 4, 2, 0))
        task.options.aux_lm_weight = aux
        obj = Choice(ChoiceConfig(num_labels=4, classifier_dropout=0.0), tok, ids, 64, task=task, layout=CAUSAL)
        obj.encode_splits(task.load(None), tmp_path / "d")
        batch = obj.stream(tmp_path / "d", "train", 4, 0, 0, 1, shuffle=False)[0]
    else:
        obj, batch = _stsb_and_sst2(tmp_path, tok, ids, name, aux)
    model = obj.build_model(tiny_gpt(tok.get_vocab_size()))
    out = obj.step(model, batch)
    gpt, T = model.backbone, batch["input_ids"].shape[-1]
    rows, lens = batch["input_ids"].reshape(-1, T), batch["attention_mask"].reshape(-1, T).sum(-1)
    with torch.no_grad():
        last = torch.stack([gpt.hidden(r[None, :n])[0, -1] for r, n in zip(rows, lens)])  # each row alone, unpadded
        nll = torch.cat([F.cross_entropy(gpt(r[None, :n])[0, :-1], r[1:n], reduction="none") for r, n in zip(rows, lens)])
        labels = batch["labels"]
        if name == "swag":
            task_loss = F.cross_entropy(model.head(last).reshape(-1, 4), labels)
        elif name == "stsb":
            task_loss = F.mse_loss(model.head(last.reshape(len(labels), 2, -1).sum(1)).squeeze(-1), labels)
        else:
            task_loss = F.cross_entropy(model.head(last), labels)
    lm = nll.mean()  # every real token after <s>, <e> included, token-weighted over all rows
    assert len(nll) == int((lens - 1).sum())
    torch.testing.assert_close(out.loss.detach(), task_loss + aux * lm)
    if aux:
        torch.testing.assert_close(out.metrics["lm_loss"] / out.count, lm)
        torch.testing.assert_close(out.metrics["task_loss"] / out.count, task_loss)
    else:
        assert "lm_loss" not in out.metrics and out.loss.item() == pytest.approx(task_loss.item(), rel=1e-6)


def test_which_runs_transfer():
    from plmcli.models.registry import model_class

    for family in ("gpt", "bert", "xlnet"):
        assert Classify.backbone_problem(model_class(family)) is None and Choice.backbone_problem(model_class(family)) is None
    # stateful LMs and the encoders of encoder-decoders read one example at a time (tests/test_finetune_matrix.py)
    assert all(Classify.backbone_problem(model_class(f)) is None for f in ("rnn", "transformer_xl", "transformer", "seq2seq", "word2vec"))
    why = {f: Classify.backbone_problem(model_class(f)) for f in ("ngram", "nnlm")}
    assert why["ngram"].startswith("counts n-grams and has no learned states to finetune")
    assert why["nnlm"].startswith("is a fixed-window LM: each prediction sees only its n-1 previous tokens")
    assert all(w.endswith("; it needs an encoder run (bert, spanbert, albert, nezha, elmo, electra or xlnet), a causal LM "
                          "run (gpt, rnn or transformer_xl) or a seq2seq, transformer or word2vec run") for w in why.values())
    # objectives that need every token's bidirectional state (tagging, span QA) keep to encoders
    assert encoder_problem(model_class("gpt")) == "is a causal LM; it needs an encoder run"
    assert encoder_problem(model_class("bert")) is None
    with pytest.raises(PlmError, match="--aux-lm-weight -1.0 is not a weight"):
        tok, ids = make_tok()
        Classify(ClassifyConfig(), tok, ids, 32, task=get_task("sst2", TaskOptions(aux_lm_weight=-1)), layout=CAUSAL)


# ------------------------------------------------------------------ end to end from a tiny GPT run


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A tiny GPT (tests/helpers.py TINY_RECIPE) pretrained a few steps on SST-2 and SWAG-style text."""
    root = tmp_path_factory.mktemp("gpt")
    lines = (SAMPLE / "SST-2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1:400]
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join([ln.split("\t")[0] for ln in lines if ln] + TEXTS + ["it costs $ 5"]) + "\n")
    (root / "tiny.yaml").write_text(TINY_RECIPE)
    with pytest.MonkeyPatch.context() as mp:  # runs/latest and caches under this module's tmp dir
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        api.pretrain(str(root / "tiny.yaml"), [str(corpus)], str(root / "run"), overrides={"train.max_steps": 4})
    return root / "run"


def test_sst2_from_a_gpt_run(gpt_run, tmp_path):
    out = tmp_path / "ft"
    res = finetune("sst2", from_run=str(gpt_run), data_dir=str(SAMPLE), train__max_steps=4, train__batch_size=16, optim__lr=1e-3, out=str(out))
    assert res["examples"] == {"train": 2000, "validation": 200, "test": 100} and res["steps"] == 4
    assert res["settings"]["max_seq_len"] == 32 and set(res["dev"]) == {"loss", "accuracy"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["family"] == "gpt" and cfg["finetune"]["options"]["aux_lm_weight"] == 0.5
    meta = json.loads((out / "data" / "meta.json").read_text())
    tok_ids = cfg["tokenizer"]["special_token_ids"]
    assert meta["transfer_tokens"]["start"] == meta["transfer_tokens"]["extract"] == tok_ids["eos"]
    assert len(meta["transfer_tokens"]["delimiter"]) == 2  # " $" in a character vocabulary
    # the loop logged both parts (once: log_every = 2000/16/4 steps); the total is task + λ·LM
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"lm_loss"' in x]
    assert len(rows) == 1 and all(r["loss"] == pytest.approx(r["task_loss"] + 0.5 * r["lm_loss"], rel=1e-5) for r in rows)
    sub = (out / "SST-2.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and len(sub) == 101 and {r.split("\t")[1] for r in sub[1:]} <= {"0", "1"}
    model, tok, fcfg = load_finetuned(str(out))
    assert isinstance(model, CausalTransfer) and isinstance(model.backbone, GPT)
    obj = Classify(ClassifyConfig(), tok, tok_ids, 32, task=get_task("sst2"), layout=CAUSAL)
    _, preds = obj.predict(model, obj.stream(out / "data", "validation", 64, 0, 0, 1, shuffle=False))
    labels = np.load(out / "data" / "validation.npz")["labels"]
    assert (preds == labels).mean() == pytest.approx(res["dev"]["accuracy"])
    again = finetune("sst2", from_run=str(out), data_dir=str(SAMPLE), eval_only=True, out=str(tmp_path / "again"))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])
    assert again["dev"]["loss"] == pytest.approx(res["dev"]["loss"], rel=1e-5)
    assert (tmp_path / "again" / "SST-2.tsv").read_text() == (out / "SST-2.tsv").read_text()
    # a finetuned GPT run is itself a valid --from: its backbone part is taken
    assert finetune("sst2", from_run=str(out), data_dir=str(SAMPLE), train__max_steps=1, out=str(tmp_path / "more"))["steps"] == 1
    torch.testing.assert_close(load_encoder(out, fcfg).wte.weight, model.backbone.wte.weight)


def test_swag_from_a_gpt_run(gpt_run, tmp_path):
    opts = swag_files(tmp_path / "swag", 32, 12, 6)
    out = tmp_path / "ft"
    res = finetune("swag", from_run=str(gpt_run), options=opts, train__epochs=2, train__batch_size=8, optim__lr=1e-3, out=str(out))
    assert res["examples"] == {"train": 32, "validation": 12, "test": 6} and res["steps"] == 8
    assert len(res["history"]) == 2 and 0 <= res["dev"]["accuracy"] <= 1
    sub = (out / "SWAG.tsv").read_text().splitlines()
    assert [r.split("\t")[0] for r in sub[1:]] == [str(2000 + i) for i in range(6)]
    assert {r.split("\t")[1] for r in sub[1:]} <= {"0", "1", "2", "3"}
    model, _, _ = load_finetuned(str(out))
    assert isinstance(model, CausalTransfer) and model.head.out_features == 1
    again = finetune("swag", from_run=str(out), options=opts, eval_only=True, out=str(tmp_path / "again"))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])
    assert (tmp_path / "again" / "SWAG.tsv").read_text() == (out / "SWAG.tsv").read_text()
    # --aux-lm-weight 0: the task loss alone is trained and logged
    off = TaskOptions(**{**asdict(opts), "aux_lm_weight": 0.0})
    finetune("swag", from_run=str(gpt_run), options=off, train__max_steps=2, train__batch_size=8, out=str(tmp_path / "off"))
    logged = [json.loads(x) for x in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    assert all("lm_loss" not in r for r in logged) and any("loss" in r for r in logged)


def mrpc_files(root: Path, n_train: int, n_dev: int) -> Path:
    """A tiny MRPC in GLUE's layout (MRPC/train.tsv, dev.tsv: Quality, #1 ID, #2 ID, #1 String, #2 String)."""
    folder = root / "MRPC"
    folder.mkdir(parents=True)
    for name, n in (("train.tsv", n_train), ("dev.tsv", n_dev)):
        lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        lines += [f"{i % 2}\t{i}\t{i + 100}\t{TEXTS[i % len(TEXTS)]}\t{TEXTS[(i + 1 + i % 2) % len(TEXTS)]}" for i in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_mrpc_from_a_gpt_run_reads_both_orders(gpt_run, tmp_path):
    """Radford et al. §3.3 "Similarity" for a paraphrase task: each example is two rows, a $ b and b $ a, whose
    features are added, so swapping an example's sentences gives the same logits."""
    out = tmp_path / "ft"
    res = finetune("mrpc", from_run=str(gpt_run), data_dir=str(mrpc_files(tmp_path / "glue", 16, 4)), train__max_steps=2,
                   train__batch_size=8, out=str(out))
    assert res["examples"]["train"] == 16 and res["steps"] == 2
    d = np.load(out / "data" / "train.npz")
    assert int(d["rows"]) == 2 and len(d["offsets"]) - 1 == 2 * 16
    model, tok, fcfg = load_finetuned(str(out))
    ids = json.loads((out / "config.json").read_text())["tokenizer"]["special_token_ids"]
    a, b = "a man is playing a guitar .", "the film is dull and far too long ."
    obj = Classify(ClassifyConfig(task="mrpc"), tok, ids, 32, task=get_task("mrpc"), layout=CAUSAL)
    logits = []
    for x, y in ((a, b), (b, a)):
        obj.encode_splits({"train": [Example(x, y, 1)], "dev": [Example(x, y, 1)]}, tmp_path / "one")
        batch = obj.stream(tmp_path / "one", "validation", 1, 0, 0, 1, shuffle=False)[0]
        assert batch["input_ids"].shape[:2] == (1, 2)  # one example, its two orderings
        with torch.no_grad():
            logits.append(model.eval()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]))
    torch.testing.assert_close(logits[0], logits[1])
