"""The policy interface: an ordering key for the pending queue, and a pure `schedule`."""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedKeyList

from plinth.sched.types import Decisions, JobState, Snapshot


class Policy:
    """A scheduling policy.

    `schedule(snapshot, now)` must not change the snapshot: it plans on `snapshot.state.copy()`.
    `order(job)` is the key the pending queue is kept sorted by. It may only read fields that do
    not change while a job waits (submit time, priority, attained service, ...), so the owner
    of the queue can keep it sorted incrementally.
    """

    name = "base"
    preemptive = False  # may return Preempt decisions
    # What the runtime must be able to do for this policy ("checkpoint": stop a job so that it
    # saves first; "relaunch": start a moved job's next attempt on other GPUs).
    requires: frozenset[str] = frozenset()
    # Whether `schedule` reads running jobs' progress, attained service or run time: the owner
    # brings every running job up to date before each pass only for a policy that does.
    reads_running = True
    # Whether `schedule` reads `Snapshot.arrived`: the owner notes the jobs queued between
    # passes only for a policy that does.
    reads_arrivals = False

    def order(self, js: JobState) -> tuple:
        return (js.job.submit_time, js.job.id)

    def pending_queue(self, jobs: Iterable[JobState] = ()) -> SortedKeyList:
        """A pending queue of `jobs`, sorted by `order`, for the owner to keep."""
        return SortedKeyList(jobs, key=self.order)

    def schedule(self, snap: Snapshot, now: float) -> Decisions:  # pragma: no cover
        raise NotImplementedError
