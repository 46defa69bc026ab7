"""Masked language modelling (BERT, RoBERTa, SpanBERT, ERNIE 1.0): predict masked tokens from both
sides, plus NSP / SOP, plus SpanBERT's span boundary objective when the model has that head.

Two data paths, one loss:
- static (BERT): `make-mlm-data` instances, masked once per copy (dupe_factor copies); the collator pads.
- dynamic (RoBERTa): rows of a tokenized corpus, masked afresh in the collator each time a sample is read;
  the mask is a pure function of (seed, epoch, sample), so a resumed run masks identically. Rows are
  `packing`: token-stream windows, or whole sentences packed (FULL-SENTENCES / DOC-SENTENCES, data/packing.py).
Batches carry the masked tokens as flat indices b·T + t, so the model runs its MLM head there only.
A model that returns `sbo_logits` (SpanBERT) predicts the masked tokens a second time from the span
boundaries; the objective adds that loss (mean over its predictions) to the MLM loss, as the paper sums them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.config_schema import Count, Formerly, Fraction, NonNegative, Range, Rule, Size
from plmcli.data.batching import BatchStream, TokenBudgetStream, row_generators
from plmcli.data.knowledge import KINDS as KNOWLEDGE_UNITS
from plmcli.data.masking_options import MaskingOptions, counted_lengths
from plmcli.data.packing import PACKINGS
from plmcli.data.store import read_meta
from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.device import row_lengths
from plmcli.models.spanbert import SpanBertOutput
from plmcli.objectives.base import Mixes, NoBatches, StepOutput
from plmcli.objectives.mlm_units import chinese_word_start_stream, knowledge_start_stream, word_start_stream

MLM_FORMAT = "plm-mlm"
MASKINGS = ("token", "wwm", "ngram", "ngram_per_word", "chinese-wwm", "span", "knowledge")
PAIRS = ("nsp", "sop", "none")
STRATEGY = {"chinese-wwm": "wwm"}  # masking -> mask_batch strategy: Chinese words are whole words
_WINDOW_TAG, _MASK_TAG = 7, 11  # seed-tuple tags: the window offset and the masks draw independent streams
SINGLE_SEGMENTS = Rule(lambda p, c: p == "window" or c["pairs"] == "none",
                       "packs single segments, and {where}.pairs is {pairs}",
                       "set {where}.pairs=none (RoBERTa), or {where}.packing=window")
CROSS_DOCUMENTS = Formerly("cross_documents", {False: "doc_sentences", True: None})
"""packing's older name on the static path (make-mlm-data --no-cross-documents): false is doc_sentences, true
leaves packing as set; a recipe or a saved config.json that has it still loads."""


@dataclass
class MLMConfig(MaskingOptions):
    """The mlm objective's keys; mask_count and ngram_start_prob (data/masking_options.py) are make-mlm-data's too."""

    mask_prob: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.15
    """Share of tokens chosen as prediction targets."""
    max_predictions: Count = 20
    """At most this many targets per sequence (BERT: 20 at 128 tokens, 80 at 512); 0 = no cap."""
    masking: Literal[MASKINGS] = "token"
    """token | wwm (whole words) | ngram (1..4 words, 40/30/20/10, the words tiled into n-grams) |
    ngram_per_word (seed 003 §7.3.4.2: walk the words, at each one start a 1..4-word n-gram with a probability
    set by mask_prob, mask it, continue after it) | chinese-wwm (jieba words; static) |
    span (SpanBERT: geometric spans of whole words) | knowledge (ERNIE: whole lexicon matches, else words)."""
    ngram_probs: list = field(default_factory=lambda: [0.4, 0.3, 0.2, 0.1])
    """masking ngram, ngram_per_word: P(n whole words) for n = 1, 2, ... (MacBERT 0.4/0.3/0.2/0.1; ALBERT ∝ 1/n for n ≤ 3)."""
    span_p: Annotated[float, Range(0, 1, lo_open=True)] = 0.2
    """masking span: span length in words ~ Geometric(span_p), in (0, 1] (SpanBERT: 0.2, mean 3.8 words)."""
    span_max: Size = 10
    """masking span: the geometric length is truncated to 1..span_max words (SpanBERT: 10)."""
    lexicon: Optional[str] = None
    """masking knowledge: a file with one phrase or entity per line, or the name of a shipped sample
    (chinese-sample-phrases.txt, chinese-sample-entities.txt). Each match is masked as one unit."""
    knowledge_units: Optional[Literal[KNOWLEDGE_UNITS]] = None
    """masking knowledge without a lexicon: phrases (ERNIE's phrase stage: chunks of jieba's part-of-speech
    tags) | entities (its entity stage: runs of person, place, organisation and other proper-noun tags),
    found in the corpus itself (data/knowledge.py); other text keeps its jieba words. Give this or lexicon."""
    pairs: Literal[PAIRS] = "nsp"
    """nsp (50% random next segment) | sop (50% swapped order) | none (full sentences packed, RoBERTa)."""
    packing: Annotated[Literal[PACKINGS], SINGLE_SEGMENTS, CROSS_DOCUMENTS] = "window"
    """pairs none, how rows are cut. window: dynamic masking reads fixed seq_len-2 windows of the token stream,
    realigned each epoch (rows start mid-sentence). full_sentences (RoBERTa's FULL-SENTENCES): whole sentences
    packed up to seq_len, across documents with a separator between them. doc_sentences (DOC-SENTENCES): a row
    never crosses a document — shorter rows, each about one topic, for corpora of short documents; dynamic
    batches take as many rows as hold about a FULL-SENTENCES micro-batch's tokens, batched by length.
    Static data (make-mlm-data) always packs sentences: doc_sentences there, else full_sentences. Older name:
    cross_documents (false is doc_sentences), still read."""
    dynamic: bool = False
    """Mask each batch afresh from the tokenized corpus (RoBERTa) instead of reading make-mlm-data instances."""
    dupe_factor: Size = 5
    """Static data: copies of the corpus, each masked differently."""
    short_seq_prob: Fraction = 0.1
    """Static data: share of instances built shorter than max length (BERT's short_seq_prob)."""
    replace_probs: list = field(default_factory=lambda: [0.8, 0.1, 0.1])
    """Of the targets: share replaced by [MASK], by a random token, kept unchanged (dynamic masking)."""
    nsp_weight: NonNegative = 1.0
    """Weight of the NSP / SOP loss added to the MLM loss."""
    sbo_weight: NonNegative = 1.0
    """Weight of the span boundary objective's loss, for a model with that head (SpanBERT: 1, a plain sum)."""


class MaskedLM(Mixes):
    Config = MLMConfig
    ppl_metric = "mlm_loss"
    """The loss whose exp is reported as val_ppl (the NSP loss is not a perplexity)."""

    def __init__(self, cfg: MLMConfig, tokenizer, special_ids: dict[str, int], seq_len: int):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if cfg.masking not in MASKINGS:
            raise PlmError(f"objective.masking '{cfg.masking}' is not one of {', '.join(MASKINGS)}", "e.g. --set objective.masking=wwm")
        if cfg.pairs not in PAIRS:
            raise PlmError(f"objective.pairs '{cfg.pairs}' is not one of {', '.join(PAIRS)}", "e.g. --set objective.pairs=none")
        if not 0 < cfg.mask_prob < 1:
            raise PlmError(f"objective.mask_prob {cfg.mask_prob} must be in (0, 1)", "e.g. --set objective.mask_prob=0.15")
        if len(cfg.replace_probs) != 3 or min(cfg.replace_probs) < 0 or abs(sum(cfg.replace_probs) - 1) > 1e-6:
            raise PlmError(f"objective.replace_probs {cfg.replace_probs} must be three shares summing to 1",
                           "e.g. [0.8, 0.1, 0.1]: [MASK], random token, unchanged")
        if cfg.dynamic and cfg.pairs != "none":
            raise PlmError(f"dynamic masking packs full sentences and has no sentence pairs (objective.pairs is {cfg.pairs})",
                           "set objective.pairs=none (RoBERTa), or objective.dynamic=false for NSP/SOP pairs")
        if cfg.packing not in PACKINGS:
            raise PlmError(f"objective.packing '{cfg.packing}' is not one of {', '.join(PACKINGS)}",
                           "e.g. --set objective.packing=full_sentences")
        if cfg.packing != "window" and cfg.pairs != "none":
            raise PlmError(f"objective.packing {cfg.packing} packs single segments, and objective.pairs is {cfg.pairs}",
                           "set objective.pairs=none (RoBERTa), or objective.packing=window")
        from plmcli.data.masking import check_ngram_probs, check_span, read_lexicon

        check_span(cfg.span_p, cfg.span_max, ("objective.span_p", "objective.span_max"))
        check_ngram_probs(cfg.ngram_probs, "objective.ngram_probs")
        if cfg.masking == "knowledge" and bool(cfg.lexicon) == bool(cfg.knowledge_units):
            raise PlmError("objective.masking knowledge needs objective.lexicon (one phrase or entity per line) or "
                           f"objective.knowledge_units (phrases or entities found by jieba's tagger){', not both' if cfg.lexicon else ''}",
                           "e.g. --set objective.knowledge_units=entities, or objective.lexicon=chinese-sample-entities.txt "
                           "with objective.knowledge_units=null")
        for name, value in (("lexicon", cfg.lexicon), ("knowledge_units", cfg.knowledge_units)):
            if value and cfg.masking != "knowledge":
                raise PlmError(f"objective.{name} applies to masking knowledge, not {cfg.masking}",
                               f"set objective.masking=knowledge, or objective.{name}=null")
        if cfg.lexicon:
            read_lexicon(cfg.lexicon)  # a missing or empty file fails now, not after tokenizing the corpus
        if cfg.sbo_weight < 0:
            raise PlmError(f"objective.sbo_weight {cfg.sbo_weight} must be ≥ 0", "e.g. --set objective.sbo_weight=1")
        self.vocab_size = tokenizer.get_vocab_size() if tokenizer is not None else 0

    def configure_model(self, model_cfg, vocab_size):
        super().configure_model(model_cfg, vocab_size)
        self.vocab_size = self.vocab_size or vocab_size

    def check_model(self, model):
        if not traits_of(model).masked_lm:
            raise PlmError(f"{type(model).__name__} is not an encoder with a masked-LM head",
                           "use objective.name: mlm with an encoder recipe (bert-mini, bert-base, roberta-base)")
        self.check_positions(model)
        self.set_predicted_share(model)

    def set_predicted_share(self, model) -> None:
        """The MLM head runs at the predicted tokens only: give the model their share of a sequence
        (mask_prob, capped by max_predictions) so its flops_per_token, and the logged MFU, count what runs."""
        c = self.cfg
        share = c.mask_prob
        if c.max_predictions and c.max_predictions > 0:
            share = min(share, c.max_predictions / self.seq_len)
        model.mlm_fraction = share

    def _id(self, role: str) -> int:
        if role not in self.special_ids:
            raise PlmError(f"masked-LM training needs a '{role}' special token, and the tokenizer has none",
                           f"add tokenizer.special_tokens.{role} (e.g. [{role.upper()}]) to the recipe")
        return self.special_ids[role]

    # ------------------------------------------------------------ data

    def prepare(self, corpus_dir, cache_root=None, num_proc: int = 1) -> Path:
        """The directory `stream` reads: static -> make-mlm-data output (built into the cache), dynamic -> the corpus."""
        corpus_dir = Path(corpus_dir)
        meta = read_meta(corpus_dir) or {}
        c = self.cfg
        if meta.get("format") == MLM_FORMAT:
            if c.dynamic:
                raise PlmError(f"'{corpus_dir}' holds pre-masked make-mlm-data instances, but objective.dynamic is true",
                               "pass the `plm tokenize` directory (or the text) instead, or --set objective.dynamic=false")
            built = int(meta.get("max_seq_len") or 0)
            if built > self.seq_len:
                raise PlmError(f"'{corpus_dir}' holds instances of up to {built} tokens, more than train.seq_len {self.seq_len}",
                               f"--set train.seq_len={built}, or re-run make-mlm-data with --max-seq-len {self.seq_len}")
            return corpus_dir
        if c.dynamic:
            return corpus_dir
        if [float(p) for p in c.replace_probs] != [0.8, 0.1, 0.1]:
            raise PlmError("objective.replace_probs applies to dynamic masking; make-mlm-data uses BERT's 80/10/10",
                           "leave replace_probs at [0.8, 0.1, 0.1], or --set objective.dynamic=true")
        from plmcli.data.corpus import default_cache_dir
        from plmcli.data.mlm_data import make_mlm_data

        settings = dict(max_seq_len=self.seq_len, short_seq_prob=c.short_seq_prob, dupe_factor=c.dupe_factor,
                        mask_prob=c.mask_prob, max_predictions=c.max_predictions, pairs=c.pairs, masking=c.masking,
                        mask_count=c.mask_count)
        if c.packing == "doc_sentences":  # only when set: the other cache keys stay as they were
            settings["packing"] = "doc_sentences"
        # Only the settings a masking uses join in, so changing another one keeps the cached data.
        if c.masking == "span":
            settings |= dict(span_p=c.span_p, span_max=c.span_max)
        if c.masking in ("ngram", "ngram_per_word"):
            settings |= dict(ngram_probs=list(c.ngram_probs))
        if c.masking == "ngram_per_word" and c.ngram_start_prob is not None:
            settings["ngram_start_prob"] = c.ngram_start_prob
        keyed = dict(settings)
        if c.masking == "knowledge" and c.lexicon:
            from plmcli.data.masking import lexicon_key

            settings["lexicon"] = c.lexicon
            keyed["lexicon"] = lexicon_key(c.lexicon)  # by content: an edited lexicon gets new data
        elif c.masking == "knowledge":
            from plmcli.data.knowledge import units_key

            settings["knowledge_units"] = c.knowledge_units
            keyed["knowledge_units"] = units_key(c.knowledge_units)  # the tagger's version and the grammar
        from plmcli.data.store import cache_key

        out = Path(cache_root or default_cache_dir()) / "mlm" / cache_key(meta.get("key"), meta.get("tokenizer", {}).get("hash"), keyed)[:16]
        if read_meta(out, MLM_FORMAT) is None:
            make_mlm_data(corpus_dir, out, num_proc=num_proc, **settings)
        return out

    def corpus_stream(self, data_dir, split, batch_size, seed, rank, world, shuffle):
        if self._static(data_dir):
            return self._static_stream(Path(data_dir), split, batch_size, seed, rank, world, shuffle)
        return self._dynamic_stream(Path(data_dir), split, batch_size, seed, rank, world, shuffle)

    def _static(self, data_dir) -> bool:
        """Whether data_dir holds make-mlm-data instances (else a corpus to mask dynamically)."""
        if read_meta(data_dir, MLM_FORMAT) is not None:
            return True
        if not self.cfg.dynamic:
            raise PlmError(f"'{data_dir}' is not make-mlm-data output and objective.dynamic is false",
                           "run `plm make-mlm-data` on it first, or --set objective.dynamic=true")
        return False

    # A mix (data/mixing.py): each source's instances or rows, collated (and masked) into one batch.

    def samples(self, data_dir, split, seed, shuffle, needed):
        if self._static(data_dir):
            ds = static_split(Path(data_dir), split, needed)
            return len(ds), lambda epochs, idx: ds[list(idx)]
        n, rows, _ = self._dynamic_rows(Path(data_dir), split, seed, shuffle, needed)
        return n, rows

    def collate(self, parts: list) -> dict:
        if isinstance(parts[0], MaskRows):
            return self._mask_rows(parts)
        import pyarrow as pa

        return collate_static(parts[0] if len(parts) == 1 else pa.concat_tables(parts), self.special_ids.get("pad", 0))

    @staticmethod
    def mix_problem(cfg):
        if cfg.dynamic and cfg.packing == "doc_sentences":
            return ("a mix draws every micro-batch's rows by weight, and objective.packing doc_sentences sizes its "
                    "micro-batches by tokens", "--set objective.packing=full_sentences, or drop the weights")
        return None

    def _static_stream(self, data_dir, split, batch_size, seed, rank, world, shuffle):
        ds = static_split(data_dir, split, needed=shuffle)
        if len(ds) < 1:
            return NoBatches()  # a validation split whose documents were too short for any instance
        pad = self.special_ids.get("pad", 0)
        import pyarrow.compute as pc

        # Instances of different lengths (short_seq_prob, DOC-SENTENCES) train in batches of similar
        # length, so padding costs little; an evaluation pass reads in order.
        lengths = pc.list_value_length(ds.data.column("input_ids")).to_numpy(zero_copy_only=False)
        grouped = shuffle and len(lengths) and lengths.min() < lengths.max()
        return BatchStream(len(ds), batch_size, lambda epochs, idx: collate_static(ds[list(idx)], pad),
                           seed, rank, world, shuffle, lengths=lengths if grouped else None)

    def _dynamic_stream(self, data_dir, split, batch_size, seed, rank, world, shuffle):
        # a window split too short is an error for evaluation too; sentence rows evaluate nothing instead
        n, rows, lengths = self._dynamic_rows(data_dir, split, seed, shuffle, shuffle or self.cfg.packing == "window")
        if n < 1:
            return NoBatches()

        def fetch(epochs, indices):
            return self._mask_rows([rows(epochs, indices)])

        if lengths is None:
            return BatchStream(n, batch_size, fetch, seed, rank, world, shuffle)
        if self.cfg.packing == "doc_sentences" and shuffle:
            from plmcli.data.packing import sentence_rows

            full = sentence_rows(data_dir, split, self._id("sep"), self.seq_len - 2, True)[:, 1] + 2
            return TokenBudgetStream(lengths, round(batch_size * float(full.mean())), fetch, seed, rank, world, shuffle)
        grouped = shuffle and lengths.min() < lengths.max()
        return BatchStream(n, batch_size, fetch, seed, rank, world, shuffle, lengths=lengths if grouped else None)

    def _dynamic_rows(self, data_dir, split, seed, shuffle, needed):
        """(rows in the split, rows(epochs, indices) -> MaskRows, each row's length or None: all seq_len)."""
        self._id("cls")
        sep = self._id("sep")
        self._id("mask")  # a tokenizer without one fails here, not at the first batch
        from plmcli.data.corpus import token_stream

        tokens = token_stream(data_dir, split, sep)
        c = self.cfg
        if c.masking == "knowledge":
            starts = knowledge_start_stream(data_dir, split, sep, c.lexicon, c.knowledge_units)
        elif c.masking == "chinese-wwm":
            starts = chinese_word_start_stream(data_dir, split, sep)
        else:
            starts = word_start_stream(data_dir, split, sep) if c.masking != "token" else None
        if c.packing != "window":
            return self._sentence_rows(data_dir, split, tokens, starts, seed, needed)
        n, rows = self._window_rows(tokens, starts, split, seed, shuffle, needed)
        return n, rows, None

    def _window_rows(self, tokens, starts, split, seed, shuffle, needed):
        """(windows in the split, rows(epochs, indices) -> MaskRows): [CLS] window [SEP], realigned each epoch."""
        cls, sep, T = self._id("cls"), self._id("sep"), self.seq_len
        W = T - 2
        shift = shuffle  # a fresh window alignment each epoch, as CausalLM
        n = max((len(tokens) - W) // W if shift else len(tokens) // W, 0) if W >= 1 else 0
        if n < 1 and needed:
            raise PlmError(f"the {split} split has {len(tokens)} tokens, too few for one sequence of {T}",
                           "add text, lower train.seq_len, or lower data.val_fraction")
        vocab = self.vocab_size or int(tokens.max(initial=0)) + 1

        def rows(epochs, indices):
            B = len(indices)
            ids = np.empty((B, T), dtype=np.int64)
            ids[:, 0], ids[:, -1] = cls, sep
            ws = np.ones((B, T), dtype=bool) if starts is not None else None
            for r, (e, i) in enumerate(zip(epochs, indices)):
                off = int(np.random.default_rng((seed, e, _WINDOW_TAG)).integers(W)) if shift else 0
                a = off + i * W
                ids[r, 1:-1] = tokens[a : a + W]
                if ws is not None:
                    ws[r, 1:-1] = starts[a : a + W]
                    ws[r, 1] = True  # a word cut by the window edge starts a word here
            # one generator per sample: the masks do not depend on how samples are batched
            rngs = [np.random.default_rng((seed, e, i, _MASK_TAG)) for e, i in zip(epochs, indices)]
            return MaskRows(ids, ws, rngs, vocab, None)

        return n, rows

    def _sentence_rows(self, data_dir, split, tokens, starts, seed, needed):
        """FULL-SENTENCES / DOC-SENTENCES rows [CLS] s1 s2 ... [SEP] (data/packing.py), padded to the longest
        row of the batch, each masked on its own length by (seed, epoch, row). DOC-SENTENCES trains on
        micro-batches of about the real tokens of batch_size FULL-SENTENCES rows of the same split
        (TokenBudgetStream), as RoBERTa raises its batch size; evaluation reads batch_size rows at a time."""
        from plmcli.data.packing import sentence_rows

        c, T = self.cfg, self.seq_len
        cls, sep, pad = self._id("cls"), self._id("sep"), self._id("pad")
        if T < 3:
            raise PlmError(f"train.seq_len {T} leaves no room for a sentence between [CLS] and [SEP]", "raise train.seq_len")
        rows = sentence_rows(data_dir, split, sep, T - 2, c.packing == "full_sentences")
        if len(rows) < 1 and needed:
            raise PlmError(f"the {split} split has no sentences to pack", "add text, or lower data.val_fraction")
        vocab = self.vocab_size or int(tokens.max(initial=0)) + 1
        lengths = rows[:, 1] + 2

        def fetch(epochs, indices):
            L = lengths[indices]
            ids = np.full((len(indices), int(L.max())), pad, dtype=np.int64)
            ws = np.ones(ids.shape, dtype=bool) if starts is not None else None
            for r, i in enumerate(indices):
                a, n = rows[i]
                ids[r, 0], ids[r, 1 : n + 1], ids[r, n + 1] = cls, tokens[a : a + n], sep
                if ws is not None:
                    ws[r, 1 : n + 1] = starts[a : a + n]
                    ws[r, 1] = True  # the piece after a cut in an over-long sentence starts a word here
            rngs = [np.random.default_rng((seed, e, i, _MASK_TAG)) for e, i in zip(epochs, indices)]
            return MaskRows(ids, ws, rngs, vocab, L)

        return len(rows), fetch, lengths

    def _mask_rows(self, parts: list) -> dict:
        """MaskRows of one or more sources -> one masked batch, rows padded to the longest (each row masked by
        its own generator on its own length: the masks do not depend on the batch a row is in)."""
        if len(parts) == 1:
            p = parts[0]
            return self._masked(p.ids, p.ws, p.rngs, p.vocab, p.lengths)
        width = max(p.ids.shape[1] for p in parts)
        ragged = any(p.lengths is not None or p.ids.shape[1] < width for p in parts)
        widen = lambda a, fill: np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill)  # noqa: E731
        ids = np.concatenate([widen(p.ids, self.special_ids.get("pad", 0)) for p in parts])
        ws = None if parts[0].ws is None else np.concatenate([widen(p.ws, True) for p in parts])
        lengths = np.concatenate([p.lengths if p.lengths is not None else np.full(len(p.ids), p.ids.shape[1])
                                  for p in parts]) if ragged else None
        return self._masked(ids, ws, [r for p in parts for r in p.rngs], max(p.vocab for p in parts), lengths)

    def _masked(self, ids: np.ndarray, ws: np.ndarray | None, rngs, vocab: int, lengths=None) -> dict:
        """(B, T) [CLS] ... [SEP] rows -> the batch `step` reads: row r masked with rngs[r] (a list of
        generators, or one for the whole batch); with `lengths`, row r is its first lengths[r] tokens, the
        rest padding (masked on its own length, so its masks do not depend on the batch it is in)."""
        from plmcli.data.masking import mask_batch

        c, (B, T) = self.cfg, ids.shape
        random_ids = _random_ids(vocab, tuple(sorted(self.special_ids.values())))
        never = np.array(sorted({v for r, v in self.special_ids.items() if r != "unk"}), dtype=np.int64)
        special = np.isin(ids, never)
        rows = [slice(r, r + 1) for r in range(B)] if isinstance(rngs, list) else [slice(0, B)]
        real = np.full(B, T) if lengths is None else np.asarray(lengths)  # each row's length, [CLS]/[SEP] included
        masked, target = ids.copy(), np.zeros((B, T), dtype=bool)
        for rs, rng in zip(rows, rngs if isinstance(rngs, list) else [rngs]):
            r = (rs, slice(0, int(lengths[rs.start])) if lengths is not None else slice(None))
            masked[r], target[r] = mask_batch(
                ids[r], special[r], None if ws is None else ws[r], rng, mask_prob=c.mask_prob,
                max_predictions=c.max_predictions, strategy=STRATEGY.get(c.masking, c.masking),
                mask_id=self._id("mask"), vocab_size=vocab,
                replace_probs=tuple(c.replace_probs), random_ids=random_ids, span_p=c.span_p, span_max=c.span_max,
                ngram_probs=tuple(c.ngram_probs), ngram_start_prob=c.ngram_start_prob,
                counted=counted_lengths(c.mask_count, real[rs]))
        positions = np.flatnonzero(target)  # row-major: b·T + t
        batch = {"input_ids": torch.from_numpy(masked), "mlm_positions": torch.from_numpy(positions),
                 "mlm_labels": torch.from_numpy(ids.reshape(-1)[positions]), "num_tokens": B * T}
        if lengths is not None:
            batch["num_tokens"] = int(np.sum(lengths))
            if np.min(lengths) < T:
                batch["attention_mask"] = torch.from_numpy((np.arange(T) < np.asarray(lengths)[:, None]).astype(np.int64))
                batch["lengths"] = np.asarray(lengths).tolist()  # for step's row_lengths: host ints, not a tensor
        return batch

    # ------------------------------------------------------------ plm pretrain --streaming (data/streaming.py)

    @staticmethod
    def streaming_problem(c: MLMConfig):
        """(message, fix) when `c` cannot train on streamed token windows, which have no word boundaries:
        dynamic token masking (RoBERTa) can."""
        if not c.dynamic:
            return ("--streaming masks each batch as it reads (dynamic masking), and objective.dynamic is false",
                    "--set objective.dynamic=true --set objective.pairs=none (RoBERTa), or drop --streaming")
        if c.masking != "token":
            return (f"--streaming reads token windows without word boundaries, so objective.masking {c.masking} "
                    "cannot find whole words", "--set objective.masking=token, or drop --streaming")
        return None

    def window_size(self) -> int:
        return self.seq_len - 2  # [CLS] window [SEP]

    def stream_packing(self) -> str:
        """How streamed rows are cut (data/streaming.py PacksSentences): objective.packing."""
        return self.cfg.packing

    def window_batch(self, x: torch.Tensor, key, seed: int = 0, lengths=None) -> dict:
        """(B, T-2) token windows -> [CLS] window [SEP], masked afresh; `key` (the stream's position) with
        `seed` picks the masks, so a resumed run masks its batches as the uninterrupted one did. With
        `lengths`, x holds sentence rows (padded): [CLS] row [SEP] padding, each row masked by (key, row)."""
        if lengths is not None:
            L = np.asarray(lengths, dtype=np.int64) + 2
            ids = np.full((len(L), int(L.max())), self._id("pad"), dtype=np.int64)
            for r, n in enumerate(lengths):
                ids[r, 0], ids[r, 1 : n + 1], ids[r, n + 1] = self._id("cls"), x[r, :n].numpy(), self._id("sep")
            rngs = row_generators([seed, _MASK_TAG, *key], len(L))
            return self._masked(ids, None, rngs, self.vocab_size or int(ids.max()) + 1, L)
        ids = np.empty((x.shape[0], self.seq_len), dtype=np.int64)
        ids[:, 0], ids[:, 1:-1], ids[:, -1] = self._id("cls"), x.numpy(), self._id("sep")
        rng = np.random.default_rng([seed, _MASK_TAG, *key])
        return self._masked(ids, None, rng, self.vocab_size or int(ids.max()) + 1)

    # ------------------------------------------------------------ loss

    def loss_counts(self, batch):
        nsp = batch.get("nsp_labels")
        return {"mlm": torch.tensor(batch["mlm_labels"].numel()),  # masked tokens
                "nsp": (nsp >= 0).sum() if nsp is not None else torch.tensor(0)}  # labelled pairs

    def step(self, model, batch, state=None):
        labels = batch["mlm_labels"]  # (N,)
        n = labels.numel()
        # With masked tokens the model fuses its decoder with the loss (the (N, V) logits are never kept);
        # a batch without any keeps the head in the graph at zero loss, so DDP finds every parameter used.
        with row_lengths(batch.get("attention_mask"), batch.get("lengths")):  # the encoder reads no lengths back
            out = model(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"),
                        batch["mlm_positions"], mlm_labels=labels if n else None)
        mlm = out.mlm_loss.float() if n else out.mlm_logits.float().sum() * 0.0
        count = labels.new_full((), n)  # filled on the device, not copied from the host
        parts, metrics = {"mlm": mlm}, {"mlm_loss": mlm.detach() * count}
        nsp_labels = batch.get("nsp_labels")
        if out.nsp_logits is not None and nsp_labels is not None:
            nsp_logits = out.nsp_logits.float()  # (B, 2)
            nsp, acc = sentence_loss(nsp_logits, nsp_labels)
            parts["nsp"] = self.cfg.nsp_weight * nsp
            metrics |= {"nsp_loss": nsp.detach() * count, "nsp_acc": acc.detach() * count}
        elif out.nsp_logits is not None:
            # No pair labels (pairs: none): keep the NSP head in the graph so DDP finds every parameter used.
            parts["mlm"] = parts["mlm"] + 0.0 * out.nsp_logits.sum()
        sbo_logits = out.sbo_logits if isinstance(out, SpanBertOutput) else None  # (M, V) at the targets the model predicts from span boundaries
        if sbo_logits is not None:
            sbo = span_boundary_loss(sbo_logits, labels.index_select(0, out.sbo_index), count, out.sbo_keep)
            parts["mlm"] = parts["mlm"] + self.cfg.sbo_weight * sbo
            metrics["sbo_loss"] = sbo.detach() * count
        loss = sum(parts.values())
        metrics["loss"] = loss.detach() * count
        return StepOutput(loss, metrics, count, parts=parts)

    def tokens_in(self, batch):
        return int(batch.get("num_tokens", batch["input_ids"].numel()))


# ---------------------------------------------------------------- helpers


class MaskRows(NamedTuple):
    """Dynamic masking's rows of one source before masking: (B, W) [CLS] ... [SEP] ids, their word starts (or
    None), one generator per row, the vocabulary the random replacements draw from, each row's length (or None:
    all W)."""

    ids: np.ndarray
    ws: np.ndarray | None
    rngs: list
    vocab: int
    lengths: np.ndarray | None


def static_split(data_dir: Path, split: str, needed: bool):
    """A make-mlm-data split (Arrow format); `needed`: no instance is an error."""
    from datasets import load_from_disk

    ds = load_from_disk(str(Path(data_dir) / "dataset" / split)).with_format("arrow")
    if len(ds) < 1 and needed:
        raise PlmError(f"the {split} split of '{data_dir}' has no instances", "use more text, or lower data.val_fraction")
    return ds


def sentence_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean CE, accuracy) over the rows whose label is ≥ 0 (this task's instances); both 0 when there are
    none, with the head still in the graph. No host sync: the mean divides by the count on the device."""
    valid = labels >= 0
    k = valid.sum().clamp(min=1)
    ce = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
    acc = ((logits.argmax(-1) == labels) & valid).sum() / k
    return (ce * valid).sum() / k, acc


def span_boundary_loss(logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor,
                       keep: torch.Tensor | None = None) -> torch.Tensor:
    """SpanBERT's SBO loss per masked token: its cross-entropies summed over the span targets it predicts
    ((M, V) logits, (M,) labels; `keep` (M,): only the rows it marks, SpanBertOutput.sbo_keep), over the `masked`
    count, as SpanBERT's criterion sums the SBO and MLM losses of a batch and divides both by its masked tokens."""
    if keep is None:
        return F.cross_entropy(logits.float(), labels, reduction="sum") / masked.clamp(min=1)
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    return torch.where(keep, ce, 0.0).sum() / masked.clamp(min=1)


@functools.lru_cache(maxsize=8)
def _random_ids(vocab: int, special: tuple[int, ...]) -> np.ndarray:
    """The ids a 10% "random token" replacement draws from: the vocabulary without the special tokens (kept: a
    set difference over the vocabulary cost a large-vocabulary batch more than its masking)."""
    out = np.setdiff1d(np.arange(vocab), special)
    out.flags.writeable = False
    return out


def _padded(col, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrow list column -> ((B, T_max) int64 right-padded with `pad`, (B,) lengths)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    out = np.full((len(lengths), int(lengths.max(initial=0))), pad, dtype=np.int64)
    out[np.arange(out.shape[1]) < lengths[:, None]] = values
    return out, lengths


def collate_static(tbl, pad: int) -> dict:
    """make-mlm-data rows (an Arrow table) -> a padded batch with flat MLM positions.

    attention_mask / token_type_ids are left out when they carry nothing (no padding / one segment),
    so the model takes its unmasked fast path.
    """
    import pyarrow.compute as pc

    ids, lengths = _padded(tbl["input_ids"], pad)
    B, T = ids.shape
    batch = {"input_ids": torch.from_numpy(ids), "num_tokens": int(lengths.sum())}
    if "token_type_ids" in tbl.column_names:
        types, _ = _padded(tbl["token_type_ids"], 0)
        if types.any():
            batch["token_type_ids"] = torch.from_numpy(types)
    if lengths.min(initial=T) < T:
        batch["attention_mask"] = torch.from_numpy((np.arange(T) < lengths[:, None]).astype(np.int64))
        batch["lengths"] = lengths.tolist()  # for step's row_lengths: ints stay on the host, a tensor would not
    per_row = pc.list_value_length(tbl["masked_lm_positions"]).to_numpy(zero_copy_only=False).astype(np.int64)
    pos = pc.list_flatten(tbl["masked_lm_positions"]).to_numpy(zero_copy_only=False).astype(np.int64)
    batch["mlm_positions"] = torch.from_numpy(np.repeat(np.arange(B, dtype=np.int64) * T, per_row) + pos)
    batch["mlm_labels"] = torch.from_numpy(pc.list_flatten(tbl["masked_lm_labels"]).to_numpy(zero_copy_only=False).astype(np.int64))
    if "next_sentence_label" in tbl.column_names:
        nsp = tbl["next_sentence_label"].to_numpy().astype(np.int64)
        if (nsp >= 0).any():
            batch["nsp_labels"] = torch.from_numpy(nsp)
    return batch
