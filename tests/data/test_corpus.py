import gzip
import io
import json
import os
import sys
import threading
from pathlib import Path

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from plmcli.config_sections import DataConfig, TokenizerConfig  # noqa: E402
from plmcli.data import corpus  # noqa: E402
from plmcli.data.corpus import (  # noqa: E402
    default_cache_dir,
    load_corpus,
    prepare_corpus,
    split_bytes,
    token_stream,
    tokenize_corpus,
)
from plmcli.data.text import iter_documents, split_lines  # noqa: E402
from plmcli.data.tokenizers import train_tokenizer  # noqa: E402
from plmcli.errors import PlmError  # noqa: E402

datasets.disable_progress_bars()

CHAR = TokenizerConfig(kind="char", vocab_size=500, min_frequency=1, special_tokens={"eos": "<eos>"})


def write(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


# ----------------------------------------------------------------------------- iter_documents


def test_documents_split_on_blank_lines(tmp_path):
    f = write(tmp_path / "a.txt", "\n\nOne.\nTwo.\n \t\n\n\nThree.\n\nFour\nfive")
    assert list(iter_documents([f], doc_per_line=False)) == ["One.\nTwo.\n", "Three.\n", "Four\nfive\n"]


def test_doc_per_line(tmp_path):
    f = write(tmp_path / "a.txt", "One.\nTwo.\n\n  \nThree.\n")
    assert list(iter_documents([f], doc_per_line=True)) == ["One.\n", "Two.\n", "Three.\n"]


def test_documents_never_span_files_and_crlf_bom(tmp_path):
    a = write(tmp_path / "a.txt", b"\xef\xbb\xbfBOM line\r\nsecond\r\n")
    b = write(tmp_path / "b.txt", "third\n")
    assert list(iter_documents([a, b])) == ["BOM line\nsecond\n", "third\n"]


def test_gz_and_directory_inputs(tmp_path):
    d = tmp_path / "dir"
    write(d / "b.txt", "bee\n")
    write(d / "a" / "z.txt", "zed\n")
    write(d / ".hidden.txt", "hidden\n")
    write(d / ".git" / "x.txt", "hidden too\n")
    (d / "c.txt.gz").write_bytes(gzip.compress("see\r\n\ngz doc\n".encode()))
    assert list(iter_documents([str(d)])) == ["zed\n", "bee\n", "see\n", "gz doc\n"]


def test_stdin_text_and_binary(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\n\nc\n"))
    assert list(iter_documents(["-"])) == ["a\nb\n", "c\n"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\r\n\ny\n")))
    assert list(iter_documents(["-"])) == ["x\n", "y\n"]


@pytest.mark.parametrize(
    "content, pattern",
    [
        (None, "not found"),
        (b"\n  \n\n", "no text"),
        (b"text\x00\x01\x02binary", "binary"),
        (b"fine\nstill fine\ncaf\xe9 au lait\n", r"not UTF-8 text \(line 3"),
        (b"\xff\xfeh\x00i\x00", r"not UTF-8.*UTF-16"),
    ],
)
def test_bad_inputs(tmp_path, content, pattern):
    path = tmp_path / "in.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PlmError, match=pattern) as e:
        list(iter_documents([str(path)]))
    assert e.value.hint
    if "UTF-8" in pattern:
        assert "iconv -f" in e.value.hint and "-t utf-8" in e.value.hint


def test_bad_gz(tmp_path):
    with pytest.raises(PlmError, match="cannot read"):
        list(iter_documents([write(tmp_path / "x.gz", "not gzip at all\n")]))


# ----------------------------------------------------------------------------- tokenize_corpus


def test_hand_example_ids_sentence_starts_bytes(tmp_path):
    f = write(tmp_path / "a.txt", "ab\ncé\n\nb\n")
    meta = tokenize_corpus([f], tmp_path / "out", CHAR, val_fraction=0.0)
    dd, tok, meta2 = load_corpus(tmp_path / "out")
    assert meta2 == meta
    assert len(dd["train"]) == 2 and len(dd["validation"]) == 0
    first = dd["train"][0]
    assert [tok.id_to_token(i) for i in first["input_ids"]] == ["a", "b", "\n", "c", "é", "\n"]
    assert first["sentence_starts"] == [0, 3]
    assert first["num_bytes"] == 7  # é is two bytes
    assert dd["train"][1]["sentence_starts"] == [0] and dd["train"][1]["num_bytes"] == 2
    assert dd["train"].features["input_ids"].feature.dtype == "int32"
    assert meta["counts"]["train"] == {"documents": 2, "sentences": 3, "tokens": 8, "bytes": 9}
    assert meta["counts"]["validation"] == {"documents": 0, "sentences": 0, "tokens": 0, "bytes": 0}
    t = meta["tokenizer"]
    assert t["kind"] == "char" and t["vocab_size"] == tok.get_vocab_size() == 7
    assert t["special_tokens"] == {"unk": "<unk>", "eos": "<eos>"}
    assert t["special_token_ids"] == {"unk": 0, "eos": 1}
    assert meta["inputs"] == [{"path": str(Path(f).resolve()), "size": 10, "mtime": os.stat(f).st_mtime_ns}]
    assert split_bytes(tmp_path / "out", "train") == 9
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "out"]  # no temp dirs left
    assert sorted(os.listdir(tmp_path / "out")) == ["dataset", "meta.json", "tokenizer.json"]  # no .cache


def test_trained_tokenizer_spec_and_no_hf_home_cache(tmp_path):
    hf_cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = sorted(hf_cache.rglob("*")) if hf_cache.exists() else None
    f = write(tmp_path / "a.txt", "the cat sat\non the mat\n\nthe dog\n")
    cfg = TokenizerConfig(kind="word", vocab_size=100, min_frequency=1, special_tokens={"pad": "[PAD]"})
    meta = tokenize_corpus([f], tmp_path / "out", cfg)
    dd, tok, _ = load_corpus(tmp_path / "out")
    assert tok.decode(dd["train"][0]["input_ids"]) == "the cat sat on the mat"
    assert dd["train"][0]["sentence_starts"] == [0, 3]
    assert meta["tokenizer"]["special_token_ids"] == {"pad": 0, "unk": 1}
    assert (sorted(hf_cache.rglob("*")) if hf_cache.exists() else None) == before


def test_tail_validation_split(tmp_path):
    f = write(tmp_path / "a.txt", "".join(f"doc {i}\n" for i in range(10)))
    meta = tokenize_corpus([f], tmp_path / "out", CHAR, doc_per_line=True, val_fraction=0.2)
    dd, tok, _ = load_corpus(tmp_path / "out")
    assert [tok.decode(r) for r in dd["train"]["input_ids"]] == [f"doc {i}\n" for i in range(8)]
    assert [tok.decode(r) for r in dd["validation"]["input_ids"]] == ["doc 8\n", "doc 9\n"]
    assert meta["counts"]["validation"]["documents"] == 2
    # a tiny fraction still holds out one document; a single document is never held out
    assert tokenize_corpus([f], tmp_path / "o2", CHAR, doc_per_line=True, val_fraction=0.01)["counts"]["validation"]["documents"] == 1
    one = write(tmp_path / "one.txt", "only\n")
    assert tokenize_corpus([one], tmp_path / "o3", CHAR, val_fraction=0.5)["counts"]["train"]["documents"] == 1


def test_cache_reuse_and_rebuild(tmp_path):
    f = write(tmp_path / "a.txt", "hello\n\nworld\n")
    out = tmp_path / "out"
    meta = tokenize_corpus([f], out, CHAR)
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert tokenize_corpus([f], out, CHAR) == meta
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    assert tokenize_corpus([f], out, CHAR, num_proc=2)["key"] == meta["key"]  # workers don't change the data

    rebuilt = tokenize_corpus([f], out, CHAR, val_fraction=0.5)
    assert rebuilt["key"] != meta["key"] and rebuilt["counts"]["validation"]["documents"] == 1
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert tokenize_corpus([f], out, CHAR, val_fraction=0.5, force=True)["key"] == rebuilt["key"]
    assert (out / "meta.json").stat().st_mtime_ns != stamp

    write(tmp_path / "a.txt", "hello there\n\nworld\n")
    assert tokenize_corpus([f], out, CHAR, val_fraction=0.5)["counts"]["train"]["bytes"] == 12
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "out"]


def test_num_proc_gives_the_same_data(tmp_path):
    f = write(tmp_path / "a.txt", "".join(f"line {i} of doc\n" + ("\n" if i % 3 == 0 else "") for i in range(40)))
    one = tokenize_corpus([f], tmp_path / "one", CHAR)
    two = tokenize_corpus([f], tmp_path / "two", CHAR, num_proc=2)
    assert one == two
    assert load_corpus(tmp_path / "one")[0]["train"][:] == load_corpus(tmp_path / "two")[0]["train"][:]


def test_stdin_is_never_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("from stdin\n"))
    m1 = tokenize_corpus(["-"], tmp_path / "out", CHAR)
    monkeypatch.setattr(sys, "stdin", io.StringIO("from stdin\n"))
    m2 = tokenize_corpus(["-"], tmp_path / "out", CHAR)
    assert m1["key"] != m2["key"] and m2["counts"]["train"]["bytes"] == 11
    assert m2["inputs"] == [{"path": "-", "size": None, "mtime": None}]


