"""Counting: the objective of n-gram models, which are fitted by counting (`model.fit`), not by the loop.

It only takes part in what pretrain shares with the other families: the corpus is prepared (tokenized) as
for any objective, the tokenizer's size is recorded in the model config, and the model is checked to be
one that fits itself. Its settings live in the model section (order, smoothing, k, min_count).
"""

from __future__ import annotations

from dataclasses import dataclass

from plmcli.errors import PlmError
from plmcli.models.base import Fits
from plmcli.models.registry import families_that, named
from plmcli.objectives.base import Objective


@dataclass
class CountingConfig:
    """No settings: an n-gram's choices are model settings (model.order, model.smoothing, model.k, model.min_count)."""


class Counting(Objective):
    Config = CountingConfig

    def check_model(self, model):
        if not isinstance(model, Fits):
            raise PlmError(f"{type(model).__name__} is trained by gradient descent, not by counting",
                           f"use objective.name: counts only with a family that fits itself "
                           f"({named(families_that(lambda c: issubclass(c, Fits)))})")

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        raise PlmError("the counts objective has no batches: its models (n-gram, word2vec) fit themselves",
                       "train it with `plm pretrain` (which calls the model's fit)")
