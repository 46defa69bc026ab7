"""ERNIE 1.0 knowledge masking: lexicon matches as masking units (plmcli.data.masking.Lexicon)."""

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from plmcli.config_sections import TokenizerConfig
from plmcli.data.masking import Lexicon, mask_batch, read_lexicon, resolve_lexicon
from plmcli.data.tokenizers import train_tokenizer
from plmcli.errors import PlmError

MASK, VOCAB = 3, 1000


def wordpiece(vocab: list[str]) -> Tokenizer:
    """A BERT-style WordPiece tokenizer over a fixed vocabulary (so "yorkshire" is york ##shire)."""
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(["[UNK]"] + vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def encode(tok, lines: list[str]):
    """One document as plm tokenize stores it: ids, word starts, sentence starts."""
    ids, ws, starts = [], [], []
    for enc in tok.encode_batch(lines, add_special_tokens=False):
        starts.append(len(ids))
        ids += enc.ids
        ws += [k == 0 or enc.word_ids[k] != enc.word_ids[k - 1] for k in range(len(enc.ids))]
    return np.array(ids), np.array(ws), starts


def units(tok, lex, lines, chinese=False):
    """The masking units of a document, as token strings joined within a unit."""
    ids, ws, starts = encode(tok, lines)
    toks = [tok.id_to_token(int(i)) for i in ids]
    out = lex.word_starts(ids, ws, starts, toks if chinese else None)
    cut = np.flatnonzero(out).tolist() + [len(ids)]
    return [" ".join(toks[a:b]) for a, b in zip(cut[:-1], cut[1:])]


EN = wordpiece(["new", "york", "##shire", "city", "hall", "is", "big", "in", ".", "a", "b"])


def test_longest_match_wins_over_a_shorter_overlapping_one():
    lex = Lexicon(["new york", "york city hall", "new"], EN)
    # "york city hall" (3 tokens) beats the overlapping "new york" (2); "new" falls back to its word.
    assert units(EN, lex, ["new york city hall is big"]) == ["new", "york city hall", "is", "big"]
    # With no longer rival, "new york" wins over "new" that starts at the same place.
    assert units(EN, lex, ["new york is big"]) == ["new york", "is", "big"]
    # Equal lengths: the one further left.
    lex = Lexicon(["a b", "b a"], EN)
    assert units(EN, lex, ["a b a"]) == ["a b", "a"]


def test_matches_are_whole_words_inside_one_sentence():
    lex = Lexicon(["new york", "york"], EN)
    # "york" is not the start of "yorkshire" (york ##shire): that word stays one unit, unmatched.
    assert units(EN, lex, ["new yorkshire is big"]) == ["new", "york ##shire", "is", "big"]
    assert units(EN, lex, ["big york"]) == ["big", "york"]
    # A match never crosses a sentence (line) boundary.
    ids, ws, starts = encode(EN, ["big new", "york is"])
    s, n = lex.matches(ids, ws, np.cumsum(np.isin(np.arange(len(ids)), starts[1:])))
    assert [EN.id_to_token(int(ids[i])) for i in s] == ["york"] and n.tolist() == [1]


def test_chinese_text_outside_the_lexicon_falls_back_to_jieba_words():
    zh = train_tokenizer(["我爱北京天安门，上海很大。"] * 3, TokenizerConfig(
        kind="wordpiece", vocab_size=100, min_frequency=1, special_tokens={"unk": "[UNK]"}))
    no_match = Lexicon(["上海"], zh)
    assert units(zh, no_match, ["我爱北京天安门"], chinese=True) == ["我", "爱", "北 京", "天 安 门"]  # jieba
    assert units(zh, no_match, ["我爱北京天安门"]) == ["我", "爱", "北", "京", "天", "安", "门"]  # no token strings: characters
    assert units(zh, Lexicon(["北京天安门"], zh), ["我爱北京天安门"], chinese=True) == ["我", "爱", "北 京 天 安 门"]
    # A jieba word that runs out of a match (北京) leaves its rest (京) as a unit of its own, not part of 爱北.
    assert units(zh, Lexicon(["爱北"], zh), ["我爱北京天安门"], chinese=True) == ["我", "爱 北", "京", "天 安 门"]


def test_byte_level_entries_match_at_and_after_the_sentence_start():
    text = ["New York is big and I love New York", "York is New"]
    tok = train_tokenizer(text * 20, TokenizerConfig(kind="bytelevel-bpe", vocab_size=300, min_frequency=1, special_tokens={}))
    lex = Lexicon(["New York"], tok)
    ids, ws, starts = encode(tok, text)
    s, n = lex.matches(ids, ws, np.cumsum(np.isin(np.arange(len(ids)), starts[1:])))
    assert len(s) == 2 and n.tolist() == [2, 2]  # "New York" first in the line and "ĠNew ĠYork" later


def test_knowledge_masking_masks_matches_whole_within_the_budget():
    """Random text over 20 tokens where four lexicon entries occur often: every chosen match is masked
    whole, the budget is BERT's 15%, and 80/10/10 is decided once per unit."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    tok = wordpiece(words)
    entries = ["w1 w2 w3", "w2 w3", "w4 w5 w6 w7", "w8 w9"]
    lex = Lexicon(entries, tok)
    B, T = 1500, 64
    ids = np.full((B, T), 0)
    special = np.zeros((B, T), dtype=bool)
    special[:, [0, -1]] = True
    ws = np.ones((B, T), dtype=bool)
    spans = []
    for r in range(B):
        picks = []
        while len(picks) < T - 2:
            picks += entries[rng.integers(4)].split() if rng.random() < 0.4 else [words[rng.integers(20)]]
        row, row_ws, _ = encode(tok, [" ".join(picks[: T - 2])])
        ids[r, 1:-1] = row
        s, n = lex.matches(row, row_ws, np.zeros(len(row), dtype=int))
        ws[r, 1:-1] = lex.word_starts(row, row_ws, [0])
        spans += [(r, a + 1, k) for a, k in zip(s, n)]
    masked, target = mask_batch(ids + 100, special, ws, np.random.default_rng(1), strategy="knowledge", mask_id=MASK,
                                vocab_size=VOCAB, random_ids=np.arange(500, 600))
    assert len(spans) > 10 * B and {k for _, _, k in spans} == {2, 3, 4}
    kinds = np.where(masked == MASK, 0, np.where(masked != ids + 100, 1, 2))  # [MASK] / random / unchanged
    chosen = 0
    for r, a, k in spans:
        t = target[r, a: a + k]
        assert t.all() or not t.any()  # never partially
        if t.all():
            chosen += 1
            assert len(set(kinds[r, a: a + k].tolist())) == 1  # one 80/10/10 draw per unit
    assert chosen > 0.1 * len(spans)
    budget = np.round((T - 2) * 0.15)
    assert (target.sum(1) <= budget).all() and abs(target.sum() / (B * (T - 2)) - 0.15) < 0.01
    share = np.bincount(kinds[target], minlength=3) / target.sum()
    assert np.abs(share - [0.8, 0.1, 0.1]).max() < 0.02


def test_lexicon_files(tmp_path):
    entities = read_lexicon("chinese-sample-entities.txt")  # a shipped sample, by name
    assert len(entities) > 100 and "中国" in entities and resolve_lexicon("chinese-sample-phrases.txt").is_file()
    f = tmp_path / "lex.txt"
    f.write_text("# phrases\nnew york\tns\t3\n\n  york city  \n", encoding="utf-8")
    assert read_lexicon(f) == ["new york", "york city"]  # text after a TAB, blank and '#' lines ignored
    with pytest.raises(PlmError, match="does not exist") as e:
        read_lexicon(tmp_path / "missing.txt")
    assert "one phrase or entity per line" in e.value.hint
    f.write_text("# nothing\n\n   \n", encoding="utf-8")
    with pytest.raises(PlmError, match="no usable lines"):
        read_lexicon(f)
    f.write_text("zzz qqq\n", encoding="utf-8")
    with pytest.raises(PlmError, match="no lexicon entry is made of known tokens"):
        Lexicon.load(f, EN, unk_id=0)