def test_given_tokenizer_path(tmp_path):
    tok = train_tokenizer(iter(["abc\n"]), CHAR)
    tok.save(str(tmp_path / "tok.json"))
    f = write(tmp_path / "a.txt", "cab\n")
    cfg = TokenizerConfig(path=str(tmp_path / "tok.json"), special_tokens={"eos": "<eos>"})
    meta = tokenize_corpus([f], tmp_path / "out", cfg)
    assert meta["tokenizer"]["kind"] == "char"
    assert meta["tokenizer"]["hash"] == corpus.tokenizer_hash(tok)
    dd, _, _ = load_corpus(tmp_path / "out")
    assert dd["train"][0]["input_ids"] == tok.encode("cab\n").ids
    with pytest.raises(PlmError, match="'<s>' \\(role 'bos'\\)"):
        tokenize_corpus([f], tmp_path / "o2", TokenizerConfig(path=str(tmp_path / "tok.json"), special_tokens={"bos": "<s>"}))


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    f = write(tmp_path / "a.txt", "hello\n")

    def boom(tok):
        raise RuntimeError("disk full")

    monkeypatch.setattr(corpus, "tokenizer_hash", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        tokenize_corpus([f], tmp_path / "out", CHAR)
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]

    monkeypatch.undo()
    meta = tokenize_corpus([f], tmp_path / "out", CHAR)
    monkeypatch.setattr(corpus, "tokenizer_hash", boom)
    with pytest.raises(RuntimeError):
        tokenize_corpus([f], tmp_path / "out", CHAR, force=True)
    assert json.loads((tmp_path / "out" / "meta.json").read_text()) == meta  # the old output survives
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "out"]


