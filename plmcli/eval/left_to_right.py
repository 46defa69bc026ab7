"""Left to right: a permutation LM scored in the identity factorisation order (XLNet, Yang et al. 2019).

Each token is predicted by the query stream from the content of every token before it, each scored
exactly once. Sliding windows (--max-length, default the training seq_len capped by the model's positions;
--stride, default half) as for causal LMs; with --mem-len / --tgt-len, segments of tgt_len tokens (default:
the training seq_len) read in order, each attending to mem_len (default: the config's) cached states per layer.
Each file is scored as one text (line ends as the tokenizer encodes them).

The model: `next_token_logits(ids (B, W), mems, mem_len) -> ((B, W, V), next mems)`, `max_positions` and
`cfg.mem_len`.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from plmcli.errors import PlmError
from plmcli.eval.perplexity import carried_nll, eval_files, from_start, sequence_nll, window_length, window_logprobs

FACTORISATION = ("left-to-right (identity permutation): the query stream predicts each token "
                 "from the content of all tokens before it")


def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu", mem_len: int | None = None, tgt_len: int | None = None) -> dict:
    """eval-ppl's report of a permutation LM over `files`; adds `factorisation`, and `window_from` (windows)
    or `tgt_len` and `mem_len` (segments)."""
    model.to(device).eval()
    if mem_len is None and tgt_len is None:
        res = by_windows(model, files, tok, cfg, max_length, stride, batch_size, device)
    else:
        if max_length is not None or stride is not None:
            raise PlmError("--max-length / --stride set sliding windows, --mem-len / --tgt-len segments with memory",
                           "use one or the other")
        res = by_segments(model, files, tok, cfg, mem_len, tgt_len, device)
    res["factorisation"] = FACTORISATION
    return res


def by_windows(model, files, tok, cfg: dict, max_length, stride, batch_size: int, device) -> dict:
    L, window_from = window_length(max_length, model.max_positions, cfg.get("seq_len"))
    S = max(1, L // 2) if stride is None else stride
    if L < 1 or not 1 <= S <= L:
        raise PlmError(f"--max-length {L} must be ≥ 1 and --stride {S} between 1 and it",
                       "e.g. --max-length 512 --stride 256")
    res = eval_files(files, tok, cfg, lambda seq: sequence_nll(lambda x: model.next_token_logits(x)[0], seq, L, S,
                                                               batch_size, device),
                     L, S, context=f"windows of {L} tokens every {S}", by_lines=False)
    res["window_from"] = window_from
    return res


def by_segments(model, files, tok, cfg: dict, mem_len, tgt_len, device) -> dict:
    tgt = tgt_len if tgt_len is not None else cfg.get("seq_len") or 128
    mem = model.cfg.mem_len if mem_len is None else mem_len
    if tgt < 1 or mem < 0:
        raise PlmError(f"--tgt-len {tgt} must be ≥ 1 and --mem-len {mem} ≥ 0", "e.g. --tgt-len 128 --mem-len 384")
    res = eval_files(files, tok, cfg, lambda seq: stream_nll(model, seq, tgt, mem, device), tgt, tgt,
                     context=f"segments of {tgt} tokens with {mem} tokens of memory per layer", by_lines=False)
    res.update(tgt_len=tgt, mem_len=mem)
    return res


def stream_nll(model, seq: np.ndarray, tgt_len: int, mem_len: int, device="cpu") -> tuple[float, int]:
    """Summed NLL of seq[1:] given everything before, one segment of tgt_len tokens at a time with memory."""

    def step(x, y, mems):
        logits, mems = model.next_token_logits(x, mems, mem_len)
        return F.cross_entropy(logits[0].float(), y, reduction="sum"), mems

    return carried_nll(seq, tgt_len, step, device)


def token_logprobs(model, ids, cfg: dict, *, batch_size: int = 8, device="cpu", tail: int | None = None):
    """plmcli.eval.scoring.token_logprobs for this protocol: windows of the training seq_len moving by half of it, read
    left to right, the first token after the run's bos/eos (`from_start`)."""
    L, _ = window_length(None, model.max_positions, cfg.get("seq_len"))
    model.to(device).eval()
    return from_start(lambda seq: window_logprobs(lambda x: model.next_token_logits(x)[0], seq, L, max(1, L // 2),
                                                  batch_size, device, tail), ids, cfg)
