"""Greedy in-order scheduling with EASY backfill, shared by FIFO, SJF and strict priority.

Jobs start in queue order while they fit. The first job that does not fit gets a reservation:
the earliest time (the shadow time) at which, by the running jobs' estimates, it would fit, and
the GPUs it would get then. Later jobs may jump ahead only if they fit now and either finish
before the shadow time or use none of the reserved GPUs. Like Slurm's bf_max_job_test, at most
`backfill_depth` jobs are examined past the head.

Two states are kept while backfilling: `work`, the cluster as it will be, and `avoid`, the same
with the reserved GPUs marked as taken. A job that would outlive the shadow time is placed on
`avoid`, so it lands on unreserved GPUs when there are any, instead of being turned away
because best fit happened to pick a reserved GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from plinth.core.resources import Allocation, Request, WorkerSlot
from plinth.sched.placement import place
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Snapshot, Start

GPU_ONLY = Request()  # book-keeping on `avoid` counts GPU share only


def easy_backfill(snap: Snapshot, now: float, work: ClusterState, queue: Iterable[JobState],
                  d: Decisions, reason: str, oracle: bool = False) -> None:
    """Start what fits in `queue` order, with EASY backfill. Allocates on `work`."""
    cfg = snap.config
    started: list[tuple[JobState, Allocation]] = []
    shadow, reserved = math.inf, frozenset()
    head: JobState | None = None
    avoid: ClusterState | None = None
    examined = 0
    behind = delays = backfilled = ""
    for js in queue:
        req = js.job.request
        if head is None:
            alloc = place(work, req, cfg.placement)
            if alloc is None:
                head = js
                shadow, reserved = reservation(snap, now, work, js, started, oracle)
                avoid = without_reserved(work, reserved)
                when = "unknown" if math.isinf(shadow) else f"t={shadow:.0f}s"
                d.waiting[js.id] = f"Resources: first in line, GPUs reserved from {when}"
                behind = f"Resources: waiting behind job {js.id}"
                delays = f"Priority: would delay the reservation of job {js.id}"
                backfilled = f"{reason}: backfilled ahead of job {js.id}"
                continue
            why = reason
        else:
            examined += 1
            if examined > cfg.backfill_depth or (work.free_milli == 0 and req.gpu_milli_total):
                break
            est = js.remaining if oracle else js.remaining_estimate
            target = work if now + est <= shadow else avoid
            alloc = place(target, req, cfg.placement)  # type: ignore[arg-type]
            if alloc is None:
                d.waiting[js.id] = behind if target is work else delays
                continue
            avoid.allocate(masked(alloc, reserved), GPU_ONLY)  # type: ignore[union-attr]
            why = backfilled
        work.allocate(alloc, req)
        started.append((js, alloc))
        d.starts.append(Start(js.id, alloc, why))


def masked(alloc: Allocation, reserved: frozenset[int]) -> Allocation:
    """The part of `alloc` on unreserved GPUs (reserved ones are already taken on `avoid`)."""
    return Allocation(tuple(WorkerSlot(s.node, (g,), s.milli, s.gpu_memory_mib)
                            for s in alloc.slots for g in s.gpus if g not in reserved))


def without_reserved(work: ClusterState, reserved: frozenset[int]) -> ClusterState:
    avoid = work.copy()
    slots = tuple(WorkerSlot(int(work.cluster.gpu_node[g]), (g,), int(work.gpu_free_milli[g]),
                             int(work.gpu_free_mem[g]))
                  for g in sorted(reserved) if work.gpu_free_milli[g] > 0)
    if slots:
        avoid.allocate(Allocation(slots), GPU_ONLY)
    return avoid


def reservation(snap: Snapshot, now: float, work: ClusterState, head: JobState,
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
    for t, _, alloc, req in ends:
        scratch.release(alloc, req)
        if scratch.free_milli < need:
            continue  # not enough GPU share free in total yet: skip the placement attempt
        a = place(scratch, head.job.request, snap.config.placement)
        if a is not None:
            return t, frozenset(g for s in a.slots for g in s.gpus)
    return math.inf, frozenset()