def test_bad_input_inside_generator_surfaces_as_plm_error(tmp_path):
    f = write(tmp_path / "a.txt", b"ok\n\xe9\n")
    with pytest.raises(PlmError, match="line 2"):
        tokenize_corpus([f], tmp_path / "out", CHAR)
    with pytest.raises(PlmError, match="no text"):
        tokenize_corpus([write(tmp_path / "b.txt", "\n\n")], tmp_path / "out", CHAR)
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]


def test_out_dir_guards(tmp_path):
    f = write(tmp_path / "a.txt", "hello\n")
    write(tmp_path / "foreign" / "notes.txt", "mine\n")
    with pytest.raises(PlmError, match="not a `plm tokenize` output"):
        tokenize_corpus([f], tmp_path / "foreign", CHAR)
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "mine\n"
    (tmp_path / "empty").mkdir()
    assert tokenize_corpus([f], tmp_path / "empty", CHAR)["counts"]["train"]["documents"] == 1
    with pytest.raises(PlmError, match="already a `plm tokenize` output"):
        tokenize_corpus([str(tmp_path / "empty")], tmp_path / "o2", CHAR)
    with pytest.raises(PlmError, match="val_fraction"):
        tokenize_corpus([f], tmp_path / "o3", CHAR, val_fraction=1.0)


def test_out_dir_inside_input_dir_is_skipped(tmp_path):
    d = tmp_path / "text"
    write(d / "a.txt", "hello\n")
    m1 = tokenize_corpus([str(d)], d / "tok", CHAR)
    assert tokenize_corpus([str(d)], d / "tok", CHAR) == m1


# ----------------------------------------------------------------------------- reading a corpus


