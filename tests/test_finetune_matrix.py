"""The finetune matrix (README "What finetunes from what"): every cell this file owns is a test.

A "yes" cell finetunes a tiny model of that family a few steps on tiny data and checks the task's metric is
written to OUT/metrics.json; a "no" cell checks the one-line refusal (before anything is read or written).
BERT's, XLNet's, ELMo's and GPT's rows are pinned here too (span QA's windows and decoding: tests/objectives/test_qa.py).
Hand computations pin what the new rows read: ULMFiT's concat pooling, a fresh state / memory per example,
Transformer-XL's segments with memory, tags at the last sub-token of a left-to-right row, the RNN encoder-decoder's
packed bidirectional encoder, ELMo's span head over its scalar mix.
"""

import csv
import json
import math
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model

from helpers import assert_clean_error, run as cli
from plmcli.config_sections import TokenizerConfig
from plmcli.config_sections import TaskOptions
from plmcli.data.tasks.conll import Sentence
from plmcli.data.tasks.registry import get_task
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.errors import PlmError
from plmcli.models.registry import model_class
from plmcli.objectives.heads import pool
from helpers import finetune
from plmcli.runs import load_finetuned, task_objective

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "glue-sample"
SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]", "bos": "<s>", "eos": "</s>"}
WORDS = "john mary paris london the a met in and visited said today chef slices onions pumps tyre plays".split()

TINY = {  # family, model section: a second or two per finetune on one CPU core
    "lstm": ("rnn", {"cell": "lstm", "n_layer": 2, "d_embed": 16, "d_hidden": 16}),
    "gru": ("rnn", {"cell": "gru", "n_layer": 1, "d_embed": 16, "d_hidden": 16}),
    "rnn": ("rnn", {"cell": "rnn", "n_layer": 1, "d_embed": 16, "d_hidden": 16, "tie_embeddings": True}),
    "transformer_xl": ("transformer_xl", {"n_layer": 1, "n_head": 2, "d_model": 16, "d_ff": 32, "mem_len": 8,
                                          "dropout": 0.0}),
    "bert": ("bert", {"max_positions": 64, "n_layer": 1, "n_head": 2, "d_model": 16}),
    "gpt": ("gpt", {"max_positions": 64, "n_layer": 1, "n_head": 2, "d_model": 16}),
    "elmo": ("elmo", {"token_encoder": "word", "d_proj": 8, "n_layer": 2, "d_hidden": 16, "max_positions": 64}),
    "xlnet": ("xlnet", {"max_positions": 64, "n_layer": 1, "n_head": 2, "d_model": 16, "d_ff": 32}),
    "transformer": ("transformer", {"max_positions": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_model": 16,
                                    "d_ff": 32, "n_head": 2}),
    "seq2seq": ("seq2seq", {"cell": "lstm", "n_layer": 2, "d_embed": 16, "d_hidden": 16, "bidirectional": True,
                            "max_positions": 64}),
    "seq2seq_gru": ("seq2seq", {"cell": "gru", "n_layer": 1, "d_embed": 16, "d_hidden": 16, "bidirectional": False,
                                "decoder": "bahdanau", "attention": "additive", "max_positions": 64}),
    "word2vec": ("word2vec", {"dim": 16, "min_count": 1}),
}

# task -> (the task name, the dev metric it writes)
TASKS = {"classification": ("sst2", "accuracy"), "pair": ("rte", "accuracy"), "regression": ("stsb", "spearman"),
         "tagging": ("conll2003", "f1"), "multiple_choice": ("swag", "accuracy")}
ALL_TASKS = {**TASKS, "span_qa": ("squad", "f1")}  # span QA: encoders with [CLS]/[SEP] only

YES = ([("lstm", t) for t in TASKS] + [("lstm", "tagging+crf")]
       + [("gru", "classification"), ("gru", "tagging"), ("rnn", "classification"), ("rnn", "regression")]
       + [("transformer_xl", t) for t in TASKS] + [("transformer", t) for t in TASKS] + [("seq2seq", t) for t in TASKS]
       + [("seq2seq_gru", "classification"), ("seq2seq_gru", "tagging")] + [("word2vec", t) for t in TASKS]
       + [("bert", t) for t in TASKS] + [("xlnet", t) for t in TASKS] + [("elmo", t) for t in TASKS] + [("gpt", t) for t in TASKS if t != "tagging"]
       + [(f, "span_qa") for f in ("bert", "xlnet", "elmo")])


