"""Token classification (NER) on an encoder, as BERT finetunes CoNLL-2003 (Devlin et al. 2018, §5.3),
optionally with a linear-chain CRF over the tag scores (Lample et al. 2016); or on the per-token states of
a family that reads one example at a time (`HasTokenStates`: an LSTM LM, as the LSTM-CRF taggers of Lample
et al. read words; Transformer-XL; a Transformer's encoder).

Words become sub-tokens in context: each sentence is encoded as its words joined by single spaces
(the text the tokenizer saw in pretraining, so byte-level BPE keeps its Ġ-marked word starts) and each
token goes to the word holding its last character; a word the tokenizer drops entirely (a stray
control character) becomes one [UNK]. The tag of a word is predicted at its first sub-token only;
the other sub-tokens and the special tokens carry no label (-100), as in BERT's NER setup. Rows are
[CLS] tokens [SEP] (`cls_last` encoders: tokens [SEP] [CLS]). In the `causal` layout rows are <s> tokens <e>
(the run's transfer tokens, classify.transfer_tokens) and a word's tag is read at its LAST sub-token: a
left-to-right state has seen the whole word only there.

A sentence longer than `max_seq_len` - 2 sub-tokens is split into windows at word boundaries, each
filled greedily; every word is labeled and predicted in exactly one window, and the windows'
predictions are joined back into the sentence before scoring. A window sees no context across its
edges and the CRF chain restarts in each; where a window starts inside an entity, its first tag is
read as B- in that window's loss (its own view: an entity starts there), so the gold path stays
valid under the BIO constraints; scoring uses the sentence's real tags. A single word longer than a
window keeps its first sub-tokens (`truncated` counts such sentences). meta.json counts windows as
`documents` (one example each: what an epoch is), and `sentences`, `words`, `windowed` (sentences
split: rare at 128; with an 8k WordPiece vocabulary, 1 of CoNLL-2003's 14,041 training sentences)
and `iob1_converted`.

Model: encoder hidden (B, T, C) at the first sub-tokens -> dropout -> Linear(C, num_tags); a family whose states
do not see their neighbours (word2vec: `Traits.tag_window`) is read by Collobert et al.'s window approach instead,
each word's letter case (`word_case`, stored beside the ids as `case`) a feature of its own. Loss: the
mean per-word cross-entropy, or with `--crf` the CRF's negative log-likelihood summed over sentences
and divided by their words (a per-word scale like cross-entropy's, so the same learning rate fits).
Decoding: argmax per word, or constrained Viterbi (never I-X after O or another type).
Evaluation decodes the whole dev set and scores whole sentences (the task's `score`: seqeval).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.config_schema import Probability, Size
from plmcli.data.batching import BatchStream
from plmcli.data.pairs import encoder_frame
from plmcli.data.tasks import load_split, save_split
from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.crf import LinearChainCRF, bio_constraints
from plmcli.models.device import row_lengths
from plmcli.objectives.base import StepOutput
from plmcli.objectives.classify import CAUSAL, frame_tokens
from plmcli.objectives.heads import TaskHead, state_width, states_problem
from plmcli.objectives.task import TaskObjective

IGNORE = -100
"""Label of a sub-token that is not a word's first (and of special tokens): no loss, no prediction."""


@dataclass
class TaggingConfig:
    task: str = "conll2003"
    """The task (plmcli.data.tasks.registry) whose data, tags and metrics this serves."""
    num_labels: Size = 9
    """Tags (CoNLL-2003 in IOB2: O and B-/I- of PER, ORG, LOC, MISC)."""
    classifier_dropout: Optional[Probability] = None
    """Dropout before the tag layer; None = the encoder's own dropout (BERT: 0.1)."""


CASES = 6
"""Capitalization feature values (Collobert et al. 2011): 0 outside the sentence, then `word_case`'s five."""
CASE_DIM = 5
"""Width of the capitalization feature's embedding (Collobert et al.: 5)."""


