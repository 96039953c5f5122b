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

import heapq
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from sortedcontainers import SortedList

from plinth.core.resources import Allocation, Request, WorkerSlot
from plinth.sched.placement import FreedWhole, PlacementConfig, place
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Snapshot, Start

GPU_ONLY = Request()  # book-keeping on `avoid` counts GPU share only

Started = Sequence[tuple[JobState, Allocation]]


def easy_backfill(snap: Snapshot, now: float, work: ClusterState, queue: Iterable[JobState],
                  d: Decisions, reason: str, oracle: bool = False, *,
                  planned: Started = (), gone: Collection[int] = (),
                  ends: EndIndex | None = None) -> None:
    """Start what fits in `queue` order, with EASY backfill. Allocates on `work`.

    `planned` are jobs this pass already started on `work` and `gone` the running jobs it
    already preempted (a preemptive policy backfills after it has made room): the head's
    reservation counts the first as running and the second as ended. `ends` is the policy's
    `EndIndex` of running jobs, kept between passes."""
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
    examined = 0
    behind = delays = backfilled = ""
    for js in queue:
        req = js.job.request
        if head is None:
            alloc = place(work, req, pcfg)
            if alloc is None:
                head = js
                res = reservation(snap, now, work, js, [*planned, *started], oracle, gone,
                                  ends)
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
            est = job.duration if oracle or job.time_limit is None else job.time_limit
            est -= js.progress
            on_work = now + (est if est > 0.0 else 0.0) <= shadow
            failed = failed_work if on_work else failed_avoid
            if id(req) in failed:
                waiting[js.id] = behind if on_work else delays
                continue
            if on_work:
                alloc = place(work, req, pcfg)
            else:
                if avoid is None:  # first needed now: `work` as it is, reserved GPUs taken
                    avoid = without_reserved(work, res.gpus)
                alloc = place(avoid, req, pcfg)
            if alloc is None:
                failed.add(id(req))
                waiting[js.id] = behind if on_work else delays
                continue
            if avoid is not None:
                avoid.allocate(masked(alloc, res.gpus), GPU_ONLY)
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


def _end(js: JobState, now: float, oracle: bool, rate: float) -> float:
    job = js.job
    left = (job.duration if oracle or job.time_limit is None else job.time_limit) - js.progress
    return now + (left if left > 0.0 else 0.0) / (rate if rate > 0 else 1.0)


class EndIndex:
    """The running jobs by expected end, then id: the order in which a reservation counts
    them as ending. Kept by a policy from pass to pass.

    A run's expected end is fixed when it is first seen (the time then, plus its remaining
    estimate over its rate), as Slurm's is its start time plus its time limit; a run that
    outlives it counts as ending now. So a pass sorts only the runs that started or changed
    speed since the last one, not every running job."""

    __slots__ = ("_order", "_seen", "oracle")

    def __init__(self, oracle: bool = False) -> None:
        self.oracle = oracle
        # id -> (the job's state object, its start, its rate, its end)
        self._seen: dict[int, tuple[JobState, float | None, float, float]] = {}
        self._order = SortedList()  # (end, id)

    def update(self, running: Mapping[int, JobState], now: float) -> SortedList:
        seen, order = self._seen, self._order
        if len(seen) > len(running) or not seen.keys() <= running.keys():
            for jid in seen.keys() - running.keys():
                order.remove((seen.pop(jid)[3], jid))
        for jid, js in running.items():
            s = seen.get(jid)
            if s is not None and s[0] is js and s[1] == js.start_time and s[2] == js.rate:
                continue
            if s is not None:
                order.remove((s[3], jid))
            if js.allocation is None:
                seen.pop(jid, None)
                continue
            end = _end(js, now, self.oracle, js.rate)
            seen[jid] = (js, js.start_time, js.rate, end)
            order.add((end, jid))
        return order


def ending(order: SortedList, now: float, gone: Collection[int]) -> Iterator[tuple[float, int]]:
    """(end, id) in order, less `gone`; runs already past their expected end end now, by id."""
    yield from sorted((now, jid) for _, jid in order.irange(maximum=(now, math.inf))
                      if jid not in gone)
    for end, jid in order.irange(minimum=(now, math.inf)):
        if jid not in gone:
            yield end, jid


class Reservation:
    """When the head of the queue could start (`shadow`), and the GPUs it would get then
    (`gpus`), placed when first asked for."""

    __slots__ = ("_gpus", "_pending", "shadow")

    def __init__(self, shadow: float, gpus: frozenset[int] | None = None,
                 pending: tuple[ClusterState, Request, PlacementConfig] | None = None) -> None:
        self.shadow, self._gpus, self._pending = shadow, gpus, pending

    @property
    def gpus(self) -> frozenset[int]:
        if self._gpus is None:
            state, req, pcfg = self._pending  # type: ignore[misc]
            a = place(state, req, pcfg)
            if a is None:
                raise AssertionError(f"reservation: {req} was counted to fit but did not")
            self._gpus, self._pending = frozenset(g for s in a.slots for g in s.gpus), None
        return self._gpus


NO_RESERVATION = Reservation(math.inf, frozenset())


def reservation(snap: Snapshot, now: float, work: ClusterState, head: JobState,
                started: Started, oracle: bool, gone: Collection[int] = (),
                ends: EndIndex | None = None) -> Reservation:
    """When and where `head` would start if the running jobs (less those in `gone`) and the
    ones `started` in this pass end as expected (`ends`, kept by the policy; else built for
    this pass alone).

    Ends are taken in order, by time then id. For a plain whole-GPU request the GPUs they free
    are counted (`FreedWhole`) until the request would fit; a copy of `work` with them released
    is kept, to place the request on if its GPUs are asked for."""
    running = snap.running
    order = (ends if ends is not None else EndIndex(oracle)).update(running, now)
    queue: Iterable[tuple[float, int, Allocation, Request]] = (
        (end, jid, running[jid].allocation, running[jid].job.request)  # type: ignore[misc]
        for end, jid in ending(order, now, gone))
    if started:
        fresh = sorted((_end(js, now, oracle, 1.0), js.id, alloc, js.job.request)
                       for js, alloc in started)
        queue = heapq.merge(queue, fresh, key=lambda e: (e[0], e[1]))
    req, pcfg = head.job.request, snap.config.placement
    need = req.gpu_milli_total
    freed = FreedWhole(work) if FreedWhole.countable(req, pcfg) else None
    taken: list[tuple[Allocation, Request]] = []
    scratch: ClusterState | None = None
    for end, _, alloc, jreq in queue:
        if scratch is None:
            taken.append((alloc, jreq))
            if freed is not None and freed.add(alloc):
                if not freed.fits(req):
                    continue
                scratch = work.copy()  # fits by the count: place later, if asked
                for a, r in taken:
                    scratch.release(a, r)
                return Reservation(float(end), pending=(scratch, req, pcfg))
            scratch = work.copy()  # cannot be counted: release for real, place every time
            for a, r in taken:
                scratch.release(a, r)
        else:
            scratch.release(alloc, jreq)
        if scratch.free_milli < need:
            continue  # not enough GPU share free in total yet: skip the placement attempt
        a = place(scratch, req, pcfg)
        if a is not None:
            return Reservation(float(end), frozenset(g for s in a.slots for g in s.gpus))
    return NO_RESERVATION
