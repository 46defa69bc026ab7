"""`plm export`: a finished run in a format other tools read.

A format is something the run's model class provides, so a family opts in by implementing it:
arpa — `write_arpa(path)`: n-gram runs, readable by KenLM, SRILM and the like;
hf — `to_hf(run_config)`: a transformers model directory (config.json, model.safetensors, tokenizer
files) that AutoModel… / AutoTokenizer.from_pretrained load (driver: plmcli.interop.hf);
word2vec — `word_vectors(token strings)`: word2vec runs, as the word2vec text format (plmcli.interop.word2vec)
that gensim's KeyedVectors.load_word2vec_format reads.
"""

from __future__ import annotations

from pathlib import Path

from plmcli.errors import PlmError
from plmcli.interop.hf import USAGE


def _arpa(run: str | None, out: str, force: bool) -> dict:
    from plmcli.models.base import WritesArpa
    from plmcli.runs import load_run

    model, _, cfg = load_run(run, USAGE, "export")
    if not isinstance(model, WritesArpa):
        raise PlmError(f"run {run or 'runs/latest'} ({cfg['family']}) cannot be exported as arpa",
                       "ARPA holds n-gram models only: export a run trained with an ngram-* recipe")
    return {"out": str(model.write_arpa(Path(out)))}


def _hf(run: str | None, out: str, force: bool) -> dict:
    from plmcli.interop.hf import export_hf

    return export_hf(run, out, force)


def _word2vec(run: str | None, out: str, force: bool) -> dict:
    from plmcli.interop.word2vec import write_word2vec
    from plmcli.models.base import HasWordVectors
    from plmcli.runs import load_run

    model, tok, cfg = load_run(run, USAGE, "export")
    if not isinstance(model, HasWordVectors):
        raise PlmError(f"run {run or 'runs/latest'} ({cfg['family']}) has no static word vectors to export as word2vec",
                       "export a run trained with a word2vec-* recipe (plm recipes lists them)")
    words, vectors = model.word_vectors([tok.id_to_token(i) or "" for i in range(tok.get_vocab_size())])
    path = write_word2vec(Path(out), words, vectors)
    return {"out": str(path), "words": len(words), "dim": int(vectors.shape[1])}


FORMATS = {"arpa": _arpa, "hf": _hf, "word2vec": _word2vec}
"""Format name -> its writer (run, out, force) -> report dict with at least "out"."""


def export_report(run: str | None, format: str, out: str, force: bool = False) -> dict:
    """Write run `run` (default runs/latest) as `format` to `out`; returns {"format", "out", ...what the writer reports}.

    `force`: replace an existing non-empty output directory (hf).
    """
    if format not in FORMATS:
        raise PlmError(f"unknown export format '{format}'", f"use one of: {', '.join(FORMATS)}")
    from plmcli.data.outdir import check_writable

    check_writable(out)
    return {"format": format, **FORMATS[format](run, out, force)}


def export(run: str | None, format: str, out: str, force: bool = False) -> Path:
    """As export_report; returns the path written (a file for arpa, a directory for hf)."""
    return Path(export_report(run, format, out, force)["out"])
