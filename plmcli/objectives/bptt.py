"""Truncated backpropagation through time over parallel token streams: the objective of stateful LMs,
the RNN LMs (their hidden state) and Transformer-XL (its memory).

The layout is Zaremba et al.'s PTB reader. The split's token stream (eos after every document; with
`data.doc_per_line` after every line) is cut into S = B·world equal contiguous streams, B = the micro
batch; rank r reads streams r·B .. r·B+B-1. Micro-batch k holds segment k of each of its streams:
bptt_len = `train.seq_len` tokens as input and the same shifted by one as labels. Consecutive micro-batches
therefore continue each other row by row, and the state the loop carries between them is every row's
true history.

- `step` detaches the incoming state: gradients stop at the segment boundary (truncated BPTT), values
  flow on. Gradient clipping is the recipe's `train.grad_clip`.
- Training: an epoch is (L-1) // bptt_len segments of a stream of L tokens (a last partial segment is
  dropped, as in Zaremba's reader); epochs wrap around, and at each epoch's first segment the state
  restarts from zeros, because the streams restart from their beginnings.
- Evaluation (shuffle=False): one pass, the last segment shorter; only the < S tokens past S·L at the
  end of the split are left out.
- Gradient accumulation: the micro-batches of one optimizer step are consecutive segments of the same
  streams, so one step learns from accum·bptt_len tokens per stream, each segment truncated.
- Resume: the loop does not checkpoint the carried state. A resumed run continues the data where it
  stopped but from a zero state, a one-segment hiccup like the start of an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.device import host_values
from plmcli.models.registry import families_that, named
from plmcli.objectives.base import Objective, StepOutput
from plmcli.objectives.clm import stateless_causal


@dataclass
class BPTTConfig:
    """No settings: bptt_len is train.seq_len, the number of streams the micro batch."""


class SegmentStream(torch.utils.data.Dataset):
    """`stream[k]`: segment k of this rank's `batch_size` streams (random access: the position is k)."""

    def __init__(self, tokens: np.ndarray, batch_size: int, bptt_len: int, rank: int = 0, world: int = 1,
                 train: bool = True, split: str = "train"):
        n_streams = batch_size * world
        L = len(tokens) // n_streams
        if L < 2 or (train and L - 1 < bptt_len):
            need = n_streams * (bptt_len + 1 if train else 2)
            raise PlmError(f"the {split} split has {len(tokens)} tokens, too few for {n_streams} streams"
                           + (f" of {bptt_len}+1 tokens" if train else " of 2 tokens"),
                           f"need ≥ {need}: add text, lower train.global_batch_size / train.seq_len, or raise data.val_fraction")
        # (S, L) view of the memmap, then this rank's rows: nothing is read until a segment is.
        self.data = np.asarray(tokens[: n_streams * L]).reshape(n_streams, L)[rank * batch_size : (rank + 1) * batch_size]
        self.bptt_len, self.train, self.stream_len = bptt_len, train, L
        self.num_segments = (L - 1) // bptt_len if train else -(-(L - 1) // bptt_len)

    def __getitem__(self, k: int):
        epoch, seg = divmod(k, self.num_segments)
        if not self.train and epoch > 0:
            return None  # an evaluation pass reads each segment once
        start = seg * self.bptt_len
        end = min(start + self.bptt_len, self.stream_len - 1)
        window = np.array(self.data[:, start : end + 1], dtype=np.int64)  # (B, t+1)
        x = torch.from_numpy(window)
        # Contiguous, and the window as ints too, which stay on the host: an adaptive softmax and adaptive input
        # count the words of each cluster there (models/adaptive.py) instead of asking the device.
        return {"input_ids": x[:, :-1].contiguous(), "labels": x[:, 1:].contiguous(), "reset": seg == 0,
                "tokens": window.tolist()}

    def batches_per_epoch(self) -> int:
        return self.num_segments

    def __len__(self) -> int:  # DataLoader wants one; a training stream is endless
        return 2**62


def detach_state(state):
    """The same state cut from the graph that produced it: (h, c) tuples, lists and tensors."""
    if state is None:
        return None
    if torch.is_tensor(state):
        return state.detach()
    return type(state)(detach_state(s) for s in state)


class TruncatedBPTT(Objective):
    Config = BPTTConfig

    def check_model(self, model):
        if not traits_of(model).stateful:
            raise PlmError(f"{type(model).__name__} carries no recurrent state between segments",
                           f"use objective.name: bptt with family {named(families_that(lambda c: c.traits.stateful))}, or clm "
                           f"for stateless causal models ({named(families_that(stateless_causal), 'and')})")

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        from plmcli.data.corpus import token_stream

        tokens = token_stream(corpus_dir, split, self.separator())
        return SegmentStream(tokens, batch_size, self.seq_len, rank, world, train=shuffle, split=split)

    def loss_counts(self, batch):
        return {"loss": torch.tensor(batch["labels"].numel())}

    def step(self, model, batch, state=None):
        # A new epoch restarts the streams, so their history is gone; otherwise keep the values, cut the graph.
        state = None if bool(batch.get("reset", False)) else detach_state(state)
        labels = batch["labels"]
        # The model scores the labels itself: an adaptive softmax (Transformer-XL) computes only the
        # clusters the targets fall in, which logits for the whole vocabulary would not allow.
        window = np.asarray(batch.get("tokens", []))  # the host's copy of the (B, t+1) window, when it came
        ids_host, labels_host = (window[:, :-1], window[:, 1:]) if window.ndim == 2 else (None, None)
        with host_values(batch["input_ids"], ids_host), host_values(labels, labels_host):
            nll, state = model(batch["input_ids"], state, labels=labels)  # (B, T)
        loss = nll.mean()
        count = labels.new_full((), labels.numel())  # filled on the device, not copied from the host
        return StepOutput(loss, {"loss": loss.detach() * count}, count, state)
