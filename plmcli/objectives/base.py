"""What every objective provides to the one loop (ARCHITECTURE.md, "The seams")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StepOutput:
    loss: torch.Tensor
    """Scalar to backpropagate (mean over this micro-batch's predicted tokens)."""
    metrics: dict
    """Detached tensors summed over the run: each is divided by `count` when logged."""
    count: torch.Tensor
    """How many predictions `loss` averages (the weight of this micro-batch in a mean)."""
    state: Any = None
    """Carried to the next micro-batch (RNN hidden state, Transformer-XL memory); None if stateless."""
    parts: dict | None = None
    """`loss` split by what each part averages over: name (a key of `Objective.loss_counts`) -> that part's
    weighted mean over this micro-batch, the parts summing to `loss`. None: one part, "loss"."""


class Objective:
    """What the one loop (plmcli.train.loop) and the pretrain pipeline call: owns masking, collation and loss.
    Subclasses set `Config` and implement the methods below. A finetuning objective is a TaskObjective
    (objectives/task.py), which adds what the finetune pipeline calls.

    An objective that can train on text streamed as it trains (`plm pretrain --streaming`, data/streaming.py)
    also has `window_size()` (tokens per row read from the stream), `window_batch(x, key, seed)` (a (B, W)
    tensor of token windows -> a training batch; `key`, the stream position, seeds anything random) and
    `streaming_problem(cfg)` (a staticmethod: None, or (message, fix) when its settings cannot stream).
    """

    Config: type
    default_data = "shakespeare-sample.txt"
    """The shipped sample (in plmcli/corpus/) that pretrain uses when no --data is given."""
    ppl_metric = "loss"
    """The metric whose exponential is reported as perplexity (MLM with NSP: the MLM part only)."""

    def __init__(self, cfg, tokenizer, special_ids: dict[str, int], seq_len: int):
        self.cfg, self.tokenizer, self.special_ids, self.seq_len = cfg, tokenizer, special_ids, seq_len

    def configure_model(self, model_cfg, vocab_size: int) -> None:
        """Fill in model settings the data decides before the model is built: vocab_size 0 = the tokenizer's."""
        if model_cfg.vocab_size == 0:
            model_cfg.vocab_size = vocab_size

    def separator(self) -> int | None:
        """The token that ends a document in a flat token stream (eos, else sep, else bos)."""
        for role in ("eos", "sep", "bos"):
            if role in self.special_ids:
                return self.special_ids[role]
        return None

    @staticmethod
    def prepare_corpus(inputs, tokenizer_cfg, data_cfg):
        """Raw inputs (or a ready directory) -> a directory with meta.json (its `tokenizer` entry) and
        tokenizer.json. Plain documents by default; objectives on other data (parallel text) override it."""
        from plmcli.data.corpus import prepare_corpus

        return prepare_corpus(inputs, tokenizer_cfg, data_cfg)

    def prepare(self, corpus_dir, cache_root, num_proc: int = 1):
        """Turn a tokenized corpus into this objective's training data (e.g. static masked instances);
        returns the directory `stream` reads. Runs on the main process first, cached."""
        return corpus_dir

    def check_positions(self, model) -> None:
        """The model's usable positions (after any offset, e.g. RoBERTa's) must hold a training sequence."""
        from plmcli.errors import PlmError

        if self.seq_len > model.max_positions:
            raise PlmError(f"train.seq_len {self.seq_len} exceeds the model's {model.max_positions} positions",
                           f"--set train.seq_len={model.max_positions}, or raise model.max_positions")

    def check_model(self, model) -> None:
        """Raise PlmError when the model cannot serve this objective."""

    def stream(self, corpus_dir, split: str, batch_size: int, seed: int, rank: int, world: int, shuffle: bool):
        raise NotImplementedError

    def step(self, model, batch: dict, state=None) -> StepOutput:
        raise NotImplementedError

    def init_state(self):
        return None

    def loss_counts(self, batch: dict) -> dict[str, torch.Tensor]:
        """For each part of `step`'s loss (StepOutput.parts), how many targets this micro-batch holds: tokens,
        or examples for a sequence-level part. Read from the batch alone, before any forward, with no host read.

        The loop divides each part's sum by its count over the optimizer step's micro-batches on every
        process, so a step's loss is a mean per target as one big batch would give it, however the batch
        is split over accumulation and processes (padding and masking leave micro-batches uneven)."""
        raise NotImplementedError

    def tokens_in(self, batch: dict) -> int:
        return int(batch["input_ids"].numel())

    def evaluate(self, accelerator, model, stream, max_batches: int) -> dict | None:
        """Validation metrics that need every prediction (MCC, F1, span matches), or None: the loop then
        reports the token-weighted means of `step`'s metrics."""
        return None


class Mixes(Objective):
    """An objective whose batches are independent samples (data/mixing.py BlendsSources): `stream` reads a mix
    directory's sources blended by weight (mixing.blended_stream, from `samples` and `collate`), any other
    directory through `corpus_stream`, the objective's own stream of one corpus."""

    def stream(self, corpus_dir, split: str, batch_size: int, seed: int, rank: int, world: int, shuffle: bool):
        from plmcli.data.mixing import blended_stream

        mixed = blended_stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle)
        return mixed if mixed is not None else self.corpus_stream(corpus_dir, split, batch_size, seed, rank, world, shuffle)

    def corpus_stream(self, corpus_dir, split: str, batch_size: int, seed: int, rank: int, world: int, shuffle: bool):
        """The stream of one corpus: its samples, batch_size at a time, collated."""
        return self.batch_stream(*self.samples(corpus_dir, split, seed, shuffle, needed=True), batch_size, seed, rank,
                                 world, shuffle)

    def batch_stream(self, n: int, fetch, batch_size: int, seed: int, rank: int, world: int, shuffle: bool):
        """A BatchStream of `n` samples read by `fetch` (what `samples` gives) and collated."""
        from plmcli.data.batching import BatchStream

        return BatchStream(n, batch_size, lambda epochs, idx: self.collate([fetch(epochs, idx)]), seed, rank, world, shuffle)

    def samples(self, data_dir, split: str, seed: int, shuffle: bool, needed: bool):
        """(samples in `split` of one source's directory, fetch(epochs, indices) -> their rows): BlendsSources."""
        raise NotImplementedError

    def collate(self, parts: list) -> dict:
        """Rows of one or more sources -> one batch (default: dicts of equal-width tensors concatenated)."""
        from plmcli.data.mixing import concatenated

        return concatenated(parts)

    @staticmethod
    def mix_problem(cfg):
        """(message, fix) when these settings cannot train on a mix, else None."""
        return None


class NoBatches:
    """A validation stream with nothing in it (its documents too short for any instance): the loop's evaluation
    reads zero batches from it, where a BatchStream would refuse to be built."""

    num_samples = 0

    def batches_per_epoch(self) -> int:
        return 0

    def __getitem__(self, k):
        return None
