"""Multiple choice (SWAG; Zellers et al. 2018): one score per candidate ending, softmax across the candidates.

Each example becomes K sequences, one per choice, scored alone and compared:
encoders read [CLS] context [SEP] ending_k [SEP] (XLNet's `cls_last`: context [SEP] ending_k [SEP] [CLS]) and
score the pooled representation with Linear(d_model, 1), as BERT's SWAG setup (Devlin et al. 2018, §4.4);
causal LMs (GPT-style transfer, Radford et al. 2018 §3.3) read <s> context $ ending_k <e> and score the
final state of <e>, with the auxiliary LM loss of classify.py on all K sequences. The K scores are
softmaxed across the choices and trained with cross-entropy against the right one; accuracy is the metric
and the test prediction is the chosen index. Everything else (data layout, batching, evaluation,
prediction) is Classify's, with K rows per example.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from plmcli.config_sections import Probability, Size
from plmcli.data.pairs import encode_framed
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
        if not type(backbone).traits.bidirectional:
            raise PlmError(f"{type(backbone).__name__} has no encoder interface", "finetune from an encoder run (bert recipes)")
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
        return encode_framed(self.tokenizer, self.frame, contexts, endings, self.seq_len), k

    def _logits(self, model, batch, with_lm: bool = False):
        """The model scores each of the B·K rows (B·K, 1); regrouped as (B, K) choice scores."""
        scores, lm = super()._logits(model, batch, with_lm)
        return scores.reshape(-1, batch["rows"]), lm