def word_case(word: str) -> int:
    """1 no cased letter (digits, punctuation, CJK), 2 all lowercase, 3 all uppercase, 4 first letter uppercase,
    5 an uppercase letter later (iPhone)."""
    if word.islower():
        return 2
    if word.isupper():
        return 3
    if word[:1].isupper():
        return 4
    return 5 if any(c.isupper() for c in word) else 1


class TokenClassifier(TaskHead):
    """encoder -> hidden states at each word's first sub-token (B, W, C) -> dropout -> Linear -> (B, W, num_tags);
    with the family's `tag_window` w, the states of words i−w … i+w and their capitalization features,
    concatenated, through the family's head_layers first (Collobert et al.'s window approach).

    `crf` (a LinearChainCRF or None) is held here so its transitions train and save with the model;
    the objective calls it.
    """

    per_token = True

    def __init__(self, encoder: nn.Module, num_tags: int, dropout: float | None = None, crf: LinearChainCRF | None = None):
        window, width = traits_of(encoder).tag_window, state_width(encoder)
        super().__init__(encoder, num_tags, dropout, width=(2 * window + 1) * (width + CASE_DIM) if window else width)
        self.window = window
        self.case = nn.Embedding(CASES, CASE_DIM) if window else None
        self.num_tags = num_tags
        self.crf = crf

    def hidden_layers(self, traits) -> int:
        return traits.head_layers if traits.tag_window else 0

    def forward(self, input_ids, attention_mask, first, case=None,
                words: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids, mask, the flags of the sub-token that carries each word's tag (`first`: the first
        sub-token, or the last in the causal layout) and, for a window tagger, each word's `word_case` at that
        sub-token (None: unknown, 0) -> (tag scores (B, W, K), word mask (B, W)).

        Words are packed to the left in sentence order (W = most words in a row of the batch). `words`: W as the
        host knows it (the batch's tags are (B, W)); None: counted from `first`, which a GPU waits to report.
        """
        hidden, _ = self.states(input_ids, None, attention_mask)  # (B, T, C)
        n_words = first.sum(1)  # (B,)
        W = int(n_words.max()) if words is None else words
        # A stable sort of "not first" puts each row's first-sub-token positions first, in order.
        where = torch.argsort((~first.bool()).to(torch.int32), dim=1, stable=True)[:, :W]  # (B, W)
        h = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, W, C)
        word_mask = torch.arange(W, device=first.device)[None, :] < n_words[:, None]
        if self.window:
            h = self._windows(h, word_mask, None if case is None else case.gather(1, where))
        return self.output(h), word_mask

    def _windows(self, h: torch.Tensor, word_mask: torch.Tensor, case: torch.Tensor | None) -> torch.Tensor:
        """(B, W, C) word states -> (B, W, (2w+1)(C + CASE_DIM)): words i−w … i+w with their capitalization
        features; beyond a sentence's ends, zero states and case 0 (a learned "outside")."""
        w, W = self.window, h.shape[1]
        case = torch.zeros_like(word_mask, dtype=torch.long) if case is None else case.long() * word_mask
        padded = torch.cat([F.pad(h * word_mask[..., None], (0, 0, w, w)), self.case(F.pad(case, (w, w)))], -1)
        return torch.cat([padded[:, k:k + W] for k in range(2 * w + 1)], -1)

    def freeze_unused(self, cls_id: int, sep_id: int) -> list[str]:
        """Freeze (and name) encoder parameters tagging never reaches (MLM/NSP heads, the pooler, an LM's
        softmax, a Transformer's decoder): the optimizer holds no state for them and DDP does not wait for
        their gradients. Saved as before. `cls_id`, `sep_id`: the row's opening and closing special tokens."""
        for p in self.parameters():
            p.requires_grad_(True)  # a backbone taken from a finetuned run may carry an earlier run's freezing
        p0 = next(self.parameters())
        x = torch.tensor([[cls_id, sep_id, sep_id]] * 2, device=p0.device)
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]], device=p0.device)
        first = torch.tensor([[False, True, False]] * 2, device=p0.device)
        was_training = self.training
        self.eval()  # no dropout: the probe draws nothing from the RNG
        self.zero_grad(set_to_none=True)
        self(x, mask, first)[0].float().sum().backward()
        unused = [n for n, p in self.encoder.named_parameters() if p.requires_grad and p.grad is None]
        for _, p in self.encoder.named_parameters():
            if p.grad is None:
                p.requires_grad_(False)
        self.zero_grad(set_to_none=True)
        self.train(was_training)
        return [f"encoder.{n}" for n in unused]


