"""`plm attention`'s patterns beyond position and [CLS]/[SEP] (Clark et al. 2019 §3–4): attention to the same
token (anywhere / in the other sentence), to punctuation, and breadth against uniform attention. Each on
hand-made attention rows whose values are worked out in the comments, then end to end on a tiny BERT."""

from plmcli.config import override_layers
import json
import math

import pytest
import torch
from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel

from helpers import assert_clean_error, run
from plmcli.analysis.attention_stats import BROAD, PatternSums, broad_heads, is_punctuation, punctuation_ids, word_classes
from plmcli.api import pretrain
from families import tiny_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

CLS, SEP, A, B, C = 2, 3, 10, 11, 12
LN2 = math.log(2)


def _rows(*rows):
    """Attention rows given as {key: probability} into a (T, T) tensor; each row must sum to 1."""
    T = len(rows)
    m = torch.zeros(T, T, dtype=torch.float64)
    for i, row in enumerate(rows):
        for j, p in row.items():
            m[i, j] = p
    torch.testing.assert_close(m.sum(-1), torch.ones(T, dtype=torch.float64))
    return m


def _encoder_pair():
    """[CLS] a b b [SEP] | a c [SEP]: segments 0 0 0 0 0 | 1 1 1, c stands for a punctuation token.
    Head 1 is hand-made, head 2 uniform (1/8 on every key)."""
    ids = torch.tensor([[CLS, A, B, B, SEP, A, C, SEP]])
    segments = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    q = 1 / 8
    head1 = _rows({j: q for j in range(8)},            # [CLS] uniform          H = ln 8
                  {5: 0.5, 0: 0.5},                    # a → its twin at 5      H = ln 2
                  {3: 0.25, 0: 0.25, 4: 0.25, 6: 0.25},  # b → its twin at 3     H = ln 4
                  {3: 1.0},                            # b → itself only        H = 0
                  {7: 0.5, 4: 0.5},                    # [SEP] → [SEP] (special: no same-token query)  H = ln 2
                  {1: 0.25, 6: 0.25, 0: 0.25, 7: 0.25},  # a → its twin at 1     H = ln 4
                  {6: 1.0},                            # c → itself             H = 0
                  {j: q for j in range(8)})            # [SEP] uniform          H = ln 8
    head2 = torch.full((8, 8), q, dtype=torch.float64)
    return [torch.stack([head1, head2])[None]], ids, segments


def test_same_token_punctuation_and_breadth_by_hand():
    maps, ids, segments = _encoder_pair()
    real = torch.ones(1, 8, dtype=torch.bool)
    special = (ids == CLS) | (ids == SEP)
    sums = PatternSums()
    sums.add(maps, real, (ids == CLS) & real, (ids == SEP) & real, False, ids=ids, special=special,
             segments=segments, punct_keys=(ids == C) & real)
    head1, head2 = sums.rows()
    # same token: queries 1, 2, 3, 5 have a twin: (α_1,5 + α_2,3 + α_3,2 + α_5,1) / 4 = (0.5 + 0.25 + 0 + 0.25) / 4
    assert head1["same_token"] == pytest.approx(0.25)
    # other sentence: only the a's (1 ↔ 5) cross the [SEP]: (0.5 + 0.25) / 2
    assert head1["same_token_other"] == pytest.approx(0.375)
    # punctuation key 6, over all 8 queries: (1/8 + 0 + 1/4 + 0 + 0 + 1/4 + 1 + 1/8) / 8
    assert head1["punct"] == pytest.approx(1.75 / 8)
    # entropy: (ln 8 + ln 2 + ln 4 + 0 + ln 2 + ln 4 + 0 + ln 8) / 8 = 12 ln 2 / 8; uniform over 8 keys: ln 8
    assert head1["entropy"] == pytest.approx(1.5 * LN2)
    assert sums.uniform_entropy() == pytest.approx(3 * LN2)
    assert head1["breadth"] == pytest.approx(0.5)
    # the uniform head: 1/8 on each twin and on the one punctuation key, entropy = uniform's
    assert head2["same_token"] == pytest.approx(1 / 8) and head2["same_token_other"] == pytest.approx(1 / 8)
    assert head2["punct"] == pytest.approx(1 / 8) and head2["breadth"] == pytest.approx(1.0)
    assert sums.counts["same_token"] == 4 and sums.counts["same_token_other"] == 2 and sums.counts["punct"] == 8
    assert broad_heads(sums.rows()) == [{"layer": 1, "head": 2, "entropy": pytest.approx(3 * LN2), "breadth": pytest.approx(1.0)}]
    lower = broad_heads(sums.rows(), threshold=0.49)  # broadest first
    assert BROAD == 0.9 and [(b["head"], b["breadth"]) for b in lower] == [(2, pytest.approx(1.0)), (1, pytest.approx(0.5))]


