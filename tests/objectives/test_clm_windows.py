"""CLM training windows: each epoch's offset drawn once per epoch, the same windows as a draw per row."""

import numpy as np
import torch

import plmcli.data.corpus as corpus
from plmcli.data.batching import EpochOrder
from plmcli.objectives.clm import CausalLM, CLMConfig


def test_windows_are_the_epoch_offset_plus_index_times_length(monkeypatch):
    tokens = np.arange(1000, dtype=np.uint16)
    monkeypatch.setattr(corpus, "token_stream", lambda corpus_dir, split, sep: tokens)
    T, B, seed = 16, 4, 5
    stream = CausalLM(CLMConfig(), None, {"eos": 0}, T).stream("unused", "train", B, seed, 0, 1, shuffle=True)
    n = (len(tokens) - T) // T
    order = EpochOrder(n, seed)
    offsets = set()
    for k in range(0, 200, 3):  # about 13 epochs, visited out of order
        batch = stream[k]
        for row, p in enumerate(range(k * B, (k + 1) * B)):
            e, i = order(p)
            off = int(np.random.default_rng((seed, e, 7)).integers(T))  # the per-row draw it replaces
            offsets.add(off)
            want = torch.from_numpy(tokens[off + i * T : off + i * T + T + 1].astype(np.int64))
            assert torch.equal(batch["input_ids"][row], want[:-1]) and torch.equal(batch["labels"][row], want[1:])
    assert len(offsets) > 3  # the epochs really start at different offsets