@pytest.fixture(scope="module")
def tokenizer():
    lines = (SAMPLE / "SST-2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1:]
    texts = [line.split("\t")[0] for line in lines if line] + [" ".join(WORDS)] * 3
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=600, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer(texts, cfg)
    return tok, {**asdict(cfg), "kind": "wordpiece", "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}


def tiny_run(path: Path, name: str, tokenizer, seed: int = 0) -> Path:
    """A run directory holding a freshly initialised tiny model of `name` (TINY) and the tokenizer."""
    tok, meta = tokenizer
    family, section = TINY[name]
    cls = model_class(family)
    torch.manual_seed(seed)
    model = cls(cls.Config(vocab_size=tok.get_vocab_size(), **section))
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    save_model(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"family": family, "model": asdict(model.cfg), "objective": "bptt",
                                                  "tokenizer": meta}))
    return path


# ------------------------------------------------------------------ tiny task data


def write_data(root: Path, kind: str):
    """(data_dir, TaskOptions | None) of a tiny dataset of `kind` under root."""
    rng = random.Random(0)
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))  # noqa: E731
    if kind == "classification":
        return str(SAMPLE), None
    if kind in ("pair", "regression"):
        folder, label = ("RTE", "label") if kind == "pair" else ("STS-B", "score")
        d = root / folder
        d.mkdir(parents=True)
        value = (lambda i: ("entailment", "not_entailment")[i % 2]) if kind == "pair" else (lambda i: f"{i % 6:.1f}")
        head = "index\tsentence1\tsentence2"
        rows = lambda n, lab: [f"{i}\t{sentence()}\t{sentence()}" + (f"\t{value(i)}" if lab else "") for i in range(n)]  # noqa: E731
        (d / "train.tsv").write_text("\n".join([f"{head}\t{label}", *rows(24, True)]) + "\n")
        (d / "dev.tsv").write_text("\n".join([f"{head}\t{label}", *rows(12, True)]) + "\n")
        (d / "test.tsv").write_text("\n".join([head, *rows(5, False)]) + "\n")
        return str(root), None
    if kind.startswith("tagging"):  # tagging+crf: an LSTM-CRF tagger (Lample et al. 2016) on the LM's states
        d = root / "conll"
        d.mkdir(parents=True)
        for name, n in (("eng.train", 24), ("eng.testa", 12), ("eng.testb", 5)):
            lines = ["-DOCSTART- -X- -X- O", ""]
            for _ in range(n):
                lines += [f"{w} x x O" for w in sentence().split()]
                lines += [f"{rng.choice(['John', 'Mary'])} x x I-PER", f"{rng.choice(['Paris', 'London'])} x x I-LOC", ""]
            (d / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return str(d), TaskOptions(crf=True) if kind.endswith("crf") else None
    if kind == "span_qa":
        return None, squad_files(root, rng)
    d = root / "swag"  # multiple choice, swagaf's CSV layout
    d.mkdir(parents=True)
    files = {}
    for name, n, labeled in (("train", 16, True), ("val", 8, True), ("test", 4, False)):
        head = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source"]
        head += [f"ending{j}" for j in range(4)] + (["label"] if labeled else [])
        rows = [[str(i), "v", str(i), "a b", sentence(), "He", "gold", *[sentence() for _ in range(4)]] + ([str(i % 4)] if labeled else [])
                for i in range(n)]
        with open(d / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([head, *rows])
        files[name] = str(d / f"{name}.csv")
    return None, TaskOptions(train=files["train"], dev=files["val"], test=files["test"])


def squad_files(root: Path, rng: random.Random) -> TaskOptions:
    """SQuAD v1.1 JSON train and dev files: each question's answer is one word of its passage."""
    paragraphs = []
    for p in range(8):
        context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))
        qas = []
        for q, answer in enumerate(rng.sample(context.split(), 2)):
            start = f" {context} ".index(f" {answer} ")  # a whole word: the answer is never inside another
            qas.append({"id": f"p{p}q{q}", "question": f"where is {answer} ?",
                        "answers": [{"text": answer, "answer_start": start}]})
        paragraphs.append({"context": context, "qas": qas})
    root.mkdir(parents=True, exist_ok=True)
    for name in ("train", "dev"):
        (root / f"{name}.json").write_text(json.dumps({"version": "1.1", "data": [{"title": name, "paragraphs": paragraphs}]}))
    return TaskOptions(train=str(root / "train.json"), dev=str(root / "dev.json"), max_query_len=8, doc_stride=8)


