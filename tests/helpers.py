"""Shared test fixtures: a tiny corpus and a tiny recipe that train in a second or two."""

from pathlib import Path

TINY_RECIPE = """\
extends: gpt-mini
model: {n_layer: 2, n_head: 2, d_model: 32, max_positions: 32, dropout: 0.1, attn_dropout: 0.0}
tokenizer: {kind: char, vocab_size: 200, min_frequency: 1, special_tokens: {eos: "<eos>", unk: "<unk>"}}
data: {val_fraction: 0.2}
train: {seq_len: 16, global_batch_size: 4, max_steps: 6, eval_every: 3, eval_batches: 2, save_every: 3, log_every: 1}
optim: {lr: 3.0e-3, warmup_steps: 2, schedule: cosine}
"""


def tiny_corpus(path: Path, n_docs: int = 30) -> Path:
    words = "the cat sat on a mat while dogs ran far away from home and back again".split()
    docs = []
    for d in range(n_docs):
        lines = [" ".join(words[(d + i + j) % len(words)] for j in range(6 + i % 3)) for i in range(3)]
        docs.append("\n".join(lines))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def tiny_recipe(path: Path) -> Path:
    path.write_text(TINY_RECIPE, encoding="utf-8")
    return path


# A stand-in encoder family for CLI checks that need a run that is not a causal LM.
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402


@dataclass
class ToyEncoderConfig:
    vocab_size: int = 0
    max_positions: int = 32
    d_model: int = 8


class ToyEncoder(torch.nn.Module):
    Config = ToyEncoderConfig
    causal = False

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.emb = torch.nn.Embedding(max(cfg.vocab_size, 1), cfg.d_model)

    def forward(self, input_ids):
        return self.emb(input_ids)
