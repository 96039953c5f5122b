"""Shortest job first, an oracle reference: it orders by the true remaining run time, which
no real scheduler knows, and backfills with true run times."""

from __future__ import annotations

from plinth.sched.backfill import easy_backfill
from plinth.sched.policies.base import Policy
from plinth.sched.types import Decisions, JobState, Snapshot


class Sjf(Policy):
    """Shortest job first: an oracle reference that knows true run times."""

    name = "sjf"

    def order(self, js: JobState) -> tuple:
        # Remaining work does not change while a job waits, so the key is stable.
        return (js.remaining * js.job.request.num_gpus, js.job.submit_time, js.job.id)

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        easy_backfill(snap, now, snap.state.copy(), snap.pending, d, "sjf", oracle=True)
        return d
