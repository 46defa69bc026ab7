"""Batches built in DataLoader workers are the batches the training process builds itself: bitwise, for every
objective, through a resume and over two processes (ARCHITECTURE.md, "GPU first": batches are built in workers)."""

import itertools
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import finetune, tiny_corpus
from plm_process import start_ranks
from plmcli import api
from plmcli.config import load_recipe
from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data import batching
from plmcli.data.batching import CountFrom, WorkerStart, batch_loader, loader_workers, row_generators
from plmcli.data.streaming import TextStream, prepare_stream_corpus
from plmcli.pipelines.pretrain import prepare
from plmcli.train.distributed import process_state

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.d_ff=64", "tokenizer.vocab_size=300",
        "train.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=0"]
XLNET = [*TINY, "objective.reuse_len=16", "objective.num_predict=5", "objective.perm_size=0", "model.mem_len=16"]
CHINESE = ["tokenizer.vocab_size=2000"]
# (recipe, overrides, on the tiny corpus? (else the recipe's shipped sample))
OBJECTIVES = {
    "mlm static (NSP)": ("bert-mini", [*TINY, "objective.dupe_factor=1"], True),
    "mlm dynamic, whole words": ("bert-mini", [*TINY, "objective.dynamic=true", "objective.pairs=none",
                                               "objective.masking=wwm"], True),
    "mlm dynamic, full sentences": ("roberta-mini", TINY, True),
    "mlm dynamic, doc sentences": ("roberta-mini", [*TINY, "objective.packing=doc_sentences"], True),
    "spanbert": ("spanbert-mini", TINY, True),
    "ernie units": ("ernie-chinese-mini", [*TINY, *CHINESE, "objective.dynamic=true", "objective.pairs=none",
                                           "objective.masking=knowledge", "objective.knowledge_units=entities"], False),
    "ernie2, knowledge masking": ("ernie2-chinese-mini", [*TINY, *CHINESE, "objective.dupe_factor=1",
                                                          "objective.masking=knowledge",
                                                          "objective.lexicon=chinese-sample-entities.txt"], False),
    "xlnet": ("xlnet-mini", XLNET, True),
    "electra": ("electra-mini", TINY, True),
    "tbptt (transformer-xl)": ("txl-mini", [], True),
    "elmo": ("elmo-mini", [], True),
    "translation": ("transformer-mini", [], False),
    "denoising": ("transformer-mini-denoising", [], True),
    "clm": ("gpt-mini", [], True),
}


def _same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _take(loader, n: int) -> list:
    return list(itertools.islice(loader, n))


@pytest.mark.parametrize("name", OBJECTIVES)
def test_workers_build_the_batches_the_training_process_would(name, tmp_path):
    """Micro-batches 3..8 (a resume's start, not 0) from two workers equal those built in the process, bitwise."""
    recipe, overrides, tiny = OBJECTIVES[name]
    r = load_recipe(recipe, overrides)
    data = [str(tiny_corpus(tmp_path / "c.txt", n_docs=60))] if tiny else None
    prep = prepare(r, [r], data, False, process_state())
    stream = prep.objectives[0].stream(prep.data_dirs[0], "train", 4, r.train.seed, 0, 1, True)
    alone = _take(batch_loader(stream, 0, sampler=CountFrom(3)), 6)
    forked = _take(batch_loader(stream, 2, sampler=CountFrom(3)), 6)
    assert len(alone) == len(forked) == 6
    assert all(_same(a, b) for a, b in zip(alone, forked))


def test_streamed_batches_do_not_depend_on_the_workers_that_read_them(tmp_path):
    """Four readers served by 0, 1 or 2 workers (3 are lowered to 2: a worker serves whole readers) give the
    same batches in the same order; `auto` takes its readers from the first loader's workers."""
    chars = TokenizerConfig(kind="char", vocab_size=200, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})
    d = prepare_stream_corpus([str(tiny_corpus(tmp_path / "c.txt", n_docs=60))], chars, DataConfig(val_fraction=0.0),
                              cache_root=tmp_path / "cache")
    tok_json = (d / "tokenizer.json").read_text()

    def window(x, key):
        return {"input_ids": x, "key": torch.tensor(key)}

    def batches(readers, workers):
        stream = TextStream(d, tok_json, 0, 9, 3, 0, 1, readers, window)
        got = _take(stream.loader(workers), 10)
        return stream, [b["input_ids"] for b in got]

    _, want = batches(4, 0)
    assert len({b.numpy().tobytes() for b in want}) == 10
    for workers in (1, 2, 3):
        stream, got = batches(4, workers)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), workers
        assert stream.first == 10 % 4
    auto, _ = batches("auto", 2)
    assert auto.readers == 2 and auto.state_dict()["readers"] == 2


