"""Byte ranges of text files, so that several readers share one big file without overlap.

`plm tokenize --num-proc` encodes a file in pieces and `plm pretrain --streaming` gives every reader
its own stretch of the corpus; both need "the text from byte a to byte b" to mean whole lines (or
whole documents) and every line to belong to exactly one range. The rule, as in Hadoop's line
reader: a range [start, end) owns the lines that *start* inside it, so a reader that starts mid-line
skips to the next line start and a reader at `end` finishes the line it is in. Documents (blank-line
separated) follow the same idea one level up (see `range_documents`).

Lines come back decoded, validated and normalized exactly as `plm tokenize` reads them: UTF-8,
CRLF -> LF, a missing final newline added, a leading BOM dropped.
"""

from __future__ import annotations

import gzip
import os
from typing import BinaryIO, Iterator

from plmcli.errors import PlmError

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
    doc: list[str] = []
    skipping = start > 0 and not doc_per_line  # the tail of a document that began in the previous range
    for pos, line in iter_lines(name, start, None):
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