# ------------------------------------------------------------------ the "yes" cells


@pytest.mark.parametrize("name,kind", YES)
def test_yes_cell_finetunes_and_writes_its_metric(tmp_path, tokenizer, name, kind):
    task, metric = ALL_TASKS[kind.split("+")[0]]
    run = tiny_run(tmp_path / name, name, tokenizer)
    data_dir, options = write_data(tmp_path / "data", kind)
    out = tmp_path / "ft"
    res = finetune(task, from_run=str(run), data_dir=data_dir, options=options, train__max_steps=3,
                   train__batch_size=8, optim__lr=1e-2, task__max_seq_len=32, out=str(out))
    saved = json.loads((out / "metrics.json").read_text())
    assert res["steps"] == 3 and saved["dev"][metric] == res["dev"][metric]
    assert math.isfinite(res["dev"][metric]) and math.isfinite(res["dev"]["loss"])
    assert res["test_predictions"], res  # the test split was predicted with the best weights
    model, _, cfg = load_finetuned(str(out))  # and the finetuned run loads back as it trained
    assert cfg["family"] == TINY[name][0] and cfg["finetune"]["task"] == task


def test_eval_only_rescores_an_lstm_finetune(tmp_path, tokenizer):
    run = tiny_run(tmp_path / "lstm", "lstm", tokenizer)
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=2, train__batch_size=8, out=str(tmp_path / "ft"))
    again = finetune("sst2", from_run=str(tmp_path / "ft"), data_dir=str(SAMPLE), eval_only=True, out=str(tmp_path / "ev"))
    assert again["dev"]["accuracy"] == pytest.approx(res["dev"]["accuracy"])


# ------------------------------------------------------------------ what the new rows read, by hand


def test_concat_pooling_is_last_max_and_mean_over_the_real_tokens():
    h = torch.tensor([[[1.0, -2.0], [3.0, 0.0], [-1.0, 5.0]],
                      [[2.0, 2.0], [9.0, 9.0], [9.0, 9.0]]])  # row 1: one real token, then padding (9s)
    lengths = torch.tensor([3, 1])
    got = pool(h, lengths, "concat")
    want = torch.tensor([[-1.0, 5.0, 3.0, 5.0, 1.0, 1.0],  # last; max; mean of row 0
                         [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]])  # the padding reaches none of them
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(pool(h, lengths, "last"), want[:, :2])
    torch.testing.assert_close(pool(h, lengths, "mean"), want[:, 4:])


@pytest.mark.parametrize("name", ["lstm", "transformer_xl", "transformer", "seq2seq", "seq2seq_gru"])
def test_each_example_is_read_alone(name, tokenizer, tmp_path):
    """A row's states do not depend on the rows batched with it, on its padding, or on what was read before."""
    from plmcli.runs import load_encoder

    run = tiny_run(tmp_path / name, name, tokenizer)
    model = load_encoder(run, json.loads((run / "config.json").read_text())).eval()
    a = torch.tensor([[5, 6, 7, 8, 9]])
    batch = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        alone = model.token_states(a, torch.ones_like(a))
        together = model.token_states(batch, mask)
        short = model.token_states(batch[1:, :3], mask[1:, :3])
        model.token_states(torch.tensor([[13, 14, 15, 16, 17]]))  # an earlier example leaves nothing behind
        again = model.token_states(a, torch.ones_like(a))
    torch.testing.assert_close(together[:1], alone)
    torch.testing.assert_close(together[1:, :3], short)
    torch.testing.assert_close(again, alone)


def test_seq2seq_encoder_states_by_hand():
    """The RNN encoder-decoder's transfer states, by hand with GRU cells: the forward direction from each row's first
    token, the backward one from each row's LAST REAL token (never from its padding); padding positions get zeros."""
    from plmcli.models.seq2seq import Seq2Seq, Seq2SeqConfig

    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=30, cell="gru", d_embed=6, d_hidden=8, bidirectional=True)).eval()
    assert model.traits.pooling == "mean" and model.traits.pair_layout == "causal"
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])

    def direction(suffix: str, xs: torch.Tensor) -> torch.Tensor:  # (n, E) -> (n, 4), from a zero state
        cell = torch.nn.GRUCell(6, 4)
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).data.copy_(getattr(model.encoder, f"{name}_l0{suffix}"))
        h, out = torch.zeros(1, 4), []
        for x in xs:
            h = cell(x[None], h)
            out.append(h[0])
        return torch.stack(out)

    with torch.no_grad():
        got = model.token_states(ids, mask)
        for b, n in enumerate((5, 3)):
            x = model.embed(ids[b, :n])
            want = torch.cat([direction("", x), direction("_reverse", x.flip(0)).flip(0)], -1)
            torch.testing.assert_close(got[b, :n], want)
            assert not got[b, n:].any()
        # and the padding changes nothing: a row alone, unpadded, reads the same
        torch.testing.assert_close(model.token_states(ids[1:, :3]), got[1:, :3])


