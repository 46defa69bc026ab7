"""Random-access micro-batches: batch k of a stream is a pure function of (seed, k, rank).

That makes the data position one integer, so `--resume` skips consumed data in O(1), and a run on
2 processes sees exactly the samples of a 1-process run with accumulation 2 at the same global batch.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
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
        return epoch, int(self.permutation(epoch)[i])

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(epochs, indices) at an array of positions: `self(p)` for each, in array operations (a micro-batch's
        worth at a time: one Python call per sample was most of a small batch's cost)."""
        epochs, i = np.divmod(positions, self.n)
        if not self.shuffle:
            return epochs, i
        out = np.empty_like(i)
        for e in np.unique(epochs).tolist():
            at = epochs == e
            out[at] = self.permutation(e)[i[at]]
        return epochs, out

    def permutation(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s samples in stream order (the last epoch's kept)."""
        if epoch != self._epoch:
            self._perm, self._epoch = self.arrange(epoch), epoch
        return self._perm

    def arrange(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(self.n)


GROUP_SIZE = 256
"""Samples per length band: the order sorts each window by length, cuts it into bands and shuffles them (a
corpus of under GROUP_SIZE × GROUP_WINDOW samples gets smaller bands, GROUP_WINDOW to an epoch). The size
depends on the corpus alone, not on the micro batch, so the order is the same whatever the micro batch,
process count and accumulation: an optimizer step reads the same samples however its batch is split.
Micro-batches of up to a band pad within it; larger ones span bands of other lengths."""
GROUP_WINDOW = 50
"""Bands per length-sorting window (the megabatch of transformers' group_by_length): wide enough that a band
finds samples of its own length, narrow enough that the order stays random across the epoch."""


class LengthGroupedOrder(EpochOrder):
    """EpochOrder whose consecutive samples have similar lengths, so dynamic padding pads little.

    Each epoch's permutation is cut into windows of `window` bands of `group` samples; a window is sorted by
    length (longest first), cut into bands, and those are shuffled by (seed, epoch, window), so the lengths
    of successive bands stay random. Bands are aligned to multiples of `group` in the stream (an epoch of
    n % group ≠ 0 samples starts mid-band, and finishes the band the previous epoch began as drawn).
    Still a permutation per epoch and a pure function of (seed, position): resume and any process count,
    micro batch or accumulation read the same samples at the same positions.
    """

    def __init__(self, lengths, seed: int, group: int = GROUP_SIZE, window: int = GROUP_WINDOW):
        super().__init__(len(lengths), seed, shuffle=True)
        if group < 1 or window < 1:
            raise ValueError("group and window must be ≥ 1")
        # A small corpus gets smaller bands, so that an epoch still has `window` of them to shuffle (its batches
        # do not run from longest to shortest every epoch): a power of two, so that micro-batches of a power
        # of two samples align with them. Still a function of the corpus alone.
        size = max(1, min(group, len(lengths) // window))
        self.lengths, self.group, self.window = np.asarray(lengths), 1 << (size.bit_length() - 1), window

    def arrange(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s samples in stream order."""
        B, n = self.group, self.n
        perm = np.random.default_rng((self.seed, epoch)).permutation(n)
        head = min((-epoch * n) % B, n)  # the rest of a band the previous epoch began: left as drawn
        out = [perm[:head]]
        for w, lo in enumerate(range(head, n, B * self.window)):
            part = perm[lo : lo + B * self.window]
            part = part[np.argsort(-self.lengths[part], kind="stable")]
            full = len(part) // B  # a short tail (< B) only at the epoch's end: it stays last, as the next epoch expects
            shuffled = np.random.default_rng((self.seed, epoch, w)).permutation(full)
            out += [part[: full * B].reshape(full, B)[shuffled].reshape(-1), part[full * B :]]
        return np.concatenate(out)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity; every core where there is none: macOS, Windows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def to_device(batch: dict, device) -> dict:
    """A batch's tensors on `device` (copied without blocking: from pinned memory the copy overlaps the step);
    other values (a mix's source index) as they are."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def row_generators(prefix: list[int], rows: int) -> list[np.random.Generator]:
    """np.random.default_rng([*prefix, r]) for each row r < rows, the same generators: numpy converts a list of
    ints one Python int at a time, so a long prefix (a streamed batch's lane positions) is converted once, into
    the 32-bit words SeedSequence makes of it (each int little-endian, 0 as one word)."""
    head = _seed_words(prefix)
    return [np.random.default_rng(np.array(head + _seed_words([r]), dtype=np.uint32)) for r in range(rows)]


def _seed_words(ints) -> list[int]:
    words = []
    for v in ints:
        v = int(v)
        words.append(v & 0xFFFFFFFF)
        while v > 0xFFFFFFFF:
            v >>= 32
            words.append(v & 0xFFFFFFFF)
    return words


class BatchStream(torch.utils.data.Dataset):
    """`stream[k]` is this rank's k-th micro-batch. `fetch(epoch, indices)` builds it from samples.

    `lengths` (one per sample), when given, groups training batches by length (LengthGroupedOrder);
    an evaluation pass (shuffle=False) reads in order either way.
    """

    def __init__(self, num_samples: int, batch_size: int, fetch: Callable, seed: int = 0, rank: int = 0,
                 world: int = 1, shuffle: bool = True, lengths=None):
        if shuffle and lengths is not None:
            if len(lengths) != num_samples:
                raise ValueError(f"{len(lengths)} lengths for {num_samples} samples")
            self.order = LengthGroupedOrder(lengths, seed)
        else:
            self.order = EpochOrder(num_samples, seed, shuffle)
        self.batch_size, self.fetch, self.rank, self.world = batch_size, fetch, rank, world
        self.num_samples = num_samples

    def positions(self, k: int) -> range:
        g = k * self.world + self.rank  # global micro-batch id
        return range(g * self.batch_size, (g + 1) * self.batch_size)

    def __getitem__(self, k: int):
        r = self.positions(k)
        positions = np.arange(r.start, r.stop)
        if not self.order.shuffle:
            # An evaluation pass reads each sample once: the last batch is short, later ones empty.
            positions = positions[positions < self.num_samples]
            if not len(positions):
                return None
        epochs, indices = self.order.take(positions)
        return self.fetch(epochs.tolist(), indices.tolist())

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


class TokenBudgetStream(torch.utils.data.Dataset):
    """Micro-batches of a varying number of samples holding about `budget` tokens each (RoBERTa's
    DOC-SENTENCES: "we dynamically increase the batch size to achieve a similar number of total tokens as
    FULL-SENTENCES"). `stream[k]` is this rank's k-th micro-batch, as BatchStream's.

    An epoch is a fixed number of micro-batches, nb = Σ lengths / budget rounded, so the data position stays one
    integer (micro-batch g is batch g mod nb of epoch g div nb) and a resume skips in O(1). Each epoch the
    samples are permuted by (seed, epoch), sorted by length within windows of GROUP_WINDOW batches (so a
    batch pads little), cut where the running token count crosses multiples of Σ lengths / nb, and the
    batches are served in an order shuffled by (seed, epoch): a pure function of (seed, position).
    An evaluation pass (shuffle=False) reads the samples in order, cut the same way.
    """

    def __init__(self, lengths, budget: int, fetch: Callable, seed: int = 0, rank: int = 0, world: int = 1,
                 shuffle: bool = True, window: int = GROUP_WINDOW):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) < 1 or budget < 1:
            raise ValueError("a stream needs at least one sample and a budget of at least one token")
        total = int(self.lengths.sum())
        self.nb = min(len(self.lengths), max(1, round(total / budget)))  # batches average the budget
        self.fetch, self.seed, self.rank, self.world, self.shuffle = fetch, seed, rank, world, shuffle
        self.window, self.num_samples = window, len(self.lengths)
        self._epoch, self._arranged = -1, None

    def arrange(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Epoch `epoch`: (samples in cut order, nb + 1 cut points into it), batch b = samples[cut[b]:cut[b+1]]."""
        n, nb = len(self.lengths), self.nb
        if self.shuffle:
            perm = np.random.default_rng((self.seed, epoch)).permutation(n)
            span = -(-n * self.window // nb)  # samples per sorting window: about `window` batches
            perm = np.concatenate([p[np.argsort(-self.lengths[p], kind="stable")]
                                   for p in np.split(perm, np.arange(span, n, span))])
        else:
            perm = np.arange(n)
        cum = np.cumsum(self.lengths[perm])
        b = np.arange(1, nb)
        cut = np.searchsorted(cum, b * (cum[-1] / nb), side="left") + 1
        # every batch non-empty: cut b within [b, n - nb + b] and strictly rising
        cut = np.maximum.accumulate(np.clip(cut, b, n - nb + b) - b) + b
        return perm, np.concatenate([[0], cut, [n]])

    def __getitem__(self, k: int):
        g = k * self.world + self.rank  # global micro-batch id
        epoch, b = divmod(g, self.nb)
        if not self.shuffle and epoch:
            return None  # an evaluation pass reads each sample once
        if epoch != self._epoch:
            perm, cut = self.arrange(epoch)
            order = np.random.default_rng((self.seed, epoch, 1)).permutation(self.nb) if self.shuffle else np.arange(self.nb)
            self._arranged, self._epoch = (perm, cut, order), epoch
        perm, cut, order = self._arranged
        b = int(order[b])
        picks = perm[cut[b] : cut[b + 1]]
        return self.fetch([epoch] * len(picks), picks.tolist())

    def batches_per_epoch(self) -> int:
        return -(-self.nb // self.world)

    def __len__(self) -> int:
        return 2**62


# ----------------------------------------------------------------------------- loader workers

MAX_AUTO_WORKERS = 8
"""train.num_workers auto: at most this many per process (beyond it a builder rarely helps, and each holds a copy
of the stream's Python state)."""
PREFETCH = 4
"""Batches each worker builds ahead: the accelerator finds the next ones ready through a slow batch or a pause."""


def loader_workers(setting, accelerated: bool, cores: int | None = None, local_processes: int | None = None) -> int:
    """train.num_workers as a count. auto: none on a CPU-only run, whose model computes on the very cores a worker
    would take; beside an accelerator, the cores this process may run on shared among the training processes of
    its node (LOCAL_WORLD_SIZE), less one for the training process itself, at most MAX_AUTO_WORKERS, at least 1.
    Also none where workers are not forked (macOS, Windows): they would need the streams pickled."""
    if setting != "auto":
        return int(setting)
    if not accelerated or worker_context() is None:
        return 0
    cores = available_cores() if cores is None else cores
    local = local_processes or int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    return max(1, min(MAX_AUTO_WORKERS, cores // max(1, local) - 1))


class WorkerStart:
    """What every loader worker does first, then `then(worker_id)` (e.g. ignore stop signals).

    The tokenizers' thread pool does not survive a fork: a worker that encodes through it hangs, even where the
    user asked for TOKENIZERS_PARALLELISM=true, so each worker encodes on its own thread."""

    def __init__(self, then: Callable[[int], None] | None = None):
        self.then = then

    def __call__(self, worker_id: int) -> None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        if self.then is not None:
            self.then(worker_id)


def worker_context():
    """How workers start: forked where the platform forks safely (Linux), so that a stream's memory maps, Arrow
    tables and closures are inherited as they are, never pickled or copied; elsewhere the platform's default."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return None


def batch_loader(dataset, workers: int, *, sampler=None, pin_memory: bool = False, worker_init_fn=None,
                 persistent: bool = False, seed: int = 0) -> torch.utils.data.DataLoader:
    """A DataLoader over a stream's ready micro-batches (batch_size None): with `workers`, built that many at a time
    in worker processes, PREFETCH each ahead, handed over in order. `persistent` keeps the workers between two
    passes of a loader iterated more than once."""
    extra = {}
    if workers:
        # Set before the fork so that the workers inherit it: the tokenizers library warns at every fork otherwise.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        extra = dict(prefetch_factor=PREFETCH, persistent_workers=persistent, multiprocessing_context=worker_context(),
                     worker_init_fn=WorkerStart(worker_init_fn))
    # Its own generator: creating the iterator would otherwise draw from the global RNG (its base seed), and after
    # a resume restored that RNG, every later dropout mask would shift.
    return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=workers,
                                       pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed), **extra)
