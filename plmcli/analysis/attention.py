"""`plm attention`: what each head looks at (Clark et al. 2019, "What Does BERT Look At?").

Per layer × head, averaged over the query positions that are real tokens (token-weighted over a
whole --corpus; padding is neither a query nor a key):
    entropy   −Σ_j α_ij ln α_ij in nats (§3.3: broad vs focused heads)
    next      α_i,i+1 (queries with a next token)           previous  α_i,i−1 (queries with one before)
    cls       Σ α_ij over [CLS] keys                         sep       Σ α_ij over [SEP] keys
    self      α_ii
    same_token, same_token_other, punct, breadth: attention to other occurrences of the token (anywhere /
              in the other sentence), to punctuation, and entropy against uniform attention's; defined in
              analysis/attention_stats.py, where all of them are computed
Encoders read [CLS] a [SEP] (b [SEP]) with segment ids, exactly as `plm finetune` encodes them. A causal
LM reads the plain tokens of the text; its [CLS] column is the first token (where causal LMs' heads
often park attention), its [SEP] column the bos/eos tokens in the text (n/a when the tokenizer has neither),
and `next` and `same_token_other` are n/a: causal attention cannot see the next token, and one text has
no other sentence. Row i of a causal head spreads over i + 1 keys only, so its entropy is at most
ln(i + 1): early rows pull a causal head's entropy down (breadth divides by the same bound).
Layers and heads are numbered from 1, as in the paper.

The probabilities come from models.layers.record_attention, so every family that declares the RecordsAttention
protocol (its self-attention a layers.MultiHeadAttention: BERT, RoBERTa, ALBERT, ELECTRA's discriminator, SpanBERT,
NEZHA, GPT) is covered without code of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from plmcli.analysis.attention_report import PATTERNS_PNG, tick_label, write_outputs
from plmcli.analysis.attention_stats import (BROAD, PATTERNS, PatternSums, broad_heads, punctuation_ids, summarize,
                                             word_classes)
from plmcli.data.pairs import encode_framed, encoder_frame
from plmcli.config_schema import Range, check_option
from plmcli.errors import PlmError
from plmcli.models.base import Encodes, HasHidden, RecordsAttention, uses_token_types

FORMAT = "plm-attention"


# ------------------------------------------------------------------ which runs


def _kind(model_cls) -> str | None:
    """How a model whose attention plm records is fed: "encoder" (encode(ids, types, mask)), "causal" (hidden(ids)),
    or None: it declares no RecordsAttention, or has neither primitive."""
    if not issubclass(model_cls, RecordsAttention):
        return None
    if model_cls.traits.bidirectional and issubclass(model_cls, Encodes):
        return "encoder"
    if model_cls.traits.causal and issubclass(model_cls, HasHidden):
        return "causal"
    return None


def attention_families() -> list[str]:
    """The model families `attention` works on: those declaring RecordsAttention that it can feed."""
    from plmcli.models.registry import families_that

    return families_that(lambda c: _kind(c) is not None)


# ------------------------------------------------------------------ inputs


@dataclass
class Encoded:
    ids: list[list[int]]
    """Each example's tokens as the model reads them."""
    type_start: list[int]
    """Where segment 1 starts in each row (= its length without a second segment)."""
    truncated: int
    """Examples cut to max_seq_len."""
    words: list[tuple[list[int], list[int]]] | None = None
    """Per row, each token's word class and word occurrence (attention_stats.word_classes), −1 on [CLS]/[SEP]."""


def read_corpus(path: str, max_lines: int | None) -> list[tuple[str, str | None]]:
    """Non-blank lines of `path`; a tab splits a line into a sentence pair (a, b)."""
    from plmcli.data.text import iter_text_lines

    examples = []
    for line in iter_text_lines([path]):
        if not line.strip():
            continue
        a, tab, b = line.rstrip("\r\n").partition("\t")
        examples.append((a, b if tab else None))
        if max_lines and len(examples) >= max_lines:
            break
    if not examples:
        raise PlmError(f"--corpus {path} has no non-blank lines", "pass a text file, one sentence (or tab-separated pair) per line")
    return examples


