"""Sequence classification and regression: GLUE-style finetuning of an encoder (Devlin et al. 2018, §4.1)
or GPT-style transfer from a causal LM (Radford et al. 2018, §3.3).

Encoders: the pretrained encoder + dropout + one linear layer on the pooled [CLS] state (the encoder's
pooler when it has one, else the [CLS] hidden state). [CLS] leads each example unless the encoder's
class says `pair_layout = "cls_last"` (XLNet: a [SEP] b [SEP] [CLS]).

Causal LMs (finetune passes layout "causal"): GPT's traversal-style input transforms, `<s> x <e>` and
`<s> x1 $ x2 <e>` for pairs; for a similarity or paraphrase task (its `symmetric_pair`: STS-B, MRPC, QQP)
both orders, whose features are added before the head. The features are what the backbone's `Traits.pooling`
names: GPT and Transformer-XL the final state of the extract token <e> (each row's last real token); RNN/LSTM/GRU LMs
ULMFiT's concat pooling [last; max; mean] over the real tokens; a Transformer's encoder (framed the same
way: its tokenizer has no [CLS]) the mean of its states; word2vec Kim's (2014) CNN over its vectors. Stateful
LMs read every example from a fresh state (`HasTokenStates`). For a causal LM the loss adds GPT's auxiliary
language-modelling objective on the same inputs: L = L_task + λ·L_LM, λ = TaskOptions.aux_lm_weight
(`--aux-lm-weight`, 0.5 as in the paper).

Cross-entropy for classes, MSE for a single regression output (STS-B). Batches are padded (right) only to
their own longest sequence, and training batches hold examples of similar length (LengthGroupedOrder in
plmcli.data.batching), so little is padded. Evaluation collects every prediction, so task metrics that are
not means (MCC, F1, correlations) are computed over the whole dev set; val_loss is the task loss alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli import kernels
from plmcli.config_schema import Probability, Size
from plmcli.data.batching import BatchStream
from plmcli.data.pairs import Frame, causal_frame, encode_framed, encoder_frame
from plmcli.data.tasks import load_split, require_roles, save_split
from plmcli.errors import PlmError
from plmcli.models import device as devices
from plmcli.models.base import HasHidden, HasLMHead, HasStateLogits, HasTaskHead, traits_of
from plmcli.models.registry import families_that, named
from plmcli.objectives.base import StepOutput
from plmcli.objectives.heads import (ConvPooling, TaskHead, encoder_problem, freeze_unreached, gives_states,  # noqa: F401
                                     pool, state_width, states_problem)  # encoder_problem: its old home
from plmcli.objectives.task import TaskObjective

def transfers(model_cls) -> bool:
    """Whether sequence classification, regression and multiple choice finetune runs of `model_cls`: GPT-style transfer
    from a causal LM's `hidden` (read at once, not counted), or every token's state (heads.gives_states)."""
    traits = model_cls.traits
    return (traits.causal and not traits.stateful and not traits.counts and issubclass(model_cls, HasHidden)) \
        or gives_states(model_cls)


def needs() -> str:
    """What sequence classification, regression and multiple choice can be finetuned from, named from the registry."""
    encoders = families_that(lambda c: transfers(c) and c.traits.bidirectional)
    causal = families_that(lambda c: transfers(c) and c.traits.causal)
    rest = families_that(lambda c: transfers(c) and not (c.traits.bidirectional or c.traits.causal))
    return f"an encoder run ({named(encoders)}), a causal LM run ({named(causal)}) or a {named(rest)} run"

CAUSAL = "causal"
"""The `layout` of a causal LM (its class's traits.pair_layout): GPT's transforms."""


@dataclass
class ClassifyConfig:
    task: str = "sst2"
    """The task (plmcli.data.tasks.registry) whose data, labels and metrics this serves."""
    num_labels: Size = 2
    """Classes; 1 = a regression output trained with MSE."""
    classifier_dropout: Optional[Probability] = None
    """Dropout before the head; None = the encoder's own dropout (BERT: 0.1)."""


class SequenceClassifier(TaskHead):
    """encoder -> pooled [CLS] (B, C) -> dropout -> Linear -> (B, num_labels)."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float | None = None):
        # A family with its own transfer recipe (ELMo: frozen biLM + mix + BiLSTM) supplies the head.
        own = encoder.task_head(num_labels, dropout) if isinstance(encoder, HasTaskHead) else None
        super().__init__(encoder, num_labels, dropout, head=own)
        self.feature_based = own is not None
        self.num_labels = num_labels

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        if self.feature_based:
            return self.head(self.encoder, input_ids, attention_mask)
        hidden, pooled = self.encoded(input_ids, token_type_ids, attention_mask)  # (B, T, C), (B, C)|None
        rep = pooled if pooled is not None else hidden[:, 0]
        return self.output(rep)  # (B, num_labels)


# ------------------------------------------------------------------ GPT-style transfer (causal LMs)


@dataclass(frozen=True)
class TransferTokens:
    """GPT's start <s>, delimiter $ (one or more ids) and extract <e> tokens, as ids of the run's vocabulary."""

    start: int
    delimiter: tuple
    extract: int

    @property
    def frame(self) -> Frame:
        return causal_frame(self.start, self.delimiter, self.extract)


def transfer_tokens(tokenizer, special_ids: dict) -> TransferTokens:
    """<s>, $ and <e> from tokens the pretrained model already knows.

    GPT added three new, randomly initialised embeddings. We do not: a larger vocabulary changes the
    backbone's shapes (config.json's vocab_size, the tied LM head), so the finetuned weights would no
    longer fit the architecture finetune and eval-only rebuild from the run's config, and the new rows
    would start untrained anyway. Instead:
    <s> = bos, else eos: in the packed pretraining stream the token before every document;
    <e> = eos, else bos: it ends every document, so its state has learned to close a text;
    $ = the tokenizer's reserved sep token when it has one; else the text " $" as the tokenizer encodes
        it (GPT's symbol; byte-level BPE always has it); else, when the vocabulary cannot spell "$"
        (a character vocabulary without it), eos: a document boundary is the nearest thing it knows.
    The choice depends only on the tokenizer and its roles, which a finetuned run keeps, so training,
    --eval-only and load_finetuned always build the same inputs.
    """
    start = special_ids.get("bos", special_ids.get("eos"))
    extract = special_ids.get("eos", special_ids.get("bos"))
    if start is None:
        raise PlmError("the run's tokenizer has no bos or eos token to start and end GPT-style inputs",
                       "finetune from a run whose tokenizer defines eos (the gpt and word2vec recipes do), or pretrain this "
                       "one again with tokenizer.special_tokens.eos set")
    if "sep" in special_ids:
        delimiter = (special_ids["sep"],)
    else:
        dollar = tuple(tokenizer.encode(" $", add_special_tokens=False).ids)
        known = dollar and special_ids.get("unk") not in dollar and tokenizer.decode(list(dollar)).strip() == "$"
        delimiter = dollar if known else (extract,)
    return TransferTokens(int(start), tuple(int(i) for i in delimiter), int(extract))


def frame_tokens(tokenizer, special_ids: dict, layout: str) -> TransferTokens | None:
    """The special tokens a row of `layout` is framed with, checked before any output exists: a causal LM's
    transfer tokens, or None for an encoder, whose [CLS] and [SEP] must then be there. No tokenizer (a model
    rebuilt to load weights into): nothing to frame, None."""
    if tokenizer is None:
        return None
    if layout == CAUSAL:
        return transfer_tokens(tokenizer, special_ids)
    require_roles(special_ids, ("cls", "sep"))
    return None


def encode_transformed(tokenizer, tokens: TransferTokens, texts_a: list[str], texts_b: list[str] | None,
                       max_seq_len: int, chunk: int = 8192) -> dict[str, np.ndarray]:
    """GPT's input transforms, truncated longest-first to `max_seq_len`: <s> a <e>, or <s> a $ b <e>.

    The same flat arrays as encode_pairs: `ids`, `offsets` (n+1), `type_start` (where b begins; the
    row length for single texts), `truncated`.
    """
    return encode_framed(tokenizer, tokens.frame, texts_a, texts_b, max_seq_len, chunk)


class CausalTransfer(TaskHead):
    """backbone -> per-token states -> each row's features (`Traits.pooling`: last / concat / mean / cnn) (B, C')
    -> dropout -> Linear -> (B, num_labels).

    A (B, R, T) input holds R orderings of one example (similarity: both orders); their features are added
    element-wise before the head. Rows are right-padded: attention_mask gives each row's length (causal
    attention, or a fresh RNN state, so the padding never reaches a real position; an encoder masks it).
    With `return_lm` the backbone's next-token logits (N, T, V) over the same rows come too, for the
    auxiliary LM loss. The dropout defaults to the backbone's (GPT: clf_pdrop 0.1); under `cnn` pooling to Kim's 0.5.
    """

    network_name = "backbone"

    def __init__(self, backbone: nn.Module, num_labels: int, dropout: float | None = None):
        pooling, states = traits_of(backbone).pooling, state_width(backbone)
        cnn = pooling == "cnn"
        width = ConvPooling.out_width() if cnn else states * (3 if pooling == "concat" else 1)
        super().__init__(backbone, num_labels, ConvPooling.dropout if cnn and dropout is None else dropout, width=width)
        self.pooling = pooling
        self.conv = ConvPooling(states) if cnn else None
        self.num_labels = num_labels

    def hidden_layers(self, traits) -> int:
        """None under `cnn` pooling: Kim's convolutions are the hidden layer, the output layer reads the pooled maps."""
        return 0 if traits.pooling == "cnn" else traits.head_layers

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, return_lm: bool = False):
        lead, T = input_ids.shape[:-1], input_ids.shape[-1]
        ids = input_ids.reshape(-1, T)  # (N, T), N = B·R
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.reshape(-1, T)
        h, _ = self.states(ids, None, mask)  # (N, T, C)
        lengths = mask.sum(-1)
        feats = self.conv(h, lengths) if self.conv is not None else pool(h, lengths, self.pooling)  # (N, C')
        feats = feats.reshape(*lead, -1)  # (B, [R,] C')
        if feats.dim() == 3:
            feats = feats.sum(1)  # (B, R, C') -> (B, C'): Radford's similarity, both orders added
        logits = self.output(feats)  # (B, num_labels)
        return (logits, self.lm_logits(h)) if return_lm else logits

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(N, T, V) next-token logits of the states: a stateful LM's `state_logits`, else GPT's lm_head."""
        net = self.backbone
        return net.state_logits(h) if isinstance(net, HasStateLogits) else net.lm_head(h)

    def freeze_unused(self, tokens: TransferTokens | None, with_lm: bool) -> list[str]:
        """As SequenceClassifier.freeze_unused (an untied LM head when λ = 0, say), starting from all trainable."""
        for p in self.parameters():
            p.requires_grad_(True)  # a backbone taken from a finetuned run may carry an earlier run's freezing
        probe_ids = [tokens.start, *tokens.delimiter, tokens.extract] if tokens else [0, 0]
        x = torch.tensor([probe_ids], device=next(self.parameters()).device)

        def probe():
            out = self(x, return_lm=with_lm)
            return out[0].float().sum() + out[1].float().sum() if with_lm else out.float().sum()

        return freeze_unreached(self, probe)


def lm_loss(lm_logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the real tokens after each row's first (fp32).

    Position t predicts token t+1 while t+1 is real, so every token of <s> x ($ y) <e> but <s> is a target,
    <e> included (as in the original finetune-transformer-lm code, whose mask covers the extract token).
    """
    T = input_ids.shape[-1]
    ids, mask = input_ids.reshape(-1, T), attention_mask.reshape(-1, T).bool()
    keep = mask[:, 1:]
    if kernels.enabled(lm_logits.device):  # a CPU reads the mask at no cost, and then skips the padding's softmax
        return F.cross_entropy(lm_logits[:, :-1][keep].float(), ids[:, 1:][keep])
    # the padding as ignored targets: selecting the real ones would make a GPU report how many there are
    return F.cross_entropy(lm_logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].masked_fill(~keep, -100).flatten(),
                           ignore_index=-100)


