"""Every reader of text input: files, directories, .gz, standard input and tables (data/tables.py), read
as lines, documents, byte ranges and sentences.

Lines come back decoded, validated and normalized the same way wherever text is read: UTF-8 (a binary
or UTF-16 input is a one-line error naming it), CRLF -> LF, a missing final newline added, a leading BOM
dropped. Documents are blank-line separated (or single lines with `doc_per_line`) and never span files.

Byte ranges let several readers share one big file without overlap: `plm tokenize --num-proc` encodes
a file in pieces and `plm pretrain --streaming` gives every reader its own stretch of the corpus; both
need "the text from byte a to byte b" to mean whole lines (or whole documents) and every line to belong
to exactly one range. The rule, as in Hadoop's line reader: a range [start, end) owns the lines that
*start* inside it, so a reader that starts mid-line skips to the next line start and a reader at `end`
finishes the line it is in. Documents follow the same idea one level up (see `range_documents`).

Sentences, for corpora that are not one sentence per line (`data.split_sentences`, `plm tokenize
--split-sentences`: one review, news item or Wikipedia article per line): BERT's create_pretraining_data
reads one sentence per line, and NSP/SOP pairs and short_seq_prob work on those sentences. This is a
punctuation rule, as light as the rest of the pipeline: a Chinese/Japanese sentence ends after 。！？ or …
(and any closing quotes or brackets after them); a Latin-script one after . ! or ? (and closing quotes)
when whitespace and then no lowercase letter follow, and the word before a period is not a common
abbreviation or a single capital (an initial). For text where that is not good enough, split it with a
real sentence splitter beforehand and write one sentence per line.
"""

from __future__ import annotations

import gzip
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from plmcli.data import store, tables
from plmcli.errors import PlmError

STDIN = "-"


# ----------------------------------------------------------------------------- lines of a file, byte ranges


PROBE_BYTES = 8192  # how much of each file is checked for NUL bytes (as git and grep do)


def binary_error(name: str) -> PlmError:
    return PlmError(f"'{name}' looks like a binary file (it contains NUL bytes)",
                    "pass only plain-text files (or .gz of them)")


def encoding_error(name: str, where: str, why: str, enc: str = "<enc>") -> PlmError:
    """`where` is 'line N' (or 'byte N' for a reader that started mid-file and cannot count lines)."""
    return PlmError(
        f"'{name}' is not UTF-8 text ({where}: {why})",
        f"convert it first: iconv -f {enc} -t utf-8 '{name}' > converted.txt"
        + (" (<enc> is the file's encoding, e.g. latin1 or cp1252)" if enc == "<enc>" else ""),
    )


def open_text(name: str) -> BinaryIO:
    """`name` opened for binary reading (gzip-decompressed for .gz), its head checked for UTF-16 and NUL bytes."""
    opener = gzip.open if name.endswith(".gz") else open
    try:
        f = opener(name, "rb")
        head = f.read(PROBE_BYTES)
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            f.close()
            raise encoding_error(name, "line 1", "it starts with a UTF-16 byte-order mark", "utf-16")
        if b"\0" in head:
            f.close()
            raise binary_error(name)
        f.seek(0)
        return f
    except (OSError, EOFError) as e:  # includes gzip.BadGzipFile and truncated .gz streams
        raise read_error(name, e) from e


def read_error(name: str, e: BaseException) -> PlmError:
    return PlmError(f"cannot read '{name}': {e}", "check the file (a .gz file must be gzip-compressed text)")


