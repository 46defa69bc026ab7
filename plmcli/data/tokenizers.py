"""Train, load and describe HF `tokenizers` tokenizers, one recipe per `TokenizerConfig.kind`.

No kind gets a post-processor that inserts [CLS]/[SEP]/<eos>: the objectives add special tokens
themselves, so encoding with or without `add_special_tokens` gives the same ids.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Iterable, get_args

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from plmcli.config_sections import TokenizerConfig, TokenizerKind
from plmcli.errors import PlmError

KINDS = get_args(TokenizerKind)
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")
"""Special-token roles; also the order in which distinct special tokens get the lowest ids."""

_NEEDS_UNK = {"wordpiece", "bpe", "unigram", "char", "word"}

_GPT2 = {"eos": "<|endoftext|>"}
DEFAULT_SPECIAL_TOKENS = {
    "wordpiece": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},  # BERT's
    "unigram": {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},  # ALBERT's, ids 0-4
    "bytelevel-bpe": _GPT2,
}
"""The special tokens the usual models of each kind need (`plm tokenize --tokenizer KIND` without a recipe),
so the next step (make-mlm-data, pretrain) finds them; other kinds get GPT-2's end-of-text token."""


def default_special_tokens(kind: str) -> dict[str, str]:
    return dict(DEFAULT_SPECIAL_TOKENS.get(kind, _GPT2))


def resolve_special_tokens(cfg: TokenizerConfig, add_unk: bool = True) -> dict[str, str]:
    """cfg.special_tokens validated and in ROLES order, plus (with `add_unk`) a default unk where the model needs one."""
    tokens = dict(cfg.special_tokens or {})
    unknown = sorted(set(tokens) - set(ROLES))
    if unknown:
        raise PlmError(
            f"unknown special-token role(s) {', '.join(map(repr, unknown))}",
            f"use roles from: {' '.join(ROLES)}",
        )
    for role, tok in tokens.items():
        if not isinstance(tok, str) or not tok:
            raise PlmError(f"special token for role '{role}' must be a non-empty string, got {tok!r}",
                           f"set tokenizer.special_tokens.{role} to e.g. '[{role.upper()}]'")
    if add_unk and cfg.kind in _NEEDS_UNK and "unk" not in tokens:
        tokens["unk"] = "[UNK]" if cfg.kind == "wordpiece" else "<unk>"
    return {role: tokens[role] for role in ROLES if role in tokens}


def _ordered_specials(tokens: dict[str, str]) -> list[str]:
    # Dict order is ROLES order (see resolve_special_tokens), so ids do not depend on YAML key order.
    return list(dict.fromkeys(tokens.values()))


CJK_IDEOGRAPH = ("[\u4E00-\u9FFF\u3400-\u4DBF\U00020000-\U0002A6DF\U0002A700-\U0002B73F\U0002B740-\U0002B81F"
                 "\U0002B820-\U0002CEAF\uF900-\uFAFF\U0002F800-\U0002FA1F]")
