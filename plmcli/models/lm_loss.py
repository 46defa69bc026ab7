"""Next-token cross-entropy straight from hidden states, without the (N, V) logits living in memory.

A language model's output layer is a matmul to V logits per token followed by log-softmax. Done the
plain way, the (N, V) logits are written, read by log_softmax, written again, and in backward read and
written twice more — for GPT-2 (V = 50,257) that is 200 kB per token, more memory traffic than all of
the transformer layers together on a CPU, and most of the activation memory on a GPU. Here the rows are
taken a chunk at a time: logits, log-sum-exp, the loss and both gradients (softmax − one-hot, times the
weight and times the hidden states) are computed while the chunk is hot, and only the gradients (the size
of the inputs) are kept for backward. Because the loss is a scalar, its gradient is known in forward up to
the incoming scale, which backward applies. The numbers are those of `F.cross_entropy(h @ w.T, y)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plmcli import kernels
from plmcli.kernels import linear, takes_onednn
from plmcli.models.vocab import mask_padding

IGNORE_INDEX = -100


def chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk: on a GPU ~256 MB of fp32 logits (keeps it busy); on a CPU ~4 MB (stays in cache),
    but at least 128 rows and a power of two.

    On a CPU the chunk's matmuls set the speed as much as its cache footprint: with a few dozen rows the
    (V × C) weight is streamed again every few rows, and an odd row count leaves MKL's blocking ragged.
    Fused head + loss, forward and backward, 2 threads (AMD EPYC): 608 rows × V 30,522 took 224 ms in
    chunks of 128 and 283 ms in chunks of 137; 2,048 rows × V 50,257 1.3 s at 128 and 3.1 s at 20.
    """
    if not kernels.enabled(device):
        return max(16, 2**26 // max(1, vocab_size))
    rows = max(128, 2**20 // max(1, vocab_size))
    return 1 << (rows.bit_length() - 1)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """Matmuls in the autocast dtype when autocast is on (as nn.Linear would run); softmax always in fp32."""
    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return h.dtype


UNDERFLOW = 2.0**-100
"""Below this a softmax probability has lost precision to fp32's denormals (2⁻¹²⁶): −log p is recomputed."""


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """Per-row cross-entropy, cross_entropy's own formula logsumexp − logit[y], over the vocabulary axis `dim`."""
    return torch.logsumexp(logits, dim=dim) - logits.gather(dim, y.unsqueeze(dim)).squeeze(dim)


def _nll(p: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, cols: bool) -> torch.Tensor:
    """−log p[i, y_i] for a chunk's softmax p (n, V) and its logits ((V, n) when `cols`, else (n, V)).

    On a CPU −log p[y], with logsumexp − logit[y] for the rows where p[y] is too small to log. On a GPU always
    logsumexp − logit[y], cross-entropy's own formula: finding those rows would stop the host every chunk.
    """
    if not kernels.enabled(p.device):
        return _cross_entropy(logits, y, 0 if cols else 1)
    picked = p.gather(1, y[:, None]).squeeze(1)
    nll = -picked.log()
    low = picked < UNDERFLOW
    if bool(low.any()):  # a confidently wrong row: its loss from the logits, as cross-entropy computes it
        rows = low.nonzero().squeeze(1)
        nll[rows] = _cross_entropy(logits[:, rows] if cols else logits[rows], y[rows], 0 if cols else 1)
    return nll


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, chunk: int, cols: bool, vocab: int):
        dt = _compute_dtype(h)
        with torch.autocast(h.device.type, enabled=False):
            hd, wd = h.to(dt), weight.to(dt)
            bd = None if bias is None else bias.to(dt)
            acc = torch.promote_types(dt, torch.float32)  # fp32 softmax, fp64 stays fp64
            valid = targets != IGNORE_INDEX
            count = valid.sum().clamp(min=1)
            loss = torch.zeros((), dtype=acc, device=h.device)
            grad_h = torch.empty_like(h)
            same = dt == acc
            # the first chunk's matmul writes it whole (unless there is no chunk)
            grad_w = (torch.empty if same and len(h) else torch.zeros)(weight.shape, dtype=acc, device=weight.device)
            grad_b = None if bias is None else torch.zeros(bias.shape, dtype=acc, device=bias.device)
            # pretraining: no ignored rows, so no per-row masking passes. Asked on a CPU only: a GPU would wait for
            # the answer, and the masking passes give the same numbers.
            every = kernels.enabled(h.device) and bool(valid.all())
            # Every chunk's logits and probabilities go to the same two buffers: a fresh chunk-sized tensor is
            # paged in by the kernel on first touch, which took as long again as the softmax over it on a CPU.
            V, rows = weight.shape[0], min(chunk, h.shape[0])
            logit_buf = torch.empty(V * rows, dtype=dt, device=h.device)
            prob_buf = torch.empty(V * rows, dtype=acc, device=h.device)
            # Under bf16 autocast, fp32 copies of each chunk's logits and weight gradient (an fp32 += bf16 add
            # would make a fresh fp32 copy of its bf16 operand every chunk).
            upcast_buf = None if same else torch.empty(V * rows, dtype=acc, device=h.device)
            grad_w_chunk = None if same else torch.empty(weight.shape, dtype=dt, device=weight.device)
            grad_w_upcast = None if same else torch.empty(weight.shape, dtype=acc, device=weight.device)
            for s in range(0, h.shape[0], chunk):
                hc, yc, vc = hd[s : s + chunk], targets[s : s + chunk], valid[s : s + chunk]
                shape = (V, len(hc)) if cols else (len(hc), V)
                out = logit_buf[: V * len(hc)].view(shape)
                if cols:
                    torch.mm(wd, hc.t(), out=out) if bd is None else torch.addmm(bd[:, None], wd, hc.t(), out=out)
                else:
                    torch.mm(hc, wd.t(), out=out) if bd is None else torch.addmm(bd, hc, wd.t(), out=out)
                logits = out if same else upcast_buf[: V * len(hc)].view(shape).copy_(out)
                mask_padding(logits, vocab, 0 if cols else 1)  # a padded vocabulary's extra rows get no mass
                # One softmax pass gives both the gradient and the loss, −log p[y]: 40% less time over the
                # chunk than log_softmax then exp (bert-mini's 30,522-word head, AMD EPYC).
                probs = torch.softmax(logits, dim=0 if cols else 1, out=prob_buf[: V * len(hc)].view(shape))
                p = probs.t() if cols else probs
                safe_y = yc if every else torch.where(vc, yc, 0)
                nll = _nll(p, logits, safe_y, cols)
                loss += nll.sum() if every else (nll * vc).sum()
                if every:
                    p.scatter_add_(1, safe_y[:, None], p.new_full((len(yc), 1), -1.0))  # − one-hot
                else:
                    p.scatter_add_(1, safe_y[:, None], -vc[:, None].to(p.dtype))
                    p.mul_(vc[:, None])  # ignored rows contribute nothing
                if not same:  # the gradient's matmuls in bf16: softmax − one-hot into the logits' buffer, free again
                    out.copy_(probs)
                pd = p if same else out.t() if cols else out
                if same and h.dtype == dt:
                    torch.mm(pd, wd, out=grad_h[s : s + chunk])
                else:
                    grad_h[s : s + chunk] = (pd @ wd).to(h.dtype)
                if same and s == 0:
                    torch.mm(pd.t(), hc, out=grad_w)
                elif same:
                    grad_w.addmm_(pd.t(), hc)
                else:
                    grad_w += grad_w_upcast.copy_(torch.mm(pd.t(), hc, out=grad_w_chunk))
                if grad_b is not None:
                    grad_b += p.sum(0)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), grad_b, count)
        return loss / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b, count = ctx.saved_tensors
        scale = grad_out / count
        grad_b = None if grad_b is None else grad_b * scale.to(grad_b.dtype)
        return grad_h * scale.to(grad_h.dtype), grad_w * scale.to(grad_w.dtype), grad_b, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int | None = None, bias: torch.Tensor | None = None,
                         vocab_major: bool | None = None, vocab_size: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of `h @ weight.T (+ bias)` (h: (N, C), weight: (V, C), bias: (V,)) against
    `targets` (N,), skipping targets equal to -100; equal to `F.cross_entropy(F.linear(h, weight, bias), targets)`.

    Chunked with gradients computed on the way when a gradient is needed; otherwise the chunked loss
    of the scored rows only (logits are never computed for a -100 target). `vocab_major` (None: on a CPU)
    computes each chunk's logits as (V, n), weight · hᵀ: on a CPU MKL runs that 1.5–2× faster than the
    (n, V) product h · weightᵀ at these shapes (n ≥ 128 rows, V in the thousands), and softmax over its
    contiguous V axis is as fast. Without a gradient, None picks (n, V) wherever the product runs on oneDNN
    (plmcli.kernels), for the faster cross-entropy kernel along V.
    `vocab_size` < V: `weight`'s rows from it on pad the vocabulary (plmcli.models.vocab), their logits masked in
    every chunk right after its matmul, so the loss and gradients are those of `weight[:vocab_size]`.
    """
    chunk = chunk or chunk_rows(weight.shape[0], h.device)
    vocab = vocab_size or weight.shape[0]
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad or bias is not None and bias.requires_grad):
        cols = kernels.enabled(h.device) if vocab_major is None else vocab_major
        if h.shape[0] <= chunk and not cols:  # the logits fit in one chunk: nothing to save, and torch's
            # own cross-entropy kernels beat the explicit softmax-minus-one-hot steps there (the (V, n)
            # matmuls of the fused path win even so)
            logits = mask_padding(F.linear(h, weight, bias), vocab)
            return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets,
                                   ignore_index=IGNORE_INDEX)
        return _LinearCrossEntropy.apply(h, weight, bias, targets, chunk, cols, vocab)
    acc = torch.promote_types(_compute_dtype(h), torch.float32)
    # Without a gradient, ignored rows need no logits at all: sliding-window perplexity scores only a
    # stride of each window, so the output layer runs on those rows alone (the copy of h is C per row, not V).
    valid = targets != IGNORE_INDEX
    # In a torch.compile graph every row stays: selecting the scored ones sizes a tensor by the data, a graph
    # break and a recompile for each new count.
    traced = torch.compiler.is_compiling()
    if not traced:
        h, targets = h[valid], targets[valid]
    elif h.shape[0] <= chunk:  # one chunk: a loop over the rows would specialise the graph on their count
        logits = mask_padding(linear(h, weight, bias).to(acc), vocab)
        return F.cross_entropy(logits, targets, reduction="sum") / valid.sum().clamp(min=1)
    # oneDNN's (n, V) product is as fast as MKL's (V, n) one, and cross-entropy's own kernel over a
    # contiguous V axis 3× faster than logsumexp across rows: 1.2–2.2× the MKL (V, n) head at V 4k–50k.
    cols = kernels.enabled(h.device) and not takes_onednn(h, weight, bias) if vocab_major is None else vocab_major
    total = torch.zeros((), dtype=acc, device=h.device)
    for s in range(0, h.shape[0], chunk):
        hc, yc = h[s : s + chunk], targets[s : s + chunk]
        if cols:  # the (V, n) layout: 1.4× the (n, V) way at 30-50k words (AMD EPYC, MKL)
            logits = (weight @ hc.t() if bias is None else torch.addmm(bias[:, None], weight, hc.t())).to(acc)
            mask_padding(logits, vocab, 0)
            nll = _cross_entropy(logits, yc.clamp(min=0), 0)
            total += (nll * (yc != IGNORE_INDEX)).sum() if traced else nll.sum()
        else:
            total += F.cross_entropy(mask_padding(linear(hc, weight, bias).to(acc), vocab), yc, reduction="sum",
                                     ignore_index=IGNORE_INDEX)
    return total / (valid.sum().clamp(min=1) if traced else max(len(targets), 1))