def test_causal_same_token_counts_earlier_twins_only():
    """a b a a, causal: row i sees keys 0..i, so only earlier twins count and uniform entropy is ln(i + 1)."""
    ids = torch.tensor([[A, B, A, A]])
    head = _rows({0: 1.0},                               # H = 0
                 {0: 0.5, 1: 0.5},                       # H = ln 2
                 {0: 0.5, 2: 0.5},                       # a → its earlier twin 0: 0.5     H = ln 2
                 {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25})   # a → earlier twins 0, 2: 0.5     H = ln 4
    real = torch.ones(1, 4, dtype=torch.bool)
    sums = PatternSums()
    sums.add([head[None, None]], real, real & (torch.arange(4) == 0), None, True, ids=ids,
             special=torch.zeros_like(real), punct_keys=torch.zeros_like(real))
    (row,) = sums.rows()
    assert row["same_token"] == pytest.approx(0.5) and sums.counts["same_token"] == 2  # queries 2 and 3
    assert row["same_token_other"] is None and row["next"] is None  # one text: no other sentence
    assert row["punct"] == 0
    assert row["entropy"] == pytest.approx(4 * LN2 / 4)
    assert sums.uniform_entropy() == pytest.approx(math.log(1 * 2 * 3 * 4) / 4)
    assert row["breadth"] == pytest.approx(4 * LN2 / math.log(24))


def test_same_word_counts_every_piece_of_the_other_occurrences():
    """[CLS] ca ##t sat ca ##t [SEP]: the word "cat" twice (pieces 1-2 and 4-5); a word's own other piece is
    no twin. Tokens: each piece has one twin (1 ↔ 4, 2 ↔ 5)."""
    ids = torch.tensor([[CLS, A, B, C, A, B, SEP]])
    words = (torch.tensor([[-1, 0, 0, 1, 0, 0, -1]]), torch.tensor([[-1, 0, 0, 1, 2, 2, -1]]))
    u = 1 / 7
    encoder = _rows({j: u for j in range(7)},
                    {2: 0.5, 5: 0.5},             # ca:  word twins 4, 5 → 0.5;  token twin 4 → 0
                    {1: 0.5, 5: 0.5},             # ##t: word twins 4, 5 → 0.5;  token twin 5 → 0.5
                    {3: 1.0},                     # sat: no twin
                    {1: 0.25, 2: 0.25, 4: 0.5},   # ca:  word twins 1, 2 → 0.5;  token twin 1 → 0.25
                    {5: 1.0},                     # ##t: word twins 1, 2 → 0;    token twin 2 → 0
                    {j: u for j in range(7)})
    causal = _rows({0: 1.0}, {0: 0.5, 1: 0.5}, {0: 0.5, 2: 0.5}, {3: 1.0},
                   {1: 0.25, 2: 0.25, 4: 0.5},    # the second "cat" alone sees a first: as above
                   {5: 1.0}, {0: 1.0})
    real = torch.ones(1, 7, dtype=torch.bool)
    for is_causal, head in ((False, encoder), (True, causal)):
        sums = PatternSums()
        sums.add([head[None, None]], real, (ids == CLS) & real, None, is_causal, ids=ids,
                 special=(ids == CLS) | (ids == SEP), words=words, segments=torch.zeros(1, 7, dtype=torch.long))
        (row,) = sums.rows()
        if not is_causal:
            assert row["same_word"] == pytest.approx((0.5 + 0.5 + 0.5 + 0) / 4)
            assert row["same_token"] == pytest.approx((0 + 0.5 + 0.25 + 0) / 4)
            assert sums.counts["same_word"] == sums.counts["same_token"] == 4
        else:  # queries 4 and 5 only
            assert row["same_word"] == pytest.approx((0.5 + 0) / 2) and row["same_token"] == pytest.approx((0.25 + 0) / 2)
            assert sums.counts["same_word"] == sums.counts["same_token"] == 2
        assert row["same_word_other"] is None and row["same_token_other"] is None  # one segment: no query has one


