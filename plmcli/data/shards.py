"""Encode work units in parallel into Arrow shard files, then file the shards as a DatasetDict on disk.

Each unit (a file, or a byte range of a big one) is encoded batch by batch by one worker into its
own shard, so a worker holds one batch, never its unit. The shards are then *moved* into the
`save_to_disk` layout that `datasets.load_from_disk` reads (a split is a list of Arrow files plus
state.json and dataset_info.json): only the one shard that straddles the train/validation cut is
rewritten, streamed batch by batch. Nothing is memory-mapped on the way, so the resident memory of
`plm tokenize` stays flat however big the corpus (a mapped file's pages count as resident once read).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Callable, Iterator

from plmcli.errors import PlmError

# The worker's encoder, built once per process from the picklable recipe `setup` returns.
_worker: dict = {}


def _init(setup: Callable, setup_arg) -> None:
    _worker["encode"] = setup(setup_arg)


def _encode_unit(job) -> dict:
    """Write shard `path` from `unit`; returns its row count and totals, or the PlmError that stopped it."""
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    unit, path, features, totals = job
    schema = features.arrow_schema
    sums: dict = {}
    rows = 0
    try:
        with ArrowWriter(features=features, path=str(path)) as writer:
            for batch in _worker["encode"](unit):
                rb = pa.RecordBatch.from_pydict(batch, schema=schema)
                writer.write_table(pa.Table.from_batches([rb]))
                rows += rb.num_rows
                for k, v in totals(rb).items():
                    sums[k] = sums.get(k, 0) + v
            writer.finalize()
    except PlmError as e:  # pickled by hand: PlmError(message) alone would lose the hint
        return {"error": [e.message, e.hint]}
    return {"path": str(path), "rows": rows, "totals": sums}


def write_shards(units: list, setup: Callable, setup_arg, features, totals: Callable, shard_dir: Path,
                 num_proc: int, sizes: list[int] | None = None) -> Iterator[dict]:
    """Encode every unit into shard_dir/unit-NNNNN.arrow; yields {path, rows, totals} per unit, in order.

    `setup(setup_arg)` (run once in each worker) returns `encode(unit) -> iterator of column dicts`;
    `totals(record_batch) -> {name: number}` is summed per shard. `sizes` (bytes per unit) drive a
    progress bar (datasets' own, so `datasets.disable_progress_bars()` hides it too).
    """
    from datasets.utils import tqdm as progress_bar

    shard_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(u, shard_dir / f"unit-{i:05d}.arrow", features, totals) for i, u in enumerate(units)]
    workers = min(num_proc, len(jobs))
    if workers <= 1:
        _init(setup, setup_arg)
        results = map(_encode_unit, jobs)
        pool = None
    else:
        pool = multiprocessing.get_context().Pool(workers, initializer=_init, initargs=(setup, setup_arg))
        results = pool.imap(_encode_unit, jobs)  # in unit order, whichever worker finishes first
    bar = progress_bar(total=sum(sizes or [0]) or None, unit="B", unit_scale=True, desc="tokenizing")
    try:
        for i, res in enumerate(results):
            if "error" in res:
                raise PlmError(*res["error"])
            bar.update(sizes[i] if sizes else 0)
            yield res
    finally:
        bar.close()
        _worker.clear()
        if pool is not None:
            pool.terminate()
            pool.join()


def _add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def file_splits(out: Path, shards: list[dict], n_train: int, features, totals: Callable, fingerprint: str) -> dict:
    """Move `shards` (in order) into out/{train,validation}: the first n_train rows train, the rest
    validation. Returns {split: totals} (with "rows")."""
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    parts: dict = {"train": [], "validation": []}
    sums: dict = {"train": {}, "validation": {}}
    for split in parts:
        (out / split).mkdir(parents=True, exist_ok=True)
    seen = 0
    for shard in shards:
        path, rows = Path(shard["path"]), shard["rows"]
        if rows == 0:
            path.unlink()
            continue
        if seen >= n_train or seen + rows <= n_train:  # wholly on one side: moved, not copied
            split = "train" if seen < n_train else "validation"
            parts[split].append(path)
            sums[split] = _add(sums[split], {"rows": rows, **shard["totals"]})
        else:  # the cut runs through this shard: stream it into two files
            cut = n_train - seen
            paths = {s: path.with_suffix(f".{s}.arrow") for s in parts}
            writers = {s: ArrowWriter(features=features, path=str(p)) for s, p in paths.items()}
            with pa.OSFile(str(path)) as src:
                done = 0
                for rb in pa.ipc.open_stream(src):
                    for split, piece in (("train", rb.slice(0, max(0, cut - done))), ("validation", rb.slice(max(0, cut - done)))):
                        if piece.num_rows:
                            writers[split].write_table(pa.Table.from_batches([piece]))
                            sums[split] = _add(sums[split], {"rows": piece.num_rows, **totals(piece)})
                    done += rb.num_rows
            for split, w in writers.items():
                w.finalize()
                w.close()
                parts[split].append(paths[split])
            path.unlink()
        seen += rows
    for split, files in parts.items():
        _write_split(out / split, split, files, features, f"{fingerprint}-{split}")
    (out / "dataset_dict.json").write_text(json.dumps({"splits": list(parts)}))
    return {split: {"rows": 0, **s} for split, s in sums.items()}


def _write_split(split_dir: Path, split: str, files: list[Path], features, fingerprint: str) -> None:
    """The `save_to_disk` layout of one split around already-written Arrow files (moved in, renamed)."""
    from datasets import DatasetInfo
    from datasets.arrow_writer import ArrowWriter

    if not files:  # load_from_disk needs at least one file, even an empty one
        empty = split_dir / ".empty.arrow"
        with ArrowWriter(features=features, path=str(empty)) as w:
            w.finalize()
        files = [empty]
    names = []
    for i, f in enumerate(files):
        name = f"data-{i:05d}-of-{len(files):05d}.arrow"
        os.replace(f, split_dir / name)
        names.append(name)
    DatasetInfo(features=features).write_to_directory(str(split_dir))
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": fingerprint, "_format_columns": None,
             "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": split}
    (split_dir / "state.json").write_text(json.dumps(state, indent=2))
