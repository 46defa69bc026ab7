"""LoRA finetuning (Hu et al. 2021) through peft: low-rank adapters in a backbone's Linear layers, the backbone frozen.

`plm finetune --lora-r R` (the finetune config's `lora` section, config_sections.FinetuneLoraConfig): after the task
model is built, `add_adapters` freezes every backbone weight and lets peft wrap the target Linear layers (plm's own
kernels.Linear is an nn.Linear, which peft's LoRA layer takes): each computes W x + (alpha / r) B A x, with B zero at
the start, so training starts from the pretrained function. The optimizer sees only what requires a gradient
(train.optim.build_optimizer): the adapters and the task head, which lives outside the backbone.

When training ends, `save_merged` writes the adapters alone to OUT/adapter.safetensors (keys relative to the
backbone, peft's names without the adapter name; the settings in its metadata), merges B A into W, puts the plain
Linear layers back and rewrites OUT/model.safetensors: a finetuned run like any other, which --eval-only, export and
eval-ppl read unchanged.

Targets: by default the Linear layers inside the family's attention modules (base.AdaptsAttention: BERT, ALBERT,
NEZHA, SpanBERT, ELECTRA, GPT, Transformer-XL, XLNet, the Transformer's encoder, each calling those layers as
modules). A family without them (RNNs, word2vec, ELMo, the RNN seq2seq) is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from plmcli.errors import PlmError, needs
from plmcli.runs import WEIGHTS

ADAPTER = "adapter.safetensors"
"""OUT/adapter.safetensors: the trained LoRA A and B matrices alone."""

if TYPE_CHECKING:
    from torch import nn

FEATURE = "LoRA finetuning (--lora-r)"


def check_lora(backbone, lora, freeze: bool, family: str, run_label: str) -> None:
    """Refuse, in one line before anything is written, a LoRA section this backbone cannot take."""
    if not lora.r:
        return
    if freeze:
        raise PlmError("--lora-r with --freeze: a frozen backbone runs without gradients, adapters included",
                       "drop --freeze (LoRA freezes the backbone's own weights) or --lora-r")
    target_modules(backbone, lora.targets, family, run_label)


def target_modules(backbone: nn.Module, targets: list[str], family: str = "", run_label: str = "the run") -> list[str]:
    """The dotted names (in `backbone`) of the Linear layers LoRA adapts: those whose name ends with one of
    `targets`, or with none given, those inside the family's self-attention modules."""
    from torch import nn

    from plmcli.models.base import AdaptsAttention

    if not isinstance(backbone, AdaptsAttention):
        raise PlmError(f"--lora-r: run {run_label} is a {family} model, and LoRA adapts the Linear layers of plm's "
                       "Transformer self-attention, which it does not run",
                       "finetune it without --lora-r, or finetune a BERT, ALBERT, NEZHA, SpanBERT, ELECTRA, GPT, "
                       "Transformer-XL, XLNet or Transformer run")
    linears = {name: m for name, m in backbone.named_modules() if isinstance(m, nn.Linear)}
    if not targets:
        inside = {id(m) for a in backbone.adapter_modules() for m in a.modules()}
        return [name for name, m in linears.items() if id(m) in inside]
    names = []
    for t in targets:
        hit = [n for n in linears if n == t or n.endswith("." + t)]
        if not hit:
            ends = sorted({".".join(n.split(".")[-2:]) for n in linears})
            raise PlmError(f"--lora-targets {t} names no Linear layer of the {family} model",
                           f"name layers by the end of their module name: {', '.join(ends[:12])}")
        names += [n for n in hit if n not in names]
    tables = {id(p) for p in backbone.embedding_tables()}
    tied = next((n for n in names if id(linears[n].weight) in tables), None)
    if tied:
        raise PlmError(f"--lora-targets: {tied} shares its weight with an embedding table, which merging would change",
                       "leave it out of --lora-targets")
    return names


def add_adapters(backbone: nn.Module, lora, family: str = "") -> list[str]:
    """Freeze every weight of `backbone` and put peft's LoRA layers in place of its target Linear layers (in place:
    the task model holding it trains them); returns their names."""
    peft = needs("peft", "lora", FEATURE)
    names = target_modules(backbone, lora.targets, family)
    backbone.requires_grad_(False)
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                             target_modules="|".join(map(re.escape, names)))  # a string: a full match of the name
    peft.inject_adapter_in_model(config, backbone)
    return names


def adapter_weights(backbone: nn.Module) -> dict:
    """The LoRA matrices of `backbone`, by peft's names relative to it (blocks.0.attn.qkv.lora_A.weight)."""
    peft = needs("peft", "lora", FEATURE)
    return {k: v.detach().cpu().contiguous() for k, v in peft.get_peft_model_state_dict(backbone).items()}


def merge_adapters(backbone: nn.Module) -> None:
    """W += (alpha / r) B A in every adapted layer and the plain Linear put back in its place: `backbone` is the
    family's own module, with no peft layer left (its weights still frozen: nothing trains after the merge)."""
    BaseTunerLayer = needs("peft.tuners.tuners_utils", "lora", FEATURE).BaseTunerLayer

    for name, m in list(backbone.named_modules()):
        if isinstance(m, BaseTunerLayer):
            m.merge()
            parent, _, attr = name.rpartition(".")
            setattr(backbone.get_submodule(parent), attr, m.get_base_layer())


def save_merged(model: nn.Module, backbone: nn.Module, names: list[str], lora, out_dir: Path) -> None:
    """OUT/adapter.safetensors (the adapters, the settings in its metadata), then the adapters merged into
    `backbone` and OUT/model.safetensors rewritten as the plain task `model`."""
    from safetensors.torch import save_file, save_model

    from plmcli.data.store import atomic_path

    meta = {"r": str(lora.r), "alpha": str(lora.alpha), "dropout": str(lora.dropout),
            "scale": str(lora.alpha / lora.r), "target_modules": json.dumps(names)}
    with atomic_path(Path(out_dir) / ADAPTER) as tmp:
        save_file(adapter_weights(backbone), str(tmp), metadata=meta)
    merge_adapters(backbone)
    with atomic_path(Path(out_dir) / WEIGHTS) as tmp:
        save_model(model, str(tmp))
