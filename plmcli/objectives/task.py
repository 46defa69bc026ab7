"""What a finetuning objective provides to `plm finetune` (plmcli.pipelines.finetune, runs.finetuned_model), and the
evaluation and prediction that every one of them runs the same way.

A task objective is an Objective (the loop trains it with `stream`, `loss_counts` and `step`) for one Task of
plmcli.data.tasks. The finetune pipeline builds it as runs.task_objective does, from the task and the backbone's
class; it asks the class's `backbone_problem` before anything is loaded, then calls `encode_splits`,
`build_model`, `aux_lm_weight` (turned off for feature-based use), `select_metric`, `stream` and `evaluate`
(the loop, after every epoch; --eval-only once) and `write_test_predictions`.

Evaluation and prediction read every example's output, not a mean of `step`'s metrics: span QA decodes
windows into answers, tagging joins windows into sentences, MCC and F1 are not means. A subclass says what one
batch gives (`eval_forward` under autocast, `eval_outputs` after it, in fp32) and what the whole split's
outputs mean (`dev_metrics`, `predictions`); the pass over the batches, the gather over processes and the
model's eval mode are here.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

from plmcli.data.tasks import write_meta
from plmcli.errors import PlmError
from plmcli.objectives.base import Objective


def eval_batches(stream, max_batches: int, device):
    """This process's evaluation batches on `device`: one pass over the stream (the first `max_batches`
    when set), skipping the empty batches a short last pass leaves."""
    n = stream.batches_per_epoch()
    for k in range(min(n, max_batches) if max_batches else n):
        batch = stream[k]
        if batch is not None:
            yield {key: v.to(device) if torch.is_tensor(v) else v for key, v in batch.items()}


def inference_autocast(device: torch.device):
    """Autocast for prediction outside the loop (no accelerator to ask): bf16 where the GPU has it, else none."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext


