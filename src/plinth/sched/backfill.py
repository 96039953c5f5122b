"""Greedy in-order scheduling with EASY backfill, shared by FIFO, SJF and strict priority.

Jobs start in queue order while they fit. The first job that does not fit gets a reservation:
the earliest time (the shadow time) at which, by the running jobs' estimates, it would fit, and
the GPUs it would get then. Later jobs may jump ahead only if they fit now and either finish
before the shadow time or use none of the reserved GPUs. Like Slurm's bf_max_job_test, at most
`backfill_depth` jobs are examined past the head.

Two states are kept while backfilling: `work`, the cluster as it will be, and `avoid`, the same
with the reserved GPUs marked as taken. A job that would outlive the shadow time is placed on
`avoid`, so it lands on unreserved GPUs when there are any, instead of being turned away
because best fit happened to pick a reserved GPU. Which GPUs are reserved is worked out only
when such a job comes (a full cluster, the usual case under load, never needs them), and
`avoid` is made then.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

import numpy as np

from plinth.core.resources import Allocation, Request, WorkerSlot
from plinth.sched.ends import RunningEnds
from plinth.sched.placement import FreedWhole, PlacementConfig, place
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Snapshot, Start

GPU_ONLY = Request()  # book-keeping on `avoid` counts GPU share only

Started = Sequence[tuple[JobState, Allocation]]


def easy_backfill(snap: Snapshot, now: float, work: ClusterState, queue: Iterable[JobState],
                  d: Decisions, reason: str, oracle: bool = False, *,
                  planned: Started = (), gone: Collection[int] = (),
                  memo: HeadPlacements | None = None) -> None:
    """Start what fits in `queue` order, with EASY backfill. Allocates on `work`.

    `planned` are jobs this pass already started on `work` and `gone` the running jobs it
    already preempted (a preemptive policy backfills after it has made room): the head's
    reservation counts the first as running and the second as ended. A policy that keeps a
    `memo` between passes saves placing the same head on the same state again."""
    cfg = snap.config
    pcfg, depth = cfg.placement, cfg.backfill_depth
    waiting, starts = d.waiting, d.starts
    started: list[tuple[JobState, Allocation]] = []
    shadow, res = math.inf, NO_RESERVATION
    head: JobState | None = None
    avoid: ClusterState | None = None
    full = False  # no GPU share left on `work`: nothing that needs a GPU can start
    # Request shapes (by identity) that failed on `work` / on `avoid` in this pass. Neither
    # state is released during backfill, so a failure stands, as the states' own memos say;
    # these only save hashing the request for every job of a long queue.
    failed_work: set[int] = set()
    failed_avoid: set[int] = set()
    since: list[tuple[Allocation, Request]] = []  # started on `work` behind the head
    examined = 0
    behind = delays = backfilled = ""
    for js in queue:
        req = js.job.request
        if head is None:
            alloc = place(work, req, pcfg)
            if alloc is None:
                head = js
                res = reservation(snap, now, work, js, [*planned, *started], oracle, gone, memo)
                shadow = res.shadow
                full = work.free_milli == 0
                when = "unknown" if math.isinf(shadow) else f"t={shadow:.0f}s"
                waiting[js.id] = f"Resources: first in line, GPUs reserved from {when}"
                behind = f"Resources: waiting behind job {js.id}"
                delays = f"Priority: would delay the reservation of job {js.id}"
                backfilled = f"{reason}: backfilled ahead of job {js.id}"
                continue
            why = reason
        else:
            examined += 1
            if examined > depth or (full and req.gpu_milli_total):
                break
            # The job's remaining estimate (JobState.remaining_estimate, or the true
            # remaining time for an oracle), inlined: this runs for every examined job.
            job = js.job
            est = (job.duration if oracle or job.time_limit is None else job.time_limit
                   ) - js.progress
            on_work = now + (est if est > 0.0 else 0.0) <= shadow
            failed = failed_work if on_work else failed_avoid
            if id(req) in failed:
                waiting[js.id] = behind if on_work else delays
                continue
            if on_work:
                alloc = place(work, req, pcfg)
            else:
                if avoid is None:  # first needed now: `work` as it is, reserved GPUs taken
                    avoid = without_reserved(work, res.reserved(since))
                alloc = place(avoid, req, pcfg)
            if alloc is None:
                failed.add(id(req))
                waiting[js.id] = behind if on_work else delays
                continue
            if avoid is not None:
                avoid.allocate(masked(alloc, res.gpus), GPU_ONLY)
            else:
                since.append((alloc, req))
            why = backfilled
        work.allocate(alloc, req)
        full = work.free_milli == 0
        started.append((js, alloc))
        starts.append(Start(js.id, alloc, why))


def masked(alloc: Allocation, reserved: frozenset[int]) -> Allocation:
    """The part of `alloc` on unreserved GPUs (reserved ones are already taken on `avoid`),
    one slot per GPU."""
    if all(len(s.gpus) == 1 and s.gpus[0] not in reserved for s in alloc.slots):
        return alloc  # already one GPU a slot, none reserved: the same slots
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


class HeadPlacements:
    """Where a head of the queue went on a cluster state, remembered between passes.

    Under load the head waits through many passes, and the state it would start on (the
    cluster with the jobs that end before its shadow time released) is usually the same from
    one pass to the next: a job that ends frees in `work` the GPUs it freed in the count. For a
    countable request (whole GPUs, nothing else asked: see `FreedWhole`) placement reads only
    the GPUs' free shares, so those are the key."""

    __slots__ = ("_memo",)
    SIZE = 64

    def __init__(self) -> None:
        self._memo: dict[tuple[Request, PlacementConfig, bytes], frozenset[int]] = {}

    def reserved(self, work: ClusterState, freed: list[tuple[Allocation, Request]],
                 req: Request, pcfg: PlacementConfig) -> frozenset[int]:
        free = work.gpu_free_milli.copy()  # as `_released(work, freed)` would have it
        slots = [s for a, _ in freed for s in a.slots]
        np.add.at(free, [g for s in slots for g in s.gpus],
                  [s.milli for s in slots for _ in s.gpus])
        key = (req, pcfg, free.tobytes())
        gpus = self._memo.get(key)
        if gpus is None:
            gpus = _placed(_released(work, freed), req, pcfg)
            if len(self._memo) >= self.SIZE:
                self._memo.clear()
            self._memo[key] = gpus
        return gpus


