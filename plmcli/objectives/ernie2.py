"""ERNIE 2.0's structure-aware pretraining (Sun et al. 2019, §4.2.2) with masked LM on the one loop.

Loss = MLM + reorder_weight · CE(sentence reordering) + distance_weight · CE(sentence distance), each CE a
mean over the micro-batch's instances of that task (each static instance serves one task, see
data/sentence_tasks.py); NSP is off. The two heads read the pooled [CLS] of a BERT-family model
(`model.reorder_classes`, `model.distance_classes`), which `configure_model` sets from these settings.
The paper's other tasks (knowledge masking: objective mlm's masking knowledge; its semantic tasks) and its
continual schedule of tasks are not here: this is its multi-task loss on one stream of instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from plmcli.config_schema import Fraction, NonNegative, Range
from plmcli.data.sentence_tasks import FORMAT, MAX_SEGMENTS, check, num_classes
from plmcli.data.store import read_meta
from plmcli.errors import PlmError
from plmcli.models.bert import Bert
from plmcli.models.device import row_lengths
from plmcli.models.spanbert import SpanBertOutput
from plmcli.objectives.base import NoBatches, StepOutput
from plmcli.objectives.mlm import (MLM_FORMAT, PAIRS, MaskedLM, MLMConfig, collate_static, sentence_loss, static_split,
                                   span_boundary_loss)

DISTANCE_CLASSES = 3
"""Adjacent, same document, other document."""


@dataclass
class Ernie2Config(MLMConfig):
    pairs: Literal[PAIRS] = "none"
    """ERNIE 2.0 has no NSP / SOP (its sentence tasks take their place): none."""
    reorder_segments: Annotated[int, Range(1, MAX_SEGMENTS)] = 3
    """m: a paragraph is split into 1..m segments and shuffled; Σ_{n=1}^{m} n! classes (3: 9)."""
    reorder_prob: Fraction = 0.5
    """Share of instances that are sentence reordering; the rest are sentence distance. 0 or 1 leaves one
    task (and its head) out."""
    reorder_weight: NonNegative = 1.0
    """Weight of the sentence reordering loss added to the MLM loss."""
    distance_weight: NonNegative = 1.0
    """Weight of the sentence distance loss added to the MLM loss."""


class Ernie2(MaskedLM):
    Config = Ernie2Config
    default_data = "chinese-sample.txt"

    def __init__(self, cfg: Ernie2Config, tokenizer, special_ids: dict[str, int], seq_len: int):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if cfg.pairs != "none":
            raise PlmError(f"objective ernie2 has no NSP / SOP (objective.pairs is {cfg.pairs}): its sentence "
                           "reordering and distance tasks take their place", "--set objective.pairs=none")
        if cfg.dynamic:
            raise PlmError("objective ernie2 trains on static instances (each one a sentence task), and objective.dynamic is true",
                           "--set objective.dynamic=false")
        if cfg.packing != "window":  # objective.cross_documents false (its older name) arrives as doc_sentences
            raise PlmError(f"objective.packing {cfg.packing} applies to objective mlm's packed sentences, not to ernie2 "
                           "(its instances are its sentence tasks)", "drop objective.packing (and objective.cross_documents)")
        if [float(p) for p in cfg.replace_probs] != [0.8, 0.1, 0.1]:
            raise PlmError("objective.replace_probs applies to dynamic masking; ernie2's static instances use BERT's 80/10/10",
                           "leave replace_probs at [0.8, 0.1, 0.1]")
        check(seq_len, cfg.reorder_segments, cfg.reorder_prob, cfg.short_seq_prob, cfg.dupe_factor)
        self.classes = {"reorder": num_classes(cfg.reorder_segments) if cfg.reorder_prob > 0 else 0,
                        "distance": DISTANCE_CLASSES if cfg.reorder_prob < 1 else 0}

    def configure_model(self, model_cfg, vocab_size):
        """The heads the tasks need, on the pooled [CLS]: the recipe's model section need not name them."""
        super().configure_model(model_cfg, vocab_size)
        model_cfg.reorder_classes, model_cfg.distance_classes = self.classes["reorder"], self.classes["distance"]

    def check_model(self, model):
        super().check_model(model)
        if not isinstance(model, Bert):
            raise PlmError(f"objective ernie2 puts ERNIE 2.0's sentence heads on family bert, not {type(model).__name__}",
                           "use recipe ernie2-chinese-mini (model.family: bert)")
        have = {"reorder": model.cfg.reorder_classes, "distance": model.cfg.distance_classes}
        if have != self.classes:
            raise PlmError(f"the model's sentence heads ({have['reorder']} reordering, {have['distance']} distance "
                           f"classes) do not fit objective ernie2's settings ({self.classes['reorder']}, "
                           f"{self.classes['distance']})", "keep objective.reorder_segments and reorder_prob "
                           "the same in every phase of a run")

    # ------------------------------------------------------------ data

    def prepare(self, corpus_dir, cache_root=None, num_proc: int = 1) -> Path:
        """The directory `stream` reads: ERNIE 2.0 instances built from a tokenized corpus into the cache."""
        from plmcli.data.store import cache_key

        corpus_dir, c = Path(corpus_dir), self.cfg
        meta = read_meta(corpus_dir) or {}
        if meta.get("format") == FORMAT:
            built = {k: meta.get(k) for k in ("reorder_segments", "max_seq_len")}
            if built["reorder_segments"] != c.reorder_segments or int(built["max_seq_len"] or 0) > self.seq_len:
                raise PlmError(f"'{corpus_dir}' holds ERNIE 2.0 instances of {built['reorder_segments']} segments and up to "
                               f"{built['max_seq_len']} tokens, not objective.reorder_segments {c.reorder_segments} and "
                               f"train.seq_len {self.seq_len}", "pass the `plm tokenize` directory (or the text) instead")
            return corpus_dir
        if meta.get("format") == MLM_FORMAT:
            raise PlmError(f"'{corpus_dir}' holds make-mlm-data instances, which carry no sentence-task labels",
                           "pass the `plm tokenize` directory (or the text) instead")
        from plmcli.data.corpus import default_cache_dir
        from plmcli.data.sentence_tasks import build_sentence_tasks

        settings = dict(max_seq_len=self.seq_len, reorder_segments=c.reorder_segments, reorder_prob=c.reorder_prob,
                        short_seq_prob=c.short_seq_prob, dupe_factor=c.dupe_factor, mask_prob=c.mask_prob,
                        max_predictions=c.max_predictions, masking=c.masking, lexicon=c.lexicon,
                        span_p=c.span_p, span_max=c.span_max, ngram_probs=tuple(c.ngram_probs))
        keyed = {k: v for k, v in settings.items() if k != "lexicon"}
        if c.lexicon:
            from plmcli.data.masking import lexicon_key

            keyed["lexicon"] = lexicon_key(c.lexicon)  # by content: an edited lexicon gets new data
        out = Path(cache_root or default_cache_dir()) / "ernie2" / cache_key(
            meta.get("key"), meta.get("tokenizer", {}).get("hash"), keyed)[:16]
        build_sentence_tasks(corpus_dir, out, **settings)
        return out

    def corpus_stream(self, data_dir, split, batch_size, seed, rank, world, shuffle):
        n, fetch = self.samples(data_dir, split, seed, shuffle, needed=shuffle)
        if n < 1:
            return NoBatches()
        # Not batched by length (as make-mlm-data's instances are): a paragraph is longer than a sentence
        # pair, so length groups would be one task each; mixed micro-batches carry both losses every step.
        return self.batch_stream(n, fetch, batch_size, seed, rank, world, shuffle)

    def samples(self, data_dir, split, seed, shuffle, needed):
        """This split's instances (a mix's source too: data/mixing.py), read as Arrow tables."""
        data_dir = Path(data_dir)
        if read_meta(data_dir, FORMAT) is None:
            raise PlmError(f"'{data_dir}' holds no ERNIE 2.0 instances", "pass a `plm tokenize` directory or text files")
        ds = static_split(data_dir, split, needed)
        return len(ds), lambda epochs, idx: ds[list(idx)]

    def collate(self, parts: list) -> dict:
        import pyarrow as pa

        return collate(parts[0] if len(parts) == 1 else pa.concat_tables(parts), self.special_ids.get("pad", 0))

    @staticmethod
    def mix_problem(cfg):
        return None

    @staticmethod
    def streaming_problem(c):
        return ("objective ernie2 trains on static instances built from a tokenized corpus", "drop --streaming")

    # ------------------------------------------------------------ loss

    def loss_counts(self, batch):
        return {"mlm": torch.tensor(batch["mlm_labels"].numel()),  # masked tokens; each task's labelled rows
                **{task: (batch[f"{task}_labels"] >= 0).sum() for task in ("reorder", "distance")}}

    def step(self, model, batch, state=None):
        with row_lengths(batch.get("attention_mask"), batch.get("lengths")):  # the encoder reads no lengths back
            out = model(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"),
                        batch["mlm_positions"])
        labels = batch["mlm_labels"]
        logits = out.mlm_logits.float()
        n = labels.numel()
        mlm = F.cross_entropy(logits, labels) if n else logits.sum() * 0.0
        count = labels.new_full((), n)  # filled on the device, not copied from the host
        parts, metrics = {"mlm": mlm}, {"mlm_loss": mlm.detach() * count}
        weights = {"reorder": self.cfg.reorder_weight, "distance": self.cfg.distance_weight}
        for task, task_logits in (("reorder", out.reorder_logits), ("distance", out.distance_logits)):
            if task_logits is None or not self.classes[task]:
                continue
            if task_logits.shape[-1] != self.classes[task]:  # a later phase that changed the settings
                raise PlmError(f"the model's {task} head has {task_logits.shape[-1]} classes, objective ernie2's "
                               f"settings need {self.classes[task]}", "keep objective.reorder_segments the same in every phase")
            part, acc = sentence_loss(task_logits.float(), batch[f"{task}_labels"])
            parts[task] = weights[task] * part
            metrics |= {f"{task}_loss": part.detach() * count, f"{task}_acc": acc.detach() * count}
        if out.nsp_logits is not None:  # a pooler-and-NSP model: the idle NSP head stays in the graph for DDP
            parts["mlm"] = parts["mlm"] + 0.0 * out.nsp_logits.sum()
        sbo_logits = out.sbo_logits if isinstance(out, SpanBertOutput) else None
        if sbo_logits is not None:
            sbo = span_boundary_loss(sbo_logits, labels.index_select(0, out.sbo_index), count, out.sbo_keep)
            parts["mlm"] = parts["mlm"] + self.cfg.sbo_weight * sbo
            metrics["sbo_loss"] = sbo.detach() * count
        loss = sum(parts.values())
        metrics["loss"] = loss.detach() * count
        return StepOutput(loss, metrics, count, parts=parts)


def collate(tbl, pad: int) -> dict:
    """ERNIE 2.0 rows (an Arrow table) -> make-mlm-data's padded batch plus the two tasks' labels (-1: the
    row serves the other task)."""
    batch = collate_static(tbl, pad)
    for task in ("reorder", "distance"):
        batch[f"{task}_labels"] = torch.from_numpy(tbl[f"{task}_label"].to_numpy().astype("int64"))
    return batch
