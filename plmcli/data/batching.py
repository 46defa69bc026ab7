"""Random-access micro-batches: batch k of a stream is a pure function of (seed, k, rank).

That makes the data position one integer, so `--resume` skips consumed data in O(1), and a run on
2 processes sees exactly the samples of a 1-process run with accumulation 2 at the same global batch.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch


class EpochOrder:
    """Sample position p -> (epoch, index): each epoch a fresh permutation seeded by (seed, epoch)."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        if n < 1:
            raise ValueError("a stream needs at least one sample")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._epoch, self._perm = -1, None

    def __call__(self, pos: int) -> tuple[int, int]:
        epoch, i = divmod(pos, self.n)
        if not self.shuffle:
            return epoch, i
        if epoch != self._epoch:
            self._perm = np.random.default_rng((self.seed, epoch)).permutation(self.n)
            self._epoch = epoch
        return epoch, int(self._perm[i])


class BatchStream(torch.utils.data.Dataset):
    """`stream[k]` is this rank's k-th micro-batch. `fetch(epoch, indices)` builds it from samples."""

    def __init__(self, num_samples: int, batch_size: int, fetch: Callable, seed: int = 0, rank: int = 0,
                 world: int = 1, shuffle: bool = True):
        self.order = EpochOrder(num_samples, seed, shuffle)
        self.batch_size, self.fetch, self.rank, self.world = batch_size, fetch, rank, world
        self.num_samples = num_samples

    def positions(self, k: int) -> range:
        g = k * self.world + self.rank  # global micro-batch id
        return range(g * self.batch_size, (g + 1) * self.batch_size)

    def __getitem__(self, k: int):
        positions = self.positions(k)
        if not self.order.shuffle:
            # An evaluation pass reads each sample once: the last batch is short, later ones empty.
            positions = [p for p in positions if p < self.num_samples]
            if not positions:
                return None
        picks = [self.order(p) for p in positions]
        return self.fetch([e for e, _ in picks], [i for _, i in picks])

    def batches_per_epoch(self) -> int:
        """Micro-batches per rank that cover the samples once (the last one may be partial)."""
        return -(-self.num_samples // (self.batch_size * self.world))

    def __len__(self) -> int:  # DataLoader wants one; the stream itself is endless
        return 2**62


class CountFrom(torch.utils.data.Sampler):
    """Yields start, start+1, ... (optionally up to stop): where the loop resumes reading."""

    def __init__(self, start: int, stop: int | None = None):
        self.start, self.stop = start, stop

    def __iter__(self) -> Iterator[int]:
        k = self.start
        while self.stop is None or k < self.stop:
            yield k
            k += 1
