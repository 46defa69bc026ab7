"""`plm pretrain --streaming`: train on text files read, tokenized and packed as training goes.

For corpora too big to tokenize up front (hundreds of GB): nothing is written but a tokenizer and a
small validation set. The training bytes (every input file, the last one up to the validation tail)
are cut into one contiguous stretch per *lane*; a micro-batch row is the next window of T+1 tokens of
its lane, so rows of one batch come from far-apart places in the corpus. Lanes = processes ×
readers × micro-batch rows; no two read the same bytes. A reader's lanes give one micro-batch at a
time, and the readers take turns: batch j of a process is the next batch of its reader j mod readers.
Readers are as many as the run's first launch had loader workers (`train.num_workers`, at least one),
and a resume keeps them: any number of workers serves them in turn (worker w of n the readers w, w+n,
...), so the batches do not depend on how many workers build them. A lane reads lines (see
data/text.py), encodes them where its reader runs and keeps the tokens of the documents in order, a
separator after each document, as `token_stream` lays out a tokenized corpus; at the end of its
stretch it starts over (the next epoch).

Exact resume: a lane's position is (epoch, piece, byte offset of the first line whose tokens are not
yet consumed, tokens of that line already consumed, whether the line before it was blank). Each
batch carries the positions of its reader's lanes after it; the main process keeps those of the last
batch the loop took, and a checkpoint saves them (all processes' gathered into one). A resumed run
seeks every lane to its offset: consumed text is never read again, and the batches that follow are
the ones an uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections import deque
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

import numpy as np
import torch

from plmcli.config_sections import DataConfig, TokenizerConfig
from plmcli.data.batching import batch_loader, loader_workers
from plmcli.data.mixing import Blend, MixedLane
from plmcli.data.store import build_atomically, cache_key, load_meta, tokenizer_settings, write_meta
from plmcli.data.text import (
    STDIN,
    document_start,
    expand_inputs,
    input_stats,
    iter_lines,
    line_before_is_blank,
    open_text,
    seek_line,
)
from plmcli.data.tables import FORMAT_NAMES, TableInput
from plmcli.errors import PlmError

KIND = "streaming"
VAL_MAX_BYTES = 16 << 20
"""The validation tail is data.val_fraction of the text, at most this much (it is tokenized up front)."""
TOKENIZER_SAMPLE_BYTES = 256 << 20
"""A tokenizer is trained on at most this much text, taken from the start of the files, spread over them."""
READ_LINES = 256  # lines a lane reads and encodes at a time


class _Reads(deque):
    """Where this process's lanes opened their files, (path, offset), the latest 4096, and the bytes they
    read: a resume must seek past consumed text, never read it again (the tests check it)."""
    bytes = 0


reads = _Reads(maxlen=4096)


# ----------------------------------------------------------------------------- preparing


def prepare_stream_corpus(inputs, tok_cfg: TokenizerConfig, data_cfg: DataConfig, objective_cls=None,
                          cache_root=None, objective_cfg=None, weights=None) -> Path:
    """A directory for streaming `inputs`: tokenizer.json, the validation tail tokenized, meta.json with
    the file list. Cached under a key over the inputs (paths, sizes, mtimes) and settings. With `weights` (one
    per input, normalised: data/mixing.py), each input is a source of a mix, with its own validation tail."""
    from plmcli.data.corpus import FORMAT, VERSION, default_cache_dir, read_corpus_meta

    if objective_cls is not None:  # before a tokenizer is trained on a corpus this big
        check_streamable(objective_cls, objective_cfg)

    inputs = [inputs] if isinstance(inputs, (str, Path)) else [str(i) for i in inputs]
    if len(inputs) == 1 and Path(inputs[0]).is_dir() and read_corpus_meta(Path(inputs[0])) is not None:
        raise PlmError(f"--streaming reads text files, and '{inputs[0]}' is already tokenized",
                       "drop --streaming (a tokenized corpus is read from disk as it trains), or pass the text files")
    groups = [expand_inputs([i], data_cfg.text_column) for i in inputs] if weights else [expand_inputs(inputs, data_cfg.text_column)]
    files = [f for g in groups for f in g]
    for name in files:
        if isinstance(name, TableInput):
            raise PlmError(f"--streaming reads plain text files, and {name.describe()} is a {FORMAT_NAMES[name.kind]}: "
                           "training seeks to byte offsets, which rows do not have",
                           "drop --streaming: `plm tokenize` it first (memory stays flat) and pass the output with --data")
        if name == STDIN or name.endswith(".gz"):
            raise PlmError(f"--streaming cannot read '{name}': training seeks into its inputs, and "
                           f"{'standard input' if name == STDIN else 'a .gz file'} cannot be entered midway",
                           "decompress it to a plain text file (or tokenize it with `plm tokenize` and drop --streaming)")
        open_text(name).close()  # binary files and UTF-16 fail now, not hours into training
    stats = input_stats(files)
    mix = [[len(g) for g in groups], list(weights)] if weights else []  # appended only when set: older keys stay
    key = cache_key(stats, tokenizer_settings(tok_cfg), data_cfg.doc_per_line, float(data_cfg.val_fraction), FORMAT,
                    VERSION, KIND, VAL_MAX_BYTES, TOKENIZER_SAMPLE_BYTES, *mix)
    out = (Path(cache_root) if cache_root is not None else default_cache_dir()) / "streams" / key[:16]
    build_atomically(out, key, read_corpus_meta, lambda tmp: _build(tmp, groups, stats, tok_cfg, data_cfg, key, weights, inputs),
                     "plm pretrain --streaming")
    return out


def _sample_lines(files: list[str], budget: int) -> Iterator[str]:
    """Lines from the start of the files, about budget/len(files) bytes each (every k-th file when there
    are too many to give each 1 MB)."""
    step = max(1, -(-len(files) * (1 << 20) // budget))
    chosen = files[::step]
    share = budget // len(chosen)
    for name in chosen:
        for pos, line in iter_lines(name):
            if pos >= share:
                break
            yield line


def _tail(files: list[str], data_cfg: DataConfig, val_max: int) -> dict:
    """One source's files: their sizes, where its training text ends in the last and its validation tail starts."""
    sizes = [os.path.getsize(f) for f in files]
    val_bytes = min(int(sum(sizes) * data_cfg.val_fraction), val_max, sizes[-1])
    cut = sizes[-1] - val_bytes
    # Train on the lines before the first validation document: nothing lost, nothing shared.
    train_end = document_start(files[-1], cut, data_cfg.doc_per_line) if val_bytes else sizes[-1]
    if sum(sizes[:-1]) + train_end == 0:
        raise PlmError("--streaming found no training text (the validation tail takes it all)",
                       "add text or lower data.val_fraction")
    return {"files": [str(Path(f).resolve()) for f in files], "sizes": sizes, "train_end": train_end,
            "train_bytes": sum(sizes[:-1]) + train_end, "validation_start": cut if val_bytes else None}