def test_token_stream_layout_dtype_and_cache(tmp_path):
    f = write(tmp_path / "a.txt", "ab\n\nc\n\nba\n")
    tokenize_corpus([f], tmp_path / "out", CHAR, val_fraction=0.34)
    dd, tok, meta = load_corpus(tmp_path / "out")
    eos = meta["tokenizer"]["special_token_ids"]["eos"]
    docs = dd["train"]["input_ids"]
    stream = token_stream(tmp_path / "out", "train", eos)
    assert isinstance(stream, np.memmap) and stream.dtype == np.uint16
    assert stream.tolist() == docs[0] + [eos] + docs[1] + [eos]
    assert tok.decode(stream.tolist(), skip_special_tokens=False) == "ab\n<eos>c\n<eos>"
    assert token_stream(tmp_path / "out", "train", None).tolist() == docs[0] + docs[1]
    assert token_stream(tmp_path / "out", "validation", None).tolist() == dd["validation"]["input_ids"][0]
    with pytest.raises(ValueError):
        stream[0] = 1  # read-only

    side = json.loads((tmp_path / "out" / f"train.{eos}.tokens.json").read_text())
    assert side["dtype"] == "uint16" and side["length"] == 7
    bin_path = tmp_path / "out" / f"train.{eos}.tokens.bin"
    stamp = bin_path.stat().st_mtime_ns
    assert token_stream(tmp_path / "out", "train", eos).tolist() == stream.tolist()
    assert bin_path.stat().st_mtime_ns == stamp  # memmapped, not rebuilt
    assert token_stream(tmp_path / "out", "train", 70_000).dtype == np.uint32
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".")]


def test_token_stream_empty_split(tmp_path):
    tokenize_corpus([write(tmp_path / "a.txt", "x\n")], tmp_path / "out", CHAR)
    empty = token_stream(tmp_path / "out", "validation", 1)
    assert empty.shape == (0,) and empty.dtype == np.uint16


def test_load_corpus_rejects_other_dirs(tmp_path):
    with pytest.raises(PlmError, match="not a tokenized corpus") as e:
        load_corpus(tmp_path)
    assert "plm tokenize" in e.value.hint
    with pytest.raises(PlmError, match="plm tokenize"):
        token_stream(tmp_path, "train", None)


