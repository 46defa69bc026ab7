"""Segments with memory (Transformer-XL, Dai et al. 2019).

The text is read in segments of tgt_len tokens, each attending to the last mem_len states of every layer,
so every token is scored once with up to mem_len + its offset in the segment of context (more through the
layers). Defaults: the model config's eval_tgt_len / eval_mem_len, else the training seq_len / mem_len.
--max-length / --stride do not apply.

Line ends: when the tokenizer cannot see them (word-level) and has an eos, eos follows every line and is
scored, as Transformer-XL's WikiText-103 / PTB setup; otherwise the file is scored as is.

The model: `model(ids (1, t), mems, labels=(1, t)) -> ((1, t) NLL, next mems)`, and
`model.evaluation_memory(mem_len)`, a context in which it keeps mem_len states with its evaluation settings.
"""

from __future__ import annotations

import numpy as np
import torch

from plmcli.errors import PlmError
from plmcli.eval.perplexity import carried_logprobs, carried_nll, eval_files, from_start, sees_newlines


@torch.no_grad()
def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu", mem_len: int | None = None, tgt_len: int | None = None) -> dict:
    """eval-ppl's report of a model with segment memory over `files`; adds `tgt_len` and `mem_len`."""
    tgt, mem = segment_lengths(model, cfg, mem_len, tgt_len)
    if tgt < 1 or mem < 0:
        raise PlmError(f"--tgt-len {tgt} must be ≥ 1 and --mem-len {mem} ≥ 0", "e.g. --tgt-len 128 --mem-len 1600")
    if max_length is not None or stride is not None:
        raise PlmError("--max-length / --stride set sliding windows, which Transformer-XL does not use",
                       "use --tgt-len (tokens per segment) and --mem-len (memory) instead")
    model.to(device).eval()
    with model.evaluation_memory(mem):
        res = eval_files(files, tok, cfg, lambda seq: stream_nll(model, seq, tgt, device), tgt, tgt,
                         context=f"segments of {tgt} tokens with {mem} tokens of memory per layer",
                         by_lines=not sees_newlines(tok))
    res.update(tgt_len=tgt, mem_len=mem)
    return res


def stream_nll(model, seq: np.ndarray, tgt_len: int, device="cpu") -> tuple[float, int]:
    """Summed NLL of seq[1:] given everything before, one segment of tgt_len tokens at a time."""
    return carried_nll(seq, tgt_len, lambda x, y, mems: model(x, mems, labels=y[None]), device)


def segment_lengths(model, cfg: dict, mem_len: int | None = None, tgt_len: int | None = None) -> tuple[int, int]:
    """(tokens per segment, states kept per layer): the flags when given, else the config's evaluation values."""
    c = model.cfg
    # a flag's 0 is a value (refused by score); the recipe's eval_tgt_len 0 means "the training seq_len"
    tgt = (c.eval_tgt_len or cfg.get("seq_len") or 128) if tgt_len is None else tgt_len
    mem = (c.eval_mem_len or c.mem_len) if mem_len is None else mem_len
    return tgt, mem


@torch.no_grad()
def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """plmcli.eval.scoring.token_logprobs for this protocol: segments of the training tgt_len with its memory carried,
    the first token after the run's bos/eos (`from_start`)."""
    tgt, mem = segment_lengths(model, cfg)
    model.to(device).eval()
    with model.evaluation_memory(mem):  # forward without labels: (log-probabilities, memory)
        return from_start(lambda seq: carried_logprobs(seq, tgt, model, device), ids, cfg)
