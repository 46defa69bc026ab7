"""Corpora in the formats `datasets` users keep them (plmcli/data/tables.py): each reads as the text file
of its rows separated by blank lines, so it tokenizes and scores exactly as that file does."""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from plmcli.config_sections import DataConfig, TokenizerConfig  # noqa: E402
from plmcli.data.corpus import corpus_key, prepare_corpus, token_stream, tokenize_corpus  # noqa: E402
from plmcli.data.text import iter_documents, iter_text_lines  # noqa: E402
from plmcli.data.streaming import prepare_stream_corpus  # noqa: E402
from plmcli.errors import PlmError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import tiny_recipe  # noqa: E402
from test_cli import assert_clean_error, run  # noqa: E402

datasets.disable_progress_bars()

CHAR = TokenizerConfig(kind="char", vocab_size=500, min_frequency=1, special_tokens={"eos": "<eos>"})
WORDS = "the cat sat on a mat while dogs ran far away from home and back again".split()
# Rows as users keep them: multi-line texts, a CRLF, a blank line inside a row (two documents, as in text).
ROWS = [" ".join(WORDS[(d + j) % len(WORDS)] for j in range(5 + d % 4)) + ("\nsecond line" if d % 3 == 0 else "")
        for d in range(24)]
ROWS[4] = "crlf line\r\nnext"
ROWS[7] = "para one\n\npara two"


def as_text(rows) -> str:
    """The text file a table reads as."""
    return "\n\n".join(r.replace("\r\n", "\n") for r in rows) + "\n"


def write_jsonl(path: Path, rows, column="text") -> Path:
    path.write_text("".join(json.dumps({"id": i, column: r}) + "\n" for i, r in enumerate(rows)), encoding="utf-8")
    return path


def write_csv(path: Path, rows) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([i, r] for i, r in enumerate(rows))
    return path


def write_parquet(path: Path, rows) -> Path:
    pq.write_table(pa.table({"id": list(range(len(rows))), "text": rows}), str(path), row_group_size=5)
    return path


def write_saved(path: Path, rows) -> Path:
    datasets.Dataset.from_dict({"text": rows, "id": list(range(len(rows)))}).save_to_disk(str(path))
    return path


def ids_of(corpus_dir, split="train") -> list[int]:
    return token_stream(corpus_dir, split, 0).tolist()


@pytest.mark.parametrize("writer, name", [(write_jsonl, "c.jsonl"), (write_csv, "c.csv"), (write_parquet, "c.parquet"),
                                          (write_saved, "saved")])
def test_table_tokenizes_as_its_text(tmp_path, writer, name):
    txt = tmp_path / "c.txt"
    txt.write_text(as_text(ROWS), encoding="utf-8")
    table = writer(tmp_path / name, ROWS)
    assert list(iter_documents([str(table)])) == list(iter_documents([str(txt)]))
    a = tokenize_corpus([str(txt)], tmp_path / "from-txt", CHAR, val_fraction=0.2)
    b = tokenize_corpus([str(table)], tmp_path / "from-table", CHAR, val_fraction=0.2)
    assert a["counts"] == b["counts"] and a["counts"]["train"]["documents"] == 20
    assert (tmp_path / "from-txt" / "tokenizer.json").read_text() == (tmp_path / "from-table" / "tokenizer.json").read_text()
    for split in ("train", "validation"):
        assert ids_of(tmp_path / "from-table", split) == ids_of(tmp_path / "from-txt", split)
    assert b["inputs"][0]["column"] == "text" and b["inputs"][0]["kind"] in ("json", "csv", "parquet", "disk")


