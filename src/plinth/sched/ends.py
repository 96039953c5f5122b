"""Running jobs in the order they are expected to end, kept between passes.

EASY backfill's reservation walks the running jobs by expected end until the head of the queue
would fit. Sorting every running job's end in every pass (and bringing every job's progress
up to date first, to compute it) cost more than the rest of a FIFO pass; this index is kept by
the owner of scheduling state as jobs start, report their speed and stop, so a pass only reads
it.

A job's expected end is now + (estimate - progress) / rate, with the estimate its time limit
(or, for an oracle, its true duration). Once the job progresses at a known rate that is a
fixed time, t0 + (estimate - progress at t0) / rate, so it is kept in a sorted list. Before
that (started in the plan but not launched, launched but not yet reporting a rate, or still
restoring from a checkpoint) its progress stands still and its end moves with the clock: such
jobs are "floating" and are computed at each read. An end in the past reads as now (a job past
its estimate is expected to end at any moment); ends that tie are taken by job id.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Iterator, Mapping

from sortedcontainers import SortedList

from plinth.sched.types import JobState


def _estimate(js: JobState, oracle: bool) -> float:
    return js.job.duration if oracle else js.job.estimate


class RunningEnds:
    """Expected ends of the owner's running jobs (see the module docstring)."""

    __slots__ = ("_fixed", "_floating", "_jobs", "_keys")

    def __init__(self) -> None:
        self._jobs: dict[int, JobState] = {}
        # Per estimate kind (False: time limit or duration, True: the oracle's duration).
        self._fixed = (SortedList(), SortedList())  # (end, id)
        self._keys: dict[int, tuple[float, float]] = {}  # id -> its two fixed ends
        self._floating: dict[int, float] = {}  # id -> when progress begins (inf: unknown)

    @classmethod
    def of(cls, running: Mapping[int, JobState], now: float) -> RunningEnds:
        """An index of jobs whose `progress` is current at `now` (a snapshot built by hand;
        the owner keeps its own as jobs start and stop)."""
        ends = cls()
        for js in running.values():
            ends.add(js, now, js.progress)  # from now on at js.rate (floating if unknown)
        return ends

    def __len__(self) -> int:
        return len(self._jobs)

    def ids(self) -> set[int]:
        return set(self._jobs)

    def add(self, js: JobState, t0: float = math.inf, base: float = 0.0) -> None:
        """`js` runs in the plan. With `t0` (finite) and `js.rate`, it progresses from `base`
        at `t0` on; without, its end floats with the clock until it is added again with them."""
        self.discard(js.id)
        self._jobs[js.id] = js
        if math.isinf(t0) or js.rate <= 0:
            self._floating[js.id] = math.inf
            return
        self._floating[js.id] = t0  # fixed from t0 on (see `_settle`)
        self._keys[js.id] = (t0 + max(0.0, _estimate(js, False) - base) / js.rate,
                             t0 + max(0.0, _estimate(js, True) - base) / js.rate)

    def discard(self, job_id: int) -> None:
        if self._jobs.pop(job_id, None) is None:
            return
        keys = self._keys.pop(job_id, None)
        if self._floating.pop(job_id, None) is None and keys is not None:
            self._fixed[0].remove((keys[0], job_id))
            self._fixed[1].remove((keys[1], job_id))

    def ordered(self, now: float, oracle: bool, *, gone: Collection[int] = (),
                fresh: Iterable[JobState] = ()) -> Iterator[tuple[float, JobState]]:
        """(expected end, job) for every running job not in `gone`, and for the `fresh` jobs
        (started in this pass, at rate 1), by end then id."""
        self._settle(now)
        fixed, jobs = self._fixed[oracle], self._jobs
        new = {js.id: js for js in fresh}
        past = fixed.bisect_left((now, math.inf))  # ends already due read as now
        moving = [(now + max(0.0, _estimate(js, oracle) - js.progress)
                   / (js.rate if js.rate > 0 else 1.0), js.id)
                  for js in map(jobs.__getitem__, self._floating)]
        moving += [(now + max(0.0, _estimate(js, oracle) - js.progress), js.id)
                   for js in new.values()]
        moving += [(now, jid) for _, jid in fixed.islice(0, past)]
        moving.sort()
        for end, jid in heapq.merge(moving, fixed.islice(past)):
            if jid not in gone:
                yield end, jobs[jid] if jid in jobs else new[jid]

    def _settle(self, now: float) -> None:
        """Floating jobs whose progress has begun by `now` take their fixed place."""
        if not self._floating:
            return
        ready = [jid for jid, t0 in self._floating.items() if t0 <= now]
        for jid in ready:
            del self._floating[jid]
            est, true = self._keys[jid]
            self._fixed[0].add((est, jid))
            self._fixed[1].add((true, jid))