def decode_line(raw: bytes, name: str, where: str, first: bool) -> str:
    """One raw line -> text ending in exactly one "\\n"; `first`: the file's first line (may carry a BOM)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise encoding_error(name, where, f"invalid byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line") from None
    if first and line.startswith("\ufeff"):
        line = line[1:]
    if line.endswith("\r\n"):
        return line[:-2] + "\n"
    return line if line.endswith("\n") else line + "\n"


def seek_line(f: BinaryIO, offset: int) -> int:
    """Move `f` to the first line that starts at or after `offset`; returns that position.

    Reading from offset-1 to the end of its line lands exactly on `offset` when a line starts there,
    and on the next line start otherwise.
    """
    if offset <= 0:
        f.seek(0)
        return 0
    f.seek(offset - 1)
    return offset - 1 + len(f.readline())


def iter_lines(name: str, start: int = 0, end: int | None = None) -> Iterator[tuple[int, str]]:
    """(byte offset, text) of each line of `name` that starts in [start, end) (end None: to the end).

    Plain files seek straight to `start`; a .gz stream can only be read from its beginning, so it is
    decompressed up to `start` (tokenize and streaming give a .gz file to one reader whole).
    """
    f = open_text(name)
    try:
        pos = seek_line(f, start)
        lineno = 1 if pos == 0 else None  # line numbers are known only when reading from the top
        while end is None or pos < end:
            try:
                raw = f.readline()
            except (OSError, EOFError) as e:
                raise read_error(name, e) from e
            if not raw:
                return
            where = f"line {lineno}" if lineno else f"the line at byte {pos}"
            yield pos, decode_line(raw, name, where, pos == 0)
            pos += len(raw)
            lineno = lineno + 1 if lineno else None
    finally:
        f.close()


def range_documents(name: str, start: int = 0, end: int | None = None, doc_per_line: bool = False) -> Iterator[str]:
    """The documents of `name` that a reader of bytes [start, end) owns, in order.

    Documents are blank-line separated (or single lines with `doc_per_line`), as `iter_documents`.
    A range owns the documents that begin before the first blank line starting at or after `end`
    (after skipping, when start > 0, the document in progress at `start`: the previous range owns it).
    Both ends are found by the same forward scan, so consecutive ranges hand over exactly once and
    splitting a file anywhere yields the documents of reading it whole.
    """
    if end is not None and end <= start:
        return
    # Skipped when start > 0: the tail of a document that began in the previous range (that range owns it).
    yield from line_documents(iter_lines(name, start, None), doc_per_line, end, skip_first=start > 0 and not doc_per_line)


def line_documents(lines: Iterable[tuple[int, str]], doc_per_line: bool = False, end: int | None = None,
                   skip_first: bool = False) -> Iterator[str]:
    """(byte offset, line) pairs -> documents: the one document splitter. Documents are blank-line
    separated (or single lines with `doc_per_line`), a document its lines joined. `end`: stop at the first
    document boundary at or after that offset; `skip_first`: drop the lines before the first blank one."""
    doc: list[str] = []
    skipping = skip_first
    for pos, line in lines:
        blank = not line.strip()
        if skipping and not blank:
            continue
        skipping = False
        if blank:
            if doc:
                yield "".join(doc)
                doc = []
            if end is not None and pos >= end:
                return
        elif doc_per_line:
            if end is not None and pos >= end:
                return
            yield line
        else:
            doc.append(line)
    if doc:  # documents never span files
        yield "".join(doc)


def line_before_is_blank(name: str, pos: int) -> bool:
    """Whether the line that ends just before byte `pos` (a line start, or the end of the file) is blank.

    A reader that starts mid-file needs it to know whether its first blank line ends a document; the
    file's start counts as blank (documents never span files). Read backwards in small steps, so a
    long line costs one pass over that line only.
    """
    if pos <= 0:
        return True
    with open(name, "rb") as f:
        f.seek(pos - 1)
        end = pos - 1 if f.read(1) == b"\n" else pos  # a final line without "\n" ends at the file's end
        start, step = end, 4096
        while start > 0:
            lo = max(0, start - step)
            f.seek(lo)
            chunk = f.read(start - lo)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                start = lo + nl + 1
                break
            start = lo
        f.seek(start)
        text = f.read(end - start).decode("utf-8", errors="replace")  # undecodable bytes are not blank
    if start == 0 and text.startswith("\ufeff"):  # as decode_line drops it from the first line
        text = text[1:]
    return not text.strip()


def document_start(name: str, offset: int, doc_per_line: bool = False) -> int:
    """Where the first document that a range starting at `offset` owns begins (the file's size if none):
    the hand-over point between the ranges [.., offset) and [offset, ..) of `range_documents`."""
    if offset <= 0:
        offset = 0
    skipping = offset > 0 and not doc_per_line
    pos = offset
    for pos, line in iter_lines(name, offset, None):
        blank = not line.strip()
        if skipping:
            skipping = not blank
        elif not blank:
            return pos
    return os.path.getsize(name)


# ----------------------------------------------------------------------------- inputs, lines, documents


def expand_inputs(inputs: list[str], column: str = "text", for_eval: bool = False) -> list[str]:
    """Input arguments -> what to read, in order: text files (directories walked recursively, sorted),
    '-', and the tables (data/tables.py) of data files, saved datasets and Hub names, read by `column`
    unless the argument carries its own (--text-column). `for_eval`: a DatasetDict gives its test split."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise PlmError("no input files given", "pass text files, directories, .gz files or '-' for stdin")
    files: list[str] = []
    for arg in inputs:
        if isinstance(arg, tables.TableInput):  # already resolved
            files.append(arg)
            continue
        col = arg.column if isinstance(arg, tables.ColumnRequest) else column
        arg = str(arg)
        if arg == STDIN:
            files.append(STDIN)
            continue
        p = Path(arg)
        if p.is_dir():
            if store.read_meta(p, store.CORPUS_FORMAT) is not None:
                raise PlmError(f"'{p}' is already a `plm tokenize` output, not text",
                               "pass it to `plm pretrain --data` directly, or give the original text files")
            if tables.is_saved_dataset(p):
                files.extend(tables.resolve(arg, col, for_eval))
                continue
            found = []
            for root, dirs, names in os.walk(p):
                # Skip hidden entries and nested tokenize outputs (e.g. `--out` placed inside the input dir);
                # a saved dataset inside is read as one input.
                dirs[:] = [d for d in dirs if not d.startswith(".") and store.read_meta(Path(root, d), store.CORPUS_FORMAT) is None]
                found.extend(Path(root, d) for d in dirs if tables.is_saved_dataset(Path(root, d)))
                dirs[:] = [d for d in dirs if not tables.is_saved_dataset(Path(root, d))]
                found.extend(Path(root, n) for n in names if not n.startswith("."))
            if not found:
                raise PlmError(f"directory '{p}' holds no text files (hidden files are skipped)",
                               "pass a directory with text (or JSON Lines / CSV / Parquet) files, or the files themselves")
            for f in sorted(found, key=lambda f: f.relative_to(p).parts):
                files.extend(_file_input(str(f), col, for_eval))
        elif p.is_file():
            files.extend(_file_input(arg, col, for_eval))
        elif tables.looks_like_hub_name(arg):
            files.extend(tables.resolve(arg, col, for_eval))
        else:
            raise PlmError(f"input '{arg}' not found", "check the path (use '-' to read standard input)")
    return files


def _file_input(name: str, column: str, for_eval: bool) -> list[str]:
    """A file (or a saved dataset met in a directory walk): its tables when `datasets` reads it, else itself."""
    if Path(name).is_dir() or tables.builder_of(name):
        return tables.resolve(name, column, for_eval)
    return [name]


def input_stats(files: list[str]) -> list[dict]:
    stats = []
    for name in files:
        if isinstance(name, tables.TableInput):
            stats.append(tables.stats(name))
        elif name == STDIN:
            stats.append({"path": STDIN, "size": None, "mtime": None})
        else:
            st = os.stat(name)
            stats.append({"path": str(Path(name).resolve()), "size": st.st_size, "mtime": st.st_mtime_ns})
    return stats


def _stdin_lines() -> Iterator[str]:
    """Standard input, decoded and checked as files are (it can only be read once, so it is checked as it streams)."""
    buf = getattr(sys.stdin, "buffer", None)
    # A text-only stdin (e.g. replaced by a StringIO) is already decoded; re-encode it line by line.
    raws = buf if buf is not None else (line.encode("utf-8") for line in sys.stdin)
    checked = 0
    for lineno, raw in enumerate(raws, start=1):
        if lineno == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise encoding_error(STDIN, "line 1", "it starts with a UTF-16 byte-order mark", "utf-16")
        if checked < PROBE_BYTES:
            if b"\0" in raw[: PROBE_BYTES - checked]:
                raise binary_error(STDIN)
            checked += len(raw)
        yield decode_line(raw, STDIN, f"line {lineno}", lineno == 1)


def text_lines(name: str) -> Iterator[str]:
    """Decoded lines of one input, each ending in exactly one "\\n" (CRLF and a missing final newline fixed)."""
    if name == STDIN:
        yield from _stdin_lines()
    elif isinstance(name, tables.TableInput):
        yield from tables.lines(name)
    else:
        yield from (line for _, line in iter_lines(name))


def spool_stdin(files: list[str], tmp: Path) -> list[str]:
    """stdin can be read only once and tokenize reads its inputs twice (tokenizer, then encoding): keep a copy."""
    if STDIN not in files:
        return files
    copy = tmp / ".stdin.txt"
    with open(copy, "w", encoding="utf-8") as f:
        f.writelines(_stdin_lines())
    return [str(copy) if name == STDIN else name for name in files]


def iter_text_lines(inputs: list[str]) -> Iterator[str]:
    """Every line of the inputs, validated and decoded as for tokenize (used by eval-ppl); a DatasetDict
    is read from its test split (else validation), a table by the column its argument carries."""
    for name in expand_inputs(inputs, for_eval=True):
        yield from text_lines(name)


def documents(files: list[str], doc_per_line: bool) -> Iterator[str]:
    """The documents of whole inputs, in order (`line_documents` of each)."""
    for name in files:
        yield from line_documents(((0, line) for line in text_lines(name)), doc_per_line)


def iter_documents(inputs: list[str], doc_per_line: bool = False, column: str = "text") -> Iterator[str]:
    """Stream documents from text/.gz files, directories, '-' (stdin) or `datasets` inputs (data/tables.py).

    Documents are separated by blank lines (or are single lines with `doc_per_line`); a document's text
    is its lines, each ending in "\\n". A table's rows are documents (its text column, `column`).
    """
    seen = False
    for doc in documents(expand_inputs(inputs, column), doc_per_line):
        seen = True
        yield doc
    if not seen:
        raise PlmError("the input contains no text (every line is blank)", "check the input files")


def split_lines(doc: str) -> list[str]:
    # Not str.splitlines: that also splits on \r, \x0b, \u2028 ... which are ordinary characters here.
    parts = doc.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


# ----------------------------------------------------------------------------- sentences


# Terminators, then closing quotes / brackets that belong to the ending sentence.
_CJK_END = re.compile(r"[。！？…]+[”’」』）》〉)\"']*")
_LATIN_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[^\s])")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf al fig no vol inc ltd co corp dept gen col lt sgt rev hon jan feb "
    "mar apr jun jul aug sep sept oct nov dec u.s u.k a.m p.m".split())


def split_sentences(line: str) -> list[str]:
    """`line` cut into sentences; the pieces concatenate back to `line` (whitespace between two sentences
    starts the next one, so a byte-level tokenizer encodes its first word as it would in running text)."""
    if not line:
        return []
    cuts = {m.end() for m in _CJK_END.finditer(line)}
    for m in _LATIN_END.finditer(line):
        rest = line[m.end():].lstrip()
        if rest[:1].islower():
            continue  # "approx. three", "e.g. this": no new sentence
        if line[m.start()] == "." and _abbreviation(line[: m.start()]):
            continue
        cuts.add(m.end())
    body = len(line.rstrip())
    cuts = sorted(c for c in cuts if 0 < c < body)  # a terminator at the very end starts no sentence
    return [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)])]


def _abbreviation(before: str) -> bool:
    m = _WORD_BEFORE.search(before)
    if not m:
        return False
    word = m.group(1)
    return word.lower().rstrip(".") in ABBREVIATIONS or (len(word) == 1 and word.isupper())