def encode_examples(tok, special_ids: dict, examples, kind: str, max_seq_len: int, layout: str = "cls_first") -> Encoded:
    """Encoders: finetuning's rows ([CLS] a [SEP] (b [SEP]) in the encoder's layout); causal LMs: the plain tokens."""
    rows, starts, truncated = [None] * len(examples), [0] * len(examples), 0
    if kind == "causal":
        texts = [a if b is None else f"{a}\t{b}" for a, b in examples]
        enc = tok.encode_batch(texts, add_special_tokens=False)
        for i, e in enumerate(enc):
            rows[i] = e.ids[:max_seq_len]
            starts[i] = len(rows[i])
            truncated += len(e.ids) > max_seq_len
        words = [(c[:len(r)], o[:len(r)]) for r, (c, o) in zip(rows, word_classes(tok, texts, {}))]
        return Encoded(rows, starts, truncated, words)
    frame = encoder_frame(layout, special_ids["cls"], special_ids["sep"])
    for paired in (False, True):  # encode_framed takes all singles or all pairs
        idx = [i for i, (_, b) in enumerate(examples) if (b is not None) == paired]
        if not idx:
            continue
        a = [examples[i][0] for i in idx]
        b = [examples[i][1] for i in idx] if paired else None
        enc = encode_framed(tok, frame, a, b, max_seq_len)
        off = enc["offsets"]
        for k, i in enumerate(idx):
            rows[i] = enc["ids"][off[k]:off[k + 1]].tolist()
            starts[i] = int(enc["type_start"][k])
        truncated += int(enc["truncated"].sum())
    return Encoded(rows, starts, truncated, _framed_words(tok, examples, rows, starts) if layout == "cls_first" else None)


def _framed_words(tok, examples, rows: list[list[int]], starts: list[int]) -> list[tuple[list[int], list[int]]]:
    """Word class and occurrence per token of [CLS] a [SEP] (b [SEP]) rows, −1 on the frame's tokens; a and b
    cut as encode_framed cut them, b's words numbered after a's."""
    classes: dict[str, int] = {}
    a_words = word_classes(tok, [a for a, _ in examples], classes)
    paired = [i for i, (_, b) in enumerate(examples) if b is not None]
    b_words = dict(zip(paired, word_classes(tok, [examples[i][1] for i in paired], classes)))
    out = []
    for i, row in enumerate(rows):
        na = (starts[i] if i in b_words else len(row)) - 2
        cls, occ = [-1, *a_words[i][0][:na], -1], [-1, *a_words[i][1][:na], -1]
        if i in b_words:
            nb, shift = len(row) - starts[i] - 1, len(a_words[i][1])  # a has no more words than tokens
            cls += [*b_words[i][0][:nb], -1]
            occ += [*(o + shift if o >= 0 else -1 for o in b_words[i][1][:nb]), -1]
        out.append((cls, occ))
    return out


