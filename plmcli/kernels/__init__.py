"""plm's CPU kernels: faster ways to compute a few plain torch ops on a CPU, quarantined here behind one switch.

Each kernel has a plain torch op it must equal (tests/kernels/test_conformance.py holds each to it):

- `linear` / `Linear` (kernels/onednn.py): `F.linear` (+ an activation from ACTIVATIONS) on oneDNN's fp32 matmul,
  the activation fused in without a gradient; `packed_weights()` keeps each weight in oneDNN's layout for a pass
  whose weights stay still (scoring, generation). Equal to F.linear up to the summation order's rounding.
- `dropout` / `Dropout` (kernels/dropout.py): `F.dropout` with masks drawn by numpy's SFC64 from one torch draw;
  the same semantics (drop with probability p, scale the rest by 1/(1 − p)), p rounded to 16 bits.
- `word2vec_kernel` (kernels/word2vec.py, word2vec.cpp): word2vec's trainer compiled on first use (g++, ninja;
  cached in torch's extension directory), word2vec.c's per-example SGD with Hogwild! threads; its plain-torch
  counterpart is models/word2vec.py's batched path, which trains where it is None (switch off, no compiler).
- `attention` (kernels/attention.py): `F.scaled_dot_product_attention`, computed explicitly where it has dropout
  (its masks from `dropout`) or where the caller wants the probabilities (recorded attention maps).

The switch: `enabled(device)` is True on a CPU, outside a torch.compile graph, unless the kernels are switched
off — for the whole process by `PLM_CPU_KERNELS=0` in the environment (read at import: a CPU where torch's own
GEMM is faster), or within a block by `with switched(False):` (a context variable: this thread or task only; a
test of the plain path). With the switch off every kernel here is the plain torch op, and the models' other
CPU-only choices that ask `enabled` (models/lm_loss.py's vocab-major chunks, reading a padding mask back on the
host, running padded rather than unpadded batches) take the device-generic path a GPU takes.

Imports only torch and numpy: models/ (and objectives/) call these as they would the torch ops they replace.
"""

from plmcli.kernels.attention import attention
from plmcli.kernels.dropout import Dropout, drop_probability, dropout
from plmcli.kernels.onednn import (ACTIVATIONS, Linear, linear, onednn_available, onednn_enabled, packed_cache,
                                   packed_weights, takes_onednn)
from plmcli.kernels.switch import ENV, enabled, switched, switched_on
from plmcli.kernels.word2vec import word2vec_kernel

__all__ = ["ACTIVATIONS", "ENV", "Dropout", "Linear", "attention", "drop_probability", "dropout", "enabled", "linear",
           "onednn_available", "onednn_enabled", "packed_cache", "packed_weights", "switched", "switched_on",
           "takes_onednn", "word2vec_kernel"]
