"""Weighted data mixing: `--data a.txt:0.7 --data b.txt:0.3` (or the recipe's `data.mix`) draws training sequences
from several sources in those shares, as Megatron's BlendedDataset and litgpt's CombinedStreamingDataset do.

Sources. A `--data` argument that names an existing path (or '-') is a path whatever colons it holds; otherwise a
number after its last colon is its weight (`C:\\corpus` and a Hub name `name:config` stay names). An argument
without a weight among weighted ones weighs 1; weights are normalised to sum 1. Without any weight the inputs are
one concatenated corpus, as before.

The order (`Blend`). Sample i of the mix goes to the source whose share so far lags its weight most: the k
maximising w_k·(i+1) − c_k(i), c_k(i) the samples it got before i, ties to the first source (Megatron's
error-minimising rule). No random numbers: the order is a function of the weights alone, so a run and its
resume agree, and after N samples every source has N·w_k of them within 1 (tests/data/test_mixing.py checks it).
Source k's c-th sample is then its own stream's sample c: a shuffled order per epoch, seeded apart per source, so
a small source cycles (epochs) while a large one is still in its first.

Tokenized (`prepare_mixed_corpus`): one tokenizer for all sources (the recipe's file, else that of a source that
is a `plm tokenize` output, else one trained on every source's text), each source tokenized into its own cached
corpus with it (its own train / validation split, by data.val_fraction), and a small mix directory (meta.json with
`mix`, tokenizer.json) that names them. The loop's data position stays one integer (the micro-batch), as for one
corpus: `BlendedStream[k]` is a pure function of (seed, k, rank), so --resume is exact with nothing more saved.

Validation is pooled: every source's validation windows once, interleaved in proportion to their numbers (so the
first train.eval_batches hold every source), one loss averaged over all their tokens: a source counts by its
validation tokens, not by its mixing weight. No per-source validation loss is reported.

Streamed (data/streaming.py): every lane holds one lane per source over that source's text (`MixedLane`); the
lane's i-th window is the next window of source Blend(i)'s lane. Its position, saved with each checkpoint, is
(i, then every source lane's byte position). Each source's validation tail is tokenized apart (`sources/k` in the
stream directory) and pooled as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch

from plmcli.errors import PlmError

FORMAT = "plm-mix-tokenizer"
"""The meta.json format of a cached tokenizer trained on every source of a mix."""


@dataclass(frozen=True)
class Source:
    """One input of a mix and its weight as given (`shares` normalises them)."""

    path: str
    weight: float


_HINT = "give each --data a weight ≥ 0 after its last colon, some > 0, e.g. --data a.txt:0.7 --data b.txt:0.3"


def _weight(text: str, arg: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise PlmError(f"--data {arg}: the weight '{text}' is not a number", _HINT) from None
    if not 0 <= w < math.inf:  # NaN fails it too
        raise PlmError(f"--data {arg}: the weight {text} must be a finite number ≥ 0", _HINT)
    return w


def parse_inputs(inputs) -> list[Source] | None:
    """`--data` arguments -> the sources of a mix, or None when no argument carries a weight (one corpus)."""
    from plmcli.data.text import STDIN

    parsed: list[tuple[str, float | None]] = []
    for arg in inputs:
        if not isinstance(arg, str) or arg == STDIN or Path(arg).exists() or ":" not in arg:
            parsed.append((arg, None))
            continue
        head, tail = arg.rsplit(":", 1)
        if head and Path(head).exists():  # an existing path before the colon: what follows must be a weight
            parsed.append((head, _weight(tail, arg)))
            continue
        try:
            float(tail)
        except ValueError:  # a Hub name's config, a Windows drive: a name, not a weight
            parsed.append((arg, None))
            continue
        parsed.append((head, _weight(tail, arg)))
    if all(w is None for _, w in parsed):
        return None
    return checked([Source(p, 1.0 if w is None else w) for p, w in parsed])


def from_config(mix: dict) -> list[Source]:
    """The recipe's data.mix (source -> weight; config_sections has checked the weights)."""
    return checked([Source(str(p), float(w)) for p, w in mix.items()])


def checked(sources: list[Source]) -> list[Source]:
    """`sources`, or a PlmError when their weights cannot be normalised or a source comes twice."""
    if not sum(s.weight for s in sources) > 0:
        raise PlmError("the mix's weights sum to 0: no source would be read", _HINT)
    paths = [s.path for s in sources]
    if len(set(paths)) != len(paths):
        raise PlmError(f"a source is named twice in the mix ({', '.join(paths)})", "name each source once, with its weight")
    return sources


