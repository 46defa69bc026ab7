"""Span-extraction question answering on an encoder (Devlin et al. 2018, §4.2; BERT's run_squad.py).

Input: [CLS] question [SEP] passage [SEP] (XLNet's `pair_layout = "cls_last"`: question [SEP] passage
[SEP] [CLS]), the question cut to --max-query-len tokens. A passage longer than the room left is read
through several windows whose starts lie --doc-stride tokens apart (run_squad's doc spans: the last
window ends at the passage's end). The tokenizer's character offsets map answers to token spans and
back, so the answer text is always a substring of the passage as written.

Model: encoder hidden states -> Linear(d_model, 2) -> start and end logits per token (`SpanExtractor`).
Loss: (CE(start) + CE(end)) / 2 per window; a window that does not hold the whole answer is trained
to point both at [CLS], as BERT does.

Decoding (run_squad's write_predictions): in each window the --n-best highest start and end logits
are paired; a pair counts when both ends are passage tokens, start ≤ end, the span is at most
--max-answer-len tokens and its start token has its *maximum context* in this window (of the windows
holding a token, the one where it sits farthest from an edge — so an answer in the overlap of two
windows is read where it is best surrounded). The best start + end logit over all windows of a
question wins; with no valid pair anywhere the answer is "". The winning span is widened to the whole
words it touches (`whole_words`: BERT's BasicTokenizer units, so punctuation and CJK characters are words
of their own), so an answer never ends inside a word.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Probability, Size
from plmcli.data.batching import BatchStream
from plmcli.data.pairs import encoder_frame
from plmcli.data.tasks import load_split, require_roles, save_split
from plmcli.errors import PlmError
from plmcli.models.device import row_lengths
from plmcli.objectives.base import StepOutput
from plmcli.objectives.heads import TaskHead, encoder_problem
from plmcli.objectives.task import TaskObjective

NEG = -1e9
"""Logit of padding positions: never a start or an end, and exp() is exactly 0 in fp32."""


@dataclass
class SpanQAConfig:
    task: str = "squad"
    """The task (plmcli.data.tasks.registry) whose data, windows and metrics this serves."""
    num_labels: Size = 2
    """Start and end: two scores per token."""
    classifier_dropout: Optional[Probability] = None
    """Dropout on the hidden states before the span head; None = none (BERT's run_squad has none)."""


class SpanExtractor(TaskHead):
    """encoder -> hidden states (B, T, C) -> Linear -> (B, T, 2) start / end logits; padding gets NEG.
    No dropout unless the task sets one (BERT's run_squad has none)."""

    per_token = True
    default_dropout = 0.0

    def __init__(self, encoder: nn.Module, dropout: float | None = None):
        super().__init__(encoder, 2, dropout)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        hidden, _ = self.encoded(input_ids, token_type_ids, attention_mask)  # (B, T, C)
        logits = self.output(hidden).float()  # (B, T, 2)
        if attention_mask is not None:
            logits = logits.masked_fill(attention_mask[..., None] == 0, NEG)
        return logits


# ------------------------------------------------------------------ windows


def window_spans(n: int, budget: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `n` passage tokens with room for `budget` of them per window:
    starts `stride` apart (never more than a window, so no token is skipped); the last one ends at n.
    An empty passage still gets one (empty) window, so every question is answered."""
    spans, start = [], 0
    while True:
        length = min(n - start, budget)
        spans.append((start, length))
        if start + length >= n:
            return spans
        start += min(length, stride)


def max_context_window(spans: list[tuple[int, int]], n: int) -> np.ndarray:
    """For each of `n` passage tokens, the window where it has the most context: the largest
    min(tokens left of it, tokens right of it) + 0.01 × window length (run_squad's
    _check_is_max_context; ties go to the earlier window)."""
    score = np.full((len(spans), n), -np.inf)
    for w, (start, length) in enumerate(spans):
        j = np.arange(length)
        score[w, start:start + length] = np.minimum(j, length - 1 - j) + 0.01 * length
    return score.argmax(0) if n else np.zeros(0, dtype=np.int64)


def answer_tokens(offsets: np.ndarray, span: tuple[int, int] | None) -> tuple[int, int] | None:
    """First and last token (rows of `offsets`, (n, 2) character [start, end)) overlapping the
    character span; None when no token covers it (whitespace the tokenizer dropped)."""
    if span is None or len(offsets) == 0:
        return None
    hit = np.nonzero((offsets[:, 0] < span[1]) & (offsets[:, 1] > span[0]))[0]
    return (int(hit[0]), int(hit[-1])) if len(hit) else None


def make_windows(questions: Sequence[Sequence[int]], contexts: Sequence[Sequence[int]],
                 context_offsets: Sequence[np.ndarray], context_of: Sequence[int],
                 answers: Sequence[tuple[int, int] | None], cls: int, sep: int, max_seq_len: int,
                 doc_stride: int, layout: str = "cls_first") -> dict[str, np.ndarray]:
    """Every question's windows as flat arrays (the rows of all windows back to back).

    questions: token ids (already cut to --max-query-len); contexts: each passage's token ids and
    (n, 2) character offsets; context_of: the passage of each question; answers: each question's
    answer as (first, last) passage token, or None.

    Per window: `offsets` (W + 1 row bounds), `type_start` (first token of segment 1: the passage),
    `start_positions` / `end_positions` (the answer's tokens in the row, or [CLS]'s position),
    `question`. Per token: `ids`, `char_start` / `char_end` (the passage characters a token covers;
    -1 outside the passage) and `max_context` (the token's best window is this one).
    """
    frame = encoder_frame(layout, cls, sep)
    before, middle, after = (np.array(part, dtype=np.int32) for part in (frame.before, frame.middle, frame.after))
    rows: dict[str, list] = {k: [] for k in ("ids", "char_start", "char_end", "max_context")}
    lengths, type_start, starts, ends, question = [], [], [], [], []
    for i, q in enumerate(questions):
        c = context_of[i]
        doc, off = np.asarray(contexts[c], dtype=np.int32), np.asarray(context_offsets[c], dtype=np.int32).reshape(-1, 2)
        q = np.asarray(q, dtype=np.int32)
        spans = window_spans(len(doc), max_seq_len - len(q) - frame.extra, doc_stride)
        best = max_context_window(spans, len(doc))
        ans = answers[i]
        p0 = frame.second_start(len(q))  # first passage token in a row
        for w, (st, ln) in enumerate(spans):
            row = np.concatenate((before, q, middle, doc[st:st + ln], after))  # frame.pair, in numpy
            cls_pos = frame.cls_position(len(row))
            cs, ce = np.full(len(row), -1, dtype=np.int32), np.full(len(row), -1, dtype=np.int32)
            cs[p0:p0 + ln], ce[p0:p0 + ln] = off[st:st + ln, 0], off[st:st + ln, 1]
            mc = np.zeros(len(row), dtype=bool)
            mc[p0:p0 + ln] = best[st:st + ln] == w
            inside = ans is not None and st <= ans[0] and ans[1] < st + ln
            starts.append(p0 + ans[0] - st if inside else cls_pos)
            ends.append(p0 + ans[1] - st if inside else cls_pos)
            for k, v in zip(("ids", "char_start", "char_end", "max_context"), (row, cs, ce, mc)):
                rows[k].append(v)
            lengths.append(len(row))
            type_start.append(p0)
            question.append(i)
    cat = {k: np.concatenate(v) if v else np.zeros(0, dtype=bool if k == "max_context" else np.int32)
           for k, v in rows.items()}
    return {**cat, "offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
            "type_start": np.array(type_start, dtype=np.int64), "start_positions": np.array(starts, dtype=np.int64),
            "end_positions": np.array(ends, dtype=np.int64), "question": np.array(question, dtype=np.int64)}


def padded(flat: np.ndarray, offsets: np.ndarray, width: int, fill) -> np.ndarray:
    """Rows of a flat per-token array as a (W, width) matrix, `fill` after each row's end."""
    lens = offsets[1:] - offsets[:-1]
    out = np.full((len(lens), width), fill, dtype=flat.dtype)
    mask = np.arange(width)[None, :] < lens[:, None]
    out[mask] = flat
    return out


# ------------------------------------------------------------------ decoding


def best_spans(logits: np.ndarray, char_start: np.ndarray, char_end: np.ndarray, max_context: np.ndarray,
               question: np.ndarray, n_questions: int, n_best: int, max_answer_len: int) -> list[tuple[int, int] | None]:
    """The answer of each question as passage characters [start, end), or None when no window has a
    valid span. logits (W, T, 2) start / end; char_start, char_end, max_context (W, T) as make_windows
    writes them (padded); question (W,) the question of each window."""
    W, T = char_start.shape
    if W == 0:
        return [None] * n_questions
    k = min(n_best, T)
    # The n-best starts and ends of each window (stable: ties keep the earlier position), all pairs.
    s_idx = np.argsort(-logits[..., 0], axis=1, kind="stable")[:, :k]  # (W, k)
    e_idx = np.argsort(-logits[..., 1], axis=1, kind="stable")[:, :k]
    rows = np.arange(W)[:, None]
    s_ok = (char_start[rows, s_idx] >= 0) & max_context[rows, s_idx]  # passage token, best context here
    e_ok = char_start[rows, e_idx] >= 0
    length = e_idx[:, None, :] - s_idx[:, :, None] + 1  # (W, k, k)
    valid = s_ok[:, :, None] & e_ok[:, None, :] & (length >= 1) & (length <= max_answer_len)
    score = logits[rows, s_idx, 0][:, :, None] + logits[rows, e_idx, 1][:, None, :]
    score = np.where(valid, score, -np.inf).reshape(W, -1)
    pick = score.argmax(1)
    win_score = score[np.arange(W), pick]
    s_tok, e_tok = s_idx[np.arange(W), pick // k], e_idx[np.arange(W), pick % k]
    out: list[tuple[int, int] | None] = [None] * n_questions
    best = np.full(n_questions, -np.inf)
    for w in np.nonzero(np.isfinite(win_score))[0]:  # the best window of each question
        q = question[w]
        if win_score[w] > best[q]:
            best[q] = win_score[w]
            out[q] = (int(char_start[w, s_tok[w]]), int(char_end[w, e_tok[w]]))
    return out


def _splits_words(ch: str) -> bool:
    """Whether `ch` is a word of its own or a gap between words, as BERT's BasicTokenizer splits text:
    whitespace, punctuation (ASCII symbols and Unicode P*), and CJK ideographs (one word each)."""
    cp = ord(ch)
    return (ch.isspace() or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(ch).startswith("P") or 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF
            or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FA1F)


def whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """The character span [start, end) of `text` widened to the whole words it touches, so an answer
    never ends inside a word ("ling Somerse" of "bowling Somerset," -> "bowling Somerset"). A word is a
    run of characters none of which `_splits_words`; a punctuation mark or CJK ideograph is a word of
    its own, so Chinese spans, and punctuation next to a word, are left as they are."""
    if start >= end:
        return start, end
    while start > 0 and not _splits_words(text[start]) and not _splits_words(text[start - 1]):
        start -= 1
    while end < len(text) and not _splits_words(text[end - 1]) and not _splits_words(text[end]):
        end += 1
    return start, end


# ------------------------------------------------------------------ the objective


class SpanQA(TaskObjective):
    Config = SpanQAConfig

    def __init__(self, cfg, tokenizer, special_ids, seq_len, task=None, layout: str = "cls_first"):
        if tokenizer is not None:  # before any output exists
            require_roles(special_ids, ("cls", "sep"))
        super().__init__(cfg, tokenizer, special_ids, seq_len, task, layout)
        o = self.task.options
        for name, value, unit, example in (("--doc-stride", o.doc_stride, "tokens", 128),
                                           ("--max-query-len", o.max_query_len, "tokens", 64),
                                           ("--max-answer-len", o.max_answer_len, "tokens", 30),
                                           ("--n-best", o.n_best, "candidates", 20)):
            if not isinstance(value, int) or value < 1:
                raise PlmError(f"{name} {value} must be a positive number of {unit}", f"e.g. {name} {example}")
        if seq_len - 3 - o.max_query_len < 1:
            raise PlmError(f"--max-query-len {o.max_query_len} leaves no room for the passage in windows of "
                           f"--max-seq-len {seq_len} ([CLS] question [SEP] passage [SEP])",
                           f"use --max-query-len {max(1, seq_len // 4)}, or a larger --max-seq-len")

    @classmethod
    def backbone_problem(cls, model_cls) -> str | None:
        """Encoders only: a span needs every token's state to see the passage on both sides (GPT-style
        transfer reads one extract token)."""
        return encoder_problem(model_cls)

    def build_model(self, encoder: nn.Module) -> SpanExtractor:
        self.check_encoder(encoder)
        model = SpanExtractor(encoder, self.cfg.classifier_dropout)
        model.frozen = model.freeze_unused(self.special_ids["cls"], self.special_ids["sep"])
        return model

    # -------------------------------------------------------------- data

    def encode(self, examples) -> tuple[dict[str, np.ndarray], dict]:
        """(window arrays, question table) of a split's QAExamples. `unmapped` in the table: the
        questions whose answer no token covers (whitespace or characters the tokenizer drops)."""
        o = self.task.options
        index: dict[str, int] = {}
        context_of = [index.setdefault(e.context, len(index)) for e in examples]
        contexts = list(index)
        ctx = self.tokenizer.encode_batch(contexts, add_special_tokens=False) if contexts else []
        ctx_offsets = [np.array(e.offsets, dtype=np.int64).reshape(-1, 2) for e in ctx]
        q_enc = self.tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False) if examples else []
        questions = [e.ids[:o.max_query_len] for e in q_enc]
        answers = [answer_tokens(ctx_offsets[c], e.span) for e, c in zip(examples, context_of)]
        unmapped = [i for i, (e, a) in enumerate(zip(examples, answers)) if e.span is not None and a is None]
        arrays = make_windows(questions, [e.ids for e in ctx], ctx_offsets, context_of, answers,
                              self.special_ids["cls"], self.special_ids["sep"], self.seq_len, o.doc_stride, self.layout)
        table = {"ids": [e.id for e in examples], "contexts": contexts, "context_of": context_of,
                 "answers": [e.answers for e in examples], "unmapped": unmapped,
                 "truncated": int(sum(len(e.ids) > o.max_query_len for e in q_enc))}
        return arrays, table

    def split_plan(self, splits: dict) -> dict:
        """train / validation (the dev split) / test windows."""
        return {"train": "train", "validation": "dev", **({"test": "test"} if "test" in splits else {})}

    def encode_split(self, splits: dict, name: str, split: str, data_dir: Path) -> dict:
        """{name}.npz, and for the splits that are decoded, {name}.questions.json (ids, passages, gold answers)."""
        arrays, table = self.encode(splits[split])
        if name == "train" and table["unmapped"]:  # no token to point at: nothing to learn from
            arrays = _drop_windows(arrays, np.isin(arrays["question"], table["unmapped"]))
            if self.task.skipped is not None:  # reported in metrics.json with the misaligned answers
                self.task.skipped["train: answer covered by no token"] = len(table["unmapped"])
        save_split(data_dir / f"{name}.npz", arrays)
        if name != "train":
            (data_dir / f"{name}.questions.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
        # "documents" are windows: what a batch holds and an epoch counts.
        return {"documents": len(arrays["question"]), "questions": len(np.unique(arrays["question"])),
                "tokens": int(len(arrays["ids"])), "truncated": table["truncated"]}

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        d = load_split(Path(corpus_dir) / f"{split}.npz")
        ids, off, type_start = d["ids"], d["offsets"], d["type_start"]
        sp, ep, n = d["start_positions"], d["end_positions"], len(d["offsets"]) - 1
        if n < 1:
            raise PlmError(f"the {split} split of {corpus_dir} has no questions", "check the task's data files")
        pad = self.pad_id

        def fetch(epochs, indices):
            idx = np.asarray(indices, dtype=np.int64)
            starts, lens = off[idx], off[idx + 1] - off[idx]
            pos = np.arange(lens.max())
            mask = pos[None, :] < lens[:, None]  # (B, T) dynamic padding
            x = np.full(mask.shape, pad, dtype=np.int64)
            x[mask] = ids[(starts[:, None] + pos[None, :])[mask]]
            types = mask & (pos[None, :] >= type_start[idx][:, None])
            return {"input_ids": torch.from_numpy(x), "token_type_ids": torch.from_numpy(types.astype(np.int64)),
                    "attention_mask": torch.from_numpy(mask.astype(np.int64)),
                    "start_positions": torch.from_numpy(sp[idx]), "end_positions": torch.from_numpy(ep[idx]),
                    "index": torch.from_numpy(idx), "num_tokens": int(lens.sum()),
                    "lengths": lens.tolist()}  # for row_lengths in _logits: stays on the host as a list of ints

        stream = BatchStream(n, batch_size, fetch, seed, rank, world, shuffle, lengths=np.diff(off))
        stream.windows = d
        stream.padded = None  # per-token tables as (W, seq_len) matrices, built at the first evaluation
        table = Path(corpus_dir) / f"{split}.questions.json"
        stream.questions = json.loads(table.read_text(encoding="utf-8")) if table.is_file() else None
        return stream

    # -------------------------------------------------------------- loss

    @staticmethod
    def _losses(logits, start_positions, end_positions) -> torch.Tensor:
        """Per-window (CE(start) + CE(end)) / 2, in fp32."""
        return (F.cross_entropy(logits[..., 0].float(), start_positions, reduction="none")
                + F.cross_entropy(logits[..., 1].float(), end_positions, reduction="none")) / 2

    def loss_counts(self, batch):
        return {"loss": torch.tensor(len(batch["start_positions"]))}  # windows

    @staticmethod
    def _logits(model, batch) -> torch.Tensor:
        """(B, T, 2) start and end logits of the batch's windows."""
        with row_lengths(batch["attention_mask"], batch.get("lengths")):  # the encoder reads no lengths back
            return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def step(self, model, batch, state=None):
        logits = self._logits(model, batch)
        loss = self._losses(logits, batch["start_positions"], batch["end_positions"]).mean()
        count = torch.full((), float(len(logits)), device=logits.device)  # filled on the device, not copied
        return StepOutput(loss, {"loss": loss.detach() * count}, count)

    # -------------------------------------------------------------- evaluation

    def eval_forward(self, model, batch):
        return self._logits(model, batch)

    def eval_outputs(self, model, batch, out, with_loss):
        """Each window's (seq_len, 2) logits, NEG past its batch's width, and its index."""
        full = torch.full((len(out), self.seq_len, 2), NEG, device=out.device)
        full[:, :out.shape[1]] = out.float()
        return {"logits": full, "index": batch["index"]}

    def no_outputs(self, device):
        return {"logits": torch.zeros(0, self.seq_len, 2, device=device),
                "index": torch.zeros(0, dtype=torch.long, device=device)}

    def _answers(self, stream, logits: np.ndarray, index: np.ndarray) -> tuple[list[int], list[str]]:
        """(questions, answer texts) for the questions that have windows among `index`."""
        w, o = stream.windows, self.task.options
        if stream.padded is None:
            stream.padded = {k: padded(w[k], w["offsets"], self.seq_len, fill)
                             for k, fill in (("char_start", -1), ("char_end", -1), ("max_context", False))}
        p, table = stream.padded, stream.questions
        question = w["question"][index]
        spans = best_spans(logits, p["char_start"][index], p["char_end"][index], p["max_context"][index],
                           question, len(table["ids"]), o.n_best, o.max_answer_len)
        seen = np.unique(question).tolist()
        texts = []
        for q in seen:
            context = table["contexts"][table["context_of"][q]]
            if spans[q]:  # a word piece's span, widened to its words: what SQuAD and CMRC then score
                a, b = whole_words(context, *spans[q])
                texts.append(context[a:b].strip())
            else:
                texts.append("")
        return seen, texts

    def dev_metrics(self, got, stream) -> dict:
        """val_loss (per window) and the task's exact_match / f1 over the questions read."""
        logits, idx = got["logits"], got["index"].cpu().numpy()
        w = stream.windows
        target = [torch.from_numpy(w[k][idx]).to(logits.device) for k in ("start_positions", "end_positions")]
        loss = self._losses(logits, *target).mean().item() if len(idx) else float("nan")
        seen, texts = self._answers(stream, logits.cpu().numpy(), idx)
        prefix = next(iter(self.task.eval_splits.values()), "")
        scores = self.task.score(texts, [stream.questions["answers"][q] for q in seen])
        return {f"val_{prefix}loss": loss, **{f"val_{prefix}{k}": v for k, v in scores.items()}}

    def predictions(self, got, stream) -> tuple[np.ndarray, list[str]]:
        """(question ids, answer texts) for every question of the stream's split."""
        seen, texts = self._answers(stream, got["logits"].cpu().numpy(), got["index"].cpu().numpy())
        ids = stream.questions["ids"]
        return np.array([ids[q] for q in seen]), texts


def _drop_windows(arrays: dict[str, np.ndarray], drop: np.ndarray) -> dict[str, np.ndarray]:
    """The window arrays without the windows marked in `drop` (W,)."""
    off = arrays["offsets"]
    lens = off[1:] - off[:-1]
    keep_tok = np.repeat(~drop, lens)
    out = {k: v[keep_tok] for k, v in arrays.items() if k in ("ids", "char_start", "char_end", "max_context")}
    out.update({k: arrays[k][~drop] for k in ("type_start", "start_positions", "end_positions", "question")})
    out["offsets"] = np.concatenate([[0], np.cumsum(lens[~drop])]).astype(np.int64)
    return out