def test_same_word_pieces_measures_attention_within_a_split_word():
    """Clark et al. §4's straw ↔ ##berries heads: [CLS] straw ##berries are red [SEP] from a WordPiece tokenizer.
    Head 1 attends from each piece only to the other piece of its word: 1.0; head 2 only to [CLS]: 0. Queries:
    the two pieces (a one-piece word and [CLS]/[SEP] have no other piece)."""
    from tokenizers import pre_tokenizers
    from tokenizers.models import WordPiece

    wp = Tokenizer(WordPiece({"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "straw": 3, "##berries": 4, "are": 5, "red": 6},
                             unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    assert wp.encode("strawberries are red").tokens == ["straw", "##berries", "are", "red"]
    ((cls, occ),) = word_classes(wp, ["strawberries are red"], {})
    ids = torch.tensor([[1, 3, 4, 5, 6, 2]])
    words = (torch.tensor([[-1, *cls, -1]]), torch.tensor([[-1, *occ, -1]]))
    encoder = _rows({0: 1.0}, {2: 1.0}, {1: 1.0}, {3: 1.0}, {4: 1.0}, {5: 1.0})  # straw ↔ ##berries
    causal = _rows({0: 1.0}, {1: 1.0}, {1: 1.0}, {3: 1.0}, {4: 1.0}, {5: 1.0})   # straw sees no later piece
    to_cls = _rows(*({0: 1.0} for _ in range(6)))
    real = torch.ones(1, 6, dtype=torch.bool)
    for is_causal, head, queries in ((False, encoder, 2), (True, causal, 1)):
        sums = PatternSums()
        sums.add([torch.stack([head, to_cls])[None]], real, (ids == 1) & real, (ids == 2) & real, is_causal, ids=ids,
                 special=(ids == 1) | (ids == 2), words=words)
        head1, head2 = sums.rows()
        assert head1["same_word_pieces"] == pytest.approx(1.0) and head2["same_word_pieces"] == pytest.approx(0.0)
        assert sums.counts["same_word_pieces"] == queries
        assert head1["same_word"] is None  # no word occurs twice: pieces of one word are not twins


def test_word_classes_follow_the_pre_tokenizer_and_the_decoded_text():
    from tokenizers import pre_tokenizers
    from tokenizers.models import WordPiece

    wp = Tokenizer(WordPiece({"[UNK]": 0, "ca": 1, "##t": 2, "sat": 3, ",": 4}, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    classes = {}
    ((cls, occ),) = word_classes(wp, ["cat sat, cat"], classes)
    assert wp.encode("cat sat, cat").tokens == ["ca", "##t", "sat", ",", "ca", "##t"]
    assert cls == [0, 0, 1, 2, 0, 0] and occ == [0, 0, 1, 2, 3, 3] and classes == {"cat": 0, "sat": 1, ",": 2}
    bl = Tokenizer(WordLevel({"cat": 0, "Ġcat": 1, "Ġsat": 2, "Ġ": 3, "[UNK]": 4}, unk_token="[UNK]"))
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    ((cls, occ),) = word_classes(bl, ["cat sat cat"], {})
    assert bl.encode("cat sat cat").tokens == ["cat", "Ġsat", "Ġcat"]
    assert cls == [0, 1, 0] and occ == [0, 1, 2]  # "cat" and " cat" are one word
    assert word_classes(bl, ["cat  cat"], {})[0][0][1] == -1  # a lone space is no word


def test_a_one_token_text_has_no_breadth():
    sums = PatternSums()
    real = torch.ones(1, 1, dtype=torch.bool)
    sums.add([torch.ones(1, 2, 1, 1)], real, real, None, True, ids=torch.tensor([[A]]), special=~real)
    assert sums.uniform_entropy() == 0 and all(r["breadth"] is None and r["same_token"] is None for r in sums.rows())


@pytest.mark.parametrize("text, punct", [
    (".", True), (",", True), ("...", True), ("?!", True), ("«", True), ("—", True), ("。", True), ("、", True),
    ("##,", True), (" ,", True), ("'", True), ("$", False), ("+", False), ("=", False), ("a.", False),
    ("'s", False), ("", False), (" ", False), ("[SEP]", False), ("5", False),
])
def test_punctuation_is_the_unicode_p_categories(text, punct):
    assert is_punctuation(text) is punct


def test_punctuation_ids_read_the_decoded_text():
    """Byte-level BPE stores " ," as "Ġ,": decoded it is punctuation, as the raw entry is not."""
    vocab = {"hello": 0, ",": 1, "Ġ,": 2, "Ġ.": 3, "$": 4, "...": 5, "[SEP]": 6, "Ġhello": 7, "[UNK]": 8}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.decoder = decoders.ByteLevel()
    assert punctuation_ids(tok, range(9), special=[6, 8]) == [1, 2, 3, 5]
    assert not is_punctuation("Ġ,")


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """A tiny BERT whose wordpiece vocabulary has "," and ".", trained 2 steps."""
    root = tmp_path_factory.mktemp("attention-patterns")
    words = "the cat sat on a mat while dogs ran far away from home and back again".split()
    lines = [" ".join(words[(d + j) % len(words)] for j in range(4)) + " , " +
             " ".join(words[(d + j + 5) % len(words)] for j in range(3)) + " ." for d in range(90)]
    docs = ["\n".join(lines[k:k + 3]) for k in range(0, len(lines), 3)]  # 3 sentences a document, as tiny_corpus
    corpus = root / "c.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLM_RUNS", str(root / "runs"))
        mp.setenv("PLM_CACHE", str(root / "cache"))
        pretrain("bert-mini", [str(corpus)], str(root / "bert"),
                 overrides=override_layers([*tiny_overrides("bert"), "model.vocab_size=0", "tokenizer.min_frequency=1", "train.seq_len=16",
                                           "train.global_batch_size=4", "objective.dupe_factor=1", "train.eval_every=0"], {"train.max_steps": 2}))
    return root / "bert"


def test_command_reports_the_patterns_on_a_tiny_bert(bert_run, tmp_path):
    out = tmp_path / "att"
    res = run("attention", bert_run, "the cat , the mat .", "--text-pair", "a cat ran .", "--out", out,
              "--max-seq-len", 16, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    tokens = got["tokens"]
    assert tokens == ["[CLS]", "the", "cat", ",", "the", "mat", ".", "[SEP]", "a", "cat", "ran", ".", "[SEP]"]
    assert sorted(got["punctuation"]) == [",", "."]
    # by hand from the tokens: the, the, cat, cat, ., . recur (6 queries); across the [SEP]: cat, cat, ., .
    assert got["queries"]["same_token"] == got["queries"]["same_word"] == 6
    assert got["queries"]["same_token_other"] == got["queries"]["same_word_other"] == 4
    assert got["queries"]["punct"] == got["queries"]["entropy"] == len(tokens) == got["query_tokens"]
    assert got["uniform_entropy"] == pytest.approx(math.log(len(tokens)))  # every encoder query sees all 13 keys
    for head in got["heads"]:
        assert head["breadth"] == pytest.approx(head["entropy"] / math.log(len(tokens)))
        assert 0 < head["punct"] < 1 and 0 < head["same_token"] < 1 and 0 < head["same_token_other"] < 1
        # every word here is one wordpiece: words and tokens are the same twins
        assert head["same_word"] == pytest.approx(head["same_token"]) and head["same_word_other"] == pytest.approx(head["same_token_other"])
    assert got["broad_heads"] == [{k: h[k] for k in ("layer", "head", "entropy", "breadth")}
                                  for h in sorted(got["heads"], key=lambda h: -h["breadth"]) if h["breadth"] >= 0.9]
    assert got["broad"] == BROAD
    assert "patterns.png" in got["figures"] and (out / "patterns.png").stat().st_size > 10_000
    tsv = (out / "attention.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[-7:] == ["same_token", "same_token_other", "same_word", "same_word_other", "same_word_pieces",
                                      "punct", "breadth"]
    assert all(h["same_word_pieces"] is None for h in got["heads"])  # every word here is one wordpiece

    res = run("attention", bert_run, "the cat , the mat .", "--text-pair", "a cat ran .", "--out", out)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())  # rich wraps the wide table's headers
    for words in ("same token elsewhere: layer", "same token in the other sentence: layer", "punctuation (",
                  "broad heads (entropy ≥ 90% of uniform attention's 2.56 nats)", "patterns.png (a heatmap per pattern)",
                  "→ [CLS]"):
        assert words in text, words


def test_command_single_text_has_no_other_sentence(bert_run, tmp_path):
    res = run("attention", bert_run, "the cat sat", "--out", tmp_path / "att", "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["queries"]["same_token_other"] == 0 and got["queries"]["same_token"] == 0
    assert all(h[p] is None for h in got["heads"] for p in ("same_token", "same_token_other", "same_word", "same_word_other"))
    assert got["punctuation"] == [] and all(h["punct"] == 0 for h in got["heads"])
    res = run("attention", bert_run, "the cat sat", "--out", tmp_path / "att")
    text = " ".join(res.stdout.split())
    assert "punctuation: none in the input" in text and "no token occurs twice in the input" in text
    assert "no word occurs twice in the input" in text and "pass --text-pair or tab-separated pairs" in text
    assert "other pieces of the same word: n/a (no word of the input is split into pieces)" in text
    assert_clean_error(run("attention", bert_run, "the cat", "--text-pair", " ", "--out", tmp_path / "b"), "--text-pair")
