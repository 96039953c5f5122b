"""Tiresias' discretised two-dimensional least-attained-service scheduler (2D-LAS; Gu et al.,
NSDI'19), which needs no job run times.

A job's service is its attained GPU time (GPUs x seconds run, both dimensions at once). Jobs sit
in K queues split by service thresholds; a new job enters queue 0 and is demoted as its service
crosses each threshold. Queues are served in order, FIFO inside each queue.

Each pass walks the pending jobs in (queue, submit time, id) order. A job that fits starts, even
behind one that does not (Tiresias is work-conserving, so no reservations). A job that does not
fit may preempt running jobs of a strictly lower queue (higher index), the most-served queue
first; jobs in its own queue are never preempted, which keeps FIFO inside a queue.

Defaults: thresholds (3600, 36000) GPU-seconds, i.e. three queues: under one GPU-hour (close to
the 3,250 GPU-s first limit of the Tiresias simulator, so short and debugging jobs finish
without waiting behind long ones), up to ten GPU-hours, and the rest. `starve_factor` = 8: a job
that has run before and has waited more than 8x its total run time since it was last preempted
is promoted to queue 0 for the pass (Tiresias' STARVELIMIT knob); 0 or None turns it off.

The order key reads only `attained`, which does not change while a job waits, so the owner can
keep the queue sorted incrementally. Promotion is decided per pass from `pending_since` and
`executed` and does not change the key: the pass merges promoted jobs into queue 0 by submit
time (it stays promoted in every pass until it runs, as `pending_since` keeps). Unlike the reference
simulator, promotion does not reset the job's service, so once running it is in the queue its
service says; its guaranteed runtime (min_runtime with backoff) keeps it from flapping.

The starvation limits a pass reads (of each lower queue's oldest `starve_scan` jobs) are kept
for the next pass while that queue is unchanged: the owner's pending queue, made by
`pending_queue`, counts the jobs added to and removed from each queue, and a waiting job's
accounting only changes while it is out of the queue. A pass then reads no waiting job for them.

A waiting job whose reason is unchanged is left out of `Decisions.waiting` (the owner would
write the same text): most waiting jobs keep their reason from pass to pass.

After a pass that started and preempted nothing, and had searches for victims to spare, a
pass that follows only arrivals (`Snapshot.arrived`: nothing freed, no timer fired) sets the
waiting jobs aside, as Kueue sets aside inadmissible workloads: each would wait again, since
every time it waits for (a demotion, a promotion, a victim leaving its guaranteed runtime)
asks for a pass of its own. New jobs have no service, so they are last in queue 0: they are
walked from where the last pass left queue 0 (`_Tail`: jobs examined, gang floors, searches
left), which is exactly where a whole pass would meet them. A new job that starts or
preempts makes the pass read the whole queue, as its victims may free more than it needs.
In the whole Philly replay, 44,306 of 210,200 passes are such passes.

`wake_at` asks for a pass when a running job's service crosses its queue's threshold (service
grows at num_gpus per second of wall time), when a waiting job would reach its starvation limit,
or when victims a waiting job needs leave their guaranteed runtime, whichever is first, so
demotions and promotions happen on time without polling.

A pass examines at most `scan_depth` jobs past the first that waits (default 100, as Slurm's
bf_max_job_test) and lets at most `preempt_depth` of them search for victims. It also ends
early once even a single-GPU job can neither start nor preempt and no GPU is partly free:
nothing behind it that needs a GPU could start then.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from sortedcontainers import SortedKeyList

from plinth.core.errors import SpecError
from plinth.core.resources import MILLI
from plinth.sched.pending import ChangeCount
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import MIN_WAKE, PreemptionPlan
from plinth.sched.types import Decisions, JobState, Snapshot

DEFAULT_THRESHOLDS: tuple[float, ...] = (3600.0, 36000.0)  # GPU-seconds
_attained = operator.attrgetter("attained")


class Tiresias(Policy):
    """Tiresias 2D-LAS: queues by attained GPU-time, with a starvation guard."""

    name = "tiresias"
    preemptive = True
    reads_arrivals = True

    def __init__(self, *, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                 starve_factor: float | None = 8.0, preempt_depth: int = 8,
                 starve_scan: int = 100, scan_depth: int = 100) -> None:
        thr = tuple(float(t) for t in thresholds)
        if any(t <= 0 for t in thr) or any(b <= a for a, b in zip(thr, thr[1:])):
            raise SpecError(
                f"tiresias.thresholds: must be positive and increasing, got {list(thr)}")
        if starve_factor is not None and starve_factor < 0:
            raise SpecError(f"tiresias.starve_factor: must not be negative, got {starve_factor}")
        if preempt_depth < 0:
            raise SpecError(f"tiresias.preempt_depth: must not be negative, got {preempt_depth}")
        self.thresholds = thr
        self._thr = np.asarray(thr)
        self.starve_factor = starve_factor or None
        self.preempt_depth = preempt_depth
        self.starve_scan = starve_scan
        self.scan_depth = scan_depth
        self._oldest: dict[int, _Oldest] = {}  # per lower queue, as the last pass read it
        self._gpus: dict[JobState, float] = {}  # see `_next_demotion`
        self._carry: _Carry | None = None  # see `_arrivals`

    def pending_queue(self, jobs: Iterable[JobState] = ()) -> SortedKeyList:
        return ChangeCount(jobs, key=self.order)

    def queue_of(self, attained: float) -> int:
        """Queue index by attained GPU-seconds; reaching a threshold exactly demotes."""
        return bisect.bisect_right(self.thresholds, attained)

    def order(self, js: JobState) -> tuple:
        return (self.queue_of(js.attained), js.job.submit_time, js.job.id)

    def starve_limit(self, js: JobState) -> float | None:
        """When this waiting job is promoted to queue 0, or None if it never is."""
        if self.starve_factor is None or js.attained <= 0 or self.queue_of(js.attained) == 0:
            return None
        return js.pending_since + self.starve_factor * js.executed

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        carry, self._carry = self._carry, None
        if snap.arrived is not None and carry is not None and carry.stands(snap):
            d = self._arrivals(snap, now, carry)
            if d is not None:
                return d
        d = Decisions()

        # Effective queue per waiting job: its own, or 0 while it is starving. The pending
        # queue is sorted by `order`, so queue q's jobs are one contiguous run, oldest first.
        # Only jobs that have run (queue > 0) can starve; the oldest `starve_scan` of each
        # lower queue are checked, which keeps a pass bounded however long the queue grows.
        thr, factor = self.thresholds, self.starve_factor
        pending = snap.pending
        # Queue q's jobs are pending[bounds[q]:bounds[q + 1]].
        bounds = [0, *(self._first_of_queue(pending, q) for q in range(1, len(thr) + 1)),
                  len(pending)]
        promoted: dict[int, int] = {}  # job id -> the queue it is promoted from
        lifted: list[tuple[float, int, JobState]] = []  # (submit time, id, job), promoted
        scanned: list[_Oldest] = []
        cut = now + MIN_WAKE  # a limit this close is due now
        if factor is not None:
            for q in range(1, len(thr) + 1):
                oldest = self._oldest_of(pending, q, bounds)
                if oldest is None:
                    continue
                scanned.append(oldest)
                for js in oldest.due(cut):
                    promoted[js.id] = q
                    lifted.append((js.job.submit_time, js.id, js))
        lifted.sort(key=lambda e: e[:2])
        entries = self._entries(pending, bounds, lifted, promoted)

        running, run_q, top_run_q = _queues_of(snap, self._thr)
        plan = self._plan(snap, now, d, running, run_q)
        best_waiting, tail = self._walk(plan, entries, _Tail.first(plan), top_run_q, promoted)

        # The next limit to come is of a job that still waits. Of the jobs started, only
        # those of a lower queue that were not promoted can be among those still to come.
        started = [js for js, _ in plan.started
                   if js.id not in promoted and self.queue_of(js.attained)]
        ahead = [oldest.next_after(cut, started) for oldest in scanned]
        next_promotion = min((t for t in ahead if t is not None), default=None)
        d.wake_at = plan.wake_at(self._next_demotion(plan, running, run_q, best_waiting),
                                 next_promotion)
        if not d.starts and not d.preempts and plan.tries_left > 0:
            # (a pass that ran out of searches deferred some to the next: not set aside)
            self._carry = _Carry(snap, tail, best_waiting)
        return d

    def _arrivals(self, snap: Snapshot, now: float, carry: _Carry) -> Decisions | None:
        """A pass after which only new jobs were queued (`Snapshot.arrived`) and that started
        and preempted nothing: as Kueue sets inadmissible workloads aside, the jobs that
        waited are not read again (nothing was freed, and no time they wait for has come).
        The new jobs, all at the end of queue 0, are walked from where that pass's walk left
        queue 0 (`_Tail`). None where a full pass is needed: a new job not last in queue 0
        (one with service already), or one that starts or preempts (its victims may free
        more than it needs)."""
        new = sorted(snap.arrived or (), key=self.order)
        pending = snap.pending
        end0 = self._first_of_queue(pending, 1)
        if not new or not all(
                a is b for a, b in zip(_walk(pending, end0 - len(new), end0), new)):
            return None
        d = Decisions()
        if carry.tail is None:  # the walk ended inside queue 0: no pass reads the new jobs
            self._carry = carry
            return d
        running, run_q, top_run_q = _queues_of(snap, self._thr)
        plan = self._plan(snap, now, d, running, run_q)
        best, tail = self._walk(plan, ((0, js) for js in new), carry.tail, top_run_q, {})
        if d.starts or d.preempts or plan.tries_left <= 0:
            return None
        demotion = None
        if best is not None and (carry.best is None or best < carry.best):
            carry.best = best  # the demotions that matter now reach higher queues
            demotion = self._next_demotion(plan, running, run_q, best)
        carry.tail = tail
        self._carry = carry
        d.wake_at = plan.wake_at(demotion)
        return d

    def _plan(self, snap: Snapshot, now: float, d: Decisions, running: list[JobState],
              run_q: np.ndarray) -> PreemptionPlan:
        # Victims: the highest queue (most served) first, then the least unsaved work.
        return PreemptionPlan(snap, now, d, depth=self.preempt_depth,
                              importance=lambda jobs: -run_q,  # `jobs` is `running`
                              running=running, whom="job in a lower queue")

    def _walk(self, plan: PreemptionPlan, entries: Iterable[tuple[int, JobState]],
              at: _Tail, top_run_q: int, promoted: dict[int, int]
              ) -> tuple[int | None, _Tail | None]:
        """Start, preempt for or leave waiting each (queue, job) of `entries`, in order, from
        the walk's state `at`. Returns the least queue of a job left waiting, and the state a
        job queued at the end of queue 0 would meet: the walk's as it left queue 0, or at its
        end if it never did (None if it broke off inside queue 0: no job there is read)."""
        d, now, factor, depth = plan.d, plan.now, self.starve_factor, self.scan_depth
        work = plan.work  # (the plan's scratch state: changed in place by starts and victims)
        plan.resume(at.tries)
        examined, first_waiting = at.examined, at.first_waiting
        # The least queue of a job left waiting: the first one's, as the pass walks the queues
        # in order.
        best_waiting: int | None = None
        # Whole-GPU gangs with no other demand fail monotonically: if n workers of g GPUs
        # cannot start or preempt at queue q, neither can more workers at queue q or below.
        # floors[g] = (fewest workers that failed, its reason); reset by any preemption,
        # since a preemption can free more than it uses.
        floors = dict(at.floors)
        preempts_seen = len(d.preempts)
        tail: _Tail | None = None
        for q, js in entries:
            if q and tail is None:  # leaving queue 0: where a job queued at its end would be
                tail = _Tail(examined, first_waiting, floors, plan)
            if first_waiting is not None:
                examined += 1
                if examined > depth:  # as Slurm's bf_max_job_test: bound the pass
                    return best_waiting, tail
                if (work.free_milli == 0 and js.job.request.gpu_milli_total
                        and (q >= top_run_q or plan.tries_left <= 0)):
                    # no GPU free and no more preemption: nothing behind can start
                    return best_waiting, tail
            req = js.job.request
            if len(d.preempts) != preempts_seen:
                floors.clear()
                preempts_seen = len(d.preempts)
            plain = req.gpus and not (req.cpus_milli or req.memory_mib or req.gpu_models
                                      or req.nodes)
            if plain:
                floor = floors.get(req.gpus)
                if floor is not None and floor[0] == 1 and req.gpus == 1 and \
                        work.free_milli == MILLI * work.whole_free_gpus():
                    # not even one whole GPU to be had, and no partly free GPU either
                    return best_waiting, tail
                if floor is not None and req.workers >= floor[0]:
                    # A smaller gang of the same shape, as high or higher in the queues,
                    # could neither start nor preempt: neither can this one.
                    if best_waiting is None:
                        best_waiting = q
                    if js.reason != floor[1]:  # (unchanged: left out)
                        d.waiting[js.id] = floor[1]
                    continue
            note = ""
            if js.id in promoted:  # the reason is written only for the jobs examined
                note = (f" (promoted from queue {promoted[js.id]}: waited "
                        f"{now - js.pending_since:.0f}s >= {factor:g} x {js.executed:.0f}s run)")
            if plan.try_start(js, f"tiresias: queue {q}{note}"):
                continue
            if q < top_run_q:
                why = plan.try_preempt(  # jobs of a higher queue only: -queue < -q
                    js, -q,
                    lambda vs, q=q, note=note: (
                        f"tiresias: queue {q}{note}, preempted "
                        + ", ".join(f"job {v.id} (queue {self.queue_of(v.attained)})"
                                    for v in vs)),
                    lambda v, js=js, q=q: (
                        f"preempted by job {js.id} (queue {q} < queue "
                        f"{self.queue_of(v.attained)}, attained {v.attained:.0f} GPU-s)"),
                )
                if why is None:
                    continue
            else:
                why = "no running job is in a lower queue"
            if first_waiting is None:
                first_waiting = js.id
            if best_waiting is None:
                best_waiting = q
            why = f"Resources: queue {q}{note}, does not fit; {why}"
            if js.reason != why:  # (unchanged: left out)
                d.waiting[js.id] = why
            if plain and len(d.preempts) == preempts_seen:
                floors[req.gpus] = (req.workers, why)
        return best_waiting, tail or _Tail(examined, first_waiting, floors, plan)

    def _next_demotion(self, plan: PreemptionPlan, running: list[JobState], run_q: np.ndarray,
                       best_waiting: int | None) -> float | None:
        """When the next running (or just started) job crosses its queue's threshold. Only
        demotions that can make a job a victim matter: at or below the best queue of a job
        left waiting (`best_waiting`), of a job that may be preempted at all."""
        if best_waiting is None:
            return None
        last, cap, now = len(self.thresholds), plan.cfg.max_preemptions, plan.now
        thr, victims = self.thresholds, plan.victims
        # The least time to a threshold; `now` is added to it alone, which gives the least of
        # `now` + each time (rounding is monotonic). Only jobs in the queues that count are read.
        soonest = math.inf
        # Each job's GPUs (`num_gpus`), or 0 if it is never preempted, kept from pass to pass
        # (a job's request and preemptibility never change); dropped once they are many.
        if len(self._gpus) > 2 * len(running) + 256:
            self._gpus = {}
        gpus_of = self._gpus
        near = ((run_q >= best_waiting) & (run_q < last)).nonzero()[0]
        for i, q in zip(near.tolist(), run_q[near].tolist()):
            js = running[i]
            if js.preemptions >= cap:  # (most running jobs are at the cap)
                continue
            gpus = gpus_of.get(js)
            if gpus is None:
                gpus = gpus_of[js] = js.job.request.num_gpus if js.job.preemptible else 0.0
            if gpus > 0 and js.id not in victims:
                t = (thr[q] - js.attained) / gpus
                if t < soonest:
                    soonest = t
        best = now + soonest if soonest < math.inf else None
        for js, _ in plan.started:  # a handful: the scalar formula
            q = self.queue_of(js.attained)
            if q >= last or best_waiting > q or not js.job.preemptible or js.preemptions >= cap:
                continue
            gpus = js.job.request.num_gpus
            if gpus > 0:
                t = now + (self.thresholds[q] - js.attained) / gpus
                best = t if best is None or t < best else best
        return best

    @staticmethod
    def _entries(pending: Sequence[JobState], bounds: list[int],
                 lifted: list[tuple[float, int, JobState]], promoted: dict[int, int]
                 ) -> Iterator[tuple[int, JobState]]:
        """(effective queue, job) in pass order: queue 0 with the promoted jobs merged in by
        (submit time, id), then each lower queue without them. The queue index comes from
        the segment a job is in, not from its attained service (the same, by the order)."""
        li, n = 0, len(lifted)
        for js in _walk(pending, 0, bounds[1]):
            if li < n:  # (once every promoted job is out, no key is made)
                key = (js.job.submit_time, js.id)
                while li < n and lifted[li][:2] < key:
                    yield 0, lifted[li][2]
                    li += 1
            yield 0, js
        for _, _, js in lifted[li:]:
            yield 0, js
        for q in range(1, len(bounds) - 1):
            for js in _walk(pending, bounds[q], bounds[q + 1]):
                if js.id not in promoted:
                    yield q, js

    def _oldest_of(self, pending: Sequence[JobState], q: int, bounds: list[int]
                   ) -> _Oldest | None:
        """Queue q's oldest `starve_scan` jobs and their limits: the last pass's, if the queue
        has not changed since, else read again. None if the queue is empty."""
        kept = self._oldest.get(q)
        if kept is not None and kept.unchanged(pending, q):
            return kept
        lo = bounds[q]
        jobs = pending[lo:min(lo + self.starve_scan, bounds[q + 1])]
        if not jobs:
            self._oldest.pop(q, None)
            return None
        oldest = self._oldest[q] = _Oldest(pending, q, jobs, self.starve_factor)
        return oldest

    def _first_of_queue(self, pending: Sequence[JobState], q: int) -> int:
        """Index of queue q's first job in the sorted pending queue."""
        if getattr(pending, "key", None) == self.order:  # a SortedKeyList by our order:
            return pending.bisect_key_left((q,))  # type: ignore[attr-defined]  # no key calls
        return bisect.bisect_left(pending, (q,), key=self.order)


