"""Greedy in-order scheduling with EASY backfill, shared by FIFO, SJF and strict priority.

Jobs start in queue order while they fit. The first job that does not fit gets a reservation:
the earliest time (the shadow time) at which, by the running jobs' estimates, it would fit, and
the GPUs it would get then. Later jobs may jump ahead only if they fit now and either finish
before the shadow time or use none of the reserved GPUs. Like Slurm's bf_max_job_test, at most
`backfill_depth` jobs are examined past the head.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from plinth.core.resources import Allocation
from plinth.sched.placement import place
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Snapshot, Start


def easy_backfill(snap: Snapshot, now: float, work: ClusterState, queue: Iterable[JobState],
                  d: Decisions, reason: str, oracle: bool = False) -> None:
    cfg = snap.config
    started: list[tuple[JobState, Allocation]] = []
    shadow, reserved = math.inf, frozenset()
    head: JobState | None = None
    examined = 0
    capacity = work.gpu_free_milli.size * 1000
    for js in queue:
        if head is not None:
            examined += 1
            if examined > cfg.backfill_depth:
                break
            if work.used_milli >= capacity and js.job.request.gpu_milli_total > 0:
                d.waiting[js.id] = "Resources: no free GPU"
                continue
        req = js.job.request
        alloc = place(work, req, cfg.placement)
        if alloc is None:
            if head is None:
                head = js
                shadow, reserved = _reservation(snap, now, work, js, started, oracle)
                when = "unknown" if math.isinf(shadow) else f"t={shadow:.0f}s"
                d.waiting[js.id] = f"Resources: first in line, GPUs reserved from {when}"
            else:
                d.waiting[js.id] = f"Resources: waiting behind job {head.id}"
            continue
        if head is not None:
            est = js.remaining if oracle else js.remaining_estimate
            if now + est > shadow and _overlaps(alloc, reserved):
                d.waiting[js.id] = f"Priority: would delay the reservation of job {head.id}"
                continue
            why = f"{reason}: backfilled ahead of job {head.id}"
        else:
            why = reason
        work.allocate(alloc, req)
        started.append((js, alloc))
        d.starts.append(Start(js.id, alloc, why))


def _overlaps(alloc: Allocation, reserved: frozenset[int]) -> bool:
    return any(g in reserved for s in alloc.slots for g in s.gpus)


def _reservation(snap: Snapshot, now: float, work: ClusterState, head: JobState,
                 started: list[tuple[JobState, Allocation]], oracle: bool
                 ) -> tuple[float, frozenset[int]]:
    """When and where `head` would start if the running jobs end as estimated."""
    def end(js: JobState, just_started: bool) -> float:
        rem = js.remaining if oracle else js.remaining_estimate
        rate = 1.0 if just_started or js.rate <= 0 else js.rate
        return now + rem / rate

    ends = [(end(js, False), js.id, js.allocation, js.job.request)
            for js in snap.running.values() if js.allocation is not None]
    ends += [(end(js, True), js.id, a, js.job.request) for js, a in started]
    ends.sort(key=lambda e: (e[0], e[1]))
    scratch = work.copy()
    need = head.job.request.gpu_milli_total
    capacity = scratch.gpu_free_milli.size * 1000
    for t, _, alloc, req in ends:
        scratch.release(alloc, req)
        if scratch.used_milli + need > capacity:
            continue  # not enough GPU share free in total yet: skip the placement attempt
        a = place(scratch, head.job.request, snap.config.placement)
        if a is not None:
            return t, frozenset(g for s in a.slots for g in s.gpus)
    return math.inf, frozenset()