def word_pieces(tokenizer, sentences: list[list[str]], unk_id: int, chunk: int = 4096) -> list[list[list[int]]]:
    """Sub-token ids of each word of each sentence, tokenized in context (see the module docstring)."""
    out = []
    for lo in range(0, len(sentences), chunk):
        part = sentences[lo:lo + chunk]
        encs = tokenizer.encode_batch([" ".join(words) for words in part], add_special_tokens=False)
        for words, enc in zip(part, encs):
            starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])  # each word's first character
            ends = np.array([e for _, e in enc.offsets], dtype=np.int64)
            owner = (np.searchsorted(starts, ends - 1, side="right") - 1).clip(0)
            pieces: list[list[int]] = [[] for _ in words]
            for tid, w in zip(enc.ids, owner):
                pieces[w].append(tid)
            out.append([p or [unk_id] for p in pieces])
    return out


def plan_windows(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Word ranges [start, end) that cover a sentence in order, greedily filled to `budget` sub-tokens
    (a word longer than the budget alone in its window)."""
    spans, start, used = [], 0, 0
    for w, n in enumerate(lengths):
        n = min(n, budget)
        if used and used + n > budget:
            spans.append((start, w))
            start, used = w, 0
        used += n
    spans.append((start, len(lengths)))
    return spans


class Tagging(TaskObjective):
    Config = TaggingConfig

    def __init__(self, cfg, tokenizer, special_ids, seq_len, task=None, layout: str = "cls_first"):
        """`layout`: where the encoder wants [CLS] (its class's `pair_layout`)."""
        self.transfer = frame_tokens(tokenizer, special_ids, layout)
        super().__init__(cfg, tokenizer, special_ids, seq_len, task, layout)

    @classmethod
    def backbone_problem(cls, model_cls) -> str | None:
        """Encoders and families with per-token states read one example at a time (heads.states_problem):
        GPT-style transfer reads one token per row."""
        return states_problem(model_cls)

    @property
    def use_crf(self) -> bool:
        return bool(self.task.options.crf)

    def build_model(self, encoder: nn.Module) -> TokenClassifier:
        problem = states_problem(type(encoder))
        if problem:
            raise PlmError(f"{type(encoder).__name__} {problem}", "finetune from an encoder run (bert recipes)")
        crf = None
        if self.use_crf:
            allowed, start = bio_constraints(list(self.task.label_names))
            crf = LinearChainCRF(self.cfg.num_labels, allowed, start)
        model = TokenClassifier(encoder, self.cfg.num_labels, self.cfg.classifier_dropout, crf)
        frame = self.frame
        model.frozen = model.freeze_unused(frame.before[0] if frame.before else frame.after[-1], frame.after[0])
        return model

    @property
    def frame(self):
        """[CLS] words [SEP] where the encoder's layout puts them, or <s> words <e> (the run's transfer tokens)."""
        if self.layout == CAUSAL:
            return self.transfer.frame
        return encoder_frame(self.layout, self.special_ids["cls"], self.special_ids["sep"])

    # -------------------------------------------------------------- data

    def encode_sentences(self, sentences, group: int = 0) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays of one split (windows: ids/offsets/first/labels/sentence; sentences: example_id,
        word_offsets/word_tags (-1 unlabeled), group) and its counts."""
        frame = self.frame
        at_last = self.layout == CAUSAL  # a left-to-right state has read the whole word at its last piece
        unk = self.special_ids.get("unk", self.pad_id)
        budget = self.seq_len - len(frame.before) - len(frame.after)
        pad_before, pad_after = [False] * len(frame.before), [False] * len(frame.after)
        ignore_before, ignore_after = [IGNORE] * len(frame.before), [IGNORE] * len(frame.after)
        pieces = word_pieces(self.tokenizer, [s.words for s in sentences], unk)
        ids, first, labels, cases, lengths, win_sent, win_start = [], [], [], [], [], [], []
        truncated = windowed = 0
        for k, (s, words) in enumerate(zip(sentences, pieces)):
            spans = plan_windows([len(p) for p in words], budget)
            windowed += len(spans) > 1
            truncated += any(len(p) > budget for p in words)
            for a, b in spans:
                toks, flag, lab, case = [], [], [], []
                for w in range(a, b):
                    p = words[w][:budget]
                    toks += p
                    rest = [False] * (len(p) - 1)
                    flag += rest + [True] if at_last else [True] + rest
                    tag = IGNORE if s.tags is None else s.tags[w]
                    if w == a and a > 0 and tag != IGNORE:
                        tag = self._window_start_tag(tag)
                    lab += [IGNORE] * len(rest) + [tag] if at_last else [tag] + [IGNORE] * len(rest)
                    c = word_case(s.words[w])
                    case += [0] * len(rest) + [c] if at_last else [c] + [0] * len(rest)
                row = frame.single(toks)
                ids += row
                first += pad_before + flag + pad_after
                labels += ignore_before + lab + ignore_after
                cases += [0] * len(frame.before) + case + [0] * len(frame.after)
                lengths.append(len(row))
                win_sent.append(k)
                win_start.append(a)
        n_words = [len(s.words) for s in sentences]
        tags = [t for s in sentences for t in (s.tags if s.tags is not None else [-1] * len(s.words))]
        arrays = {"ids": np.array(ids, dtype=np.int32), "first": np.array(first, dtype=bool),
                  "labels": np.array(labels, dtype=np.int64), "case": np.array(cases, dtype=np.int8),
                  "offsets": np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
                  "window_sentence": np.array(win_sent, dtype=np.int64),
                  "window_word_start": np.array(win_start, dtype=np.int64),
                  "example_id": np.array([str(s.id) for s in sentences]),
                  "word_offsets": np.concatenate([[0], np.cumsum(n_words, dtype=np.int64)]).astype(np.int64),
                  "word_tags": np.array(tags, dtype=np.int64), "group": np.full(len(sentences), group, dtype=np.int8)}
        counts = {"documents": len(lengths), "sentences": len(sentences), "words": int(sum(n_words)),
                  "tokens": len(ids), "truncated": int(truncated), "windowed": int(windowed),
                  "iob1_converted": int(sum(s.converted for s in sentences))}
        return arrays, counts

    def _window_start_tag(self, tag: int) -> int:
        """I-X opening a window (a sentence split inside an entity) reads as B-X there."""
        names = self.task.label_names
        name = names[tag]
        return names.index("B-" + name[2:]) if name.startswith("I-") and "B-" + name[2:] in names else tag

    def split_plan(self, splits: dict) -> dict:
        """train / validation (the task's eval splits, tagged by group) / test splits, those the task has data for."""
        plan = {"train": ["train"], "validation": list(self.task.eval_splits),
                **{s: [s] for s in self.task.test_splits}}
        return {name: parts for name, parts in plan.items() if all(p in splits for p in parts)}

    def encode_split(self, splits: dict, name: str, parts, data_dir: Path) -> dict:
        encoded = [self.encode_sentences(splits[p], g) for g, p in enumerate(parts)]
        save_split(data_dir / f"{name}.npz", _concat([a for a, _ in encoded]))
        return {k: sum(c[k] for _, c in encoded) for k in encoded[0][1]}

    def data_meta(self) -> dict:
        return {"tags": list(self.task.label_names)}

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        d = load_split(Path(corpus_dir) / f"{split}.npz")
        ids, off, first, labels = d["ids"], d["offsets"], d["first"], d["labels"]
        # encoded before the capitalization feature existed: every word's case unknown (0)
        cases = d["case"] if "case" in d else np.zeros(len(ids), dtype=np.int8)
        n = len(off) - 1
        if n < 1:
            raise PlmError(f"the {split} split of {corpus_dir} has no sentences", "check the task's data files")
        pad = self.pad_id

        def fetch(epochs, indices):
            idx = np.asarray(indices, dtype=np.int64)
            starts, lens = off[idx], off[idx + 1] - off[idx]
            pos = np.arange(lens.max())
            mask = pos[None, :] < lens[:, None]  # (B, T): padded to the longest row of this batch
            flat = (starts[:, None] + pos[None, :])[mask]
            x = np.full(mask.shape, pad, dtype=np.int64)
            x[mask] = ids[flat]
            f = np.zeros(mask.shape, dtype=bool)
            f[mask] = first[flat]
            lab = np.full(mask.shape, IGNORE, dtype=np.int64)
            lab[mask] = labels[flat]
            case = np.zeros(mask.shape, dtype=np.int64)
            case[mask] = cases[flat]
            n_words = f.sum(1)
            word_mask = np.arange(n_words.max())[None, :] < n_words[:, None]
            tags = np.full(word_mask.shape, IGNORE, dtype=np.int64)
            tags[word_mask] = lab[f]  # both row-major: row b's words in order
            return {"input_ids": torch.from_numpy(x), "attention_mask": torch.from_numpy(mask.astype(np.int64)),
                    "first": torch.from_numpy(f), "case": torch.from_numpy(case), "tags": torch.from_numpy(tags),
                    "index": torch.from_numpy(idx), "num_tokens": int(lens.sum()),
                    "lengths": lens.tolist()}  # for row_lengths in _scores: stays on the host as a list of ints

        stream = BatchStream(n, batch_size, fetch, seed, rank, world, shuffle, lengths=np.diff(off))
        stream.arrays = d  # sentences and windows, for joining predictions back into sentences
        return stream

    # -------------------------------------------------------------- loss

    def _crf(self, model) -> LinearChainCRF | None:
        from accelerate.utils import extract_model_from_parallel

        return extract_model_from_parallel(model).crf

    def _losses(self, crf, scores, tags, word_mask) -> torch.Tensor:
        """Summed loss per window (B,), in fp32."""
        if crf is not None:
            return crf.nll(scores, tags, word_mask)
        return F.cross_entropy(scores.float().transpose(1, 2), tags, ignore_index=IGNORE, reduction="none").sum(1)

    def loss_counts(self, batch):
        return {"loss": batch["first"].sum()}  # words: each is tagged at its first sub-token

    @staticmethod
    def _scores(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's (tag scores (B, W, K), word mask (B, W)), told W and the rows' lengths by the host."""
        with row_lengths(batch["attention_mask"], batch.get("lengths")):  # the encoder reads no lengths back
            return model(batch["input_ids"], batch["attention_mask"], batch["first"], batch["case"],
                         words=batch["tags"].shape[1])

    def step(self, model, batch, state=None):
        scores, word_mask = self._scores(model, batch)
        tags, crf = batch["tags"], self._crf(model)
        count = word_mask.sum().float()
        loss = self._losses(crf, scores, tags, word_mask).sum() / count.clamp(min=1)
        metrics = {"loss": loss.detach() * count}
        if crf is None:  # with a CRF the per-word argmax is not the prediction; dev accuracy reports it
            metrics["accuracy"] = ((scores.argmax(-1) == tags) & word_mask).sum().float()
        return StepOutput(loss, metrics, count)

    # -------------------------------------------------------------- evaluation

    def eval_forward(self, model, batch):
        return self._scores(model, batch)

    def eval_outputs(self, model, batch, out, with_loss):
        """Per window: predicted tags (seq_len,) padded with -1, summed loss, words, index."""
        crf = self._crf(model)
        scores, word_mask = out
        scores = scores.float()
        preds = crf.decode(scores, word_mask) if crf is not None else scores.argmax(-1).masked_fill(~word_mask, -1)
        losses = (self._losses(crf, scores, batch["tags"], word_mask) if with_loss
                  else torch.zeros(len(preds), device=preds.device))
        return {"preds": F.pad(preds, (0, self.seq_len - preds.shape[1]), value=-1), "loss": losses.float(),
                "words": word_mask.sum(1), "index": batch["index"]}

    def no_outputs(self, device):
        long = torch.zeros(0, dtype=torch.long, device=device)
        return {"preds": torch.zeros(0, self.seq_len, dtype=torch.long, device=device),
                "loss": torch.zeros(0, device=device), "words": long, "index": long}

    @staticmethod
    def _sentences(arrays: dict, got: dict) -> tuple[np.ndarray, list[np.ndarray]]:
        """Join the windows' predictions into sentences: (sentence numbers, predicted tags of each)."""
        index = got["index"].cpu().numpy()
        order = np.argsort(index, kind="stable")  # windows of a sentence are consecutive, in word order
        index, preds, words = index[order], got["preds"].cpu().numpy()[order], got["words"].cpu().numpy()[order]
        sent = arrays["window_sentence"][index]
        joined = np.concatenate([p[:w] for p, w in zip(preds, words)]) if len(index) else np.zeros(0, dtype=np.int64)
        numbers, first_window = np.unique(sent, return_index=True)
        ends = np.append(first_window[1:], len(sent))
        word_ends = np.cumsum(words)
        bounds = np.concatenate([[0], word_ends[ends - 1]]) if len(index) else np.zeros(1, dtype=np.int64)
        return numbers, [joined[bounds[i]:bounds[i + 1]] for i in range(len(numbers))]

    def dev_metrics(self, got, stream) -> dict:
        """Loss and the task's metrics (entity P/R/F1, token accuracy) per eval split, over whole sentences."""
        a = stream.arrays
        numbers, preds = self._sentences(a, got)
        win_group = a["group"][a["window_sentence"][got["index"].cpu().numpy()]]
        losses, words = got["loss"].cpu().numpy(), got["words"].cpu().numpy()
        res = {}
        for g, prefix in enumerate(self.task.eval_splits.values()):
            sel = np.flatnonzero(a["group"][numbers] == g)
            if not len(sel):
                continue
            w = win_group == g
            res[f"val_{prefix}loss"] = float(losses[w].sum() / max(words[w].sum(), 1))
            gold = [a["word_tags"][a["word_offsets"][s]:a["word_offsets"][s + 1]] for s in numbers[sel]]
            res.update({f"val_{prefix}{k}": v for k, v in self.task.score([preds[i] for i in sel], gold).items()})
        return res

    def predictions(self, got, stream) -> tuple[np.ndarray, list[np.ndarray]]:
        """(sentence ids, predicted tag indices of each sentence's words)."""
        numbers, preds = self._sentences(stream.arrays, got)
        return stream.arrays["example_id"][numbers], preds


def _concat(parts: list[dict]) -> dict[str, np.ndarray]:
    """One split's arrays from several groups' (offsets and sentence numbers shifted)."""
    if len(parts) == 1:
        return parts[0]
    out = {k: np.concatenate([p[k] for p in parts]) for k in ("ids", "first", "labels", "case", "window_word_start",
                                                              "example_id", "word_tags", "group")}
    for key, count in (("offsets", "ids"), ("word_offsets", "word_tags")):
        shift = np.cumsum([0] + [len(p[count]) for p in parts[:-1]])
        out[key] = np.concatenate([[0]] + [p[key][1:] + s for p, s in zip(parts, shift)]).astype(np.int64)
    shift = np.cumsum([0] + [len(p["example_id"]) for p in parts[:-1]])
    out["window_sentence"] = np.concatenate([p["window_sentence"] + s for p, s in zip(parts, shift)])
    return out
