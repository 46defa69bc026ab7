"""CMRC 2018 scoring equals cmrc2018_evaluate.py (ymcui/cmrc2018), including its nltk.word_tokenize."""

import json
import re

import numpy as np
import pytest

from plmcli.data.tasks.squad import cmrc_f1, cmrc_segments, cmrc_words, score_answers

# Each expected list is what nltk.word_tokenize gives with NLTK's full punkt_tab English model installed.
WORD_TOKENIZE = {
    "50％ of u.s. sales. then": ["50％", "of", "u.s.", "sales", ".", "then"],
    "mr. smith went. then he left": ["mr.", "smith", "went", ".", "then", "he", "left"],
    "it is 3.5 mm. next": ["it", "is", "3.5", "mm", ".", "next"],
    "3. 5": ["3", ".", "5"],
    "no. 1 and 2. 3": ["no", ".", "1", "and", "2", ".", "3"],
    "j. k. rowling": ["j.", "k.", "rowling"],
    "（st. john of matha）": ["（st", ".", "john", "of", "matha）"],
    '"ok." he said': ["``", "ok.", "''", "he", "said"],
    "don't": ["do", "n't"],
}


@pytest.mark.parametrize("text", list(WORD_TOKENIZE))
def test_words_are_nltk_word_tokenize(text):
    assert cmrc_words(text) == WORD_TOKENIZE[text]


def test_full_width_percent_stays_one_segment():
    assert cmrc_segments("50％") == ["50％"]
    assert cmrc_segments("约50％左右") == ["约", "50％", "左", "右"]
    # One shared segment of three predicted: P 1/3, R 1 (a split "50 ％" would share two of four).
    assert cmrc_f1("50％左右", "50％") == pytest.approx(0.5)


def _punkt_model():
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return None
    return nltk.word_tokenize


def _trial(shared_data):
    path = shared_data / "chinese" / "cmrc2018" / "cmrc2018_trial.json"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    return json.loads(path.read_text(encoding="utf-8"))


def test_equals_the_full_punkt_model_when_installed(shared_data):
    word_tokenize = _punkt_model()
    if word_tokenize is None:
        pytest.skip("NLTK's punkt_tab data is not installed (nltk.download('punkt_tab'))")
    doc = _trial(shared_data)
    runs = {r for a in doc["data"] for p in a["paragraphs"] for r in re.split(r"[\u4e00-\u9fa5]", p["context"].lower())
            if r.strip()}
    assert len(runs) > 1000
    assert [r for r in runs if cmrc_words(r) != word_tokenize(r)] == []


# ---------------------------------------------------------------- the official rules, written again

SP_CHAR = ['-', ':', '_', '*', '^', '/', '\\', '~', '`', '+', '=', '，', '。', '：', '？', '！', '“', '”', '；', '’', '《',
           '》', '……', '·', '、', '「', '」', '（', '）', '－', '～', '『', '』']


def official_scores(golds, preds, word_tokenize):
    """cmrc2018_evaluate.py's evaluate (v6) over in-memory answers: mean best F1 and EM, in percent."""
    def segments(s):
        out, tmp = [], ""
        for ch in str(s).lower().strip():
            if ch in SP_CHAR:  # rm_punc=True
                continue
            if re.search(r"[\u4e00-\u9fa5]", ch):
                if tmp != "":
                    out.extend(word_tokenize(tmp))
                    tmp = ""
                out.append(ch)
            else:
                tmp += ch
        if tmp != "":
            out.extend(word_tokenize(tmp))
        return out

    def lcs(a, b):
        m = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        best = 0
        for i in range(len(a)):
            for j in range(len(b)):
                if a[i] == b[j]:
                    m[i + 1][j + 1] = m[i][j] + 1
                    best = max(best, m[i + 1][j + 1])
        return best

    def f1(answers, pred):
        scores = []
        for ans in answers:
            a, p = segments(ans), segments(pred)
            n = lcs(a, p)
            if n == 0:
                scores.append(0)
                continue
            precision, recall = n / len(p), n / len(a)
            scores.append(2 * precision * recall / (precision + recall))
        return max(scores)

    def strip(s):
        return "".join(ch for ch in str(s).lower().strip() if ch not in SP_CHAR)

    em = sum(any(strip(a) == strip(p) for a in ans) for ans, p in zip(golds, preds))
    f = sum(f1(ans, p) for ans, p in zip(golds, preds))
    return 100.0 * f / len(preds), 100.0 * em / len(preds)


def test_trial_set_scores_equal_the_official_rules(shared_data):
    """Predictions that miss the gold span by a few characters on either side (so words get cut, and
    non-Chinese runs with periods, numbers and ％ get split) score as the official script scores them."""
    doc = _trial(shared_data)
    rng = np.random.default_rng(0)
    golds, preds = [], []
    for article in doc["data"]:
        for para in article["paragraphs"]:
            ctx = para["context"]
            for qa in para["qas"]:
                answers = [a["text"] for a in qa["answers"]]
                first = qa["answers"][0]
                start, end = first["answer_start"], first["answer_start"] + len(first["text"])
                a, b = rng.integers(-4, 5, 2)
                golds.append(answers)
                preds.append(ctx[max(0, start + a):max(0, end + b)])
    assert len(preds) == 1002
    word_tokenize = _punkt_model() or cmrc_words  # the full model where installed; else the equivalent above
    f1, em = official_scores(golds, preds, word_tokenize)
    ours = score_answers(preds, golds, "cmrc")
    assert ours["f1"] == pytest.approx(f1, abs=1e-9) and ours["exact_match"] == pytest.approx(em, abs=1e-9)
    assert 20 < f1 < 100 and 0 < em < 100
    # Gold against itself scores 100 / 100, as the script does.
    assert score_answers([g[0] for g in golds], golds, "cmrc") == {"exact_match": 100.0, "f1": 100.0}