class _Oldest:
    """The oldest jobs of one lower queue and their starvation limits, as read from `queue`
    when it had made `changes` to that queue. Sorted by limit only when a pass needs it
    (some limit is due)."""

    __slots__ = ("by_limit", "changes", "jobs", "limits", "low", "queue")

    def __init__(self, queue: Sequence[JobState], q: int, jobs: list[JobState],
                 factor: float) -> None:
        self.queue, self.changes = queue, _changes(queue, q)
        self.jobs = jobs
        self.limits = [js.pending_since + factor * js.executed for js in jobs]
        self.low = min(self.limits)
        self.by_limit: tuple[list[float], list[JobState]] | None = None

    def unchanged(self, queue: Sequence[JobState], q: int) -> bool:
        """Whether `queue`'s queue q is as it was when this was read."""
        return queue is self.queue and self.changes is not None \
            and _changes(queue, q) == self.changes

    def due(self, cut: float) -> list[JobState]:
        """The jobs whose limit is at or before `cut` (promoted)."""
        if self.low > cut:
            return []  # the common case
        limits, jobs = self._by_limit()
        return jobs[:bisect.bisect_right(limits, cut)]

    def next_after(self, cut: float, started: list[JobState]) -> float | None:
        """The earliest limit after `cut` of a job not `started` (by identity)."""
        if self.low > cut and not (started and any(js in self.jobs for js in started)):
            return self.low  # the common case
        limits, jobs = self._by_limit()
        i = bisect.bisect_right(limits, cut)
        for t, js in zip(limits[i:], jobs[i:]):
            if not started or all(js is not s for s in started):
                return t
        return None

    def _by_limit(self) -> tuple[list[float], list[JobState]]:
        """The limits in order, and the jobs in that order; sorted once."""
        if self.by_limit is None:
            order = sorted(range(len(self.limits)), key=self.limits.__getitem__)
            self.by_limit = ([self.limits[i] for i in order], [self.jobs[i] for i in order])
        return self.by_limit


