"""Shortest job first, an oracle reference: it orders by the true remaining run time, which
no real scheduler knows, and backfills with true run times."""

from __future__ import annotations

from plinth.sched.backfill import HeadPlacements, easy_backfill
from plinth.sched.policies.base import Policy
from plinth.sched.types import Decisions, JobState, Snapshot


class Sjf(Policy):
    """Shortest job first: an oracle reference that knows true run times."""

    name = "sjf"
    reads_running = False  # the reservation reads the owner's index of expected ends

    def __init__(self) -> None:
        self.memo = HeadPlacements()  # the head's placement at its shadow time, between passes

    def order(self, js: JobState) -> tuple:
        # Remaining work does not change while a job waits, so the key is stable.
        return (js.remaining * js.job.request.num_gpus, js.job.submit_time, js.job.id)

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        easy_backfill(snap, now, snap.state.copy(), snap.pending, d, "sjf", oracle=True,
                      memo=self.memo)
        return d
