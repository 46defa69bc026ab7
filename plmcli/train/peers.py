"""Which process of a multi-process run is gone when a collective fails.

Every process's host and pid are gathered once, at the start of training, so that when a process dies
(kill -9, out of memory, a lost node) the survivors say which one in one line, instead of a backend's
traceback about a closed connection. A process on this host is checked directly; one on another host
cannot be, and the line names the hosts that may have lost it.
"""

from __future__ import annotations

import os
import socket

import torch

from plmcli.train.checkpoint import RunStopped, process_alive

# What a collective's error says when a peer is gone (gloo: "Connection closed by peer", "Connection reset
# by peer"; NCCL, and any backend at train.dist_timeout: "timed out" / "Timeout").
_LOST = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "timeout", "socket")


class Peers:
    """The run's processes, as (host, pid) by rank."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        me = (socket.gethostname(), os.getpid())
        self.table = [me]
        if world > 1:
            self.table = [None] * world
            torch.distributed.all_gather_object(self.table, me)

    def failed(self, error: BaseException) -> bool:
        """Whether `error` is a collective that lost another process (only on a multi-process run)."""
        if self.world == 1 or not isinstance(error, RuntimeError):
            return False
        text = str(error).lower()
        return isinstance(error, torch.distributed.DistError) or any(w in text for w in _LOST)

    def lost(self, error: BaseException, saved: str) -> RunStopped:
        """The one-line stop of a survivor: which process died (or which hosts may have), and how to go on."""
        here = socket.gethostname()
        dead = [r for r, (host, pid) in enumerate(self.table)
                if r != self.rank and host == here and not process_alive(pid)]
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

