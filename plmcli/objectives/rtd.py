"""Replaced-token detection (ELECTRA, Clark et al. 2020): a small generator fills the masked positions
with samples, and the discriminator tells every token original or replaced.

Masking and data are MaskedLM's (dynamic by default, as RoBERTa: the released ELECTRA code masks on the
fly too), with ELECTRA's replacement shares: of the targets 85% become [MASK] and 15% stay, no random
token (pretrain_helpers.mask). One step, both networks through the model's `forward`:
  1. generator logits at the masked positions -> MLM loss (cross-entropy, mean over targets);
  2. each masked position gets a sample from the generator's softmax (at `temperature`, by inverse CDF),
     drawn without gradient from detached logits: the RTD loss never reaches the generator;
  3. the discriminator reads the corrupted ids; label 1 where a token differs from the original (a
     sample equal to the original counts as original, as in the paper) -> BCE with logits, mean over
     every non-padding token ([CLS]/[SEP] included: the released code weights by input_mask).
  loss = gen_weight · MLM + disc_weight · RTD (λ = 50).
Sampling noise comes from a torch.Generator seeded by (seed, split, global micro-batch id), which the
stream puts on each batch as `sample_seed`: a resumed run draws bitwise the same replacements.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.config_schema import NonNegative, Positive
from plmcli.errors import PlmError
from plmcli.models.base import traits_of
from plmcli.models.device import row_lengths
from plmcli.objectives.base import StepOutput
from plmcli.objectives.mlm import PAIRS, MaskedLM, MLMConfig

_SAMPLE_TAG = 13  # seed-tuple tag: the generator's samples draw a stream of their own


@dataclass
class RTDConfig(MLMConfig):
    """MaskedLM's settings (mask_prob, max_predictions, masking, ...) with ELECTRA's defaults, plus the RTD loss."""

    dynamic: bool = True
    """Mask each batch afresh from the tokenized corpus (as ELECTRA's code does) instead of make-mlm-data instances."""
    pairs: Literal[PAIRS] = "none"
    """ELECTRA has no sentence-pair loss: full sentences packed (none)."""
    replace_probs: list = field(default_factory=lambda: [0.85, 0.0, 0.15])
    """Of the targets: share shown to the generator as [MASK], as a random token, unchanged (ELECTRA: 85/0/15)."""
    disc_weight: NonNegative = 50.0
    """λ: weight of the replaced-token-detection loss (paper §3: 50)."""
    gen_weight: NonNegative = 1.0
    """Weight of the generator's MLM loss."""
    temperature: Positive = 1.0
    """The generator's softmax is sampled at this temperature (1 = the paper)."""


class ReplacedTokenDetection(MaskedLM):
    Config = RTDConfig
    ppl_metric = "mlm_loss"
    """val_ppl is the generator's masked-LM perplexity (the RTD loss is not one)."""

    def __init__(self, cfg: RTDConfig, tokenizer, special_ids: dict[str, int], seq_len: int):
        super().__init__(cfg, tokenizer, special_ids, seq_len)
        if cfg.pairs != "none":
            raise PlmError(f"objective.pairs is {cfg.pairs}, and replaced-token detection has no sentence-pair loss",
                           "set objective.pairs=none")
        for name in ("disc_weight", "gen_weight"):
            if getattr(cfg, name) < 0:
                raise PlmError(f"objective.{name} {getattr(cfg, name)} must be ≥ 0", f"e.g. --set objective.{name}=1")
        if cfg.temperature <= 0:
            raise PlmError(f"objective.temperature {cfg.temperature} must be > 0", "e.g. --set objective.temperature=1")

    def check_model(self, model):
        if not traits_of(model).replaced_token_detection:
            raise PlmError(f"{type(model).__name__} has no generator and discriminator for replaced-token detection",
                           "use objective.name: rtd with an electra recipe (electra-mini, electra-small, electra-base)")
        self.check_positions(model)
        self.set_predicted_share(model)

    def stream(self, data_dir, split, batch_size, seed, rank, world, shuffle):
        stream = super().stream(data_dir, split, batch_size, seed, rank, world, shuffle)
        return SampleSeeds(stream, seed, split, rank, world)

    def window_batch(self, x: torch.Tensor, key, seed: int = 0, lengths=None) -> dict:
        """plm pretrain --streaming: the masked batch, and its generator-sample seed from the same position."""
        batch = super().window_batch(x, key, seed, lengths)
        state = np.random.SeedSequence([seed, _SAMPLE_TAG, *key]).generate_state(1, np.uint64)[0]
        return batch | {"sample_seed": int(state >> np.uint64(1))}

    # ------------------------------------------------------------ loss

    def corrupt(self, gen_logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a generator sample into every masked position: ((B, T) corrupted ids, (B, T) replaced).

        `replaced` is exactly corrupted != original, so it is False on padding and wherever the sample
        happens to be the original token. No gradient: the sample is drawn from detached logits.
        """
        ids, pos, labels = batch["input_ids"], batch["mlm_positions"], batch["mlm_labels"]
        with torch.no_grad():
            seed = batch.get("sample_seed")
            gen = torch.Generator(device=gen_logits.device).manual_seed(seed) if seed is not None else None
            sampled = sample(gen_logits.detach().float() / self.cfg.temperature, gen)  # (N,)
            original = ids.flatten().index_put((pos,), labels)  # undo [MASK]: the text as it was
            corrupted = original.index_put((pos,), sampled)
            replaced = corrupted != original
        return corrupted.view_as(ids), replaced.view_as(ids)

    def losses(self, model, batch: dict) -> dict:
        """This micro-batch's MLM and RTD losses (with their graphs) and the RTD accuracy."""
        labels = batch["mlm_labels"]  # (N,)
        types, attention = batch.get("token_type_ids"), batch.get("attention_mask")
        gen_logits = model(batch["input_ids"], types, attention, batch["mlm_positions"], part="generator").mlm_logits.float()
        mlm = F.cross_entropy(gen_logits, labels) if labels.numel() else gen_logits.sum() * 0.0
        corrupted, replaced = self.corrupt(gen_logits, batch)
        rtd_logits = model(corrupted, types, attention, part="discriminator").rtd_logits.float()  # (B, T)
        real = attention.bool() if attention is not None else torch.ones_like(replaced)
        n_real = real.sum().clamp(min=1)
        bce = F.binary_cross_entropy_with_logits(rtd_logits, replaced.float(), reduction="none")
        rtd = (bce * real).sum() / n_real
        acc = (((rtd_logits > 0) == replaced) & real).sum() / n_real
        return {"mlm": mlm, "rtd": rtd, "rtd_acc": acc.detach(), "corrupted": corrupted, "replaced": replaced}

    def loss_counts(self, batch):
        attention = batch.get("attention_mask")
        return {"mlm": torch.tensor(batch["mlm_labels"].numel()),  # the generator's masked tokens
                "rtd": attention.sum() if attention is not None else torch.tensor(batch["input_ids"].numel())}  # real tokens

    def step(self, model, batch, state=None):
        with row_lengths(batch.get("attention_mask"), batch.get("lengths")):  # the encoders read no lengths back
            parts = self.losses(model, batch)
        weighted = {"mlm": self.cfg.gen_weight * parts["mlm"], "rtd": self.cfg.disc_weight * parts["rtd"]}
        loss = weighted["mlm"] + weighted["rtd"]
        # Metrics are weighted by the masked-token count, so mlm_loss averages per prediction (val_ppl).
        count = batch["mlm_labels"].new_full((), batch["mlm_labels"].numel())  # filled on the device, not copied
        metrics = {"mlm_loss": parts["mlm"].detach() * count, "rtd_loss": parts["rtd"].detach() * count,
                   "rtd_acc": parts["rtd_acc"] * count, "loss": loss.detach() * count}
        return StepOutput(loss, metrics, count, parts=weighted)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None, block: int = 64) -> torch.Tensor:
    """One draw per row of softmax(logits), by inverse CDF with one uniform u per row.

    Gumbel-max needs an exponential per logit (N × V of them: ~5% of an electra-mini step on a CPU), and a
    running sum over all V probabilities is a slow sequential pass. Here the vocabulary is cut in blocks
    of `block` tokens: a block is drawn with probability its mass (a running sum over V / block block
    masses), then a token inside it with probability p / mass, from what is left of u. A token of
    probability 0 (or padding past V) is never drawn; the running sums are float64."""
    p = torch.softmax(logits.float(), -1)  # (N, V)
    N, V = p.shape
    blocks = (F.pad(p, (0, -V % block)) if V % block else p).view(N, -1, block)  # (N, nb, block), zero mass past V
    mass = blocks.sum(-1).double()  # (N, nb); a float32 sum of `block` terms (a float64 one is 100× slower on a CPU)
    cdf = mass.cumsum(-1)
    u = torch.rand(N, 1, generator=generator, dtype=torch.float64, device=logits.device) * cdf[:, -1:]
    b = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[1] - 1)  # (N, 1): the block with cdf > u
    m = mass.gather(1, b)
    r = ((u - (cdf.gather(1, b) - m)) / m).clamp_(0.0, 1.0 - 2.0**-52)  # u's position inside the block, in [0, 1)
    inner = blocks[torch.arange(N, device=p.device), b.squeeze(1)].double().cumsum_(-1)  # (N, block)
    t = torch.searchsorted(inner, r * inner[:, -1:], right=True)  # < block: r · total < total
    return (b * block + t).squeeze(1)


class SampleSeeds(torch.utils.data.Dataset):
    """A stream whose batch k also carries `sample_seed`, a function of (seed, split, global micro-batch id).
    What the loop reads of a stream (batch k, its length, `batches_per_epoch`) is the wrapped stream's."""

    def __init__(self, stream, seed: int, split: str, rank: int, world: int):
        self.stream, self.seed, self.tag = stream, seed, zlib.crc32(split.encode())
        self.rank, self.world = rank, world

    def __getitem__(self, k: int):
        batch = self.stream[k]
        if batch is not None:
            g = k * self.world + self.rank  # as BatchStream: unique over ranks and steps
            state = np.random.SeedSequence((self.seed, self.tag, g, _SAMPLE_TAG)).generate_state(1, np.uint64)[0]
            batch["sample_seed"] = int(state >> np.uint64(1))  # 63 bits: any torch seed
        return batch

    def __len__(self) -> int:
        return len(self.stream)

    def batches_per_epoch(self) -> int:
        return self.stream.batches_per_epoch()