def _word_batch(enc: Encoded, order: list[int], device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Right-padded (B, T) word classes and occurrences of the rows in `order` (−1 on padding)."""
    if enc.words is None:
        return None
    T = max(len(enc.ids[i]) for i in order)
    classes, occurrence = torch.full((len(order), T), -1, dtype=torch.long), torch.full((len(order), T), -1, dtype=torch.long)
    for r, i in enumerate(order):
        c, o = enc.words[i]
        classes[r, :len(c)], occurrence[r, :len(o)] = torch.tensor(c, dtype=torch.long), torch.tensor(o, dtype=torch.long)
    return classes.to(device), occurrence.to(device)


def _batch(enc: Encoded, order: list[int], pad: int, device):
    """Right-padded (B, T) ids, segment ids and a 1/0 mask of the rows in `order`."""
    T = max(len(enc.ids[i]) for i in order)
    ids = torch.full((len(order), T), pad, dtype=torch.long)
    for r, i in enumerate(order):
        ids[r, :len(enc.ids[i])] = torch.tensor(enc.ids[i])
    lengths = torch.tensor([len(enc.ids[i]) for i in order])
    pos = torch.arange(T)
    mask = pos[None, :] < lengths[:, None]
    types = mask & (pos[None, :] >= torch.tensor([enc.type_start[i] for i in order])[:, None])
    return ids.to(device), types.long().to(device), mask.long().to(device)


# ------------------------------------------------------------------ the command


def attention(run: str | None, text: str | None = None, text_pair: str | None = None, corpus: str | None = None,
              out: str | None = None, max_seq_len: int | None = None, batch_size: int = 16,
              max_lines: int | None = None) -> dict:
    """Attention heatmaps (OUT/layer_{i}.png, of `text`, else the corpus' first line), the patterns per
    head over `text` or every line of `corpus` (OUT/attention.tsv, OUT/attention.json) and a layer × head
    heatmap per pattern (OUT/patterns.png, a panel each)."""
    from plmcli.data.store import build_atomically
    from plmcli.data.tokenizers import load_tokenizer
    from plmcli.runs import load_encoder

    _check_options(text, text_pair, corpus, out, batch_size, max_lines, max_seq_len)
    path, cfg, kind, layout = _open_run(run, text_pair)
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    examples = read_corpus(corpus, max_lines) if corpus else [(text, text_pair)]
    if kind == "causal":  # a tab read from a corpus line is part of the text
        examples = [(a if b is None else f"{a}\t{b}", None) for a, b in examples]
    shown = (text, text_pair) if text is not None else examples[0]

    tok = load_tokenizer(path / "tokenizer.json")
    model = load_encoder(path, cfg).eval()
    L = model.max_positions if max_seq_len is None else max_seq_len  # 0 is a value (refused below), not the default
    if not 4 <= L <= model.max_positions:
        raise PlmError(f"--max-seq-len {L} is outside 4..{model.max_positions} (the model's positions)",
                       f"use --max-seq-len ≤ {model.max_positions}")
    enc = encode_examples(tok, special_ids, examples, kind, L, layout)
    if any(not r for r in enc.ids):
        raise PlmError("a text encodes to no tokens", "pass text the run's tokenizer can read")
    one = encode_examples(tok, special_ids, [shown], kind, L, layout) if corpus else enc  # the heatmaps' text
    punct = punctuation_ids(tok, {i for r in enc.ids for i in r}, special_ids.values())
    runner = Recorder(model, kind, special_ids, punct)
    sums = PatternSums()
    by_length = sorted(range(len(enc.ids)), key=lambda i: -len(enc.ids[i]))  # little padding per batch
    for lo in range(0, len(by_length), batch_size):
        runner.add_to(sums, enc, by_length[lo:lo + batch_size])
    shown_maps = runner(one, [0])[-1]
    result = {"format": FORMAT, "run": str(path), "family": cfg["family"], "causal": kind == "causal",
              "text": shown[0], "text_pair": shown[1], "corpus": str(Path(corpus).resolve()) if corpus else None,
              "examples": len(enc.ids), "query_tokens": int(sum(len(r) for r in enc.ids)), "truncated": enc.truncated,
              "max_seq_len": L, "n_layer": len(shown_maps), "n_head": int(shown_maps[0].shape[1]),
              "targets": _targets(tok, runner, special_ids),
              "punctuation": [tok.decode([i], skip_special_tokens=False).strip() for i in punct],
              **_statistics(sums), "tokens": [tick_label(tok.id_to_token(i)) for i in one.ids[0]]}
    result["figures"] = [f"layer_{i + 1}.png" for i in range(len(shown_maps))] + [PATTERNS_PNG]
    build_atomically(Path(out), "", _read_meta, lambda tmp: write_outputs(tmp, result, shown_maps), "plm attention",
                     force=True)
    return {**result, "out_dir": str(out)}


def _targets(tok, runner: Recorder, special_ids: dict) -> dict:
    """What the cls and sep patterns count, in words: the tokens, or a causal LM's stand-ins for them."""
    if runner.causal:
        return {"cls": "first token", "sep": "/".join(dict.fromkeys(tok.id_to_token(i) for i in runner.boundary)) or "bos/eos"}
    return {"cls": tok.id_to_token(special_ids["cls"]), "sep": tok.id_to_token(special_ids["sep"])}


def _statistics(sums: PatternSums) -> dict:
    rows = sums.rows()
    return {"heads": rows, "summary": summarize(rows), "uniform_entropy": sums.uniform_entropy(), "broad": BROAD,
            "broad_heads": broad_heads(rows), "queries": {p: int(sums.counts.get(p, 0)) for p in PATTERNS[:-1]}}


def _check_options(text, text_pair, corpus, out, batch_size, max_lines, max_seq_len) -> None:
    if not out:
        raise PlmError("no output directory given", "pass --out DIR (it receives layer_{i}.png, attention.tsv, attention.json)")
    if text is not None and not text.strip():
        raise PlmError("the text is empty", 'pass the text to look at, e.g. plm attention RUN "the cat sat on the mat" --out att/')
    if text is None and corpus is None:
        raise PlmError("no text given", "pass a TEXT argument, or --corpus FILE (one sentence or tab-separated pair per line)")
    if text_pair is not None and (text is None or not text_pair.strip()):
        raise PlmError("--text-pair needs a non-empty second text and a first TEXT",
                       'e.g. plm attention RUN "a question" --text-pair "its answer" --out att/')
    # before the run is loaded: its positions bound --max-seq-len from above only
    for flag, value, least, example in (("--batch-size", batch_size, 1, 16), ("--max-lines", max_lines, 1, 500),
                                        ("--max-seq-len", max_seq_len, 4, 128)):
        check_option(flag, value, Range(least), f"e.g. {flag} {example}, or leave it out")
    out_dir = Path(out)  # checked now, not after the model has run (build_atomically checks again)
    if out_dir.exists() and not (out_dir.is_dir() and (not any(out_dir.iterdir()) or _read_meta(out_dir))):
        raise PlmError(f"'{out_dir}' exists and is not a `plm attention` output", "choose another --out directory (plm will not overwrite it)")


def _open_run(run: str | None, text_pair: str | None):
    """(run dir, its config.json, "encoder" | "causal", [CLS] layout), or PlmError for a run we cannot read."""
    from plmcli.models.registry import model_class
    from plmcli.runs import resolve_run, run_config

    path = resolve_run(run, "plm attention RUN")
    cfg = run_config(path)
    family, label = cfg["family"], run or f"runs/latest ({path.resolve().name})"
    cls = model_class(family)
    kind = _kind(cls)
    if kind is None:
        raise PlmError(f"run {label} is {family}, whose attention plm cannot record",
                       f"use a run of a family built on plm's self-attention layers: {', '.join(attention_families())}")
    special_ids = cfg.get("tokenizer", {}).get("special_token_ids", {})
    if kind == "causal" and text_pair is not None:
        raise PlmError(f"--text-pair: run {label} is a causal LM ({family}), which reads one plain text",
                       "join the two texts into TEXT, or use an encoder run for sentence pairs")
    if kind == "encoder" and not {"cls", "sep"} <= set(special_ids):
        raise PlmError(f"run {label}'s tokenizer has no cls / sep token to build [CLS] a [SEP] inputs from",
                       "use an encoder run whose tokenizer defines the cls and sep roles (bert recipes do)")
    return path, cfg, kind, cls.traits.pair_layout or "cls_first"


def _read_meta(d: Path) -> dict | None:
    """attention.json of an earlier `plm attention` output in `d`, else None."""
    try:
        meta = json.loads((d / "attention.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


class Recorder:
    """Runs batches of encoded rows through the model and hands back every layer's attention."""

    def __init__(self, model, kind: str, special_ids: dict, punct: list[int] = ()):
        self.model, self.causal, self.special_ids = model, kind == "causal", special_ids
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model.to(self.device)
        # One segment embedding (RoBERTa) or none: as the task heads, no segment ids then.
        self.use_types = uses_token_types(model)
        self.pad = special_ids.get("pad", 0)
        self.boundary = [special_ids[r] for r in ("bos", "eos") if r in special_ids]
        self.special = torch.tensor(sorted(set(special_ids.values())), dtype=torch.long, device=self.device)
        self.punct = torch.tensor(list(punct), dtype=torch.long, device=self.device)

    def __call__(self, enc: Encoded, order: list[int]):
        """(ids (B, T), segment ids (B, T), real-token mask (B, T), per layer (B, H, T, T) probabilities)
        of rows `order`."""
        from plmcli.models.layers import record_attention

        ids, types, mask = _batch(enc, order, self.pad, self.device)
        with torch.no_grad(), record_attention() as maps:
            if self.causal:  # right padding: a causal row never sees the pads after it
                self.model.hidden(ids)
            else:
                self.model.encode(ids, types if self.use_types else None, mask)
        return ids, types, mask.bool(), [m.float() for m in maps]

    def add_to(self, sums: PatternSums, enc: Encoded, order: list[int]) -> None:
        ids, types, real, maps = self(enc, order)
        if self.causal:
            cls_keys = torch.zeros_like(real)
            cls_keys[:, 0] = True
            sep_keys = torch.isin(ids, torch.tensor(self.boundary, device=ids.device)) & real if self.boundary else None
        else:
            cls_keys = (ids == self.special_ids["cls"]) & real
            sep_keys = (ids == self.special_ids["sep"]) & real
        # segments, also of a model without segment embeddings: "the other sentence" is a fact of the input
        sums.add(maps, real, cls_keys, sep_keys, self.causal, ids=ids, special=torch.isin(ids, self.special),
                 segments=None if self.causal else types, words=_word_batch(enc, order, self.device),
                 punct_keys=torch.isin(ids, self.punct) & real)