class TaskObjective(Objective):
    """A finetuning objective: its task's data, head, loss, dev metrics and test predictions.

    `Config` is a dataclass with `task` (a name in plmcli.data.tasks.registry), `num_labels` and
    `classifier_dropout`. Subclasses implement `backbone_problem`, `build_model`, `split_plan` and `encode_split`
    (what `encode_splits` writes), `stream`, `loss_counts`, `step`, and the evaluation hooks `eval_forward`,
    `eval_outputs`, `no_outputs`, `dev_metrics` and `predictions`.
    """

    aux_lm_weight: float = 0.0
    """λ of an auxiliary language-modelling loss added to the task loss (GPT-style transfer, classify.py). The
    finetune pipeline sets it to 0 for feature-based use: a frozen backbone's LM trains nothing, and mixed layers
    are not the states its LM head reads."""

    def __init__(self, cfg, tokenizer, special_ids: dict[str, int], seq_len: int, task=None,
                 layout: str = "cls_first"):
        """`task`: the Task (default: `cfg.task` from the registry); `layout`: the backbone class's
        `traits.pair_layout` (plmcli.data.pairs), "causal" for GPT's input transforms on a causal LM."""
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if task is None:
            from plmcli.data.tasks.registry import get_task

            task = get_task(cfg.task)
        self.task, self.layout = task, layout
        self.pad_id = special_ids.get("pad", 0)

    # -------------------------------------------------------------- the model

    @classmethod
    def backbone_problem(cls, model_cls) -> str | None:
        """Why runs of `model_cls` cannot be finetuned by this objective (one clause, "; it needs ..." naming
        what can), or None when they can. Read from the class alone, before any weights are loaded."""
        raise NotImplementedError(f"{cls.__name__} must say which backbone classes it finetunes (backbone_problem)")

    def build_model(self, backbone: nn.Module) -> nn.Module:
        """The task model: `backbone` + this task's head (a heads.TaskHead), with `frozen` naming the backbone
        parameters the task never reaches."""
        raise NotImplementedError(f"{type(self).__name__} must build its task model on a backbone (build_model)")

    @staticmethod
    def check_encoder(backbone: nn.Module) -> None:
        """A head that reads [CLS] or every token's two-sided state needs an encoder."""
        if not type(backbone).traits.bidirectional:
            raise PlmError(f"{type(backbone).__name__} has no encoder interface", "finetune from an encoder run (bert recipes)")

    # -------------------------------------------------------------- data

    def encode_splits(self, splits: dict, data_dir: Path) -> dict:
        """Encode the task's splits (`Task.load`'s split name -> examples) into DATA_DIR: one file per encoded
        split (`split_plan`) and meta.json, written last (a directory with it is complete); returns the meta."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        plan = self.split_plan(splits)
        counts = {name: self.encode_split(splits, name, parts, data_dir) for name, parts in plan.items()}
        meta = {"task": self.task.name, "max_seq_len": self.seq_len, "counts": counts, "splits": plan,
                **self.data_meta()}
        write_meta(data_dir, meta)
        return meta

    def split_plan(self, splits: dict) -> dict:
        """Encoded split ("train", "validation", the test splits) -> the task splits it is made of."""
        raise NotImplementedError(f"{type(self).__name__} must say which task splits it encodes (split_plan)")

    def encode_split(self, splits: dict, name: str, parts, data_dir: Path) -> dict:
        """Write encoded split `name` (from the task splits `parts`) into `data_dir`; its meta.json counts:
        `documents` (the examples a batch holds and an epoch counts), `tokens`, `truncated`, ..."""
        raise NotImplementedError(f"{type(self).__name__} must encode a split of its task (encode_split)")

    def data_meta(self) -> dict:
        """What meta.json records beyond the counts and the plan (e.g. the tokens the inputs were framed with)."""
        return {}

    def tokens_in(self, batch) -> int:
        return batch["num_tokens"]

    # -------------------------------------------------------------- evaluation and prediction

    @property
    def select_metric(self) -> str:
        """The dev metric the best weights are chosen on (higher is better): the task's main metric."""
        return f"val_{self.task.main_metric}"

    def eval_forward(self, model, batch: dict):
        """The model's output on an evaluation batch: run under autocast, with no gradient."""
        raise NotImplementedError(f"{type(self).__name__} must run its model on an evaluation batch (eval_forward)")

    def eval_outputs(self, model, batch: dict, out, with_loss: bool) -> dict[str, torch.Tensor]:
        """What a batch contributes, from `eval_forward`'s `out` (outside autocast): name -> a tensor with one
        row per example, `index` (the example's position in the split) among them. `with_loss`: evaluation
        (True) wants each example's loss too; prediction (False) reads splits without labels."""
        raise NotImplementedError(f"{type(self).__name__} must say what an evaluation batch gives (eval_outputs)")

    def no_outputs(self, device) -> dict[str, torch.Tensor]:
        """`eval_outputs`' tensors with no rows, under the same names in the same order (the processes gather
        them one name after another): what a process with no examples joins the gather with."""
        raise NotImplementedError(f"{type(self).__name__} must give empty evaluation outputs (no_outputs)")

    def dev_metrics(self, got: dict[str, torch.Tensor], stream) -> dict:
        """The dev split's metrics (`val_` + each eval split's prefix + name, the loss included) from every
        example's outputs (`got`: `eval_outputs` of all processes, in no particular order)."""
        raise NotImplementedError(f"{type(self).__name__} must score its dev outputs (dev_metrics)")

    def predictions(self, got: dict[str, torch.Tensor], stream) -> tuple:
        """(example ids, predictions as the task's `write_predictions` takes them) from a split's outputs."""
        raise NotImplementedError(f"{type(self).__name__} must turn outputs into predictions (predictions)")

    def collect(self, model, stream, max_batches: int, device, autocast, with_loss: bool) -> dict[str, torch.Tensor]:
        """`eval_outputs` of this process's share of the stream, concatenated."""
        out: dict[str, list] = {}
        with torch.no_grad():
            for batch in eval_batches(stream, max_batches, device):
                with autocast():
                    raw = self.eval_forward(model, batch)
                for key, value in self.eval_outputs(model, batch, raw, with_loss).items():
                    out.setdefault(key, []).append(value)
        if not out:  # a rank with no examples (tiny dev set, many processes) still joins the gather
            return self.no_outputs(device)
        return {k: torch.cat(v) for k, v in out.items()}

    def evaluate(self, accelerator, model, stream, max_batches) -> dict:
        """Loss and the task's metrics over the dev split, every process's examples together."""
        got = self.collect(model, stream, max_batches, accelerator.device, accelerator.autocast, with_loss=True)
        if accelerator.num_processes > 1:  # every example sits on exactly one rank; pads carry index -1
            got = {k: accelerator.gather(accelerator.pad_across_processes(v, dim=0, pad_index=-1 if k == "index" else 0))
                   for k, v in got.items()}
            keep = got["index"] >= 0
            got = {k: v[keep] for k, v in got.items()}
        return self.dev_metrics(got, stream)

    def predict(self, model, stream) -> tuple:
        """(example ids, predictions) over the whole stream on this process, the model in eval mode meanwhile."""
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            got = self.collect(model, stream, 0, device, inference_autocast(device), with_loss=False)
        finally:
            model.train(was_training)
        return self.predictions(got, stream)

    def predict_split(self, model, data_dir: Path, split: str, batch_size: int, seed: int) -> tuple:
        """`predict` over the encoded split `split` of DATA_DIR, read in order."""
        return self.predict(model, self.stream(data_dir, split, batch_size, seed, 0, 1, shuffle=False))

    def write_test_predictions(self, model, data_dir: Path, counts: dict, out_dir: Path, batch_size: int, seed: int,
                               task=None) -> dict:
        """Predict every test split DATA_DIR holds examples of (`counts`: encoded split -> examples) and write
        each into OUT as the task's submission file; {split: file name}. `task`: the Task that read the test
        data, when it is not this objective's (--eval-only: a writer may need what its reader kept, CoNLL its words)."""
        task = self.task if task is None else task
        written = {}
        for split, filename in task.test_splits.items():
            if counts.get(split):
                ids, preds = self.predict_split(model, data_dir, split, batch_size, seed)
                task.write_predictions(Path(out_dir) / filename, ids, preds)
                written[split] = filename
        return written
