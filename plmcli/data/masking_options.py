"""Masking settings that `plm make-mlm-data`'s flags and the mlm objective's keys share, declared once: a field's
type is its check (config_schema.check_value for a flag, build_section for a recipe key), its docstring the
flag's help and the key's reference. objectives.mlm.MLMConfig inherits them; data.mlm_data reads them.
No numpy here: the CLI reads these docstrings when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from plmcli.config_schema import Range

MASK_COUNTS = ("reference", "maskable")


@dataclass
class MaskingOptions:
    mask_count: Literal[MASK_COUNTS] = "reference"
    """How many tokens an instance masks: reference (Google's create_pretraining_data: min(max_predictions,
    max(1, round(mask_prob · length))), the length counting [CLS] and [SEP]) | maskable (the same share of the
    maskable tokens alone, plm's count before; a little fewer targets in short sequences)."""
    ngram_start_prob: Optional[Annotated[float, Range(0, 1, lo_open=True, hi_open=True)]] = None
    """masking ngram_per_word: the probability of starting an n-gram at a word, in (0, 1); none = derived from
    mask_prob, so that a walk masks that share of the words (0.081 at 15% with n-grams of 40/30/20/10)."""


def counted_lengths(mask_count: str, lengths):
    """What masking.mask_batch's `counted` is for `mask_count`: the rows' real lengths ([CLS]/[SEP] included) for
    the reference count, None (the maskable tokens) otherwise."""
    return lengths if mask_count == "reference" else None
