"""Multiple choice (SWAG, Zellers et al. 2018; RACE, Lai et al. 2017): one score per candidate, softmax across them.

Each example becomes K sequences, one per choice, scored alone and compared:
encoders read [CLS] context [SEP] ending_k [SEP] (XLNet's `cls_last`: context [SEP] ending_k [SEP] [CLS]) and
score the pooled representation with Linear(d_model, 1), as BERT's SWAG setup (Devlin et al. 2018, §4.4);
causal LMs (GPT-style transfer, Radford et al. 2018 §3.3) read <s> context $ ending_k <e> and score the
final state of <e>, with the auxiliary LM loss of classify.py on all K sequences. The K scores are
softmaxed across the choices and trained with cross-entropy against the right one; accuracy is the metric
and the test prediction is the chosen index. Everything else (data layout, batching, evaluation,
prediction) is Classify's, with K rows per example.

With a question between passage and option (RACE, plmcli.data.tasks.race) the second text is the question and
the option: `<s> passage $ question $ option_k <e>` for causal LMs (the question behind its own delimiter, seed
003 §7.2.3(4)), `[CLS] passage [SEP] question option_k [SEP]` for encoders (XLNet: `passage [SEP] question option_k
[SEP] [CLS]`). Longest-first truncation as for pairs, but a cut second text keeps its end: the option, which
tells the K rows apart, goes last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from torch import nn

from plmcli.config_schema import Probability, Size
from plmcli.data.pairs import Frame, encode_framed, truncate_pair
from plmcli.data.tasks.race import RaceExample
from plmcli.errors import PlmError
from plmcli.objectives.classify import CAUSAL, Classify, SequenceClassifier


@dataclass
class ChoiceConfig:
    task: str = "swag"
    """The task (plmcli.data.tasks.registry) whose data and metrics this serves."""
    num_labels: Size = 4
    """Choices per example (the task finds them in its data)."""
    classifier_dropout: Optional[Probability] = None
    """Dropout before the scoring layer; None = the backbone's own dropout."""


class Choice(Classify):
    Config = ChoiceConfig
    stack_rows = False  # the K choices are K independent sequences to the model: (B·K, T)

    def __init__(self, cfg, tokenizer, special_ids, seq_len, task=None, layout: str = "cls_first"):
        if cfg.num_labels < 2:
            raise PlmError(f"multiple choice needs at least 2 choices, not {cfg.num_labels}",
                           "give every row two or more endings")
        super().__init__(cfg, tokenizer, special_ids, seq_len, task=task, layout=layout)

    def build_model(self, backbone: nn.Module) -> nn.Module:
        """The backbone with a one-output head: a score per (context, ending) sequence."""
        if self.layout == CAUSAL:
            return self._causal_model(backbone, 1)
        self.check_encoder(backbone)
        model = SequenceClassifier(backbone, 1, self.cfg.classifier_dropout)
        model.frozen = model.freeze_unused(self.special_ids["cls"], self.special_ids["sep"])
        return model

    def _encode(self, examples) -> tuple[dict, int]:
        """K rows per example, choice-major within it: row i·K + k = (context_i, ending_k of i)."""
        k = self.cfg.num_labels
        for e in examples:
            if len(e.endings) != k:
                raise PlmError(f"example {e.id} has {len(e.endings)} endings, expected {k}",
                               "every example of a run needs the same number of choices")
        contexts = [e.context for e in examples for _ in range(k)]
        endings = [x for e in examples for x in e.endings]
        if any(isinstance(e, RaceExample) for e in examples):
            questions = [e.question if isinstance(e, RaceExample) else "" for e in examples for _ in range(k)]
            return encode_with_questions(self.tokenizer, self.frame, contexts, questions, endings, self.seq_len), k
        return encode_framed(self.tokenizer, self.frame, contexts, endings, self.seq_len), k

    def _logits(self, model, batch, with_lm: bool = False):
        """The model scores each of the B·K rows (B·K, 1); regrouped as (B, K) choice scores."""
        scores, lm = super()._logits(model, batch, with_lm)
        return scores.reshape(-1, batch["rows"]), lm


def encode_with_questions(tokenizer, frame: Frame, passages: list[str], questions: list[str], options: list[str],
                          max_seq_len: int, chunk: int = 8192) -> dict[str, np.ndarray]:
    """Rows of `frame` whose second text is question + option: `<s> p $ q $ c <e>` for GPT's frame (the question
    behind the frame's own delimiter), `[CLS] p [SEP] q c [SEP]` for an encoder's (q and c simply follow each
    other); an empty question is left out with its delimiter. Longest-first truncation between the passage and
    question + option; a cut second text loses its start, so the option stays whole while it fits.
    The flat arrays of plmcli.data.pairs.encode_framed, encoded `chunk` rows at a time."""
    joiner = list(frame.middle) if frame.layout == CAUSAL else []
    encode = lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]  # noqa: E731
    parts = {"ids": [], "lengths": [], "type_start": [], "truncated": []}
    for lo in range(0, len(passages), chunk):
        hi = lo + chunk
        enc_p, enc_q, enc_c = encode(passages[lo:hi]), encode(questions[lo:hi]), encode(options[lo:hi])
        seconds = [[*q, *joiner, *c] if q else c for q, c in zip(enc_q, enc_c)]
        lp = np.array([len(x) for x in enc_p], dtype=np.int64)
        ls = np.array([len(x) for x in seconds], dtype=np.int64)
        na, nb = truncate_pair(lp, ls, max_seq_len - frame.extra)
        rows = [frame.pair(p[:n], s[len(s) - m:]) for p, s, n, m in zip(enc_p, seconds, na, nb)]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        parts["ids"].append(np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(lengths.sum())))
        parts["lengths"].append(lengths)
        parts["type_start"].append(np.asarray(frame.second_start(na), dtype=np.int64))
        parts["truncated"].append((na < lp) | (nb < ls))
    cat = {k: np.concatenate(v) if v else np.zeros(0, dtype=bool if k == "truncated" else np.int64)
           for k, v in parts.items()}
    return {"ids": cat["ids"].astype(np.int32), "offsets": np.concatenate([[0], np.cumsum(cat["lengths"])]).astype(np.int64),
            "type_start": cat["type_start"], "truncated": cat["truncated"]}