"""One CJK ideograph (BERT's _is_chinese_char): the `word` tokenizer's word in Chinese text."""


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    """Train a tokenizer of `cfg.kind` from a stream of texts (typically lines); never holds the corpus."""
    if cfg.kind not in KINDS:
        raise PlmError(f"unknown tokenizer kind '{cfg.kind}'", f"use one of: {', '.join(KINDS)}")
    if cfg.vocab_size < 1:
        raise PlmError(f"tokenizer.vocab_size must be positive, got {cfg.vocab_size}", "set e.g. tokenizer.vocab_size=8192")
    roles = resolve_special_tokens(cfg)
    specials = _ordered_specials(roles)
    unk = roles.get("unk")
    if cfg.segment != "char":
        if cfg.kind != "word":
            raise PlmError(f"tokenizer.segment={cfg.segment} applies to the word tokenizer, not {cfg.kind}",
                           "set tokenizer.kind=word, or leave tokenizer.segment at char")
        return _jieba_words(texts, cfg, specials, unk)
    common = dict(vocab_size=cfg.vocab_size, special_tokens=specials, show_progress=False)

    if cfg.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=cfg.lowercase, lowercase=cfg.lowercase
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            min_frequency=cfg.min_frequency, continuing_subword_prefix="##", **common
        )
    elif cfg.kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=unk, end_of_word_suffix="</w>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
        trainer = trainers.BpeTrainer(min_frequency=cfg.min_frequency, end_of_word_suffix="</w>", **common)
    elif cfg.kind == "bytelevel-bpe":
        # No unk_token: every byte is in the initial alphabet, so any text encodes.
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        trainer = trainers.BpeTrainer(
            min_frequency=cfg.min_frequency, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common
        )
    elif cfg.kind == "unigram":
        tok = Tokenizer(models.Unigram())
        # "first": no extra "▁" after an inline special token, so such text round-trips (as in Llama).
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        # Unigram has no min_frequency: pieces are pruned by likelihood down to vocab_size.
        trainer = trainers.UnigramTrainer(unk_token=unk, **common)
    elif cfg.kind == "char":
        tok = Tokenizer(models.WordLevel(unk_token=unk))
        # Every character is its own pre-token, whitespace and newlines included.
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        trainer = trainers.WordLevelTrainer(min_frequency=cfg.min_frequency, **common)
    else:  # word
        tok = Tokenizer(models.WordLevel(unk_token=unk))
        # Chinese and Japanese are written without spaces: each CJK ideograph is a word of its own, as BERT's
        # BasicTokenizer makes it (its _is_chinese_char ranges), so Chinese text gets character vectors / n-grams.
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Split(Regex(CJK_IDEOGRAPH), behavior="isolated")])
        # No decoder on purpose: `Tokenizer.decode` then joins tokens with single spaces.
        trainer = trainers.WordLevelTrainer(min_frequency=cfg.min_frequency, **common)

    if cfg.lowercase and cfg.kind != "wordpiece":  # BertNormalizer already lowercases wordpiece
        tok.normalizer = normalizers.Lowercase()
    try:
        tok.train_from_iterator(texts, trainer=trainer)
    except PlmError:
        raise
    except Exception as e:  # the Rust side reports e.g. an impossible unigram vocab as a bare Exception
        raise PlmError(f"training the {cfg.kind} tokenizer failed: {e}",
                       "check tokenizer.vocab_size against the corpus size, or try another tokenizer.kind") from e
    tok = _renumber_after_collisions(tok, specials)
    if tok.get_vocab_size() <= len(specials):
        raise PlmError(f"the {cfg.kind} tokenizer learned no tokens beyond the special tokens",
                       "use more text or a lower tokenizer.min_frequency")
    return tok


def _jieba_words(texts: Iterable[str], cfg: TokenizerConfig, specials: list[str], unk: str | None) -> Tokenizer:
    """The word tokenizer with Chinese in jieba's words: a unigram model whose units are the corpus' whitespace words
    and jieba's words of its CJK runs, each scored by its log frequency, so a run is cut into the most probable
    sequence of known units (jieba's own rule for its dictionary words; the words its HMM found in this corpus are
    units too). Every ideograph seen is a unit, so a run always has a cut; an unseen one is [UNK] alone.
    Serialisable, unlike a jieba pre-tokenizer: tokenizer.json cuts the same way wherever it is loaded."""
    from collections import Counter

    from plmcli.data.masking import load_jieba

    if unk is None:
        raise PlmError("tokenizer.segment=jieba needs an unk token", "add one to tokenizer.special_tokens, e.g. unk: [UNK]")
    jieba = load_jieba()
    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                   pre_tokenizers.Split(Regex(CJK_IDEOGRAPH + "+"), behavior="isolated")])
    is_run = re.compile(CJK_IDEOGRAPH).match
    counts: Counter = Counter()
    for text in texts:
        text = text.lower() if cfg.lowercase else text
        for piece, _ in pre.pre_tokenize_str(text):
            counts.update(jieba.lcut(piece) if is_run(piece) else (piece,))
    # By count, ties in the order first seen (most_common's sort is stable), not a set's order: that follows the
    # process' string hash seed, so ideographs of equal count would get other ids, and other vectors, in every process.
    ranked = counts.most_common()
    chars = [w for w, _ in ranked if len(w) == 1 and is_run(w)]
    single = set(chars)
    words = [w for w, n in ranked if n >= cfg.min_frequency and w not in single and w not in specials]
    units = chars + words[:max(0, cfg.vocab_size - len(specials) - len(chars))]
    if not units:
        raise PlmError("the word tokenizer learned no tokens beyond the special tokens",
                       "use more text or a lower tokenizer.min_frequency")
    total = sum(counts[w] for w in units)
    tok = Tokenizer(models.Unigram([(t, 0.0) for t in specials] + [(w, math.log(counts[w] / total)) for w in units],
                                   unk_id=specials.index(unk)))
    tok.pre_tokenizer = pre
    if cfg.lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.add_special_tokens(specials)
    return tok


