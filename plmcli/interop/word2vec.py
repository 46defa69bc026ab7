"""The word2vec text format (word2vec.c's `-binary 0` output), which gensim's
KeyedVectors.load_word2vec_format, fastText and most embedding tools read:

    V D                 the number of vectors and their size
    word v1 v2 … vD     one line per word, fields separated by single spaces

Values are written with 9 significant digits, which give every float32 back exactly, so a file scores
as the vectors it was written from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plmcli.errors import PlmError, os_error


def write_word2vec(path, words: list[str], vectors: np.ndarray) -> Path:
    """Write `words` and their (n, D) `vectors` to `path` (through a temp file: never half-written)."""
    from plmcli.data.store import atomic_path

    bad = [w for w in words if not w or w.split() != [w]]
    if bad:
        raise PlmError(f"{len(bad)} word(s) are empty or hold whitespace (e.g. {bad[0]!r}), which the word2vec "
                       "format cannot hold", "train word2vec with the word tokenizer (tokenizer.kind: word)")
    vectors = np.asarray(vectors, dtype=np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = " ".join(["%.9g"] * vectors.shape[1])
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(f"{len(words)} {vectors.shape[1]}\n")
        f.writelines(f"{w} {row % tuple(v)}\n" for w, v in zip(words, vectors.tolist()))
    return path


def read_word2vec(path) -> tuple[list[str], np.ndarray]:
    """(words, (V, D) float32 vectors) of a word2vec text file, in the file's order."""
    path = Path(path)
    fix = "pass a word2vec text file: a 'V D' line, then 'word v1 … vD' lines (`plm export --format word2vec`)"
    try:
        with open(path, encoding="utf-8") as f:
            head = f.readline().split()
            if len(head) != 2 or not all(x.isdigit() for x in head):
                raise PlmError(f"{path} does not start with a 'V D' line (got {' '.join(head)[:40]!r})", fix)
            V, D = int(head[0]), int(head[1])
            words, vectors = [], np.empty((V, D), dtype=np.float32)
            for i in range(V):
                parts = f.readline().rstrip().split(" ")
                if len(parts) != D + 1:
                    what = "ends early" if parts == [""] else f"has {len(parts) - 1} values"
                    raise PlmError(f"{path}: line {i + 2} {what}, and its header says {V} vectors of {D}", fix)
                words.append(parts[0])
                vectors[i] = np.asarray(parts[1:], dtype=np.float32)
    except UnicodeDecodeError as e:
        raise PlmError(f"{path} is not UTF-8 text (a binary word2vec file?): {e.reason}",
                       "write the vectors as text (gensim: save_word2vec_format(path, binary=False))") from e
    except ValueError as e:
        raise PlmError(f"{path} holds a value that is not a number ({e})", fix) from e
    except OSError as e:
        raise os_error(e) from e
    return words, vectors
