"""Causal language modelling: predict token t+1 from tokens ≤ t (GPT, GPT-2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.registry import families_that, named
from plmcli.objectives.base import Mixes, StepOutput


def stateless_causal(model_cls) -> bool:
    """The families clm trains: causal LMs that carry no state across batches and learn by gradient."""
    return model_cls.traits.causal and not (model_cls.traits.stateful or model_cls.traits.counts)


@dataclass
class CLMConfig:
    shift_windows: bool = True
    """Each epoch starts its windows at a new random offset, so a model sees new token alignments
    instead of the same chunks again."""


class CausalLM(Mixes):
    Config = CLMConfig

    def check_model(self, model):
        if not traits_of(model).causal:
            raise PlmError(f"{type(model).__name__} is not a causal LM", f"use objective.name: clm with a causal family "
                           f"({named(families_that(stateless_causal))})")
        if traits_of(model).stateful:
            raise PlmError(f"{type(model).__name__} is a recurrent LM that carries state", "use objective.name: bptt")

    # ------------------------------------------------------------ plm pretrain --streaming (data/streaming.py)

    def window_size(self) -> int:
        return self.seq_len + 1

    def window_batch(self, x: torch.Tensor, key, seed: int = 0) -> dict:
        """Windows of T+1 tokens -> inputs and next-token targets, as `stream` makes them."""
        return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

    @staticmethod
    def streaming_problem(cfg):
        return None

    def samples(self, data_dir, split, seed, shuffle, needed):
        """One source of a mix: its windows (data/mixing.py)."""
        return self.windows(data_dir, split, seed, shuffle, needed)

    def windows(self, corpus_dir, split: str, seed: int, shuffle: bool, needed: bool = True):
        """(windows of T+1 tokens in `split`, fetch(epochs, indices) -> their batch). `needed`: none is an error."""
        from plmcli.data.corpus import token_stream

        tokens = token_stream(corpus_dir, split, self.separator())
        T = self.seq_len
        # Windows of T+1 tokens (input + shifted target); reserving T-1 tokens of slack keeps the
        # window count the same in every epoch whatever the epoch's offset.
        n = (len(tokens) - T) // T if self.cfg.shift_windows and shuffle else (len(tokens) - 1) // T
        if n < 1 and needed:
            raise PlmError(
                f"the {split} split has {len(tokens)} tokens, too few for one sequence of {T}+1",
                "add text, lower train.seq_len, or lower data.val_fraction",
            )
        shift = self.cfg.shift_windows and shuffle
        offsets: dict[int, int] = {}  # epoch -> its window offset; a generator per row cost more than the row's copy

        def offset(e: int) -> int:
            if e not in offsets:
                offsets[e] = int(np.random.default_rng((seed, e, 7)).integers(T)) if shift else 0
            return offsets[e]

        def fetch(epochs, indices):
            starts = np.array([offset(e) for e in epochs], dtype=np.int64) + np.asarray(indices, dtype=np.int64) * T
            x = torch.from_numpy(np.asarray(tokens[starts[:, None] + np.arange(T + 1)], dtype=np.int64))  # (B, T+1)
            return {"input_ids": x[:, :-1], "labels": x[:, 1:]}

        return max(n, 0), fetch

    def loss_counts(self, batch):
        return {"loss": (batch["labels"] != -100).sum()}

    def step(self, model, batch, state=None):
        labels = batch["labels"]
        # The model takes the loss itself: GPT's fused head never holds the (B, T, V) logits.
        loss = model(batch["input_ids"], labels=labels)
        count = (labels != -100).sum()
        return StepOutput(loss, {"loss": loss.detach() * count}, count)
