"""Conditional: target given source, or each line given itself (encoder–decoders: seq2seq, transformer).

translation run: every non-blank line is `source<TAB>target`; the score is -log p(target + eos | source),
summed over target tokens. denoising run: every non-blank line is both the source (uncorrupted) and the
target, an autoencoding perplexity (how well the model restores text it is shown intact); a line longer
than max_length-1 tokens is scored in consecutive pieces. tokens = target tokens + one eos per line;
bytes = target UTF-8 bytes + one per line (its line end, which eos stands for); words = whitespace words
of the targets. Sources longer than max_length-1 tokens are cut (counted in `truncated_sources`).

Batches are built as objective translation's (plmcli.objectives.seq2seq.collate). The model:
`model(src_ids, src_mask, tgt_in_ids) -> (B, T, V)` next-token logits, and `max_positions`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from plmcli.errors import PlmError
from plmcli.eval.perplexity import report
from plmcli.objectives.seq2seq import collate

LINES_PER_BATCH = 64
"""Lines encoded at a time, in batches of --batch-size: tokenizing many lines at once is what makes it fast."""


@dataclass
class PairScorer:
    """Sums -log p(target + eos | source) over (source, target, where) pairs, batch_size pairs per pass."""

    model: torch.nn.Module
    tok: object
    max_length: int
    positions: int
    pad: int
    start: int
    eos: int
    translation: bool
    batch_size: int
    device: object

    def pieces(self, pairs) -> tuple[list, list, int]:
        """(source ids, target ids, sources cut) of `pairs`; a long denoising target becomes pieces that
        each restore themselves, a long translation target is refused."""
        L, P = self.max_length, self.positions
        srcs = [e.ids for e in self.tok.encode_batch([p[0] for p in pairs], add_special_tokens=False)]
        tgts = [e.ids for e in self.tok.encode_batch([p[1] for p in pairs], add_special_tokens=False)]
        s_ids, t_ids, cut = [], [], 0
        for (_, _, where), s, t in zip(pairs, srcs, tgts):
            if len(t) > L - 1:
                if self.translation:
                    raise PlmError(f"{where}: the target has {len(t)} tokens, more than --max-length {L} - 1",
                                   f"split the line, or raise --max-length (at most {P})")
                for a in range(0, len(t), L - 1):  # autoencoding: each piece restores itself
                    s_ids.append(t[a : a + L - 1])
                    t_ids.append(t[a : a + L - 1])
                continue
            cut += len(s) > L - 1
            s_ids.append(s)
            t_ids.append(t)
        return s_ids, t_ids, cut

    def __call__(self, pairs) -> tuple[float, int, int]:
        """(summed NLL, target tokens + eos, sources cut) of `pairs`."""
        s_ids, t_ids, cut = self.pieces(pairs)
        nll, B, dev = 0.0, self.batch_size, self.device
        for b in range(0, len(s_ids), B):
            batch = collate(s_ids[b : b + B], t_ids[b : b + B], self.pad, self.start, self.eos, self.max_length)
            with torch.no_grad():
                logits = self.model(batch["src_ids"].to(dev), batch["src_mask"].to(dev), batch["tgt_in_ids"].to(dev))
            nll += F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].to(dev).flatten(),
                                   ignore_index=-100, reduction="sum").item()
        return nll, sum(len(t) + 1 for t in t_ids), cut


def score(model, files, tok, cfg: dict, *, max_length: int | None = None, stride: int | None = None,
          batch_size: int = 8, device="cpu") -> dict:
    """eval-ppl's report of an encoder–decoder run over `files`; adds truncated_sources and `scores`."""
    P = model.max_positions
    L = P if max_length is None else max_length  # 0 is a value (refused below), not the default
    if not 2 <= L <= P:
        raise PlmError(f"--max-length {L} is outside 2..{P} (the model's positions)", f"use --max-length ≤ {P}")
    ids = cfg["tokenizer"].get("special_token_ids", {})
    if "pad" not in ids or "eos" not in ids:
        raise PlmError("the run's tokenizer has no pad/eos special tokens", "retrain with a seq2seq recipe's tokenizer settings")
    translation = cfg.get("objective", "translation") != "denoising"
    model.to(device).eval()
    scorer = PairScorer(model, tok, L, P, ids["pad"], ids.get("bos", ids["eos"]), ids["eos"], translation, batch_size, device)
    totals = np.zeros(5)  # nll, tokens, bytes, words, truncated sources
    per_file = []
    for f in files:
        sums = file_sums(f, scorer)
        per_file.append({"file": f, **report(sums[0], int(sums[1]), int(sums[2]), int(sums[3]), L, L),
                         "truncated_sources": int(sums[4])})
        totals += sums
    res = report(totals[0], int(totals[1]), int(totals[2]), int(totals[3]), L, L)
    res["truncated_sources"] = int(totals[4])
    res["scores"] = "target given source" if translation else "each line given itself uncorrupted (autoencoding)"
    res["first_token"] = "conditioned on the source (the decoder starts from " + ("bos)" if "bos" in ids else "eos)")
    res["files"] = per_file
    return res


def file_sums(f: str, scorer: PairScorer) -> np.ndarray:
    """(nll, tokens, bytes, words, truncated sources) of one input, read LINES_PER_BATCH batches at a time."""
    from plmcli.data.parallel import split_pair
    from plmcli.data.text import expand_inputs, text_lines

    sums, pending = np.zeros(5), []

    def flush():
        nll, n, cut = scorer(pending)
        sums[:] += [nll, n, 0, 0, cut]
        pending.clear()

    for name in expand_inputs([f]):
        for lineno, line in enumerate(text_lines(name), start=1):
            if not line.strip():
                continue
            src, tgt = split_pair(line, name, lineno) if scorer.translation else (line.strip(), line.strip())
            pending.append((src, tgt, f"'{name}' line {lineno}"))
            sums[2] += len(tgt.encode("utf-8")) + 1
            sums[3] += len(tgt.split())
            if len(pending) == LINES_PER_BATCH * scorer.batch_size:
                flush()
    if pending:
        flush()
    if sums[1] == 0:
        raise PlmError(f"{f} has no lines to score",
                       "pass a file with text" + (" (source<TAB>target per line)" if scorer.translation else ""))
    return sums