def test_word2vec_heads_read_kims_cnn_over_the_word_vectors_and_train_them(tmp_path, tokenizer):
    """word2vec × a sequence head is Kim's (2014) CNN: filters over 3, 4 and 5 of the vectors v in order, ReLU, the
    largest value over each row's windows, dropout 0.5, the output layer; each row's logits are its own tokens', however
    far the batch pads it. Tagging reads each word's own v (Collobert et al.'s window); a finetune trains v (not the
    output vectors v', which no head reads)."""
    from plmcli.runs import load_encoder

    tok, meta = tokenizer
    run = tiny_run(tmp_path / "w2v", "word2vec", tokenizer)
    backbone = load_encoder(run, json.loads((run / "config.json").read_text()))
    obj = task_objective(get_task("sst2"), tok, meta["special_token_ids"], 32, type(backbone))
    model = obj.build_model(backbone).eval()
    assert model.frozen == ["backbone.output_vectors"] and model.head.in_features == 300 and len(model.deep) == 0
    assert model.dropout.p == 0.5 and [c.kernel_size[0] for c in model.conv.convs] == [3, 4, 5]
    ids = torch.tensor([[3, 20, 21, 4, 22, 23], [3, 22, 4, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    v = backbone.input_vectors
    with torch.no_grad():
        def kim(row):  # (n, C) vectors of one row's real tokens -> (300,)
            maps = []
            for conv in model.conv.convs:
                k = conv.kernel_size[0]
                x = torch.cat([row, torch.zeros(k - 1, row.shape[1])])  # a window past the row's end reads zeros
                w = conv.weight.permute(0, 2, 1).reshape(conv.out_channels, -1)  # (maps, k·C), window order
                windows = torch.stack([x[s:s + k].reshape(-1) for s in range(len(row))])  # one per real start
                maps.append((windows @ w.T + conv.bias).relu().amax(0))
            return torch.cat(maps)

        want = torch.stack([kim(v[ids[0]]), kim(v[ids[1, :3]])])
        got = model(ids, None, mask)
        torch.testing.assert_close(got, model.head(want))
        torch.testing.assert_close(model(ids[1:, :3], None, mask[1:, :3]), got[1:])  # alone, unpadded
    before = v.detach().clone()
    res = finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=3, train__batch_size=8, optim__lr=1e-2, out=str(tmp_path / "ft"))
    tuned, _, _ = load_finetuned(str(tmp_path / "ft"))
    assert res["steps"] == 3 and not torch.equal(tuned.backbone.input_vectors, before)
    torch.testing.assert_close(tuned.backbone.output_vectors, backbone.output_vectors)
    task = get_task("conll2003")
    task.restore({"tags": ["O", "B-PER", "I-PER"]})
    tagger = task_objective(task, tok, meta["special_token_ids"], 32, type(backbone)).build_model(backbone).eval()
    first = torch.tensor([[False, True, True, False]])
    case = torch.tensor([[0, 4, 2, 0]])  # "Word word": first letter uppercase, then all lowercase
    with torch.no_grad():
        scores, _ = tagger(ids[:1], mask[:1], first, case)
        # Collobert et al.'s window approach, w = 2: words i-2 .. i+2 (zeros and case 0 beyond the sentence), each
        # with its case embedding, through the same two hidden layers
        e, zero = tagger.case.weight, torch.zeros(16)
        words = [torch.cat([zero, e[0]])] * 2 + [torch.cat([v[ids[0, 1]], e[4]]), torch.cat([v[ids[0, 2]], e[2]])]
        words += [torch.cat([zero, e[0]])] * 2
        want = torch.stack([torch.cat(words[i:i + 5]) for i in range(2)])
        first, second = tagger.deep[0], tagger.deep[3]
        assert tagger.head.in_features == 5 * (16 + 5)
        torch.testing.assert_close(scores[0], tagger.head(second(first(want).relu()).relu()))


def test_elmo_span_head_reads_the_scalar_mix_of_each_window_alone(tmp_path, tokenizer):
    """ELMo × span QA: start / end logits are the head over ELMo's scalar mix of its layers, both directions of every
    token (the backward LM starts at each window's last real token, so the padding reaches no real token)."""
    from plmcli.objectives.qa import NEG
    from plmcli.runs import load_encoder

    tok, meta = tokenizer
    run = tiny_run(tmp_path / "elmo", "elmo", tokenizer)
    backbone = load_encoder(run, json.loads((run / "config.json").read_text()))
    obj = task_objective(get_task("squad", TaskOptions(max_query_len=8)), tok, meta["special_token_ids"], 32, type(backbone))
    model = obj.build_model(backbone).eval()
    cls, sep = meta["special_token_ids"]["cls"], meta["special_token_ids"]["sep"]
    ids = torch.tensor([[cls, 20, 21, sep, 22, 23, 24, sep], [cls, 25, sep, 26, sep, 0, 0, 0]])
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        got = model(ids, types, mask)  # (2, 8, 2)
        want = model.head(backbone.mix(backbone.layers(ids[:1])))  # by hand: Linear over the mixed layers
        torch.testing.assert_close(got[:1], want)
        torch.testing.assert_close(got[1, :5], model(ids[1:, :5], types[1:, :5], mask[1:, :5])[0])
        assert (got[1, 5:] == NEG).all()


def test_rnn_head_reads_ulmfit_concat_pooling(tmp_path, tokenizer):
    tok, meta = tokenizer
    run = tiny_run(tmp_path / "lstm", "lstm", tokenizer)
    from plmcli.runs import load_encoder

    backbone = load_encoder(run, json.loads((run / "config.json").read_text()))
    obj = task_objective(get_task("sst2", TaskOptions(aux_lm_weight=0)), tok, meta["special_token_ids"], 32,
                         type(backbone))
    model = obj.build_model(backbone).eval()
    assert model.head.in_features == 3 * 16 and model.frozen == ["backbone.lm_head.weight", "backbone.lm_head.bias"]
    ids = torch.tensor([[3, 20, 21, 22, 4], [3, 23, 4, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        got = model(ids, None, mask)
        want = []
        for row, n in zip(ids, (5, 3)):
            h = backbone.rnn(backbone.wte(row[None, :n]))[0][0]  # (n, H) from a zero state
            want.append(torch.cat([h[-1], h.max(0).values, h.mean(0)]))
        torch.testing.assert_close(got, model.head(torch.stack(want)))


def test_transformer_xl_reads_long_rows_in_segments_with_memory(tmp_path, tokenizer):
    """With eval_tgt_len 4 and mem_len ≥ the row, segments with memory give the whole row's causal attention."""
    from plmcli.models.transformer_xl import TransformerXL, TransformerXLConfig

    torch.manual_seed(0)
    whole = TransformerXL(TransformerXLConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32, mem_len=16)).eval()
    seg = TransformerXL(TransformerXLConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32, mem_len=16,
                                            eval_tgt_len=4)).eval()
    seg.load_state_dict(whole.state_dict())
    ids = torch.randint(0, 50, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(seg.token_states(ids), whole.token_states(ids), atol=1e-5, rtol=1e-5)
        # and a short memory forgets: the last segment no longer sees the first
        short = TransformerXL(TransformerXLConfig(vocab_size=50, n_layer=2, n_head=2, d_model=16, d_ff=32, mem_len=4,
                                                  eval_tgt_len=4)).eval()
        short.load_state_dict(whole.state_dict())
        assert not torch.allclose(short.token_states(ids)[:, 8:], whole.token_states(ids)[:, 8:])


def test_tags_sit_on_the_last_sub_token_of_a_left_to_right_row(tokenizer):
    from plmcli.objectives.tagging import IGNORE, Tagging, TaggingConfig

    tok, meta = tokenizer
    ids = meta["special_token_ids"]
    task = get_task("conll2003")
    task.restore({"tags": ["O", "B-PER", "I-PER"]})
    obj = Tagging(TaggingConfig(num_labels=3), tok, ids, 32, task=task, layout="causal")
    words = ["Smithsonianish", "met", "Mary"]
    arrays, _ = obj.encode_sentences([Sentence(words, [1, 0, 1], "s-0")])
    pieces = [tok.encode(w, add_special_tokens=False).ids for w in words]
    assert len(pieces[0]) > 1
    assert arrays["ids"].tolist() == [ids["bos"], *pieces[0], *pieces[1], *pieces[2], ids["eos"]]
    last = [len(pieces[0]), len(pieces[0]) + len(pieces[1]), len(pieces[0]) + len(pieces[1]) + len(pieces[2])]
    assert [i for i, f in enumerate(arrays["first"]) if f] == last
    assert [int(x) for x in arrays["labels"] if x != IGNORE] == [1, 0, 1]
    # each word's letter case (the window tagger's capitalization feature) sits where its tag does
    assert [int(c) for c, f in zip(arrays["case"], arrays["first"]) if f] == [4, 2, 4]
    assert not arrays["case"][~arrays["first"]].any()


def test_word_case_is_collobert_s_capitalization_feature():
    from plmcli.objectives.tagging import word_case

    got = [word_case(w) for w in ("1996", ",", "北京", "the", "EU", "I", "German", "iPhone", "McDonald")]
    assert got == [1, 1, 1, 2, 3, 3, 4, 5, 4]


# ------------------------------------------------------------------ the "no" cells

NEED_SEQ = ("an encoder run (bert, spanbert, albert, nezha, elmo, electra or xlnet), a causal LM run (gpt, rnn or transformer_xl) "
            "or a seq2seq, transformer or word2vec run")  # named from the registry, by traits
NEED_TOK = ("an encoder run (bert, spanbert, albert, nezha, elmo, electra or xlnet) or a run with per-token states (seq2seq, "
            "transformer, rnn, transformer_xl or word2vec)")
WHY = {
    "ngram": "counts n-grams and has no learned states to finetune",
    "nnlm": "is a fixed-window LM: each prediction sees only its n-1 previous tokens, no state reads a whole example",
}
NO = [(f, kind) for f in WHY for kind in ("classification", "pair", "regression", "tagging", "multiple_choice", "span_qa")] \
    + [(f, "span_qa") for f in ("gpt", "rnn", "transformer_xl", "transformer", "seq2seq", "word2vec")] + [("gpt", "tagging")]
QA_WHY = {**dict.fromkeys(("gpt", "rnn", "transformer_xl", "ngram", "nnlm"), "is a causal LM"),
          **dict.fromkeys(("transformer", "seq2seq"), "is an encoder-decoder: its tokenizer has no [CLS]/[SEP] to frame "
                                                      "span QA's [CLS] question [SEP] passage [SEP] windows"),
          "word2vec": "has no encoder to finetune"}


@pytest.mark.parametrize("family,kind", NO)
def test_no_cell_is_refused_in_one_line(tmp_path, tokenizer, family, kind):
    _, meta = tokenizer
    run = tmp_path / family
    run.mkdir()  # refused from config.json alone, before any weights or data are read
    (run / "config.json").write_text(json.dumps({"family": family, "model": {}, "tokenizer": meta}))
    (run / "model.safetensors").write_bytes(b"")
    task = "squad" if kind == "span_qa" else TASKS[kind][0]
    with pytest.raises(PlmError) as e:
        finetune(task, from_run=str(run), data_dir=str(tmp_path / "nothing"), out=str(tmp_path / "o"))
    msg = str(e.value)
    assert "\n" not in msg and not (tmp_path / "o").exists()
    if kind == "span_qa":  # a span needs every token to see the passage on both sides: encoders only
        assert f"{QA_WHY[family]} ({family}); finetuning on squad needs an encoder run" in msg, msg
    elif family == "gpt":  # GPT-style transfer reads one token per row
        assert f"is a causal LM (gpt); finetuning on conll2003 needs {NEED_TOK}" in msg, msg
        assert "gpt-mini" not in msg and "--recipe bert-mini`" in msg  # the hint names runs that can, only
    else:
        need = NEED_TOK if kind == "tagging" else NEED_SEQ
        assert f"{WHY[family]} ({family}); " in msg and f" needs {need} — " in msg, msg


def test_refusal_on_the_command_line(tmp_path, tokenizer):
    _, meta = tokenizer
    run = tmp_path / "ngram"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"family": "ngram", "model": {}, "tokenizer": meta}))
    (run / "model.safetensors").write_bytes(b"")
    res = cli("finetune", "--task", "sst2", "--from", run, "--data-dir", SAMPLE, "--out", tmp_path / "o")
    assert_clean_error(res, "counts n-grams and has no learned states to finetune (ngram)", "plm pretrain --recipe")
