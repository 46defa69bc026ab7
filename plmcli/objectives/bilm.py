"""Bidirectional LM (ELMo): a forward LM and a backward LM trained together on the same windows.

Batches are the causal LM's (plmcli.objectives.clm): windows of seq_len + 1 tokens from the token
stream. The model reads the whole window and returns (forward logits, backward logits); the forward LM
predicts tokens 1..T from the tokens before them, the backward LM tokens 0..T-1 from the tokens after.
The loss is the sum of the two mean NLLs (Peters et al. 2018, eq. in §3.1: the joint log likelihood of
both directions), so each direction gets its own full gradient. Logged: `fwd_loss`, `bwd_loss` and
`avg_loss` = their mean, whose exponential is the reported perplexity (`ppl_metric`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plmcli.errors import PlmError
from plmcli.models.base import TakesTokenStrings, traits_of
from plmcli.objectives.base import StepOutput
from plmcli.objectives.clm import CausalLM


@dataclass
class BiLMConfig:
    shift_windows: bool = True
    """Each epoch starts its windows at a new random offset (as the clm objective)."""


class BidirectionalLM(CausalLM):
    Config = BiLMConfig
    ppl_metric = "avg_loss"

    def check_model(self, model):
        if not traits_of(model).bilm:
            raise PlmError(f"{type(model).__name__} is not a bidirectional LM", "use objective.name: bilm with family elmo")
        # A character-level token encoder needs each id's characters: the tokenizer's vocabulary.
        if self.tokenizer is not None and isinstance(model, TakesTokenStrings):
            n = self.tokenizer.get_vocab_size()
            model.set_token_strings([self.tokenizer.id_to_token(i) or "" for i in range(n)])

    def loss_counts(self, batch):
        return {"loss": torch.tensor(batch["labels"].numel())}  # each direction predicts as many tokens

    def step(self, model, batch, state=None):
        x = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)  # (B, T+1): the whole window
        fwd, bwd = model(x)  # (B, T+1, V) each
        V = fwd.shape[-1]
        fwd_loss = F.cross_entropy(fwd[:, :-1].reshape(-1, V).float(), x[:, 1:].reshape(-1))  # t predicts t+1
        bwd_loss = F.cross_entropy(bwd[:, 1:].reshape(-1, V).float(), x[:, :-1].reshape(-1))  # t predicts t-1
        loss = fwd_loss + bwd_loss
        count = x.new_full((), batch["labels"].numel())  # filled on the device, not copied from the host
        metrics = {"loss": loss.detach() * count, "fwd_loss": fwd_loss.detach() * count,
                   "bwd_loss": bwd_loss.detach() * count, "avg_loss": (loss.detach() / 2) * count}
        return StepOutput(loss, metrics, count)