def test_prepare_corpus(tmp_path, monkeypatch):
    f = write(tmp_path / "a.txt", "hello\n\nworld\n")
    out = tmp_path / "tok"
    tokenize_corpus([f], out, CHAR)
    assert prepare_corpus([str(out)], CHAR, DataConfig(), cache_root=tmp_path / "cache") == out
    assert not (tmp_path / "cache").exists()

    path = prepare_corpus([f], CHAR, DataConfig(val_fraction=0.5), cache_root=tmp_path / "cache")
    assert path.parent == tmp_path / "cache" / "corpora" and len(path.name) == 16
    meta = json.loads((path / "meta.json").read_text())
    assert path.name == meta["key"][:16] and meta["counts"]["validation"]["documents"] == 1
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert prepare_corpus(f, CHAR, DataConfig(val_fraction=0.5), cache_root=tmp_path / "cache") == path
    assert (path / "meta.json").stat().st_mtime_ns == stamp

    monkeypatch.setenv("PLM_CACHE", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    assert prepare_corpus([f], CHAR, DataConfig()).parent == tmp_path / "env-cache" / "corpora"
    monkeypatch.delenv("PLM_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "plm"


# ----------------------------------------------------------------------------- vectorised encoding


def _reference_encode(batch: dict, tok, split_sentences: bool = False) -> dict:
    """The corpus columns of a batch of documents as the first implementation built them, token by token in
    Python: the output the vectorised pipeline must equal."""
    assert not split_sentences  # the reference reads lines as sentences, as the files it is compared on
    lines, per_doc = [], []
    for doc in batch["text"]:
        doc_lines = split_lines(doc)
        lines.extend(doc_lines)
        per_doc.append(len(doc_lines))
    encodings = iter(tok.encode_batch(lines, add_special_tokens=False))
    ids_out, starts_out, words_out = [], [], []
    for n in per_doc:
        ids: list[int] = []
        starts = []
        word_starts: list[bool] = []
        for _ in range(n):
            enc = next(encodings)
            starts.append(len(ids))
            ids.extend(enc.ids)
            w = enc.word_ids
            word_starts.extend(i == 0 or w[i] != w[i - 1] for i in range(len(w)))
        ids_out.append(ids)
        starts_out.append(starts)
        words_out.append(word_starts)
    return {"input_ids": ids_out, "sentence_starts": starts_out, "word_starts": words_out,
            "num_bytes": [len(doc.encode("utf-8")) for doc in batch["text"]]}


def _tree(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# Lines the tokenizer encodes to nothing ("\x01": wordpiece's clean_text drops control characters), added
# tokens in the text (word id None, alone and two in a row), "##" continuations, CJK, one-token lines, CRLF.
EDGE_TEXT = ("the cat sat on the mat\nunbelievably <eos><eos> cats\n\x01\n\n<eos> first\n\n"
             "数据 集 分词\r\nx\n\n\x01\n\nemoji 🙂 ok\nlast line <eos>\n\x01\n")


@pytest.mark.parametrize("kind", ["wordpiece", "bytelevel-bpe", "char", "unigram"])
def test_vectorised_encoding_writes_the_reference_bytes(tmp_path, monkeypatch, kind):
    """Every file `plm tokenize` writes (Arrow shards, state, meta.json, tokenizer) is byte for byte what the
    per-token implementation wrote, over several batches, pieces and a validation cut inside a piece."""
    rng = np.random.default_rng(0)
    words = "the cat sat on a mat unbelievably dogs ran far 数据 集 <eos>".split()
    docs = ["\n".join(" ".join(rng.choice(words, rng.integers(1, 9))) for _ in range(rng.integers(1, 4)))
            for _ in range(120)]
    f = write(tmp_path / "a.txt", EDGE_TEXT + "\n" + "\n\n".join(docs) + "\n\n" + EDGE_TEXT)
    cfg = TokenizerConfig(kind=kind, vocab_size=120, min_frequency=1, special_tokens={"eos": "<eos>", "unk": "<unk>"})
    tok = train_tokenizer(iter(["the cat sat on a mat unbelievably\n", "数据 集\n", "dogs ran far x\n"]), cfg)
    tok.save(str(tmp_path / "tok.json"))
    given = TokenizerConfig(kind=kind, path=str(tmp_path / "tok.json"), special_tokens={"eos": "<eos>", "unk": "<unk>"})
    monkeypatch.setattr(corpus, "UNIT_BYTES", 1500)
    monkeypatch.setattr(corpus, "ENCODE_BATCH_BYTES", 400)
    new = tokenize_corpus([f], tmp_path / "new", given, val_fraction=0.3)
    with monkeypatch.context() as m:
        # the per-token implementation, from the documents, in place of reading the pipeline's encodings out
        m.setattr(corpus, "_columns", lambda docs, per_doc, encodings: _reference_encode({"text": docs}, tok))
        ref = tokenize_corpus([f], tmp_path / "ref", given, val_fraction=0.3)
    assert new == ref
    a, b = _tree(tmp_path / "new"), _tree(tmp_path / "ref")
    assert len([n for n in a if n.endswith(".arrow")]) > 3
    assert a.keys() == b.keys() and all(a[n] == b[n] for n in a), [n for n in a if a[n] != b[n]]
    if kind == "wordpiece":  # the edge cases are there: a line encoded to nothing, words in several pieces
        batch = _reference_encode({"text": EDGE_TEXT.replace("\r\n", "\n").split("\n\n")}, tok)
        assert [] in [ids[s:e] for ids, st in zip(batch["input_ids"], batch["sentence_starts"])
                      for s, e in zip(st, st[1:] + [len(ids)])]
        assert not all(all(ws) for ws in batch["word_starts"])


class _StubEncoding:
    def __init__(self, word_ids):
        self.word_ids = word_ids

    def __len__(self):
        return len(self.word_ids)


def test_word_starts_of_tokens_without_a_word():
    """Tokens with word id None (special tokens) compare as the per-token code did: None == None, None != 0."""
    lines = [[None, None, 0, 0, None, 1, 1], [], [0, 0, None], [None], [3, 3], [3]]
    encodings = [_StubEncoding(w) for w in lines]
    expected = [i == 0 or w[i] != w[i - 1] for w in lines for i in range(len(w))]
    line_at = corpus._offsets(np.array([len(w) for w in lines]))
    assert corpus._word_starts(encodings, line_at).tolist() == expected
    assert expected == [True, False, True, False, True, True, False, True, False, True, True, True, False, True]


def test_batches_start_small_grow_and_end_small(tmp_path):
    # 600 documents of ~1 kB: the tokenizer gets 32 kB first, then twice as much each time, and at the end
    # of a plain file halves again, so neither thread waits long alone at either end of a unit.
    docs = [f"document {i} " + "word " * 200 for i in range(600)]
    f = tmp_path / "c.txt"
    f.write_text("\n\n".join(docs) + "\n")
    (unit,) = corpus._plan_units([str(f)])
    batches = list(corpus._document_batches(unit, False))
    assert [d.strip() for b in batches for d in b] == [d.strip() for d in docs]  # all, in order, once
    sizes = [sum(map(len, b)) for b in batches]
    first, doc = corpus.FIRST_BATCH_BYTES, len(docs[0]) + 1
    assert sizes[0] <= first + doc and sizes[-1] <= first + doc
    peak = sizes.index(max(sizes))
    assert 0 < peak < len(sizes) - 1
    assert all(b >= a for a, b in zip(sizes[:peak], sizes[1:peak + 1]))  # growing ...
    assert all(b <= a for a, b in zip(sizes[peak:], sizes[peak + 1:]))  # ... then shrinking
    assert sizes[1] >= 2 * first - doc
    # a .gz file's size is not its text's: batches grow only, up to ENCODE_BATCH_BYTES or 1000 documents
    g = tmp_path / "c.txt.gz"
    g.write_bytes(gzip.compress(f.read_bytes()))
    (gz_unit,) = corpus._plan_units([str(g)])
    gz_sizes = [sum(map(len, b)) for b in corpus._document_batches(gz_unit, False)]
    assert gz_sizes[0] <= first + doc and all(b >= a for a, b in zip(gz_sizes[:-2], gz_sizes[1:-1]))
    assert sum(gz_sizes) == sum(sizes)


class _TracedEncoding:
    """An encoding that records the thread it is freed on."""

    def __init__(self, encoding, freed_on: list):
        self.ids, self.word_ids, self._freed_on = encoding.ids, encoding.word_ids, freed_on

    def __len__(self):
        return len(self.ids)

    def __del__(self):
        self._freed_on.append(threading.get_ident())


def test_encodings_are_freed_on_the_tokenizer_thread(tmp_path):
    # The thread that made an encoding frees it (frees from the other thread contend with the tokenizer's
    # allocator); only the last batches, read out after the tokenizer is done, go on this thread. The switch
    # interval is short while the unit is encoded and restored after.
    docs = [f"document {i} " + "word " * 200 for i in range(300)]
    f = tmp_path / "c.txt"
    f.write_text("\n\n".join(docs) + "\n")
    tok = train_tokenizer(iter(docs[:20]), CHAR)
    freed_on, made_on, switch = [], [], []

    class Traced:
        def encode_batch(self, lines, add_special_tokens):
            made_on.append(threading.get_ident())
            switch.append(sys.getswitchinterval())
            return [_TracedEncoding(e, freed_on) for e in tok.encode_batch(lines, add_special_tokens=add_special_tokens)]

    (unit,) = corpus._plan_units([str(f)])
    before = sys.getswitchinterval()
    batches = list(corpus._encoder((Traced(), False, False))(unit))
    assert sys.getswitchinterval() == before and switch == [pytest.approx(corpus.GIL_SWITCH_S)] * len(switch)
    assert sum(len(b["num_bytes"]) for b in batches) == len(docs)
    assert batches[0]["input_ids"][0].as_py() == tok.encode(docs[0] + "\n", add_special_tokens=False).ids
    main, (worker,) = threading.get_ident(), set(made_on)
    assert worker != main and len(made_on) > 4
    assert len(freed_on) == sum(len(d.split("\n")) for d in docs)  # one encoding a line, every one freed
    lines_per_batch = [sum(len(b) for b in batch["sentence_starts"].to_pylist()) for batch in batches]
    on_worker = freed_on.count(worker)
    assert freed_on.count(main) + on_worker == len(freed_on)
    assert on_worker >= sum(lines_per_batch[:-3])  # all but the last batches, read out after the tokenizer's last
