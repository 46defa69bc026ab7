"""A vocabulary padded to a multiple (`model.pad_vocab_multiple`): rows nobody predicts, for the tensor cores.

A GPU's tensor cores run a matmul at full rate when its sizes are multiples of 64 elements (of 8 at least).
GPT-2's 50,257 words (RoBERTa's 50,265, GPT's 40,478, BERT's 30,522) leave the largest matmuls of a small
model — the LM head, its input gradient and the tied embedding's weight gradient — well below that rate;
nanoGPT pads GPT-2's vocabulary to 50,304 for it. Padded, a family builds its word embedding and output layer
with `padded_vocab` rows. A padded id is never in the data, so its embedding row is never read; its output
column is cut from every logits tensor a model returns (`real_columns`: a view of the aligned matmul's output)
and masked to the dtype's minimum inside the fused loss's chunks (`mask_padding`), so it has no probability,
wins no argmax, is never sampled, and sends no gradient to its row.

`vocab_size` stays the tokenizer's wherever a user reads it: logits are (…, vocab_size), recipe parameter counts
are the model's at vocab_size (plmcli.recipe_params), and a transformers export is cut back to it
(`without_padding`). A run saved before a family had padding has no `pad_vocab_multiple`: it loads at 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from plmcli.config_schema import Size
from plmcli.kernels import Linear


@dataclass
class PadsVocab:
    """The model-section setting of every family whose embedding and output matrices have a row per token of
    the tokenizer's vocabulary (its Config inherits it); a family without such matrices (n-grams, word2vec, ELMo's
    character CNN) has none. Transformer-XL pads its full softmax only: an adaptive one's clusters are sized by
    the words."""

    pad_vocab_multiple: Size = 1
    """Embedding and output rows for the vocabulary rounded up to a multiple of this (64: a GPU's tensor cores
    run the LM head at full rate); the extra rows are never predicted. 1 = no padding."""

    @property
    def padded_vocab(self) -> int:
        """Rows of the word embedding and the output layer: vocab_size rounded up to pad_vocab_multiple."""
        m = self.pad_vocab_multiple
        return -(-self.vocab_size // m) * m


def real_columns(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The first `vocab_size` columns (last axis) of a padded output layer's logits: a view, so the matmul keeps
    its aligned width and nothing downstream (softmax, sampling, label smoothing) sees a padded column."""
    return logits if logits.shape[-1] == vocab_size else logits[..., :vocab_size]


def mask_padding(logits: torch.Tensor, vocab_size: int, dim: int = -1) -> torch.Tensor:
    """`logits` with the padding entries along `dim` (index ≥ vocab_size) set, in place, to the dtype's minimum:
    after a softmax they are exactly 0, with neither the NaN of −inf − (−inf) nor a read back to the host.
    For logits that stay padded-wide because a kernel wants them contiguous (the fused loss's chunks)."""
    extra = logits.shape[dim] - vocab_size
    if extra > 0:
        logits.narrow(dim, vocab_size, extra).fill_(torch.finfo(logits.dtype).min)
    return logits


class VocabHead(Linear):
    """An output layer onto a padded vocabulary: a Linear with `padded` output rows whose logits come out
    (…, vocab_size), the padding columns cut (`real_columns`). Its weight and bias keep the padded shape, so
    tying it to a padded embedding and reading `weight` for the fused loss work as with a plain Linear."""

    def __init__(self, in_features: int, vocab_size: int, padded: int, bias: bool = True):
        super().__init__(in_features, padded, bias=bias)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return real_columns(super().forward(x), self.vocab_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, vocab_size={self.vocab_size}"


def without_padding(model: nn.Module) -> nn.Module:
    """`model` at its tokenizer's vocabulary: the same family built at pad_vocab_multiple 1 (on the meta device, so
    nothing is allocated twice) holding `model`'s weights, the padding rows cut (views of the same memory).
    What a transformers export converts: transformers' models have a row per token. Weights `model` ties stay
    tied; buffers it does not save come from `model`. A model without padding comes back as it is."""
    cfg = model.cfg
    if not isinstance(cfg, PadsVocab) or cfg.padded_vocab == cfg.vocab_size:
        return model
    with torch.device("meta"):
        plain = type(model)(replace(cfg, pad_vocab_multiple=1))
    shapes = {k: v.shape for k, v in plain.state_dict().items()}
    # Only the vocabulary's rows differ between the two builds: each such tensor is cut to the plain one's rows.
    plain.load_state_dict({k: _rows(v, shapes[k]) for k, v in model.state_dict().items()}, assign=True)
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        kept = first.setdefault(id(p), name)
        if kept != name:  # a tied weight: the second name gets the first one's parameter again
            owner, _, attr = name.rpartition(".")
            setattr(plain.get_submodule(owner), attr, plain.get_parameter(kept))
    for name, b in plain.named_buffers():
        if b.is_meta:  # not in a state dict: made at construction, so the padded model's copy is the same
            owner, _, attr = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(attr, _rows(model.get_buffer(name), b.shape), persistent=False)
    return plain.train(model.training)


def _rows(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if t.shape == shape:
        return t
    if t.shape[1:] != shape[1:] or t.shape[0] < shape[0]:
        raise ValueError(f"a padded tensor {tuple(t.shape)} does not hold the unpadded {tuple(shape)}")
    return t[: shape[0]]
