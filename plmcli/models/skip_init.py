"""Building a model whose every parameter is loaded next (a run's weights) without drawing its random init."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


class NoRandomInit(TorchFunctionMode):
    """While it is active on this thread, the random fills that initialise parameters (torch.nn.init's and the
    tensor methods they call) leave the tensor as allocated and draw nothing from the generator. Buffers
    computed otherwise (sinusoid tables, masks) are built as always, and constant fills still run. A torch
    function mode is thread-local, so nothing else in the process is touched; a parameter the weights file
    lacks cannot slip through uninitialised: the loads are strict."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


_RANDOM_FILLS = frozenset({torch.Tensor.uniform_, torch.Tensor.normal_, torch.nn.init.uniform_, torch.nn.init.normal_,
                           torch.nn.init.kaiming_uniform_})
"""torch.nn.init's fillers that dispatch to a mode themselves, and the tensor fills under all the others."""