def _build(tmp: Path, groups: list[list[str]], stats: list[dict], tok_cfg: TokenizerConfig, data_cfg: DataConfig,
           key: str, weights=None, names=None) -> dict:
    from plmcli.data.corpus import FORMAT, VERSION, encode_splits, tokenizer_entry

    files = [f for g in groups for f in g]
    if not any(line.strip() for line in _sample_lines(files, TOKENIZER_SAMPLE_BYTES)):  # stops at the first text
        raise PlmError("the input contains no text (every line is blank)", "check the input files")
    tails = [_tail(g, data_cfg, VAL_MAX_BYTES // len(groups)) for g in groups]
    tok, entry = tokenizer_entry(tok_cfg, lambda: _sample_lines(files, TOKENIZER_SAMPLE_BYTES))
    units = [[(g[-1], t["validation_start"], None, t["sizes"][-1] - t["validation_start"])]
             if t["validation_start"] is not None else [] for g, t in zip(groups, tails)]
    counts = encode_splits(tmp, [u for us in units for u in us], tok, data_cfg.doc_per_line, 1, key, lambda n: 0)
    tok.save(str(tmp / "tokenizer.json"))
    streamed = {**tails[-1], "files": [str(Path(f).resolve()) for f in files],
                "sizes": [s for t in tails for s in t["sizes"]], "train_bytes": sum(t["train_bytes"] for t in tails)}
    meta = {"format": FORMAT, "version": VERSION, "tokenizer": entry, "inputs": stats,
            "doc_per_line": data_cfg.doc_per_line, "val_fraction": data_cfg.val_fraction, "counts": counts, "key": key,
            KIND: streamed}
    if weights:  # a mix: each source's own files, and its validation tail apart too (data/mixing.py)
        streamed["sources"] = [{**t, "weight": w} for t, w in zip(tails, weights)]
        meta["mix"] = {"dirs": [f"sources/{k}" for k in range(len(groups))], "weights": list(weights),
                       "names": list(names or [])}  # each source's val_loss/NAME (mixing.source_names)
        for k, us in enumerate(units):
            sub = tmp / "sources" / str(k)
            sub.mkdir(parents=True)
            c = encode_splits(sub, us, tok, data_cfg.doc_per_line, 1, f"{key}-{k}", lambda n: 0)
            tok.save(str(sub / "tokenizer.json"))
            write_meta(sub, {"format": FORMAT, "version": VERSION, "tokenizer": entry, "counts": c, "key": f"{key}-{k}"})
    write_meta(tmp, meta)
    return meta


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class Piece:
    """Bytes [start, end) of one file that a lane reads; `file_end`: no training text follows in that file."""
    path: str
    start: int
    end: int
    file_end: bool


def lane_pieces(files: list[str], sizes: list[int], train_end: int, lanes: int) -> list[list[Piece]]:
    """Cut the training bytes (all files, the last up to train_end) into `lanes` contiguous stretches."""
    ends = sizes[:-1] + [train_end]
    offsets = np.concatenate([[0], np.cumsum(ends)]).tolist()
    total = offsets[-1]
    out = []
    for j in range(lanes):
        lo, hi = total * j // lanes, total * (j + 1) // lanes
        pieces = []
        for i, name in enumerate(files):
            a, b = max(lo, offsets[i]), min(hi, offsets[i + 1])
            if a < b:
                pieces.append(Piece(name, a - offsets[i], b - offsets[i], b == offsets[i + 1]))
        out.append(pieces)
    return out


class Lane:
    """Tokens of one stretch of the corpus, window after window, forever (epoch after epoch)."""

    def __init__(self, pieces: list[Piece], tok, sep: int | None, position: list | None, name: str):
        self.pieces, self.tok, self.sep, self.name = pieces, tok, sep, name
        if position is None:
            position = [0, 0, pieces[0].start if pieces else 0, 0, None]
        epoch, piece, offset, self.skip, prev_blank = position
        self.pending: deque = deque()  # (position key, token ids) of units not wholly consumed
        self.units = self._units(epoch, piece, offset, prev_blank)

    @staticmethod
    def _start_blank(piece: Piece) -> bool:
        """Whether the line before the piece's first line is blank (then a blank first line ends no document)."""
        if piece.start == 0:
            return True
        with open(piece.path, "rb") as f:
            first = seek_line(f, piece.start)
        return line_before_is_blank(piece.path, first)

    def _units(self, epoch: int, p: int, offset: int, prev_blank) -> Iterator[tuple[list, list[int]]]:
        """(position key, token ids) per line that yields tokens; the key restarts reading at that line."""
        if not self.pieces:
            raise PlmError(f"streaming {self.name} has no text to read", _FEWER)
        produced = 0
        while True:
            piece = self.pieces[p]
            if prev_blank is None:
                prev_blank = self._start_blank(piece)
            lines = iter_lines(piece.path, offset, piece.end)
            reads.append((piece.path, offset))
            while True:
                chunk = [x for _, x in zip(range(READ_LINES), lines)]
                if not chunk:
                    break
                reads.bytes += chunk[-1][0] - chunk[0][0] + len(chunk[-1][1])  # about: CRLF counts as one
                encoded = iter(self.tok.encode_batch([x for _, x in chunk if x.strip()], add_special_tokens=False))
                for pos, line in chunk:
                    blank = not line.strip()
                    ids = ([self.sep] if not prev_blank and self.sep is not None else []) if blank else next(encoded).ids
                    if ids:
                        produced += len(ids)
                        yield [epoch, p, pos, prev_blank], ids
                    prev_blank = blank
            if piece.file_end and not prev_blank and self.sep is not None:  # documents never span files
                produced += 1
                yield [epoch, p, piece.end, prev_blank], [self.sep]
            p += 1
            if p == len(self.pieces):
                if not produced:
                    raise PlmError(f"streaming {self.name} found no text in its share of the corpus", _FEWER)
                p, epoch, produced = 0, epoch + 1, 0
            offset, prev_blank = self.pieces[p].start, None

    def window(self, n: int) -> list[int]:
        """The next n tokens; all but the last are consumed (the last starts the next window, as the
        target of one window's last position is the next window's first input)."""
        have = sum(len(ids) for _, ids in self.pending) - self.skip
        while have < n:
            unit = next(self.units)
            self.pending.append(unit)
            have += len(unit[1])
        out: list[int] = []
        for i, (_, ids) in enumerate(self.pending):
            out.extend(ids[self.skip if i == 0 else 0 :][: n - len(out)])
            if len(out) == n:
                break
        drop = n - 1
        while drop:
            left = len(self.pending[0][1]) - self.skip
            if drop < left:
                self.skip += drop
                break
            drop -= left
            self.pending.popleft()
            self.skip = 0
        return out

    def position(self) -> list:
        key, _ = self.pending[0]
        return [*key[:3], self.skip, key[3]]

    # Sentence rows (RoBERTa's FULL-SENTENCES / DOC-SENTENCES): a lane's lines are its sentences (a tokenized
    # corpus's sentences are its lines too), and a unit that is the separator alone ends a document.

    def _unit(self, k: int) -> list[int]:
        """The ids of pending unit k (read ahead as needed; the first one less what is consumed of it)."""
        while len(self.pending) <= k:
            self.pending.append(next(self.units))
        return self.pending[k][1][self.skip:] if k == 0 else self.pending[k][1]

    def _is_sep(self, k: int) -> bool:
        return self.sep is not None and self._unit(k) == [self.sep]

    def _plan(self, cap: int, cross_documents: bool) -> tuple[int, list[int]]:
        """The next row without consuming it: (units it uses up, -1 for a cut line; its tokens).

        A row never starts with a separator (skipped: a row starts at a sentence); it takes whole lines
        while they fit in `cap` tokens, the separators between documents included unless not
        `cross_documents`, where a separator ends it; it ends with a line, never a separator, and where the lane
        starts over (its stretch's end and start are not one text). A line longer than `cap` gives a row of its
        first `cap` tokens, and the rest of it starts the next row."""
        lead = 0
        while self._is_sep(lead):
            lead += 1
        out = list(self._unit(lead))
        if len(out) > cap:
            return -(lead + 1), out[:cap]
        k = lead + 1
        while (len(out) + len(self._unit(k)) <= cap and self.pending[k][0][0] == self.pending[k - 1][0][0]
               and (cross_documents or not self._is_sep(k))):
            out.extend(self._unit(k))
            k += 1
        if self._is_sep(k - 1):  # a separator only between two documents' sentences
            k -= 1
            out.pop()
        return k, out

    def _consume(self, used: int, cap: int) -> None:
        cut = used < 0
        for _ in range(-used - 1 if cut else used):
            self.pending.popleft()
            self.skip = 0
        if cut:
            self.skip += cap
        self._unit(0)  # position() reads the unit the next row starts in

    def rows(self, cap: int, cross_documents: bool, budget: int = 0) -> list[list[int]]:
        """The next sentence row, consumed; with `budget` (DOC-SENTENCES), further rows while their tokens,
        2 each added for [CLS] and [SEP], stay within it: a lane of short documents gives more rows."""
        used, row = self._plan(cap, cross_documents)
        self._consume(used, cap)
        out, spent = [row], len(row) + 2
        while budget:
            used, row = self._plan(cap, cross_documents)
            if spent + len(row) + 2 > budget:
                break
            self._consume(used, cap)
            out.append(row)
            spent += len(row) + 2
        return out


_FEWER = ("the corpus is too small for this many readers (processes × readers (train.num_workers) × micro-batch rows): "
          "use fewer processes or train.num_workers, a smaller train.micro_batch_size, or more text")


class TextStream(torch.utils.data.IterableDataset):
    """This process's training micro-batches, read from text as they are needed (see the module doc).

    The loop reads it through `loader()` and saves `state_dict()` with each checkpoint (see the
    streaming seam in train/loop.py).
    """

    sequential = True  # the loop: no random access, a position of its own

    def __init__(self, corpus_dir, tokenizer_json: str, sep: int | None, window: int, batch_size: int,
                 rank: int, world: int, num_workers, make_batch, packing: str = "window"):
        """Rows of `window` tokens; `make_batch(x, key)` turns a (B, window) tensor into a training batch, `key`
        (ints: the lanes' positions after it) seeds anything random in it, so a resumed run repeats it.
        With `packing` full_sentences / doc_sentences, rows are whole lines up to `window` tokens (Lane.rows)
        and `make_batch(x, key, lengths=...)` gets them padded with their lengths. `num_workers` (a count, or
        auto: decided by the first `loader`) sets the readers of a run that does not resume."""
        meta = load_meta(corpus_dir)
        s = meta[KIND]
        self.key, self.tok_json, self.sep, self.W, self.B = meta["key"], tokenizer_json, sep, window, batch_size
        self.rank, self.world, self.make_batch = rank, world, make_batch
        self.num_workers, self.packing = num_workers, packing
        self.text = (s["files"], s["sizes"], s["train_end"])
        self.mix = s.get("sources")  # a mix: every lane reads each source's own stretch (data/mixing.py)
        if self.mix and packing != "window":
            raise PlmError(f"a streamed mix reads token windows, not {packing} rows", "drop the weights, or use clm")
        self.blend = Blend([m["weight"] for m in self.mix]) if self.mix else None
        self.readers = None
        if num_workers != "auto":
            self.cut(max(1, int(num_workers)))

    def cut(self, readers: int) -> None:
        """Share this process's lanes among `readers` readers, none of them started."""
        per_reader = readers * self.B
        mine = slice(self.rank * per_reader, (self.rank + 1) * per_reader)
        if self.mix:  # per lane, its stretch of every source
            cuts = [lane_pieces(m["files"], m["sizes"], m["train_end"], self.world * per_reader)[mine] for m in self.mix]
            self.pieces = [list(p) for p in zip(*cuts)]
        else:
            self.pieces = lane_pieces(*self.text, self.world * per_reader)[mine]
        self.readers = readers
        self.positions: list = [None] * readers  # per reader: its lanes' positions (None: not started)
        self.first = 0  # the reader whose batch comes next

    def _lanes(self, reader: int):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.tok_json)
        pos = self.positions[reader] or [None] * self.B
        base = (self.rank * self.readers + reader) * self.B
        if self.mix:
            return [self._mixed_lane(self.pieces[reader * self.B + b], tok, pos[b], base + b) for b in range(self.B)]
        return [Lane(self.pieces[reader * self.B + b], tok, self.sep, pos[b], f"lane {base + b}") for b in range(self.B)]

    def _mixed_lane(self, pieces: list[list[Piece]], tok, position, lane: int) -> MixedLane:
        makers = [functools.partial(lambda pc, name, pos: Lane(pc, tok, self.sep, pos, name), pc, f"lane {lane} of source {k}")
                  for k, pc in enumerate(pieces)]
        starts = [[0, 0, pc[0].start if pc else 0, 0, None] for pc in pieces]
        return MixedLane(self.blend, position, makers, starts)

    def _batches(self, reader: int):
        lanes = self._lanes(reader)
        while True:
            if self.packing == "window":
                x, lengths = torch.tensor([lane.window(self.W) for lane in lanes], dtype=torch.long), None  # (B, W)
            else:
                # DOC-SENTENCES: each lane fills about one FULL-SENTENCES row's tokens, in as many rows as that takes
                budget = self.W + 2 if self.packing == "doc_sentences" else 0
                rows = [r for lane in lanes for r in lane.rows(self.W, self.packing == "full_sentences", budget)]
                lengths = [len(r) for r in rows]
                flat = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=sum(lengths))
                padded = np.zeros((len(rows), max(lengths)), dtype=np.int64)  # (R, longest row)
                padded[np.arange(padded.shape[1]) < np.array(lengths)[:, None]] = flat
                x = torch.from_numpy(padded)
            where = [lane.position() for lane in lanes]
            # a seed's words are non-negative: a mix's lane position says -1 for a source lane's unknown line end
            key = [int(v) % (1 << 64) for p in where for v in p]
            batch = self.make_batch(x, key) if lengths is None else self.make_batch(x, key, lengths=lengths)
            yield {**batch, "_position": {"reader": reader, "lanes": where}}

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        n, w = (info.num_workers, info.id) if info else (1, 0)
        # The loader takes one batch from each worker in turn, so worker w serves every n-th reader from `first`:
        # batch j comes from reader (first + j) mod readers, as in one process.
        mine = [self._batches((self.first + w + i * n) % self.readers) for i in range(self.readers // n)]
        try:
            for batches in itertools.cycle(mine):
                yield next(batches)
        except PlmError as e:
            if info is None:
                raise
            # A worker's exception reaches the main process as its traceback text; this keeps the one line.
            yield {"_error": [e.message, e.hint]}

    def loader(self, workers: int | None = None, pin_memory: bool | None = None, worker_init_fn=None) -> Iterator[dict]:
        """The batches in order, each leaving its reader's position behind for `state_dict`. `workers` (default:
        train.num_workers resolved) is lowered to a divisor of the readers: a worker serves whole readers."""
        cuda = torch.cuda.is_available()
        workers = loader_workers(self.num_workers, accelerated=cuda) if workers is None else workers
        if self.readers is None:
            self.cut(max(1, workers))
        workers = max(d for d in range(1, min(workers, self.readers) + 1) if self.readers % d == 0) if workers else 0
        dl = batch_loader(self, workers, pin_memory=cuda if pin_memory is None else pin_memory,
                          worker_init_fn=worker_init_fn)
        for batch in dl:
            if "_error" in batch:
                raise PlmError(*batch["_error"])
            where = batch.pop("_position")
            self.positions[where["reader"]] = where["lanes"]
            self.first = (where["reader"] + 1) % self.readers
            yield batch

    def state_dict(self) -> dict:
        """Every process's position (a collective call: all processes make it together)."""
        local = {"first": self.first, "positions": self.positions}
        if self.world > 1:
            from accelerate.utils import gather_object

            ranks = gather_object([local])
        else:
            ranks = [local]
        return {"key": self.key, "readers": self.readers, "rows": self.B, "ranks": ranks}

    def load_state_dict(self, state: dict) -> None:
        if state.get("key") != self.key:
            raise PlmError("the streamed input files changed since the checkpoint was written (sizes or times differ)",
                           "resume with the same files, unchanged, or start a new run")
        was = (len(state["ranks"]), state["rows"])
        if was != (self.world, self.B):
            raise PlmError(f"the checkpoint streamed with {was[0]} processes × {was[1]} rows, this run with "
                           f"{self.world} × {self.B}", "resume --streaming with the same process count and micro batch")
        self.cut(state["readers"])  # the checkpoint's readers, whatever the workers that serve them now
        local = state["ranks"][self.rank]
        self.first, self.positions = local["first"], local["positions"]


# ----------------------------------------------------------------------------- the objective


@runtime_checkable
class TrainsOnWindows(Protocol):
    """An objective that trains on plain token windows (clm, dynamic token-masked mlm, rtd): each streamed
    (B, T) window batch and its stream position `key` become the objective's batch."""

    def window_batch(self, x, key, seed: int = 0) -> dict: ...


@runtime_checkable
class PacksSentences(Protocol):
    """An objective whose streamed rows may be whole sentences (mlm's objective.packing): `stream_packing()`
    names the packing, and its `window_batch` also takes `lengths=` (the rows' lengths, x padded)."""

    def stream_packing(self) -> str: ...


def check_streamable(objective_cls, cfg=None) -> None:
    """Streaming reads plain token windows; an objective trains on them through `window_batch` (clm, dynamic
    token-masked mlm). With its config, the objective's settings are checked too (`streaming_problem`)."""
    if not issubclass(objective_cls, TrainsOnWindows):
        raise PlmError(f"--streaming trains on plain token windows (objectives clm and mlm), not {objective_cls.__name__}",
                       "drop --streaming: `plm tokenize` the corpus first (memory stays flat) and pass it with --data")
    problem = objective_cls.streaming_problem(cfg) if cfg is not None else None
    if problem:
        raise PlmError(*problem)


class StreamingObjective:
    """An objective that trains on a TextStream; evaluation and everything else are the wrapped one's.

    It answers the Objective calls (objectives/base.py, a layer above this one) that the loop and the pretrain
    pipeline make, each passed on to the wrapped objective; only `stream`'s training split is its own."""

    def __init__(self, inner, num_workers=0):
        check_streamable(type(inner), inner.cfg)
        self.inner, self.num_workers = inner, num_workers

    @property
    def cfg(self):
        return self.inner.cfg

    @property
    def ppl_metric(self) -> str:
        return self.inner.ppl_metric

    def configure_model(self, model_cfg, vocab_size: int) -> None:
        self.inner.configure_model(model_cfg, vocab_size)

    def check_model(self, model) -> None:
        self.inner.check_model(model)

    def prepare(self, corpus_dir, cache_root, num_proc: int = 1):
        return self.inner.prepare(corpus_dir, cache_root, num_proc=num_proc)

    def init_state(self):
        return self.inner.init_state()

    def loss_counts(self, batch: dict) -> dict:
        return self.inner.loss_counts(batch)

    def step(self, model, batch: dict, state=None):
        return self.inner.step(model, batch, state)

    def tokens_in(self, batch: dict) -> int:
        return self.inner.tokens_in(batch)

    def evaluate(self, accelerator, model, stream, max_batches: int) -> dict | None:
        return self.inner.evaluate(accelerator, model, stream, max_batches)

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        if split != "train":
            return self.inner.stream(corpus_dir, split, batch_size, seed, rank, world, shuffle)
        tok_json = (Path(corpus_dir) / "tokenizer.json").read_text(encoding="utf-8")
        packing = self.inner.stream_packing() if isinstance(self.inner, PacksSentences) else "window"
        return TextStream(corpus_dir, tok_json, self.inner.separator(), self.inner.window_size(), batch_size, rank,
                          world, self.num_workers, functools.partial(self.inner.window_batch, seed=seed), packing)