def shares(sources: list[Source]) -> list[float]:
    """The weights normalised to sum 1: from the weights as given, so a resume (which reads them again from
    the run's recorded inputs) gets the very same floats."""
    total = sum(s.weight for s in sources)
    return [s.weight / total for s in sources]


def spec(source: Source) -> str:
    """The `--data` argument that names `source` again (its path absolute where it exists, its weight as given):
    what a run records."""
    path = str(Path(source.path).resolve()) if Path(source.path).exists() else source.path
    return f"{path}:{source.weight!r}"


# ----------------------------------------------------------------------------- the order


PERIOD = 1 << 20
"""The most samples one period of a Blend of weights that are not simple fractions spans (their shares are then
rounded to multiples of 1/PERIOD)."""


def integer_weights(weights) -> list[int]:
    """Weights as integers in the same ratios: the shares as fractions of denominator ≤ 1000 where they are those
    (0.7 → 7/10, 1/3), else rounded to multiples of 1/PERIOD (a positive weight stays > 0). Integers as they are."""
    from fractions import Fraction

    if all(isinstance(w, int) for w in weights):
        return list(weights)
    total = sum(weights)
    shares = [w / total for w in weights]
    simple = [Fraction(x).limit_denominator(1000) for x in shares]
    if all(abs(float(f) - x) < 1e-12 for f, x in zip(simple, shares)):
        lcm = math.lcm(*(f.denominator for f in simple))
        if lcm <= PERIOD:
            return [int(f * lcm) for f in simple]
    return [max(1, round(x * PERIOD)) if x > 0 else 0 for x in shares]