class Classify(TaskObjective):
    Config = ClassifyConfig
    stack_rows = True
    """Batches of examples with several rows (similarity's two orders) come as (B, R, T); Choice flattens them."""

    def __init__(self, cfg, tokenizer, special_ids, seq_len, task=None, layout: str = "cls_first"):
        """`layout`: the backbone class's `traits.pair_layout` (plmcli.data.pairs): where the encoder wants
        [CLS], or "causal" (CAUSAL) for GPT's transforms on a causal LM."""
        self.transfer = frame_tokens(tokenizer, special_ids, layout)
        super().__init__(cfg, tokenizer, special_ids, seq_len, task, layout)
        self.regression = cfg.num_labels == 1
        weight = float(self.task.options.aux_lm_weight)
        if not (math.isfinite(weight) and weight >= 0):
            raise PlmError(f"--aux-lm-weight {weight} is not a weight ≥ 0",
                           "use 0.5 (GPT's λ), or 0 to train on the task loss alone")
        self.aux_lm_weight = weight if layout == CAUSAL else 0.0  # an encoder has no next-token head

    @classmethod
    def backbone_problem(cls, model_cls) -> str | None:
        """Why runs of `model_cls` cannot be finetuned by this objective, or None when they can.

        Encoders (the pooled [CLS]); causal LMs that read a whole sequence at once and expose `hidden(ids)`
        (GPT-style transfer); families whose per-token states read one example at a time (`HasTokenStates`:
        RNN LMs, Transformer-XL with its memory reset per example, a Transformer's encoder), pooled as their
        traits say. Not: n-gram counts, a feed-forward NNLM (it sees only n-1 tokens), encoder-decoders
        without encoder states (models/heads.states_problem says why and what to use instead).
        """
        return None if transfers(model_cls) else states_problem(model_cls, needs)

    def build_model(self, encoder: nn.Module) -> nn.Module:
        if self.layout == CAUSAL:
            return self._causal_model(encoder, self.cfg.num_labels)
        self.check_encoder(encoder)
        model = SequenceClassifier(encoder, self.cfg.num_labels, self.cfg.classifier_dropout)
        model.frozen = model.freeze_unused(self.special_ids["cls"], self.special_ids["sep"])
        return model

    def _causal_model(self, backbone: nn.Module, num_outputs: int) -> CausalTransfer:
        kind = type(backbone)
        problem = self.backbone_problem(kind)
        if problem or kind.traits.pooling == "cls":
            raise PlmError(f"{kind.__name__} {problem or 'reads its pooled [CLS], not GPT-style inputs'}",
                           f"finetune from a {named(families_that(lambda c: transfers(c) and c.traits.pooling != 'cls'))} run")
        if not kind.traits.causal:
            self.aux_lm_weight = 0.0  # an encoder's states predict no next token: no auxiliary LM loss
        if self.aux_lm_weight > 0 and not isinstance(backbone, (HasStateLogits, HasLMHead)):
            raise PlmError(f"{kind.__name__} has no lm_head for the auxiliary LM loss", "pass --aux-lm-weight 0")
        model = CausalTransfer(backbone, num_outputs, self.cfg.classifier_dropout)
        model.frozen = model.freeze_unused(self.transfer, with_lm=self.aux_lm_weight > 0)
        return model

    # -------------------------------------------------------------- data

    def split_plan(self, splits: dict) -> dict:
        """train, validation (all eval splits, tagged by group) and the test splits the task has data for."""
        return {"train": ["train"], "validation": list(self.task.eval_splits),
                **{s: [s] for s in self.task.test_splits if s in splits}}

    def encode_split(self, splits: dict, name: str, parts, data_dir: Path) -> dict:
        examples = [e for p in parts for e in splits[p]]
        group = np.concatenate([np.full(len(splits[p]), g, dtype=np.int8) for g, p in enumerate(parts)])
        enc, rows = self._encode(examples)
        labels = np.array([-1 if e.label is None else e.label for e in examples],
                          dtype=np.float32 if self.regression else np.int64)
        save_split(data_dir / f"{name}.npz", {**enc, "rows": np.int64(rows), "labels": labels, "group": group,
                                              "example_id": np.array([str(e.id) for e in examples])})
        return {"documents": len(examples), "tokens": int(len(enc["ids"])),
                "truncated": int(enc["truncated"].reshape(-1, rows).any(1).sum())}

    def data_meta(self) -> dict:
        return {"transfer_tokens": asdict(self.transfer)} if self.transfer is not None else {}

    def _encode(self, examples) -> tuple[dict, int]:
        """(encode_pairs-style arrays, rows per example): example i is rows i·R .. i·R + R-1."""
        pair = any(e.text_b is not None for e in examples)
        a, b = [e.text_a for e in examples], [e.text_b or "" for e in examples] if pair else None
        if pair and self.task.symmetric_pair and self.layout == CAUSAL:
            # similarity and paraphrase have no natural order: both, <s> a $ b <e> and <s> b $ a <e>
            both_a = [t for x, y in zip(a, b) for t in (x, y)]
            both_b = [t for x, y in zip(a, b) for t in (y, x)]
            return encode_framed(self.tokenizer, self.frame, both_a, both_b, self.seq_len), 2
        return encode_framed(self.tokenizer, self.frame, a, b, self.seq_len), 1

    @property
    def frame(self) -> Frame:
        """How a row lays out its texts: the run's transfer tokens for a causal LM, else [CLS] and [SEP]
        where the encoder's layout puts them (plmcli.data.pairs)."""
        if self.layout == CAUSAL:
            return self.transfer.frame
        frame = encoder_frame(self.layout, self.special_ids.get("cls"), self.special_ids.get("sep"))
        require_roles(self.special_ids, ("cls", "sep"))
        return frame

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        d = load_split(Path(corpus_dir) / f"{split}.npz")
        ids, off, type_start = d["ids"], d["offsets"], d["type_start"]
        R = int(d["rows"]) if "rows" in d else 1
        labels, group, n = d["labels"], d["group"], (len(d["offsets"]) - 1) // R
        if n < 1:
            raise PlmError(f"the {split} split of {corpus_dir} has no examples", "check the task's data files")
        pad = self.pad_id

        def fetch(epochs, indices):
            idx = np.asarray(indices, dtype=np.int64)
            rows = (idx[:, None] * R + np.arange(R)).reshape(-1)  # (B·R,) the examples' rows, in order
            starts, lens = off[rows], off[rows + 1] - off[rows]
            pos = np.arange(lens.max())
            mask = pos[None, :] < lens[:, None]  # (B·R, T) dynamic right padding: T = longest in this batch
            x = np.full(mask.shape, pad, dtype=np.int64)
            x[mask] = ids[(starts[:, None] + pos[None, :])[mask]]
            types = mask & (pos[None, :] >= type_start[rows][:, None])
            shape = (len(idx), R, -1) if R > 1 and self.stack_rows else (len(rows), -1)
            as_t = lambda a: torch.from_numpy(a.astype(np.int64).reshape(shape))  # noqa: E731
            return {"input_ids": as_t(x), "token_type_ids": as_t(types), "attention_mask": as_t(mask),
                    "labels": torch.from_numpy(labels[idx]), "group": torch.from_numpy(group[idx].astype(np.int64)),
                    "index": torch.from_numpy(idx), "rows": R, "num_tokens": int(lens.sum()),
                    "lengths": lens.tolist()}  # for row_lengths in _logits: stays on the host as a list of ints

        # Training batches of similar lengths: dynamic padding then pads little (evaluation reads in order).
        lengths = np.diff(off)[: n * R].reshape(n, R).max(1)
        stream = BatchStream(n, batch_size, fetch, seed, rank, world, shuffle, lengths=lengths)
        stream.example_ids = d["example_id"]
        return stream

    # -------------------------------------------------------------- loss

    def _losses(self, logits, labels) -> torch.Tensor:
        """Per-example loss, in fp32."""
        if self.regression:
            return F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="none")
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def _preds(self, logits) -> torch.Tensor:
        return logits.squeeze(-1).float() if self.regression else logits.argmax(-1)

    def _logits(self, model, batch, with_lm: bool = False):
        """(task logits (B, num_labels), next-token logits of the rows or None)."""
        args = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        with devices.row_lengths(batch["attention_mask"], batch.get("lengths")):  # the backbone reads no lengths back
            return model(*args, return_lm=True) if with_lm else (model(*args), None)

    def loss_counts(self, batch):
        counts = {"task": torch.tensor(len(batch["labels"]))}  # examples
        if self.aux_lm_weight > 0:  # lm_loss's targets: every real token after its row's first
            mask = batch["attention_mask"]
            counts["lm"] = mask.reshape(-1, mask.shape[-1])[:, 1:].sum()
        return counts

    def step(self, model, batch, state=None):
        with_lm = self.aux_lm_weight > 0
        logits, lm_logits = self._logits(model, batch, with_lm)
        labels = batch["labels"]
        loss = self._losses(logits, labels).mean()
        count = torch.full((), float(len(labels)), device=labels.device)  # filled on the device, not copied
        metrics, parts = {}, {"task": loss}
        if with_lm:  # L3 = L2 + λ·L1 (Radford et al. 2018, eq. 5)
            lm = lm_loss(lm_logits, batch["input_ids"], batch["attention_mask"])
            metrics.update(task_loss=loss.detach() * count, lm_loss=lm.detach() * count)
            parts["lm"] = self.aux_lm_weight * lm
            loss = loss + parts["lm"]
        metrics["loss"] = loss.detach() * count
        if not self.regression:
            metrics["accuracy"] = (logits.argmax(-1) == labels).sum().float()
        return StepOutput(loss, metrics, count, parts=parts)

    # -------------------------------------------------------------- evaluation

    def eval_forward(self, model, batch):
        return self._logits(model, batch)[0]

    def eval_outputs(self, model, batch, logits, with_loss):
        return {"logits": logits.float(), "labels": batch["labels"], "group": batch["group"], "index": batch["index"]}

    def no_outputs(self, device):
        long = torch.zeros(0, dtype=torch.long, device=device)
        return {"logits": torch.zeros(0, self.cfg.num_labels, device=device),
                "labels": torch.zeros(0, device=device) if self.regression else long, "group": long, "index": long}

    def dev_metrics(self, got, stream) -> dict:
        """Loss and the task's metrics per eval split: val_loss, val_accuracy, val_mismatched_accuracy, ..."""
        losses = self._losses(got["logits"], got["labels"]).cpu().numpy()
        preds, labels = self._preds(got["logits"]).cpu().numpy(), got["labels"].cpu().numpy()
        group = got["group"].cpu().numpy()
        res = {}
        for g, prefix in enumerate(self.task.eval_splits.values()):
            sel = group == g
            if not sel.any():
                continue
            res[f"val_{prefix}loss"] = float(losses[sel].mean())
            res.update({f"val_{prefix}{k}": v for k, v in self.task.score(preds[sel], labels[sel]).items()})
        return res

    def predictions(self, got, stream) -> tuple[np.ndarray, np.ndarray]:
        """(example ids, class indices or scores)."""
        index = got["index"].cpu().numpy()
        return stream.example_ids[index], self._preds(got["logits"]).cpu().numpy()
