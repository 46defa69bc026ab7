"""Sequence classification and regression on an encoder: GLUE-style finetuning (Devlin et al. 2018, §4.1).

The model is the pretrained encoder + dropout + one linear layer on the pooled [CLS] state (the
encoder's pooler when it has one, else the [CLS] hidden state). [CLS] leads each example unless the
encoder's class says `pair_layout = "cls_last"` (XLNet: a [SEP] b [SEP] [CLS]). Cross-entropy for
classes, MSE for a single regression output (STS-B). Batches are padded only to their own longest sequence.
Evaluation collects every prediction, so task metrics that are not means (MCC, F1, correlations)
are computed over the whole dev set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plmcli.data.batching import BatchStream
from plmcli.data.tasks import encode_pairs, load_split, require_roles, save_split, write_meta
from plmcli.errors import PlmError
from plmcli.objectives.base import Objective, StepOutput


@dataclass
class ClassifyConfig:
    task: str = "sst2"
    """The task (plmcli.data.tasks.registry) whose data, labels and metrics this serves."""
    num_labels: int = 2
    """Classes; 1 = a regression output trained with MSE."""
    classifier_dropout: Optional[float] = None
    """Dropout before the head; None = the encoder's own dropout (BERT: 0.1)."""


class SequenceClassifier(nn.Module):
    """encoder -> pooled [CLS] (B, C) -> dropout -> Linear -> (B, num_labels)."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float | None = None):
        super().__init__()
        self.encoder = encoder
        self.num_labels = num_labels
        self.frozen: list[str] = []
        cfg = encoder.cfg
        # One segment embedding (RoBERTa) or none: pairs are told apart by [SEP] alone.
        self.use_types = getattr(cfg, "type_vocab_size", 2) >= 2
        # A family with its own transfer recipe (ELMo: frozen biLM + mix + BiLSTM) supplies the head.
        self.feature_based = hasattr(encoder, "task_head")
        if self.feature_based:
            self.head = encoder.task_head(num_labels, dropout)
            return
        self.dropout = nn.Dropout(getattr(cfg, "dropout", 0.1) if dropout is None else dropout)
        self.head = nn.Linear(cfg.d_model, num_labels)
        nn.init.normal_(self.head.weight, std=getattr(cfg, "init_std", 0.02))  # as BERT's classifier
        nn.init.zeros_(self.head.bias)

    @property
    def max_positions(self) -> int:
        return self.encoder.max_positions

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        if self.feature_based:
            return self.head(self.encoder, input_ids, attention_mask)
        types = token_type_ids if self.use_types else None
        hidden, pooled = self.encoder.encode(input_ids, types, attention_mask)  # (B, T, C), (B, C)|None
        rep = pooled if pooled is not None else hidden[:, 0]
        return self.head(self.dropout(rep))  # (B, num_labels)

    def freeze_unused(self, cls_id: int, sep_id: int) -> list[str]:
        """Freeze the parameters a classification pass never reaches (MLM/NSP heads) and name them.

        They get no gradient anyway; frozen, the optimizer holds no state for them and DDP does not
        wait for their gradients. They stay in the saved weights, so the file loads back as is.
        """
        p0 = next(self.parameters())
        x = torch.tensor([[cls_id, sep_id, sep_id], [cls_id, sep_id, sep_id]], device=p0.device)
        types = torch.tensor([[0, 0, 1], [0, 0, 0]], device=p0.device)
        mask = torch.tensor([[1, 1, 1], [1, 1, 0]], device=p0.device)
        was_training = self.training
        self.eval()  # no dropout: the probe draws nothing from the RNG
        self.zero_grad(set_to_none=True)
        self(x, types, mask).float().sum().backward()
        unused = [n for n, p in self.named_parameters() if p.requires_grad and p.grad is None]
        for n, p in self.named_parameters():
            if p.grad is None:
                p.requires_grad_(False)
        self.zero_grad(set_to_none=True)
        self.train(was_training)
        return unused


class Classify(Objective):
    Config = ClassifyConfig

    def __init__(self, cfg, tokenizer, special_ids, seq_len, task=None, layout: str = "cls_first"):
        """`layout`: where the encoder wants [CLS] (its class's `pair_layout`; see encode_pairs)."""
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if tokenizer is not None:  # before any output exists: [CLS] a [SEP] b [SEP] needs both
            require_roles(special_ids, ("cls", "sep"))
        self.layout = layout
        if task is None:
            from plmcli.data.tasks.registry import get_task

            task = get_task(cfg.task)
        self.task = task
        self.regression = cfg.num_labels == 1
        self.pad_id = special_ids.get("pad", 0)

    @classmethod
    def backbone_problem(cls, model_cls) -> str | None:
        """Why runs of `model_cls` cannot be finetuned by this objective, or None when they can."""
        if getattr(model_cls, "encoder", False):
            return None
        if getattr(model_cls, "causal", False):
            return "is a causal LM; it needs an encoder run"
        return "has no encoder to finetune; it needs an encoder run"

    def build_model(self, encoder: nn.Module) -> SequenceClassifier:
        if not getattr(type(encoder), "encoder", False):
            raise PlmError(f"{type(encoder).__name__} has no encoder interface", "finetune from an encoder run (bert recipes)")
        model = SequenceClassifier(encoder, self.cfg.num_labels, self.cfg.classifier_dropout)
        model.frozen = model.freeze_unused(self.special_ids["cls"], self.special_ids["sep"])
        return model

    # -------------------------------------------------------------- data

    def encode_splits(self, splits: dict, data_dir: Path) -> dict:
        """Encode train / validation (all eval splits, tagged by group) / test splits into DATA_DIR."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        plan = {"train": ["train"], "validation": list(self.task.eval_splits),
                **{s: [s] for s in self.task.test_splits if s in splits}}
        counts = {}
        for name, parts in plan.items():
            examples = [e for p in parts for e in splits[p]]
            group = np.concatenate([np.full(len(splits[p]), g, dtype=np.int8) for g, p in enumerate(parts)])
            pair = any(e.text_b is not None for e in examples)
            enc = encode_pairs(self.tokenizer, self.special_ids, [e.text_a for e in examples],
                               [e.text_b or "" for e in examples] if pair else None, self.seq_len,
                               layout=self.layout)
            labels = np.array([-1 if e.label is None else e.label for e in examples],
                              dtype=np.float32 if self.regression else np.int64)
            save_split(data_dir / f"{name}.npz", {**enc, "labels": labels, "group": group,
                                                  "example_id": np.array([str(e.id) for e in examples])})
            counts[name] = {"documents": len(examples), "tokens": int(len(enc["ids"])),
                            "truncated": int(enc["truncated"].sum())}
        meta = {"task": self.task.name, "max_seq_len": self.seq_len, "counts": counts, "splits": plan}
        write_meta(data_dir, meta)
        return meta

    def stream(self, corpus_dir, split, batch_size, seed, rank, world, shuffle):
        d = load_split(Path(corpus_dir) / f"{split}.npz")
        ids, off, type_start = d["ids"], d["offsets"], d["type_start"]
        labels, group, n = d["labels"], d["group"], len(d["offsets"]) - 1
        if n < 1:
            raise PlmError(f"the {split} split of {corpus_dir} has no examples", "check the task's data files")
        pad = self.pad_id

        def fetch(epochs, indices):
            idx = np.asarray(indices, dtype=np.int64)
            starts, lens = off[idx], off[idx + 1] - off[idx]
            pos = np.arange(lens.max())
            mask = pos[None, :] < lens[:, None]  # (B, T) dynamic padding: T = longest in this batch
            x = np.full(mask.shape, pad, dtype=np.int64)
            x[mask] = ids[(starts[:, None] + pos[None, :])[mask]]
            types = mask & (pos[None, :] >= type_start[idx][:, None])
            return {"input_ids": torch.from_numpy(x), "token_type_ids": torch.from_numpy(types.astype(np.int64)),
                    "attention_mask": torch.from_numpy(mask.astype(np.int64)), "labels": torch.from_numpy(labels[idx]),
                    "group": torch.from_numpy(group[idx].astype(np.int64)), "index": torch.from_numpy(idx),
                    "num_tokens": int(lens.sum())}

        stream = BatchStream(n, batch_size, fetch, seed, rank, world, shuffle)
        stream.example_ids = d["example_id"]
        return stream

    def tokens_in(self, batch) -> int:
        return batch["num_tokens"]

    # -------------------------------------------------------------- loss

    def _losses(self, logits, labels) -> torch.Tensor:
        """Per-example loss, in fp32."""
        if self.regression:
            return F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="none")
        return F.cross_entropy(logits.float(), labels, reduction="none")

    def _preds(self, logits) -> torch.Tensor:
        return logits.squeeze(-1).float() if self.regression else logits.argmax(-1)

    def step(self, model, batch, state=None):
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        labels = batch["labels"]
        loss = self._losses(logits, labels).mean()
        count = torch.tensor(float(len(labels)), device=labels.device)
        metrics = {"loss": loss.detach() * count}
        if not self.regression:
            metrics["accuracy"] = (logits.argmax(-1) == labels).sum().float()
        return StepOutput(loss, metrics, count)

    # -------------------------------------------------------------- evaluation

    def _run(self, model, stream, max_batches, device, autocast) -> dict:
        out = {"logits": [], "labels": [], "group": [], "index": []}
        n = stream.batches_per_epoch()
        with torch.no_grad():
            for k in range(min(n, max_batches) if max_batches else n):
                batch = stream[k]
                if batch is None:
                    continue
                batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
                with autocast():
                    logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
                out["logits"].append(logits.float())
                for key in ("labels", "group", "index"):
                    out[key].append(batch[key])
        if not out["logits"]:  # a rank with no samples (tiny dev set, many processes) still joins the gather
            long = torch.zeros(0, dtype=torch.long, device=device)
            return {"logits": torch.zeros(0, self.cfg.num_labels, device=device), "group": long, "index": long,
                    "labels": torch.zeros(0, device=device) if self.regression else long}
        return {k: torch.cat(v) for k, v in out.items()}

    def evaluate(self, accelerator, model, stream, max_batches) -> dict:
        """Loss and the task's metrics per eval split: val_loss, val_accuracy, val_mismatched_accuracy, ..."""
        got = self._run(model, stream, max_batches, accelerator.device, accelerator.autocast)
        if accelerator.num_processes > 1:  # every sample sits on exactly one rank; pads carry index -1
            got = {k: accelerator.gather(accelerator.pad_across_processes(v, dim=0, pad_index=-1 if k == "index" else 0))
                   for k, v in got.items()}
            keep = got["index"] >= 0
            got = {k: v[keep] for k, v in got.items()}
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

    def predict(self, model, stream) -> tuple[np.ndarray, np.ndarray]:
        """(example ids, predictions) over the whole stream on this process: class indices or scores."""
        from contextlib import nullcontext

        device = next(model.parameters()).device
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else nullcontext
        was_training = model.training
        model.eval()
        try:
            got = self._run(model, stream, 0, device, autocast)
        finally:
            model.train(was_training)
        index = got["index"].cpu().numpy()
        return stream.example_ids[index], self._preds(got["logits"]).cpu().numpy()