def test_auto_workers_leave_a_cpu_run_its_cores_and_feed_an_accelerator():
    assert loader_workers("auto", accelerated=False, cores=64) == 0
    assert loader_workers("auto", accelerated=True, cores=16, local_processes=1) == 8
    assert loader_workers("auto", accelerated=True, cores=16, local_processes=2) == 7
    assert loader_workers("auto", accelerated=True, cores=16, local_processes=8) == 1
    assert loader_workers("auto", accelerated=True, cores=4, local_processes=8) == 1  # at least one
    assert loader_workers(3, accelerated=False) == 3 and loader_workers(0, accelerated=True) == 0
    with pytest.raises(Exception, match="train.num_workers -1 must be ≥ 0 or auto"):
        load_recipe("gpt-mini", ["train.num_workers=-1"])
    assert load_recipe("gpt-mini").train.num_workers == "auto"


@pytest.mark.e2e
def test_a_worker_encodes_on_its_own_thread_then_runs_the_loop_s_start(monkeypatch):
    """The tokenizers' thread pool does not survive a fork: a worker encodes without it, whatever the user set."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    seen = []
    WorkerStart(seen.append)(1)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false" and seen == [1]


ROBERTA = [*TINY, "train.max_steps=6", "train.save_every=3", "train.eval_every=3", "train.eval_batches=1",
           "train.log_every=1", "data.val_fraction=0.2"]


def test_a_run_built_by_workers_resumes_bitwise(tmp_path):
    """Dynamic masking (RoBERTa) with two workers, stopped after step 3 and resumed with two, ends with the weights
    of an uninterrupted run that built its batches in the training process."""
    corpus = str(tiny_corpus(tmp_path / "c.txt", n_docs=60))
    api.pretrain("roberta-mini", [corpus], str(tmp_path / "full"), overrides=[*ROBERTA, "train.num_workers=0"])
    workers = [*ROBERTA, "train.num_workers=2"]
    api.pretrain("roberta-mini", [corpus], str(tmp_path / "cut"), overrides=workers, stop_after=3)
    api.pretrain(out=str(tmp_path / "cut"), resume=True, overrides=["train.num_workers=2"])
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.distributed
def test_two_processes_with_workers_take_the_steps_of_one_with_accumulation(tmp_path):
    """2 gloo processes, each with two workers, against 1 process with accumulation 2 and none: the same weights."""
    corpus = tiny_corpus(tmp_path / "c.txt", n_docs=60)
    split = [*ROBERTA, "train.micro_batch_size=2"]
    api.pretrain("roberta-mini", [str(corpus)], str(tmp_path / "one"), overrides=[*split, "train.num_workers=0"])
    sets = [a for kv in [*split, "train.num_workers=2"] for a in ("--set", kv)]
    procs = start_ranks(tmp_path, 2, "pretrain", "--recipe", "roberta-mini", "--data", corpus, "--out", tmp_path / "two",
                        *sets)
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    a, b = load_file(str(tmp_path / "one" / "model.safetensors")), load_file(str(tmp_path / "two" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7)


def test_finetuning_with_workers_trains_as_without(tmp_path, monkeypatch):
    """Finetuning runs THE loop: with `auto` giving two workers (as beside a GPU), the same finetuned weights."""
    from test_finetune import SAMPLE, SPECIALS, make_run  # the shipped GLUE sample, its specials, a run around a model

    from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
    from plmcli.models.bert import Bert, BertConfig

    lines = (SAMPLE / "SST-2" / "train.tsv").read_text(encoding="utf-8").split("\n")[1:]
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=400, min_frequency=1, lowercase=True, special_tokens=SPECIALS)
    tok = train_tokenizer([line.split("\t")[0] for line in lines if line], cfg)
    meta = {"kind": "wordpiece", "special_token_ids": special_token_ids(tok, resolve_special_tokens(cfg))}
    torch.manual_seed(0)
    run = make_run(tmp_path / "bert", "bert", Bert(BertConfig(vocab_size=tok.get_vocab_size(), max_positions=48, n_layer=1,
                                                              n_head=2, d_model=16)), tok, meta)
    results, asked = [], []
    for workers in (0, 2):
        monkeypatch.setattr(batching, "loader_workers", lambda setting, accelerated, n=workers: asked.append(n) or n)
        out = tmp_path / f"w{workers}"
        results.append(finetune("sst2", from_run=str(run), data_dir=str(SAMPLE), train__max_steps=4, train__batch_size=8, out=str(out)))
    a, b = (load_file(str(tmp_path / f"w{w}" / "model.safetensors")) for w in (0, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert results[0]["dev"] == results[1]["dev"] and asked == [0, 2]


def test_row_generators_are_the_generators_their_lists_seed():
    """A streamed batch's masks: one generator per row from its lane positions, the long prefix converted once."""
    prefix = [1337, 11, 0, 5, 2**32 - 1, 2**32, 2**40 + 7, 2**70 + 3, *range(100, 260)]
    for r, rng in enumerate(row_generators(prefix, 4)):
        assert (rng.random(8) == np.random.default_rng([*prefix, r]).random(8)).all()
