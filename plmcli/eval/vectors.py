"""`plm eval-vectors`: static word vectors on the standard test sets, scored as gensim's KeyedVectors scores
them (evaluate_word_analogies, evaluate_word_pairs with their defaults), so the two agree on the same vectors.

Vocabulary: the first `restrict_vocab` words in the vectors' order (a run's: most frequent first; a file's:
its line order). Case-insensitive by default: words are compared upper-cased, and a word present in several
cases is the one that comes first.

Analogies (questions-words.txt, Mikolov et al. 2013a): ': section' lines, then lines 'a b c d' — a is to b
as c is to d. A question with a word outside the vocabulary is skipped and counted as OOV. The answer is
3CosAdd: the word closest in cosine to b̂ + ĉ − â (x̂ = x/|x|) other than a, b and c — of the 5 nearest
words that are not a, b, c themselves, the first that is no other case of them either (gensim's rule).
A line that is not 4 words is skipped as invalid (not a question); a question before any header is an error.

Similarity (WordSim-353's TSV: word1 TAB word2 TAB score, '#' comments): the cosine of each pair within the
vocabulary against the human score, Spearman's ρ and Pearson's r by scipy; pairs with an OOV word are
counted and left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError, os_error

USAGE = "plm eval-vectors RUN"
TOPN = 5
"""Nearest words gensim's analogy rule looks through for one that is not a case of a question word."""