def _renumber_after_collisions(tok: Tokenizer, specials: list[str]) -> Tokenizer:
    """Give special tokens ids 0..n-1 and close id gaps in WordLevel/Unigram vocabularies.

    Their trainers (tokenizers 0.23) mishandle a special token that also occurs as corpus text (e.g.
    unk "?" in a char model): WordLevel re-ids it and leaves id 0 unused, Unigram lists it twice.
    """
    spec = json.loads(tok.to_str())
    model = spec["model"]
    if model["type"] == "WordLevel":
        order = specials + [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in specials]
        model["vocab"] = {t: i for i, t in enumerate(order)}
        new_id = model["vocab"]
    elif model["type"] == "Unigram":
        seen, pieces = set(), []
        for piece, score in model["vocab"]:
            if piece not in seen:
                seen.add(piece)
                pieces.append([piece, score])
        model["vocab"] = pieces
        new_id = {piece: i for i, (piece, _) in enumerate(pieces)}
        if model.get("unk_id") is not None:
            model["unk_id"] = new_id[spec["model"]["vocab"][model["unk_id"]][0]]
    else:
        return tok
    for added in spec["added_tokens"]:
        added["id"] = new_id[added["content"]]
    return Tokenizer.from_str(json.dumps(spec))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer.json written by HF tokenizers (or by `plm tokenize` / `plm pretrain`)."""
    p = Path(path)
    if not p.is_file():
        raise PlmError(f"tokenizer file '{p}' not found",
                       "point tokenizer.path at a tokenizer.json, or leave it empty to train one")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:
        raise PlmError(f"'{p}' is not a valid tokenizer.json ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                       "re-create it with `plm tokenize`, or use a file saved by HF tokenizers") from e


def special_token_ids(tok: Tokenizer, special_tokens: dict) -> dict[str, int]:
    """Role -> id for each special token; a token the vocabulary lacks is an error."""
    ids = {}
    for role, token in special_tokens.items():
        idx = tok.token_to_id(token)
        if idx is None:
            raise PlmError(f"special token {token!r} (role '{role}') is not in the tokenizer's vocabulary",
                           f"set tokenizer.special_tokens.{role} to a token the tokenizer has, or retrain it")
        ids[role] = idx
    return ids


def tokenizer_hash(tok: Tokenizer) -> str:
    """Short content hash of the tokenizer (first 16 hex digits of sha256 of its JSON)."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()[:16]


def tokenizer_kind(tok: Tokenizer) -> str:
    """Best guess at which `KINDS` entry built `tok` (useful for tokenizers loaded from a file)."""
    # The model's class and the pre-tokenizer's own JSON: parsing the whole tokenizer's takes milliseconds.
    model = type(tok.model).__name__
    pre = "null" if tok.pre_tokenizer is None else tok.pre_tokenizer.__getstate__().decode("utf-8")
    if model == "WordPiece":
        return "wordpiece"
    if model == "Unigram":  # word: whitespace splits, Chinese in jieba's words (tokenizer.segment=jieba)
        return "word" if '"WhitespaceSplit"' in pre else "unigram"
    if model == "BPE":
        return "bytelevel-bpe" if '"ByteLevel"' in pre else "bpe"
    if model == "WordLevel":
        # char: every character its own pre-token; word: whitespace splits (then CJK ideographs)
        return "word" if '"WhitespaceSplit"' in pre else "char"
    return str(model).lower()
