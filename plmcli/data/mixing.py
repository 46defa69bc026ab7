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

Which objectives (`BlendsSources`). An objective mixes when its batches are independent samples: it says so by
subclassing objectives/base.py's `Mixes` and giving `samples(dir, split, seed, shuffle, needed)` -> (n, fetch) for one
source's directory and `collate(parts)`, one batch of rows from one or more sources; `blended_stream` alone turns a
mix directory into a BlendedStream of them. clm and bilm (token windows), mlm (BERT, RoBERTa, ALBERT, SpanBERT,
NEZHA, ERNIE: static make-mlm-data instances, or dynamic masking's windows or full_sentences rows, each row masked by
its source's (seed, epoch, index)), rtd (ELECTRA: mlm's rows; its generator's sample seed per global micro-batch),
ernie2 (its static instances), translation and denoising (pairs, noised chunks). A mixed micro-batch holds its
sources' rows in source order (a batch is a sum over its rows: the order changes nothing but float rounding). Refused
in one line (`check_mixable`): objectives whose batches continue streams across micro-batches (bptt's TBPTT lanes,
XLNet's plm with its memory) or that count (n-grams, word2vec); and settings that cannot draw rows by weight
(`mix_problem`: dynamic doc_sentences, whose micro-batches hold a token budget).

Tokenized (`prepare_mixed_corpus`): one tokenizer for all sources (the recipe's file, else that of a source that
is a `plm tokenize` output, else one trained on every source's text), each source tokenized into its own cached
corpus with it (its own train / validation split, by data.val_fraction), and a small mix directory (meta.json with
`mix`, tokenizer.json) that names them. An objective's own data (`prepared`: make-mlm-data instances, ERNIE 2.0
tasks) is built per source, and a second mix directory names those. The loop's data position stays one integer
(the micro-batch), as for one corpus: `BlendedStream[k]` is a pure function of (seed, k, rank), so --resume is
exact with nothing more saved; a resumed run reads its mix directory as it is.

Validation: every source's validation samples once, in batches of one source each: one batch of every source first,
then the rest interleaved in proportion to their numbers (so the first train.eval_batches, if at least the number of
sources, hold every source, each about in proportion). The pooled `val_loss` is one mean
over all their targets (a source counts by its validation size, not its mixing weight), as before; beside it each
source's own mean, `val_loss/NAME` (train/validation.py), in metrics.jsonl, the trackers, summary.json and (up to 3
short names) the progress line. NAME is the source's file or directory stem as given (`web` for web.txt or web/),
a later source of the same stem suffixed -2, -3, ... (`source_names`); `source0`, ... where the mix recorded no
names. Each batch carries its source's index (SOURCE); the loop adds each source's loss sum and target count into a
(sources, 2) tensor on the device and reduces it over the processes with the pooled sums: one read per pass.

Streamed (data/streaming.py): every lane holds one lane per source over that source's text (`MixedLane`); the
lane's i-th window is the next window of source Blend(i)'s lane. Its position, saved with each checkpoint, is
(i, then every source lane's byte position). Each source's validation tail is tokenized apart (`sources/k` in the
stream directory) and evaluated as above.
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


SOURCE = "mix_source"
"""The key of a validation batch of a mix that says which source (its index) all its rows come from."""


@runtime_checkable
class BlendsSources(Protocol):
    """An objective whose batches are independent samples, so a mix can blend them (clm, bilm, mlm, rtd, ernie2,
    translation, denoising): `samples` reads one source's directory, `collate` makes a batch of any sources' rows.
    Objectives whose batches continue streams across micro-batches (bptt, XLNet's plm) or that count (n-grams)
    are not: check_mixable refuses them."""

    def samples(self, data_dir, split: str, seed: int, shuffle: bool, needed: bool) -> tuple[int, Callable]:
        """(how many samples `split` of data_dir holds, fetch(epochs, indices) -> their rows); `needed`: none is
        an error (else 0). `seed` is the source's own (source_seed): its windows and masks are keyed by it."""

    def collate(self, parts: list) -> dict:
        """The rows of one or more sources' fetches (in source order) -> one batch."""

    @staticmethod
    def mix_problem(cfg) -> tuple[str, str] | None:
        """(message, fix) when the objective's settings cannot mix (e.g. token-budget batches), else None."""


def check_mixable(objective_cls, name: str, cfg=None) -> None:
    """A PlmError (one line) unless objective `name` can train on a mix with these settings."""
    if not issubclass(objective_cls, BlendsSources):
        raise PlmError(f"data mixing (--data PATH:WEIGHT, data.mix) draws independent samples by weight, and objective "
                       f"{name} does not train on independent samples (its batches continue streams, or it counts)",
                       "drop the weights (the inputs are then one corpus), or use an objective that mixes "
                       "(clm, bilm, mlm, rtd, ernie2, translation, denoising)")
    problem = objective_cls.mix_problem(cfg) if cfg is not None else None
    if problem:
        raise PlmError(*problem)


def mix_of(meta: dict, corpus_dir) -> dict | None:
    """A mix directory's sources ({"dirs", "weights", "names"}; dirs absolute, or below the mix directory: a streamed
    mix's validation sets), or None for one corpus."""
    mix = meta.get("mix")
    return None if mix is None else {**mix, "dirs": [Path(corpus_dir) / d for d in mix["dirs"]]}


def is_mix(path) -> bool:
    """Whether `path` is a mix directory (prepare_mixed_corpus's, or prepared's)."""
    from plmcli.data.store import read_meta

    return isinstance(path, (str, Path)) and mix_of(read_meta(path) or {}, path) is not None


def source_names(mix: dict) -> list[str]:
    """Each source's name in metrics (val_loss/NAME): its file's (or directory's) stem, a later one of the same stem
    suffixed -2, -3, ...; `source0`, ... where the mix does not record its inputs."""
    given = mix.get("names") or [f"source{k}" for k in range(len(mix["dirs"]))]
    out: list[str] = []
    for path in given:
        stem = Path(str(path).rstrip("/\\")).stem or str(path)
        name, n = stem, 1
        while name in out:
            n += 1
            name = f"{stem}-{n}"
        out.append(name)
    return out


def names_of(data_dir) -> list[str] | None:
    """The source names of a mix directory (what a validation batch's SOURCE indexes), or None for one corpus."""
    from plmcli.data.store import read_meta

    mix = mix_of(read_meta(data_dir) or {}, data_dir)
    return None if mix is None else source_names(mix)


def lacking(data_dir, split: str) -> list[str]:
    """What in `data_dir` has no `split`: for a mix the names of the sources without one (source_names), for one
    corpus ["the corpus"] when it has none; [] when every part has it."""
    from plmcli.data.store import has_split, load_meta

    meta = load_meta(data_dir)
    mix = mix_of(meta, data_dir)
    if mix is None:
        return [] if has_split(meta, split) else ["the corpus"]
    return [name for name, d in zip(source_names(mix), mix["dirs"]) if not has_split(load_meta(d), split)]


def blended_stream(obj: BlendsSources, data_dir, split, batch_size, seed, rank, world, shuffle):
    """The BlendedStream of a mix directory for `obj`, or None when data_dir is one corpus. Training reads the
    sources of weight > 0 (each needs a sample); evaluation every source that has the split."""
    from plmcli.data.store import has_split, load_meta, read_meta

    mix = mix_of(read_meta(data_dir) or {}, data_dir)
    if mix is None:
        return None
    parts = []
    for k, (d, w) in enumerate(zip(mix["dirs"], mix["weights"])):
        wanted = w > 0 if shuffle else has_split(load_meta(d), split)
        parts.append(obj.samples(d, split, source_seed(seed, k), shuffle, needed=shuffle) if wanted else (0, None))
    if shuffle and not any(n for n, _ in parts):
        raise PlmError(f"no source of the mix has a {split} sample", "add text, lower train.seq_len, or lower data.val_fraction")
    return BlendedStream([n for n, _ in parts], mix["weights"], batch_size,
                         lambda k, epochs, indices: parts[k][1](epochs, indices), seed, rank, world, shuffle,
                         collate=obj.collate)


def prepared(corpus_dir, prepare_one: Callable, cache_root=None) -> Path:
    """What an objective trains on (`prepare_one(dir)`: its prepare) for a corpus or a mix: for a mix, each source
    prepared apart (its own make-mlm-data instances, ERNIE 2.0 tasks) and, when that made new directories, a mix
    directory naming them with the same weights and names (cached)."""
    from plmcli.data.corpus import default_cache_dir
    from plmcli.data.store import cache_key, load_meta, read_meta

    meta = read_meta(corpus_dir) or {}
    mix = mix_of(meta, corpus_dir)
    if mix is None:
        return Path(prepare_one(corpus_dir))
    dirs = [Path(prepare_one(d)).resolve() for d in mix["dirs"]]
    if dirs == [Path(d).resolve() for d in mix["dirs"]]:
        return Path(corpus_dir)
    metas = [load_meta(d) for d in dirs]
    key = cache_key([m.get("key") for m in metas], mix["weights"], PREPARED, "prepared")
    root = Path(cache_root) if cache_root is not None else default_cache_dir()
    fields = {"tokenizer": metas[0].get("tokenizer", meta.get("tokenizer")),
              "mix": {**{k: v for k, v in meta["mix"].items() if k != "dirs"}, "dirs": [str(d) for d in dirs]}}
    return mix_directory(root, key, PREPARED, Path(corpus_dir) / "tokenizer.json", metas, fields,
                         "plm pretrain (a mix's training data)")


def mix_directory(root: Path, key: str, fmt: str, tokenizer_json: Path, metas: list[dict], fields: dict,
                  what: str) -> Path:
    """The cached mix directory `root/mixes/<key>`: the tokenizer, and a meta.json of format `fmt` with the sources'
    summed counts and `fields` (the tokenizer entry, the mix's dirs, weights and names, ...)."""
    import shutil

    from plmcli.data.store import build_atomically, read_meta, write_meta

    def build(tmp: Path) -> dict:
        shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")
        meta = {"format": fmt, "key": key, "counts": summed_counts(metas), **fields}
        write_meta(tmp, meta)
        return meta

    out = root / "mixes" / key[:16]
    build_atomically(out, key, lambda d: read_meta(d, fmt), build, what)
    return out


def summed_counts(metas: list[dict]) -> dict:
    """The sources' counts per split (documents, tokens, instances, examples, ...) added up."""
    counts: dict = {}
    for m in metas:
        for split, c in m.get("counts", {}).items():
            for k, v in c.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    counts.setdefault(split, {})[k] = counts.get(split, {}).get(k, 0) + v
    return counts


PREPARED = "plm-mix-prepared"
"""The meta.json format of a mix directory of the sources' prepared data (make-mlm-data, ERNIE 2.0 instances)."""


class BlendedStream(torch.utils.data.Dataset):
    """`stream[k]` is this rank's k-th micro-batch of a mix, a pure function of (seed, k, rank) as BatchStream's.

    `fetch(source, epochs, indices)` reads rows of one source's samples; `collate(parts)` makes one batch of the
    parts (in source order; default: dicts of tensors concatenated). Training: the samples in Blend order, source
    k's c-th sample is its EpochOrder's c-th (its own seed). Evaluation (shuffle False): every source's samples
    once, in order, in batches of one source each (tagged SOURCE: the loop sums each source's loss apart): first
    one batch of every source, then the others interleaved by the Blend of their numbers, so any first batches (a
    capped train.eval_batches) hold every source, and in proportion to its validation set."""

    def __init__(self, sizes: list[int], weights, batch_size: int, fetch: Callable, seed: int = 0, rank: int = 0,
                 world: int = 1, shuffle: bool = True, collate: Callable | None = None):
        from plmcli.data.batching import EpochOrder

        self.sizes, self.batch_size, self.fetch, self.rank, self.world = sizes, batch_size, fetch, rank, world
        self.shuffle, self.num_samples, self.collate = shuffle, sum(sizes), collate or concatenated
        self.per_source = [-(-int(n) // batch_size) for n in sizes]  # evaluation: each source's batches
        self.num_batches = sum(self.per_source)
        # evaluation: each source's first batch, then the others by the Blend of their numbers
        self.firsts = [k for k, m in enumerate(self.per_source) if m]
        rest = [max(m - 1, 0) for m in self.per_source]
        self.blend = Blend(weights) if shuffle else Blend(rest) if sum(rest) else None
        self.orders = [EpochOrder(n, source_seed(seed, k), shuffle) if n else None for k, n in enumerate(sizes)]

    def __getitem__(self, k: int):
        g = k * self.world + self.rank  # global micro-batch id
        if not self.shuffle:
            return self._validation(g)
        positions = np.arange(g * self.batch_size, (g + 1) * self.batch_size)
        src, nth = self.blend.take(positions)
        parts = []
        for s in np.unique(src).tolist():
            epochs, indices = self.orders[s].take(nth[src == s])
            parts.append(self.fetch(s, epochs.tolist(), indices.tolist()))
        return self.collate(parts)

    def _validation(self, g: int):
        """Batch g of an evaluation pass (each sample once; the batches past the last None)."""
        if g >= self.num_batches:
            return None
        if g < len(self.firsts):
            s, j = self.firsts[g], 0
        else:
            src, nth = self.blend.take(np.array([g - len(self.firsts)]))
            s, j = int(src[0]), int(nth[0]) + 1
        indices = list(range(j * self.batch_size, min((j + 1) * self.batch_size, self.sizes[s])))
        batch = self.collate([self.fetch(s, [0] * len(indices), indices)])
        batch[SOURCE] = s
        return batch

    def batches_per_epoch(self) -> int:
        if not self.shuffle:
            return -(-self.num_batches // self.world)
        return -(-self.num_samples // (self.batch_size * self.world))

    def __len__(self) -> int:  # DataLoader wants one; the stream itself is endless
        return 2**62


def concatenated(parts: list[dict]) -> dict:
    """Batches of equal-width rows (dicts of tensors) as one: each key's tensors concatenated."""
    return parts[0] if len(parts) == 1 else {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


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

    from plmcli.data.corpus import FORMAT as CORPUS, VERSION, default_cache_dir
    from plmcli.data.store import cache_key, load_meta

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
    fields = {"version": VERSION, "tokenizer": entry or metas[0]["tokenizer"],
              "inputs": [i for m in metas for i in m.get("inputs", [])], "val_fraction": data_cfg.val_fraction,
              "mix": {"dirs": [str(d) for d in dirs], "weights": weights, "names": [s.path for s in sources]}}
    return mix_directory(root, key, CORPUS, dirs[0] / "tokenizer.json", metas, fields, "plm pretrain (a mix)")


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
