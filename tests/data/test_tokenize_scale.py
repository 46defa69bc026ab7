"""`plm tokenize` on corpora larger than memory: byte ranges, parallel shards, flat memory."""

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import pytest
from datasets import load_from_disk

from plmcli.config_sections import TokenizerConfig
from plmcli.data import corpus
from plmcli.data.corpus import load_corpus, tokenize_corpus
from plmcli.data.text import document_start, iter_documents, iter_lines, line_before_is_blank, range_documents
from plmcli.data.tokenizers import train_tokenizer
from plmcli.errors import PlmError

CHAR = TokenizerConfig(kind="char", vocab_size=500, min_frequency=1, special_tokens={"eos": "<eos>"})
PIECES = ["a b\n", "\n", "  \n", "xyz\n", "c\r\n", "é\n", "\u3000\n", "q"]


def test_ranges_split_a_file_anywhere(tmp_path):
    """Cut a file at any bytes: the ranges' documents (and lines), in order, are the file's, once each."""
    rng = random.Random(0)
    path = tmp_path / "f.txt"
    for _ in range(400):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        path.write_bytes(("\ufeff" if rng.random() < 0.1 else "").encode() + text.encode("utf-8"))
        size = path.stat().st_size
        bounds = [0] + sorted(rng.randint(0, size) for _ in range(rng.randint(0, 4))) + [None]
        for per_line in (False, True):
            whole = list(iter_documents([str(path)], per_line)) if text.strip() else []
            assert [d for a, b in zip(bounds, bounds[1:]) for d in range_documents(str(path), a, b, per_line)] == whole
            # the hand-over point: the documents after a cut begin at document_start(cut)
            cut = rng.randint(0, size)
            tail = list(range_documents(str(path), cut, None, per_line))
            start = document_start(str(path), cut, per_line)
            assert tail[0].startswith(dict(iter_lines(str(path)))[start]) if tail else start == size
        lines = list(iter_lines(str(path)))
        assert [x for a, b in zip(bounds, bounds[1:]) for x in iter_lines(str(path), a, b)] == lines
        for i, (pos, _) in enumerate(lines + [(size, "")]):
            assert line_before_is_blank(str(path), pos) == (i == 0 or not lines[i - 1][1].strip())


def _corpus(d: Path) -> list[str]:
    d.mkdir()
    rng = random.Random(1)
    words = "the cat sat on a mat while dogs ran far away from home".split()
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(1, 4)))
            for _ in range(300)]
    (d / "a.txt").write_text("\n\n".join(docs[:150]) + "\n", encoding="utf-8")
    (d / "b.txt.gz").write_bytes(gzip.compress(("\n\n\n".join(docs[150:200]) + "\n").encode()))
    (d / "c.txt").write_text("\r\n\r\n".join(docs[200:]).replace("\n", "\r\n"), encoding="utf-8")  # no final newline
    return [str(d / n) for n in ("a.txt", "b.txt.gz", "c.txt")]


@pytest.mark.parametrize("doc_per_line", [False, True])
def test_pieces_and_workers_give_the_same_corpus(tmp_path, monkeypatch, doc_per_line):
    files = _corpus(tmp_path / "text")
    whole = tokenize_corpus(files, tmp_path / "whole", CHAR, doc_per_line=doc_per_line, val_fraction=0.1)
    monkeypatch.setattr(corpus, "UNIT_BYTES", 997)  # a.txt and c.txt in ~6 pieces each; the .gz stays whole
    monkeypatch.setattr(corpus, "ENCODE_BATCH_BYTES", 300)
    assert len(corpus._plan_units(files)) > 10
    for num_proc in (1, 3):
        out = tmp_path / f"pieces-{num_proc}"
        meta = tokenize_corpus(files, out, CHAR, doc_per_line=doc_per_line, val_fraction=0.1, num_proc=num_proc)
        assert meta == whole  # same key, tokenizer, counts
        a, b = load_corpus(tmp_path / "whole")[0], load_corpus(out)[0]
        for split in ("train", "validation"):
            assert a[split][:] == b[split][:], split
        # the shards were moved in as they were written, the one the validation cut runs through split in two
        names = sorted(p.name for p in (out / "dataset" / "train").glob("*.arrow"))
        assert len(names) > 5 and names[-1] == f"data-{len(names) - 1:05d}-of-{len(names):05d}.arrow"
        assert not list(out.glob(".*"))
    assert whole["counts"]["validation"]["documents"] == round(0.1 * sum(c["documents"] for c in whole["counts"].values()))


def test_empty_validation_and_one_piece_loads(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("only one\n", encoding="utf-8")
    tokenize_corpus([str(f)], tmp_path / "out", CHAR)
    dd = load_from_disk(str(tmp_path / "out" / "dataset"))
    assert len(dd["train"]) == 1 and len(dd["validation"]) == 0
    assert dd["validation"].features == dd["train"].features


def test_a_worker_error_keeps_its_hint(tmp_path, monkeypatch):
    """Bad UTF-8 deep in a big file, found by a worker process (a given tokenizer: no training pass reads it first)."""
    tok = train_tokenizer(iter(["abc\n"]), CHAR)
    tok.save(str(tmp_path / "tok.json"))
    f = tmp_path / "a.txt"
    f.write_bytes(b"abc\n\n" * 400 + b"ab\xe9c\n" + b"abc\n\n" * 10)
    monkeypatch.setattr(corpus, "UNIT_BYTES", 500)
    cfg = TokenizerConfig(path=str(tmp_path / "tok.json"), special_tokens={"eos": "<eos>"})
    with pytest.raises(PlmError, match=r"not UTF-8 text \(the line at byte 2000: invalid byte 0xe9") as e:
        tokenize_corpus([str(f)], tmp_path / "out", cfg, num_proc=2)
    assert "iconv" in e.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "tok.json"]


def test_python_memory_is_flat_in_corpus_size(tmp_path, monkeypatch):
    """Peak Python heap while tokenizing 4× more text stays put: no stage holds the corpus, its documents
    or their token lists (the tokenizers library's own memory is not traced; the benchmark covers RSS)."""
    monkeypatch.setattr(corpus, "ENCODE_BATCH_BYTES", 32 << 10)
    rng = random.Random(2)
    words = [f"w{i}" for i in range(300)]
    peaks = []
    for n_docs in (2000, 8000):
        f = tmp_path / f"{n_docs}.txt"
        f.write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(20)) for _ in range(n_docs)) + "\n")
        tracemalloc.start()
        meta = tokenize_corpus([str(f)], tmp_path / f"out-{n_docs}", CHAR)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert meta["counts"]["train"]["documents"] + meta["counts"]["validation"]["documents"] == n_docs
    assert peaks[1] < 1.25 * peaks[0], peaks
    assert json.loads((tmp_path / "out-8000" / "meta.json").read_text())["counts"]["train"]["bytes"] > 4 * 2000 * 20 * 2