class Vocabulary:
    """The first `restrict_vocab` words and vectors, keyed as compared (upper-cased when case-insensitive)."""

    def __init__(self, words: list[str], vectors: np.ndarray, restrict_vocab: int = 300000,
                 case_insensitive: bool = True):
        n = min(restrict_vocab, len(words))
        self.case_insensitive = case_insensitive
        self.keys = [self.key(w) for w in words[:n]]
        self.index: dict[str, int] = {}
        for i, k in enumerate(self.keys):
            self.index.setdefault(k, i)  # the first (most frequent) case of a word stands for it
        self.vectors = np.asarray(vectors[:n], dtype=np.float32)
        norms = np.linalg.norm(self.vectors, axis=1)
        self.norms = np.where(norms > 0, norms, np.float32(1.0)).astype(np.float32)
        self.unit = self.vectors / self.norms[:, None]

    def key(self, word: str) -> str:
        return word.upper() if self.case_insensitive else word

    def solve(self, abc: np.ndarray) -> list[str | None]:
        """3CosAdd answers (keys) of questions given as (Q, 3) indices of a, b, c."""
        out: list[str | None] = []
        rows = max(1, (1 << 24) // max(len(self.keys), 1))  # questions per (rows, vocabulary) matrix: 64 MB
        k = min(TOPN + 3, len(self.keys))
        for s in range(0, len(abc), rows):
            a, b, c = abc[s:s + rows].T
            mean = self.unit[b].astype(np.float64) + self.unit[c] - self.unit[a]
            size = np.linalg.norm(mean, axis=1, keepdims=True)
            mean = (mean / np.where(size > 0, size, 1.0)).astype(np.float32)  # gensim's unitvec leaves a zero vector be
            dists = (mean @ self.vectors.T) / self.norms
            top = np.argpartition(-dists, k - 1, axis=1)[:, :k] if k < dists.shape[1] else np.tile(np.arange(k), (len(a), 1))
            top = np.take_along_axis(top, np.argsort(-np.take_along_axis(dists, top, 1), axis=1, kind="stable"), 1)
            for q, row in enumerate(top):
                asked = (a[q], b[q], c[q])
                ignore = {self.keys[i] for i in asked}
                predicted = None
                for i in [i for i in row if i not in asked][:TOPN]:
                    predicted = self.keys[i]
                    if predicted not in ignore:
                        break
                out.append(predicted)
        return out

    def similarity(self, a: int, b: int) -> float:
        return float(np.dot(self.unit[a], self.unit[b]))


# ---------------------------------------------------------------- the files


def _lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as e:
        raise PlmError(f"{path} is not UTF-8 text ({e.reason})", "pass the test set as UTF-8 text") from e
    except OSError as e:
        raise os_error(e) from e


def read_analogies(path) -> tuple[list[tuple[str, list[tuple[str, str, str, str]]]], int]:
    """([(section, [(a, b, c, d), ...]), ...], invalid lines) of a questions-words.txt file."""
    sections: list = []
    invalid = 0
    for n, line in enumerate(_lines(path), start=1):
        if line.startswith(": "):
            sections.append((line.lstrip(": ").strip(), []))
            continue
        if not sections:
            raise PlmError(f"{path}: line {n} comes before the first ': section' line",
                           "pass a file in the questions-words.txt format (': name' headers, then 'a b c d' lines)")
        words = line.split()
        if len(words) != 4:
            invalid += 1
            continue
        sections[-1][1].append(tuple(words))
    if not any(q for _, q in sections):
        raise PlmError(f"{path} holds no analogy questions", "pass questions-words.txt (gensim ships it in gensim/test/test_data)")
    return sections, invalid


def read_word_pairs(path) -> tuple[list[tuple[str, str, float]], int]:
    """([(word1, word2, score), ...], invalid lines) of a WordSim-353-style TSV file ('#' lines are comments)."""
    pairs, invalid = [], 0
    for line in _lines(path):
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        try:
            if len(parts) != 3:
                raise ValueError
            pairs.append((parts[0], parts[1], float(parts[2])))
        except ValueError:
            invalid += 1
    return pairs, invalid


# ---------------------------------------------------------------- the scores


def analogy_report(vocab: Vocabulary, sections, invalid: int = 0) -> dict:
    """Accuracy per section and in total over the questions inside the vocabulary; OOV questions counted."""
    rows, questions, oov = [], 0, 0
    for name, quads in sections:
        keys = [[vocab.key(w) for w in q] for q in quads]
        inside = [q for q in keys if all(k in vocab.index for k in q)]
        idx = np.array([[vocab.index[k] for k in q] for q in inside], dtype=np.int64).reshape(-1, 4)
        predicted = vocab.solve(idx[:, :3]) if len(idx) else []
        correct = sum(p == q[3] for p, q in zip(predicted, inside))
        rows.append({"section": name, "correct": correct, "scored": len(inside), "oov": len(quads) - len(inside),
                     "accuracy": correct / len(inside) if inside else 0.0})
        questions += len(quads)
        oov += len(quads) - len(inside)
    correct, scored = sum(r["correct"] for r in rows), sum(r["scored"] for r in rows)
    return {"sections": rows, "correct": correct, "scored": scored, "accuracy": correct / scored if scored else 0.0,
            "questions": questions, "oov": oov, "oov_ratio": oov / questions if questions else 0.0,
            "invalid_lines": invalid}


def similarity_report(vocab: Vocabulary, pairs, invalid: int = 0, path="the pairs") -> dict:
    """Spearman's ρ (and Pearson's r) of the vectors' cosines against the human scores; OOV pairs counted."""
    from scipy import stats

    gold, model, oov = [], [], 0
    for a, b, score in pairs:
        ia, ib = vocab.index.get(vocab.key(a)), vocab.index.get(vocab.key(b))
        if ia is None or ib is None:
            oov += 1
            continue
        gold.append(score)
        model.append(vocab.similarity(ia, ib))
    if len(gold) < 2:
        raise PlmError(f"{len(gold)} pair(s) of {path} are inside the vocabulary ({oov} out of it): too few to "
                       "correlate", "pass a WordSim-353-style file (word1 TAB word2 TAB score) in the vectors' language")
    rho, pearson = stats.spearmanr(gold, model), stats.pearsonr(gold, model)
    return {"spearman": float(rho[0]), "spearman_p": float(rho[1]), "pearson": float(pearson[0]),
            "pearson_p": float(pearson[1]), "pairs": len(gold), "oov": oov, "oov_ratio": oov / (len(gold) + oov),
            "invalid_lines": invalid}


def load_vectors(source: str | None) -> tuple[list[str], np.ndarray, str]:
    """(words, vectors, what they are) of a word2vec text file, or of a run (None: runs/latest)."""
    if source is not None and Path(source).is_file():
        from plmcli.interop.word2vec import read_word2vec

        words, vectors = read_word2vec(source)
        return words, vectors, f"file {source}"
    from plmcli.models.base import HasWordVectors
    from plmcli.models.registry import model_class
    from plmcli.runs import load_run_at, resolve_run, run_config, run_label

    path = resolve_run(source, USAGE)
    cfg = run_config(path)
    family = cfg["family"]
    if not issubclass(model_class(family), HasWordVectors):
        raise PlmError(f"run {run_label(source, path)} ({family}) has no static word vectors to score",
                       "pass a word2vec run (a word2vec-* recipe) or a word2vec text file")
    model, tok, _ = load_run_at(path, cfg, source, USAGE, "score its word vectors")
    words, vectors = model.word_vectors([tok.id_to_token(i) or "" for i in range(tok.get_vocab_size())])
    return words, vectors, f"run {run_label(source, path)}"


def evaluate(source: str | None, analogies: str | None = None, similarity: str | None = None,
             restrict_vocab: int = 300000, case_insensitive: bool = True) -> dict:
    """eval-vectors' report of `source` (a run or a word2vec text file) on an analogy and/or a similarity file."""
    if not analogies and not similarity:
        raise PlmError("no test set given", "pass --analogies questions-words.txt and/or --similarity wordsim353.tsv "
                       "(gensim ships both in gensim/test/test_data)")
    check_option("--restrict-vocab", restrict_vocab, Range(1), "e.g. --restrict-vocab 300000 (gensim's default)")
    tests = [(p, what) for p, what in ((analogies, "--analogies"), (similarity, "--similarity")) if p]
    for p, what in tests:
        if not Path(p).is_file():
            raise PlmError(f"{what} {p} is not a file", "check the path")
    words, vectors, label = load_vectors(source)
    vocab = Vocabulary(words, vectors, restrict_vocab, case_insensitive)
    res = {"vectors": label, "words": len(words), "dim": int(vectors.shape[1]) if vectors.ndim == 2 else 0,
           "restrict_vocab": len(vocab.keys), "case_insensitive": case_insensitive}
    if analogies:
        res["analogies"] = {"file": str(analogies), **analogy_report(vocab, *read_analogies(analogies))}
    if similarity:
        pairs, invalid = read_word_pairs(similarity)
        res["similarity"] = {"file": str(similarity), **similarity_report(vocab, pairs, invalid, similarity)}
    return res