class Blend:
    """Sample position i -> (source, how many samples that source had before i): the error-minimising order (see
    the module doc), in exact integer arithmetic (w_k·(i+1) − c_k·Σw, integer_weights). After Σw samples every
    source has had exactly w_k and the order starts again, so one period, worked out CHUNK samples at a time as
    positions need them, serves every position: a resume far into a run reaches its position at once."""

    CHUNK = 1 << 15

    def __init__(self, weights):
        self.w = integer_weights(weights)
        self.total = sum(self.w)
        self.starts = [[0] * len(self.w)]  # the counts at the start of chunk j of the period
        self.cached: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _chunk(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        if j in self.cached:
            return self.cached[j]
        while len(self.starts) <= j:  # every chunk before j, to know j's starting counts
            self._chunk(len(self.starts) - 1)
        w, total, counts, lo = self.w, self.total, list(self.starts[j]), j * self.CHUNK
        hi = min(lo + self.CHUNK, total)
        src = np.empty(hi - lo, dtype=np.int64)
        nth = np.empty(hi - lo, dtype=np.int64)
        order = range(len(w))
        for i in range(lo, hi):
            k = max(order, key=lambda k: w[k] * (i + 1) - counts[k] * total)  # max keeps the first of equals
            src[i - lo], nth[i - lo] = k, counts[k]
            counts[k] += 1
        if len(self.starts) == j + 1:
            self.starts.append(counts)
        if len(self.cached) >= 4:
            self.cached.pop(min(self.cached))
        self.cached[j] = (src, nth)
        return src, nth

    def take(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(sources, each sample's index in its source's own order) at an array of positions."""
        periods, r = np.divmod(np.asarray(positions, dtype=np.int64), self.total)
        src, nth = np.empty_like(r), np.empty_like(r)
        chunks = r // self.CHUNK
        for j in np.unique(chunks).tolist():
            at = chunks == j
            s, n = self._chunk(j)
            src[at], nth[at] = s[r[at] - j * self.CHUNK], n[r[at] - j * self.CHUNK]
        return src, nth + periods * np.asarray(self.w, dtype=np.int64)[src]

    def at(self, i: int) -> int:
        """The source of sample i."""
        r = i % self.total
        s, _ = self._chunk(r // self.CHUNK)
        return int(s[r % self.CHUNK])


def source_seed(seed: int, k: int) -> int:
    """Source k's own seed: its shuffled order is apart from every other source's."""
    return int(np.random.SeedSequence((seed, k)).generate_state(1)[0]) if k else seed


# ----------------------------------------------------------------------------- tokenized sources


@runtime_checkable
class BlendsSources(Protocol):
    """An objective that trains on a mix (clm): its `stream` reads a mix directory (`mix_of(meta)`)."""

    def blended_stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle): ...


def check_mixable(objective_cls) -> None:
    if not issubclass(objective_cls, BlendsSources):
        raise PlmError(f"data mixing (--data PATH:WEIGHT, data.mix) trains objective clm (or bilm) only, not "
                       f"{objective_cls.__name__}", "drop the weights (the inputs are then one corpus), or use a clm recipe")


def mix_of(meta: dict, corpus_dir) -> dict | None:
    """A mix directory's sources ({"dirs", "weights", "names"}; dirs absolute, or below the mix directory: a streamed
    mix's validation sets), or None for one corpus."""
    mix = meta.get("mix")
    return None if mix is None else {**mix, "dirs": [Path(corpus_dir) / d for d in mix["dirs"]]}


class BlendedStream(torch.utils.data.Dataset):
    """`stream[k]` is this rank's k-th micro-batch of a mix, a pure function of (seed, k, rank) as BatchStream's.

    `fetch(source, epochs, indices)` builds a dict of row tensors from one source's samples. Training: the samples
    in Blend order, source k's c-th sample is its EpochOrder's c-th (its own seed). Evaluation (shuffle False):
    every source's samples once, in order, interleaved by the Blend of their sizes: any first batches (a capped
    train.eval_batches) hold each source in proportion to its validation set."""

    def __init__(self, sizes: list[int], weights, batch_size: int, fetch: Callable, seed: int = 0, rank: int = 0,
                 world: int = 1, shuffle: bool = True):
        from plmcli.data.batching import EpochOrder

        self.sizes, self.batch_size, self.fetch, self.rank, self.world = sizes, batch_size, fetch, rank, world
        self.shuffle, self.num_samples = shuffle, sum(sizes)
        self.blend = Blend(weights if shuffle else [int(n) for n in sizes])
        self.orders = [EpochOrder(n, source_seed(seed, k), shuffle) if n else None for k, n in enumerate(sizes)]

    def __getitem__(self, k: int):
        g = k * self.world + self.rank  # global micro-batch id
        positions = np.arange(g * self.batch_size, (g + 1) * self.batch_size)
        if not self.shuffle:  # an evaluation pass reads each sample once: the last batch is short, later ones empty
            positions = positions[positions < self.num_samples]
            if not len(positions):
                return None
        src, nth = self.blend.take(positions)
        parts, where = [], []
        for s in np.unique(src).tolist():
            at = np.flatnonzero(src == s)
            epochs, indices = self.orders[s].take(nth[at])
            parts.append(self.fetch(s, epochs.tolist(), indices.tolist()))
            where.append(at)
        back = torch.from_numpy(np.argsort(np.concatenate(where), kind="stable"))
        return {key: torch.cat([p[key] for p in parts])[back] for key in parts[0]}

    def batches_per_epoch(self) -> int:
        return -(-self.num_samples // (self.batch_size * self.world))

    def __len__(self) -> int:  # DataLoader wants one; the stream itself is endless
        return 2**62


def _shared_tokenizer(paths: list[str], tok_cfg, data_cfg, root: Path) -> tuple[Path, dict | None]:
    """(tokenizer.json of a mix, its meta entry if known): tok_cfg.path's, else that of the first source that is a
    `plm tokenize` output, else one trained on every source's text (cached by its inputs)."""
    import dataclasses

    from plmcli.data.corpus import read_corpus_meta, tokenizer_entry
    from plmcli.data.store import build_atomically, inputs_key, read_meta, write_meta
    from plmcli.data.text import expand_inputs, input_stats, text_lines

    if tok_cfg.path:
        return Path(tok_cfg.path), None
    for path in paths:
        meta = read_corpus_meta(Path(path)) if Path(path).is_dir() else None
        if meta is not None:
            return Path(path) / "tokenizer.json", meta["tokenizer"]
    files = expand_inputs(paths, data_cfg.text_column)
    key = inputs_key(input_stats(files), tok_cfg, FORMAT)

    def build(tmp: Path) -> dict:
        tok, entry = tokenizer_entry(tok_cfg, lambda: (line for name in files for line in text_lines(name)))
        tok.save(str(tmp / "tokenizer.json"))
        meta = {"format": FORMAT, "key": key, "tokenizer": entry, "settings": dataclasses.asdict(tok_cfg)}
        write_meta(tmp, meta)
        return meta

    out = root / "tokenizers" / key[:16]
    meta = build_atomically(out, key, lambda d: read_meta(d, FORMAT), build, "plm pretrain (a mix's tokenizer)")
    return out / "tokenizer.json", meta["tokenizer"]


def prepare_mixed_corpus(sources: list[Source], tok_cfg, data_cfg, prepare_one: Callable, cache_root=None) -> Path:
    """A mix directory for `sources`: each tokenized by `prepare_one(inputs, tok_cfg, data_cfg)` (the objective's
    prepare_corpus) with one shared tokenizer, and meta.json naming them with their weights (cached)."""
    import dataclasses
    import shutil

    from plmcli.data.corpus import FORMAT as CORPUS, VERSION, default_cache_dir
    from plmcli.data.store import build_atomically, cache_key, load_meta, read_meta, write_meta

    root = Path(cache_root) if cache_root is not None else default_cache_dir()
    tok_file, entry = _shared_tokenizer([s.path for s in sources], tok_cfg, data_cfg, root)
    shared = dataclasses.replace(tok_cfg, path=str(tok_file))
    dirs = [Path(prepare_one([s.path], shared, data_cfg)).resolve() for s in sources]
    metas = [load_meta(d) for d in dirs]
    first = metas[0]["tokenizer"]["hash"]
    for s, m in zip(sources, metas):
        if m["tokenizer"]["hash"] != first:
            raise PlmError(f"the mix's source {s.path} is tokenized with another tokenizer than {sources[0].path}",
                           "mix text files (one tokenizer is trained on them all), or corpora of one tokenizer")
    weights = shares(sources)
    key = cache_key([m["key"] for m in metas], weights, CORPUS, VERSION, "mix")

    def build(tmp: Path) -> dict:
        shutil.copyfile(dirs[0] / "tokenizer.json", tmp / "tokenizer.json")
        counts = {split: {k: sum(m["counts"].get(split, {}).get(k, 0) for m in metas)
                          for k in ("documents", "sentences", "tokens", "bytes")} for split in ("train", "validation")}
        meta = {"format": CORPUS, "version": VERSION, "tokenizer": entry or metas[0]["tokenizer"], "counts": counts, "key": key,
                "inputs": [i for m in metas for i in m.get("inputs", [])], "val_fraction": data_cfg.val_fraction,
                "mix": {"dirs": [str(d) for d in dirs], "weights": weights,
                        "names": [s.path for s in sources]}}
        write_meta(tmp, meta)
        return meta

    out = root / "mixes" / key[:16]
    build_atomically(out, key, lambda d: read_meta(d, CORPUS), build, "plm pretrain (a mix)")
    return out


# ----------------------------------------------------------------------------- streamed sources


class MixedLane:
    """A streaming lane over several sources: one lane per source (anything with `window(n)`, `position()` and
    `pending`), its i-th window from source Blend(i)'s. `position()` is flat ints: [i, then per source the lane's
    five (epoch, piece, offset, skip, line before blank: 1 / 0, -1 for not known yet)]."""

    WIDTH = 5

    def __init__(self, blend: Blend, position: list | None, make_lanes: list[Callable], starts: list[list]):
        self.blend = blend
        if position is None:
            self.count, subs = 0, [None] * len(make_lanes)
        else:
            self.count = int(position[0])
            subs = [self._decode(position[1 + k * self.WIDTH : 1 + (k + 1) * self.WIDTH]) for k in range(len(make_lanes))]
        self.starts = [sub if sub is not None else start for sub, start in zip(subs, starts)]
        self.lanes = [make(sub) for make, sub in zip(make_lanes, subs)]

    @staticmethod
    def _decode(p: list) -> list:
        return [*map(int, p[:4]), None if p[4] == -1 else bool(p[4])]

    def window(self, n: int) -> list[int]:
        k = self.blend.at(self.count)
        self.count += 1
        return self.lanes[k].window(n)

    def position(self) -> list[int]:
        out = [self.count]
        for lane, start in zip(self.lanes, self.starts):
            p = lane.position() if lane.pending else start  # a lane not read yet stands where it starts
            out += [*map(int, p[:4]), -1 if p[4] is None else int(p[4])]
        return out
