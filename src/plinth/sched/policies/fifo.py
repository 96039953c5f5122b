"""First in, first out, with EASY backfill (Slurm's default pairing)."""

from __future__ import annotations

from plinth.sched.backfill import HeadPlacements, easy_backfill
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.types import Decisions, Snapshot, Start


class Fifo(Policy):
    """First in, first out, with EASY backfill (a reservation for the head job)."""

    name = "fifo"
    reads_running = False  # the reservation reads the owner's index of expected ends

    def __init__(self, backfill: bool = True) -> None:
        self.backfill = backfill
        self.memo = HeadPlacements()  # the head's placement at its shadow time, between passes

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        work = snap.state.copy()
        if self.backfill:
            easy_backfill(snap, now, work, snap.pending, d, "fifo", memo=self.memo)
            return d
        for js in snap.pending:  # strict FIFO: stop at the first job that does not fit
            alloc = place(work, js.job.request, snap.config.placement)
            if alloc is None:
                d.waiting[js.id] = "Resources: first in line (no backfill)"
                break
            work.allocate(alloc, js.job.request)
            d.starts.append(Start(js.id, alloc, "fifo"))
        return d