def test_dataset_dict_keeps_its_validation_split(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ROWS[:20]}),
                               "validation": datasets.Dataset.from_dict({"text": ROWS[20:]}),
                               "test": datasets.Dataset.from_dict({"text": ["held out test text"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    meta = tokenize_corpus([str(tmp_path / "dd")], tmp_path / "tok", CHAR, val_fraction=0.5)
    assert meta["counts"]["train"]["documents"] == 21 and meta["counts"]["validation"]["documents"] == 4
    (tmp_path / "t.txt").write_text(as_text(ROWS[20:]))
    tokenize_corpus([str(tmp_path / "t.txt")], tmp_path / "ref", TokenizerConfig(
        **{**CHAR.__dict__, "path": str(tmp_path / "tok" / "tokenizer.json")}), val_fraction=0.0)
    assert ids_of(tmp_path / "tok", "validation") == ids_of(tmp_path / "ref", "train")
    # eval-ppl reads the test split of a DatasetDict
    assert list(iter_text_lines([str(tmp_path / "dd")])) == ["held out test text\n"]


def test_text_column_and_errors(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", ROWS, column="body")
    with pytest.raises(PlmError, match=r"has no column 'text' \(its columns: id, body\)") as e:
        list(iter_documents([str(f)]))
    assert "--text-column" in e.value.hint
    assert list(iter_documents([str(f)], column="body")) == list(iter_documents([str(write_jsonl(tmp_path / "d.jsonl", ROWS))]))
    pq.write_table(pa.table({"body": ROWS}), str(tmp_path / "p.parquet"))
    with pytest.raises(PlmError, match=r"no column 'text' \(its columns: body\)"):
        list(iter_documents([str(tmp_path / "p.parquet")]))
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\nnot json at all\n')
    with pytest.raises(PlmError, match=r"cannot read 'bad.jsonl|cannot read '.*bad.jsonl' as JSON Lines"):
        list(iter_documents([str(tmp_path / "bad.jsonl")]))
    (tmp_path / "n.jsonl").write_text('{"text": 5}\n')
    with pytest.raises(PlmError, match="holds int values, not text"):
        list(iter_documents([str(tmp_path / "n.jsonl")]))


def test_cache_key_names_column_and_content(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [r.replace("\n", " ") for r in ROWS])
    k = corpus_key([str(f)], CHAR)
    assert corpus_key([str(f)], CHAR, column="body") != k
    write_jsonl(f, ROWS[:-1])
    assert corpus_key([str(f)], CHAR) != k
    saved = write_saved(tmp_path / "s", ROWS)
    k = corpus_key([str(saved)], CHAR)
    datasets.Dataset.from_dict({"text": ROWS[:-1], "id": list(range(23))}).save_to_disk(str(tmp_path / "s2"))
    os.replace(tmp_path / "s", tmp_path / "old")
    os.replace(tmp_path / "s2", tmp_path / "s")
    assert corpus_key([str(saved)], CHAR) != k


def test_hub_names(tmp_path, monkeypatch):
    from plmcli.data import tables

    assert tables.looks_like_hub_name("wikitext:wikitext-103-raw-v1") and tables.looks_like_hub_name("user/name")
    assert not tables.looks_like_hub_name("missing.txt") and not tables.looks_like_hub_name("a/b/c")
    (t,) = tables.resolve("wikitext:wikitext-103-raw-v1:test", "text", for_eval=True)
    assert (t.path, t.config, t.split) == ("wikitext", "wikitext-103-raw-v1", "test")
    assert tables.stats(t) == {"kind": "hub", "column": "text", "split": "test", "hub": "wikitext",
                               "config": "wikitext-103-raw-v1"}
    # train + validation splits of a dict; what load_dataset would stream, without the network
    monkeypatch.setattr(tables, "_hub_splits", lambda arg, name, config: ["train", "validation", "test"])
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split, streaming: datasets.Dataset.from_dict(
        {"text": ROWS[:20] if split == "train" else ROWS[20:]}).to_iterable_dataset())
    meta = tokenize_corpus(["wikitext:wikitext-103-raw-v1"], tmp_path / "tok", CHAR)
    assert meta["counts"]["train"]["documents"] == 21 and meta["counts"]["validation"]["documents"] == 4
    assert [s["split"] for s in meta["inputs"]] == ["train", "validation"]


def test_hub_offline_is_one_line(tmp_path):
    res = run("tokenize", "no-such-dataset-xyz:cfg", "--out", tmp_path / "o", "--tokenizer", "char")
    assert_clean_error(res, "no-such-dataset-xyz:cfg", "Hub")
    assert_clean_error(run("tokenize", tmp_path / "missing.jsonl", "--out", tmp_path / "o"), "not found")


def test_streaming_refuses_tables(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", ROWS)
    with pytest.raises(PlmError, match="--streaming reads plain text files.*JSON Lines") as e:
        prepare_stream_corpus([str(f)], CHAR, DataConfig(), cache_root=tmp_path / "cache")
    assert "plm tokenize" in e.value.hint


def test_empty_directory_wording(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlmError, match="directory '.*empty' holds no text files"):
        list(iter_documents([str(tmp_path / "empty")]))


def test_directory_of_tables_and_prepare_corpus_column(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    write_jsonl(d / "a.jsonl", ROWS[:12], column="body")
    pq.write_table(pa.table({"body": ROWS[12:]}), str(d / "b.parquet"))
    (tmp_path / "c.txt").write_text(as_text(ROWS[:12]) + "\n" + as_text(ROWS[12:]))
    cfg = DataConfig(text_column="body", val_fraction=0.2)
    out = prepare_corpus([str(d)], CHAR, cfg, cache_root=tmp_path / "cache")
    ref = prepare_corpus([str(tmp_path / "c.txt")], CHAR, DataConfig(val_fraction=0.2), cache_root=tmp_path / "cache")
    assert out != ref and ids_of(out) == ids_of(ref) and ids_of(out, "validation") == ids_of(ref, "validation")


def test_cli_pretrain_and_eval_ppl_on_jsonl(tmp_path):
    recipe = tiny_recipe(tmp_path / "tiny.yaml")
    f = write_jsonl(tmp_path / "c.jsonl", ROWS, column="body")
    txt = tmp_path / "c.txt"
    txt.write_text(as_text(ROWS))
    res = run("pretrain", "--recipe", recipe, "--data", f, "--text-column", "body", "--out", tmp_path / "run", "--json")
    assert res.exit_code == 0, res.output
    res = run("eval-ppl", f, "--text-column", "body", "--model", tmp_path / "run", "--json", "--max-length", "32")
    assert res.exit_code == 0, res.output
    from_table = json.loads(res.stdout)
    res = run("eval-ppl", txt, "--model", tmp_path / "run", "--json", "--max-length", "32")
    from_text = json.loads(res.stdout)
    assert from_table["tokens"] == from_text["tokens"] == len(as_text(ROWS).replace("\r", ""))
    for k in ("ppl", "nll", "bpb", "words", "word_ppl"):
        assert from_table[k] == from_text[k], k
    assert_clean_error(run("eval-ppl", f, "--model", tmp_path / "run"), "no column 'text'", "--text-column")
    res = run("tokenize", f, "--text-column", "body", "--out", tmp_path / "tok", "--tokenizer", "char", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["counts"]["train"]["documents"] > 20
    assert np.all(np.asarray(ids_of(tmp_path / "tok")) >= 0)


@pytest.mark.parametrize("name, content, needle", [
    ("bad.jsonl", '{"text": "fine"}\nnot json\n', "cannot read 'BAD' as JSON Lines"),
    ("bad.parquet", "not parquet\n", "cannot read 'BAD' as Parquet"),
    ("bad.csv", 'text,id\n"open quote,1\n', "cannot read 'BAD' as CSV"),
    ("cols.jsonl", '{"body": "x", "id": 1}\n', "has no column 'text' (its columns: body, id)"),
])
def test_bad_tables_are_one_line(tmp_path, name, content, needle):
    (tmp_path / name).write_text(content)
    res = run("tokenize", tmp_path / name, "--out", tmp_path / "out", "--tokenizer", "char")
    assert_clean_error(res, needle.replace("BAD", str(tmp_path / name)))
    assert not (tmp_path / "out").exists()


def test_rows_are_read_in_batches(tmp_path, monkeypatch):
    from plmcli.data import tables

    monkeypatch.setattr(tables, "BATCH_ROWS", 3)
    seen = []
    real = tables._check_column
    monkeypatch.setattr(tables, "_check_column", lambda t, cols: (seen.append(1), real(t, cols)))
    f = write_jsonl(tmp_path / "c.jsonl", ROWS)
    (t,) = tables.resolve(str(f), "text", False)
    assert sum(1 for _ in tables.rows(t)) == len(ROWS) and len(seen) >= len(ROWS) // 3
