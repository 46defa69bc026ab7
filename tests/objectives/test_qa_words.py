"""Span-QA answers are whole words: a predicted span that cuts a word is widened to it."""


import numpy as np
import pytest

from plmcli.config import TokenizerConfig
from plmcli.data.tasks import TaskOptions
from plmcli.data.tasks.registry import get_task
from plmcli.data.tasks.squad import QAExample
from plmcli.data.tokenizers import resolve_special_tokens, special_token_ids, train_tokenizer
from plmcli.objectives.qa import SpanQA, SpanQAConfig, whole_words

TEXT = "He was bowling Somerset, then Kent."


def cut(text, part):
    start = text.index(part)
    a, b = whole_words(text, start, start + len(part))
    return text[a:b]


@pytest.mark.parametrize("part,widened", [
    ("ling Somerse", "bowling Somerset"),  # both ends inside words
    ("owl", "bowling"),
    ("Somerset", "Somerset"),  # already whole: the comma after it is a word of its own
    ("Somerset,", "Somerset,"),  # the comma was predicted: kept
    ("t, th", "Somerset, then"),
    ("Kent.", "Kent."),
    ("He", "He"),
    (" was ", " was "),  # spaces are not widened over (the caller strips them)
])
def test_whole_words_in_whitespace_text(part, widened):
    assert cut(TEXT, part) == widened


def test_chinese_characters_are_words_of_their_own():
    text = "我爱北京天安门，型号iPhone12于2018年发布。"
    assert cut(text, "北京") == "北京" and cut(text, "京天") == "京天"
    assert cut(text, "Phone1") == "iPhone12"  # a Latin run inside Chinese is still one word
    assert cut(text, "01") == "2018" and cut(text, "年发") == "年发"
    assert cut("50％以上", "0") == "50"  # ％ is punctuation: not part of the number's word
    assert whole_words(text, 3, 3) == (3, 3)


def test_decoded_answers_are_widened_words():
    """Logits that point inside a word, through the objective's own decoding path (word pieces of a
    small WordPiece vocabulary: "bowling" is bowl ##i ##n ##g)."""
    passage = "He was bowling Somerset, then Kent; the bowler was Botham."
    question = "Who was he bowling?"
    specials = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
    cfg = TokenizerConfig(kind="wordpiece", vocab_size=45, min_frequency=1, lowercase=True, special_tokens=specials)
    tok = train_tokenizer([passage, question], cfg)
    ids = special_token_ids(tok, resolve_special_tokens(cfg))
    task = get_task("squad", TaskOptions(max_query_len=8, doc_stride=16))
    obj = SpanQA(SpanQAConfig(), tok, ids, 48, task=task)
    start = passage.index("Somerset")
    w, table = obj.encode([QAExample("q0", question, passage, ["Somerset"], (start, start + 8))])
    assert len(w["question"]) == 1
    enc = tok.encode(passage, add_special_tokens=False)
    # The first token that starts inside "bowling" (a ## piece) and the last one inside "Somerset" short of its end.
    pieces = [i for i, (a, b) in enumerate(enc.offsets) if passage.index("bowling") < a < passage.index("bowling") + 7]
    ends = [i for i, (a, b) in enumerate(enc.offsets) if start <= a and b < start + 8]
    assert pieces and ends, enc.tokens
    p0 = int(w["type_start"][0])
    logits = np.zeros((1, 48, 2))
    logits[0, p0 + pieces[0], 0] = logits[0, p0 + ends[-1], 1] = 10.0

    class Stream:
        windows, questions, padded = w, table, None  # padded: built by _answers on first use, as eval_stream leaves it
    raw = passage[enc.offsets[pieces[0]][0]:enc.offsets[ends[-1]][1]]
    assert raw != "bowling Somerset" and raw in "bowling Somerset"
    seen, texts = obj._answers(Stream, logits, np.arange(1))
    assert seen == [0] and texts == ["bowling Somerset"]
    scores = task.score(texts, table["answers"])
    assert scores["exact_match"] == 0.0 and scores["f1"] == pytest.approx(100 * 2 * 0.5 / 1.5)