class _Tail:
    """Where a pass's walk stood: jobs examined past the first that waits, that job, the
    gang floors and the plan's preemption searches (`PreemptionPlan.tries`). Taken as the
    walk leaves queue 0, it is the state a job queued at the end of queue 0 would meet."""

    __slots__ = ("examined", "first_waiting", "floors", "tries")

    def __init__(self, examined: int, first_waiting: int | None,
                 floors: dict[int, tuple[int, str]], plan: PreemptionPlan) -> None:
        self.examined, self.first_waiting = examined, first_waiting
        self.floors, self.tries = dict(floors), plan.tries()

    @classmethod
    def first(cls, plan: PreemptionPlan) -> _Tail:
        return cls(0, None, {}, plan)


class _Carry:
    """What a pass that started and preempted nothing leaves for the next, if only jobs are
    queued in between: where its walk left queue 0 (None: it broke off inside queue 0) and
    the least queue of a job it left waiting. It stands while the owner's queue, state and
    config are the same objects and as many jobs run."""

    __slots__ = ("best", "config", "n_running", "pending", "state", "tail")

    def __init__(self, snap: Snapshot, tail: _Tail | None, best: int | None) -> None:
        self.pending, self.state, self.config = snap.pending, snap.state, snap.config
        self.n_running, self.tail, self.best = len(snap.running), tail, best

    def stands(self, snap: Snapshot) -> bool:
        return (snap.pending is self.pending and snap.state is self.state
                and snap.config is self.config and len(snap.running) == self.n_running)


def _queues_of(snap: Snapshot, thr: np.ndarray) -> tuple[list[JobState], np.ndarray, int]:
    """The running jobs, each one's queue (`queue_of`, vectorised: a pass reads it for all of
    them) and the highest of those queues (-1: none runs)."""
    running = list(snap.running.values())
    attained = np.fromiter(map(_attained, running), float, len(running))
    run_q = thr.searchsorted(attained, "right")
    return running, run_q, int(run_q[run_q.argmax()]) if run_q.size else -1  # (no wrapper)


def _changes(queue: Sequence[JobState], q: int) -> tuple[int, int] | None:
    """The count of changes to `queue`'s queue q (with its bulk changes); None if it keeps
    no count."""
    if not isinstance(queue, ChangeCount):
        return None
    return queue.epoch, queue.changes[q]


def _walk(pending: Sequence[JobState], lo: int, hi: int) -> Iterator[JobState]:
    """pending[lo:hi], lazily: a pass reads only the start of a long segment."""
    islice = getattr(pending, "islice", None)  # a sorted container walks in O(1) a step
    if islice is not None:
        return iter(islice(lo, hi))
    if lo == 0:
        return itertools.islice(pending, hi)
    return (pending[i] for i in range(lo, hi))