def _placed(state: ClusterState, req: Request, pcfg: PlacementConfig) -> frozenset[int]:
    a = place(state, req, pcfg)
    if a is None:
        raise AssertionError(f"reservation: {req} was counted to fit but did not")
    return frozenset(g for s in a.slots for g in s.gpus)


class Reservation:
    """When the head of the queue could start (`shadow`), and the GPUs it would get then
    (`gpus`), placed when first asked for: on `work` with the allocations in `taken` (all whole
    GPUs) released."""

    __slots__ = ("_gpus", "_pending", "shadow")

    def __init__(self, shadow: float, gpus: frozenset[int] | None = None,
                 pending: tuple[ClusterState, list[tuple[Allocation, Request]], Request,
                                PlacementConfig, HeadPlacements | None] | None = None) -> None:
        self.shadow, self._gpus, self._pending = shadow, gpus, pending

    @property
    def gpus(self) -> frozenset[int]:
        return self.reserved()

    def reserved(self, since: Sequence[tuple[Allocation, Request]] = ()) -> frozenset[int]:
        """The GPUs; `since` are the jobs started on `work` after the reservation was made,
        all expected to end before the shadow time (so free by then)."""
        if self._gpus is None:
            work, taken, req, pcfg, memo = self._pending  # type: ignore[misc]
            freed = [*taken, *since]
            self._gpus = (_placed(_released(work, freed), req, pcfg) if memo is None
                          else memo.reserved(work, freed, req, pcfg))
            self._pending = None
        return self._gpus


NO_RESERVATION = Reservation(math.inf, frozenset())


def _released(work: ClusterState, taken: list[tuple[Allocation, Request]]) -> ClusterState:
    scratch = work.copy()
    for a, r in taken:
        scratch.release(a, r)
    return scratch


def reservation(snap: Snapshot, now: float, work: ClusterState, head: JobState,
                started: Started, oracle: bool, gone: Collection[int] = (),
                memo: HeadPlacements | None = None) -> Reservation:
    """When and where `head` would start if the running jobs (less those in `gone`) and the
    ones `started` in this pass end as expected.

    Ends are taken in order, by time then id (`RunningEnds`, which the owner keeps between
    passes). For a plain whole-GPU request the GPUs they free are counted (`FreedWhole`) until
    the request would fit; where it will go is worked out only if asked for."""
    ends = snap.ends if snap.ends is not None else RunningEnds.of(snap.running, now)
    fresh = {js.id: a for js, a in started}
    queue = ends.ordered(now, oracle, gone=gone, fresh=[js for js, _ in started])
    req, pcfg = head.job.request, snap.config.placement
    need = req.gpu_milli_total
    freed = FreedWhole(work) if FreedWhole.countable(req, pcfg) else None
    taken: list[tuple[Allocation, Request]] = []
    scratch: ClusterState | None = None
    for end, js in queue:
        alloc, jreq = fresh.get(js.id) or js.allocation, js.job.request
        if scratch is None:
            taken.append((alloc, jreq))  # type: ignore[arg-type]
            if freed is not None and freed.add(alloc):  # type: ignore[arg-type]
                if freed.fits(req):  # fits by the count: place later, if asked
                    return Reservation(end, pending=(work, taken, req, pcfg, memo))
                continue
            scratch = _released(work, taken)  # cannot be counted: release, place every time
        else:
            scratch.release(alloc, jreq)  # type: ignore[arg-type]
        if scratch.free_milli < need:
            continue  # not enough GPU share free in total yet: skip the placement attempt
        a = place(scratch, req, pcfg)
        if a is not None:
            return Reservation(end, frozenset(g for s in a.slots for g in s.gpus))
    return NO_RESERVATION
