"""Which process of a multi-process run is gone when a collective fails.

Every process's host and pid are gathered once, at the start of training, so that when a process dies
(kill -9, out of memory, a lost node) the survivors say which one in one line, instead of a backend's
traceback about a closed connection. A process on this host is checked directly; one on another host
cannot be, and the line names the hosts that may have lost it.
"""

from __future__ import annotations

import os
import socket
import time

import torch

from plmcli.data.store import process_alive
from plmcli.train.checkpoint import RunStopped

# What a collective's error says when a peer is gone (gloo: "Connection closed by peer", "Connection reset
# by peer"; NCCL, and any backend at train.dist_timeout: "timed out" / "Timeout").
_LOST = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "timeout", "socket")


class Peers:
    """The run's processes, as (host, pid) by rank."""

    def __init__(self, rank: int, world: int, timeout_s: int | None = None):
        self.rank, self.world = rank, world
        me = (socket.gethostname(), os.getpid())
        self.table, self.group = [me], None
        if world > 1:
            self.table = [None] * world
            torch.distributed.all_gather_object(self.table, me)
            # The per-step agreement runs on the host (gloo, beside NCCL on GPUs): its values (tokens, the
            # clock, a stop signal) live on the host, and a collective on a GPU stream would make the host
            # wait for the step's queued kernels every step.
            from datetime import timedelta

            kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
            self.group = torch.distributed.new_group(backend="gloo", **kw)

    def agree(self, tokens: int, elapsed: float, signal_number: int) -> tuple[int, float, int]:
        """This optimizer step's (tokens summed, the latest clock, any stop signal) over every process, so that
        they all stop at the same step (max_tokens, time_budget, a scheduler's signal)."""
        if self.world == 1:
            return tokens, elapsed, signal_number
        row = torch.tensor([tokens, elapsed, signal_number], dtype=torch.float64)
        rows = [torch.empty_like(row) for _ in range(self.world)]
        torch.distributed.all_gather(rows, row, group=self.group)
        table = torch.stack(rows).tolist()  # host tensors: no device is waited for
        return int(sum(r[0] for r in table)), max(r[1] for r in table), int(max(r[2] for r in table))

    def failed(self, error: BaseException) -> bool:
        """Whether `error` is a collective that lost another process (only on a multi-process run)."""
        if self.world == 1 or not isinstance(error, RuntimeError):
            return False
        text = str(error).lower()
        return isinstance(error, torch.distributed.DistError) or any(w in text for w in _LOST)

    def lost(self, error: BaseException, saved: str) -> RunStopped:
        """The one-line stop of a survivor: which process died (or which hosts may have), and how to go on."""
        here = socket.gethostname()
        local = [r for r, (host, _) in enumerate(self.table) if r != self.rank and host == here]
        dead: list = []
        # A killed process's sockets close while it is still exiting: give it a moment to be seen gone.
        for _ in range(20):
            dead = [r for r in local if not process_alive(self.table[r][1])]
            if dead or not local:
                break
            time.sleep(0.1)
        if dead:
            gone = ", ".join(f"process {r} (pid {self.table[r][1]})" for r in dead)
            what = f"{gone} of this {self.world}-process run died"
        else:
            hosts = sorted({host for host, _ in self.table if host != here}) or [here]
            reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            what = (f"a collective with the other processes of this {self.world}-process run failed ({reason}); "
                    f"a process on {', '.join(hosts)} stopped or cannot be reached")
        return RunStopped(f"{what}, so process {self.rank} stops too; {saved}",
                          "its own output says why (out of memory, a node failure, a kill); then run the same "
                          "command again with --resume (or --auto-resume)")

