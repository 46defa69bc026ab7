"""plm eval-vectors: analogies and similarity on hand-made vectors whose answers are worked out below, the
readers of the three formats, and agreement with gensim's own evaluation on the same vectors and files."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_clean_error, run
from plmcli.errors import PlmError
from plmcli.eval.vectors import Vocabulary, analogy_report, evaluate, read_analogies, read_word_pairs
from plmcli.interop.word2vec import read_word2vec, write_word2vec

# Most frequent first. "King" is a second case of "king": case-blind, KING is king (index 2), the first.
WORDS = ["man", "woman", "king", "queen", "apple", "King"]
VECTORS = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 1], [0, 1, 1], [0, 0, -1], [1, 0, 1.1]], dtype=np.float32)

QUESTIONS = """\
: royal
man woman king queen
woman woman king man
man woman pear apple
man woman king
: fruit
man woman king apple
"""
# man:woman = king:?  b̂ + ĉ − â = (0,1,0) + (1,0,1)/√2 − (1,0,0) = (−0.29, 1, 0.71), |·| = 1.259; cosines:
#   queen (0,1,1)/√2: (1 + 0.71)/√2/1.259 = 0.96   King: 0.26   apple: −0.56   (woman, king, man asked)
#   -> queen: correct in "royal", wrong in "fruit".
# woman:woman = king:?  the target is k̂ itself; nearest not asked: King (cos 0.9985), a case of the asked
#   "king", so skipped (gensim's rule); then man (0.71) before queen (0.5) -> man: correct.
# "pear" is not in the vocabulary: skipped as OOV; "man woman king" is 3 words: an invalid line.


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_analogies_by_hand(tmp_path):
    sections, invalid = read_analogies(write(tmp_path, "q.txt", QUESTIONS))
    assert [name for name, _ in sections] == ["royal", "fruit"] and invalid == 1
    r = analogy_report(Vocabulary(WORDS, VECTORS), sections, invalid)
    royal, fruit = r["sections"]
    assert (royal["correct"], royal["scored"], royal["oov"]) == (2, 2, 1)
    assert (fruit["correct"], fruit["scored"], fruit["accuracy"]) == (0, 1, 0.0)
    assert (r["correct"], r["scored"], r["questions"], r["oov"]) == (2, 3, 4, 1)
    assert r["accuracy"] == pytest.approx(2 / 3) and r["oov_ratio"] == 0.25
    # Case-sensitive, "King" is a word of its own, no longer a case of "king": woman:woman = king:? is King.
    r = analogy_report(Vocabulary(WORDS, VECTORS, case_insensitive=False), sections)
    assert r["sections"][0]["correct"] == 1
    # Only the first 4 words: apple (and King) are out, so the "fruit" question is OOV too.
    r = analogy_report(Vocabulary(WORDS, VECTORS, restrict_vocab=4), sections)
    assert (r["scored"], r["oov"], r["sections"][1]["oov"]) == (2, 2, 1)


def test_similarity_by_hand(tmp_path):
    pairs = write(tmp_path, "ws.tsv", "# Word 1\tWord 2\tHuman (mean)\n"
                  "man\twoman\t1.0\nking\tqueen\t5.0\nking\tKing\t9.0\nman\tking\t10.0\nman\tpear\t3.0\n"
                  "man\twoman\nx\ty\tmuch\n")
    res = evaluate(str(write_vectors(tmp_path)), similarity=str(pairs))["similarity"]
    # cosines: man·woman 0, king·queen 0.5, king·King 1 (case-blind, King is king), man·king 0.71
    # ranks: human 1 2 3 4, cosine 1 2 4 3 -> ρ = 1 − 6·(1 + 1)/(4·(16 − 1)) = 0.8
    assert res["spearman"] == pytest.approx(0.8)
    cos = [0.0, 0.5, 1.0, 1 / math.sqrt(2)]
    assert res["pearson"] == pytest.approx(np.corrcoef([1, 5, 9, 10], cos)[0, 1], rel=1e-6)
    assert (res["pairs"], res["oov"], res["invalid_lines"]) == (4, 1, 2) and res["oov_ratio"] == 0.2


def write_vectors(tmp_path: Path) -> Path:
    return write_word2vec(tmp_path / "v.txt", WORDS, VECTORS)


def test_word2vec_text_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(0)
    v = (rng.normal(size=(5, 7)) * 10.0 ** rng.integers(-6, 3, (5, 7))).astype(np.float32)
    path = write_word2vec(tmp_path / "v.txt", ["a", "b", "ç", "<unk>", "N"], v)
    assert path.read_text(encoding="utf-8").splitlines()[0] == "5 7"
    words, back = read_word2vec(path)
    assert words == ["a", "b", "ç", "<unk>", "N"] and back.dtype == np.float32
    np.testing.assert_array_equal(back, v)
    with pytest.raises(PlmError, match="whitespace"):
        write_word2vec(tmp_path / "w.txt", ["a b"], v[:1])


@pytest.mark.parametrize("text,message", [
    ("a 0.1 0.2\n", "does not start with a 'V D' line"),
    ("2 2\na 0.1 0.2\n", "line 3 ends early"),
    ("1 2\na 0.1 0.2 0.3\n", "line 2 has 3 values"),
    ("1 2\na 0.1 x\n", "not a number"),
])
def test_word2vec_reader_refuses_damaged_files(tmp_path, text, message):
    with pytest.raises(PlmError, match=message):
        read_word2vec(write(tmp_path, "v.txt", text))


def test_readers_of_the_test_sets(tmp_path):
    with pytest.raises(PlmError, match="line 1 comes before the first ': section' line"):
        read_analogies(write(tmp_path, "q.txt", "a b c d\n: s\n"))
    sections, invalid = read_analogies(write(tmp_path, "q.txt", ": capital-common-countries\r\nAthens Greece Baghdad Iraq\r\n\n"))
    assert sections == [("capital-common-countries", [("Athens", "Greece", "Baghdad", "Iraq")])] and invalid == 1
    pairs, invalid = read_word_pairs(write(tmp_path, "ws.tsv", "#c\ntiger\tcat\t7.35\nbad line\n"))
    assert pairs == [("tiger", "cat", 7.35)] and invalid == 1


def test_cli_reports_and_refuses_in_one_line(tmp_path):
    vec, q = write_vectors(tmp_path), write(tmp_path, "q.txt", QUESTIONS)
    res = run("eval-vectors", vec, "--analogies", q)
    assert res.exit_code == 0, res.output
    assert "royal" in res.stdout and "analogies 66.67% (2/3); 1 of 4 questions skipped as OOV" in res.stdout
    res = run("eval-vectors", vec, "--analogies", q, "--json", "--restrict-vocab", "4")
    assert json.loads(res.stdout)["analogies"]["oov"] == 2
    assert_clean_error(run("eval-vectors", vec), "no test set given", "--analogies")
    assert_clean_error(run("eval-vectors", vec, "--analogies", tmp_path / "none.txt"), "is not a file")
    assert_clean_error(run("eval-vectors", write(tmp_path, "bad.txt", "x\n"), "--analogies", q), "'V D' line")
    assert_clean_error(run("eval-vectors", tmp_path / "norun", "--analogies", q), "not a plm run directory")


# ---------------------------------------------------------------- gensim, the peer


def structured_vectors(seed: int, n: int = 40, dim: int = 8, noise: float = 0.5):
    """country_i, capital_i = country_i + r + noise: 3CosAdd gets some questions right and some wrong."""
    rng = np.random.default_rng(seed)
    country = rng.normal(size=(n, dim))
    capital = country + rng.normal(size=dim) + noise * rng.normal(size=(n, dim))
    words = [f"country{i}" for i in range(n)] + [f"capital{i}" for i in range(n)] + ["Country3", "CAPITAL5"]
    extra = rng.normal(size=(2, dim))
    return words, np.vstack([country, capital, extra]).astype(np.float32)


def test_agrees_with_gensim_on_the_same_vectors(tmp_path):
    gensim = pytest.importorskip("gensim")
    words, vectors = structured_vectors(0)
    vec = write_word2vec(tmp_path / "v.txt", words, vectors)
    lines = [": pairs"] + [f"country{i} capital{i} country{j} capital{j}" for i in range(0, 40, 3) for j in range(40) if i != j]
    lines += [": mixed", "Country3 capital3 country7 capital7", "country1 capital1 nowhere capital2", "only three words"]
    q = write(tmp_path, "q.txt", "\n".join(lines) + "\n")
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(vec))
    score, sections = kv.evaluate_word_analogies(str(q))
    ours = evaluate(str(vec), analogies=str(q))["analogies"]
    assert 0.1 < ours["accuracy"] < 0.9  # enough right and wrong answers for the comparison to mean something
    assert ours["accuracy"] == pytest.approx(score)
    assert [(s["section"], s["correct"], s["scored"]) for s in ours["sections"]] == \
        [(s["section"], len(s["correct"]), len(s["correct"]) + len(s["incorrect"])) for s in sections[:-1]]
    pairs = write(tmp_path, "ws.tsv", "\n".join(f"country{i}\tcapital{(i * 7) % 45}\t{(i * 13) % 10}" for i in range(40)))
    pearson, spearman, oov_ratio = kv.evaluate_word_pairs(str(pairs))
    res = evaluate(str(vec), similarity=str(pairs))["similarity"]
    assert res["spearman"] == pytest.approx(spearman[0], abs=1e-6) and res["pearson"] == pytest.approx(pearson[0], abs=1e-6)
    assert res["oov_ratio"] * 100 == pytest.approx(oov_ratio)


def test_reads_the_standard_files_gensim_ships(tmp_path):
    gensim = pytest.importorskip("gensim")
    from gensim.test.utils import datapath

    questions, ws353 = datapath("questions-words.txt"), datapath("wordsim353.tsv")
    sections, invalid = read_analogies(questions)
    assert len(sections) == 14 and sum(len(q) for _, q in sections) == 19544 and invalid == 0
    pairs, _ = read_word_pairs(ws353)
    assert len(pairs) == 353
    rng = np.random.default_rng(1)
    vocab = sorted({w for _, qs in sections for q in qs for w in q} | {w for p in pairs for w in p[:2]})
    vocab = [w for w in vocab if rng.random() < 0.9]  # a tenth missing: OOV questions and pairs
    vec = write_word2vec(tmp_path / "v.txt", vocab, rng.normal(size=(len(vocab), 3)).astype(np.float32))
    kv = gensim.models.KeyedVectors.load_word2vec_format(str(vec))
    res = evaluate(str(vec), analogies=questions, similarity=ws353)
    score, gsections = kv.evaluate_word_analogies(questions)
    assert res["analogies"]["accuracy"] == pytest.approx(score)
    assert [s["correct"] for s in res["analogies"]["sections"]] == [len(s["correct"]) for s in gsections[:-1]]
    pearson, spearman, oov_ratio = kv.evaluate_word_pairs(ws353)
    assert res["similarity"]["spearman"] == pytest.approx(spearman[0], abs=1e-6)
    assert res["similarity"]["oov_ratio"] * 100 == pytest.approx(oov_ratio)
