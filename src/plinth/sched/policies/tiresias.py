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
from collections.abc import Iterator, Sequence

import numpy as np

from plinth.core.errors import SpecError
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import MIN_WAKE, PreemptionPlan
from plinth.sched.types import Decisions, JobState, Snapshot

DEFAULT_THRESHOLDS: tuple[float, ...] = (3600.0, 36000.0)  # GPU-seconds


class Tiresias(Policy):
    """Tiresias 2D-LAS: queues by attained GPU-time, with a starvation guard."""

    name = "tiresias"
    preemptive = True

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
        d = Decisions()
        depth = self.scan_depth

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
        scanned: list[tuple[list[JobState], list[float]]] = []  # the oldest jobs, their limits
        cut = now + MIN_WAKE  # a limit this close is due now
        if factor is not None:
            for q in range(1, len(thr) + 1):
                lo = bounds[q]
                jobs = pending[lo:min(lo + self.starve_scan, bounds[q + 1])]
                if not jobs:
                    continue
                limits = [js.pending_since + factor * js.executed for js in jobs]
                scanned.append((jobs, limits))
                if min(limits) > cut:
                    continue  # none due: the common case
                for js, t in zip(jobs, limits):
                    if cut >= t:
                        promoted[js.id] = q
                        lifted.append((js.job.submit_time, js.id, js))
        lifted.sort(key=lambda e: e[:2])
        entries = self._entries(pending, bounds, lifted, promoted)

        # Every running job's queue, vectorised: a pass reads it for all of them.
        running = list(snap.running.values())
        attained = np.fromiter((js.attained for js in running), float, len(running))
        run_q = np.searchsorted(self._thr, attained, side="right")  # queue_of, for all
        top_run_q = int(run_q.max()) if run_q.size else -1
        # Victims: the highest queue (most served) first, then the least unsaved work.
        plan = PreemptionPlan(snap, now, d, depth=self.preempt_depth,
                              importance=lambda jobs: -run_q,  # `jobs` is `running`
                              running=running, whom="job in a lower queue")

        first_waiting: int | None = None
        examined = 0
        waiting_q: dict[int, int] = {}
        # Whole-GPU gangs with no other demand fail monotonically: if n workers of g GPUs
        # cannot start or preempt at queue q, neither can more workers at queue q or below.
        # floors[g] = (fewest workers that failed, its reason); reset by any preemption,
        # since a preemption can free more than it uses.
        floors: dict[int, tuple[int, str]] = {}
        preempts_seen = 0
        for q, js in entries:
            if first_waiting is not None:
                examined += 1
                if examined > depth:  # as Slurm's bf_max_job_test: bound the pass
                    break
                if (plan.work.free_milli == 0 and js.job.request.gpu_milli_total
                        and (q >= top_run_q or plan.tries_left <= 0)):
                    break  # no GPU free and no more preemption: nothing behind can start
            req = js.job.request
            if len(d.preempts) != preempts_seen:
                floors.clear()
                preempts_seen = len(d.preempts)
            plain = req.gpus and not (req.cpus_milli or req.memory_mib or req.gpu_models
                                      or req.nodes)
            if plain:
                floor = floors.get(req.gpus)
                if floor is not None and floor[0] == 1 and req.gpus == 1 and \
                        plan.work.free_milli == 1000 * int(plan.work.free_whole_by_model.sum()):
                    break  # not even one whole GPU to be had, and no partly free GPU either
                if floor is not None and req.workers >= floor[0]:
                    # A smaller gang of the same shape, as high or higher in the queues,
                    # could neither start nor preempt: neither can this one.
                    waiting_q[js.id] = q
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
            waiting_q[js.id] = q
            d.waiting[js.id] = f"Resources: queue {q}{note}, does not fit; {why}"
            if plain and len(d.preempts) == preempts_seen:
                floors[req.gpus] = (req.workers, d.waiting[js.id])

        # The next limit to come is of a job that still waits. Of the jobs started, only
        # those of a lower queue that were not promoted can be among those still to come.
        started = [js for js, _ in plan.started
                   if js.id not in promoted and self.queue_of(js.attained)]
        ahead = [_next_limit(jobs, limits, cut, started) for jobs, limits in scanned]
        next_promotion = min((t for t in ahead if t is not None), default=None)
        d.wake_at = plan.wake_at(self._next_demotion(plan, running, run_q, waiting_q),
                                 next_promotion)
        return d

    def _next_demotion(self, plan: PreemptionPlan, running: list[JobState], run_q: np.ndarray,
                       waiting_q: dict[int, int]) -> float | None:
        """When the next running (or just started) job crosses its queue's threshold. Only
        demotions that can make a job a victim matter: below some waiting job's queue, of a
        job that may be preempted at all."""
        if not waiting_q:
            return None
        best_waiting = min(waiting_q.values())
        last, cap, now = len(self.thresholds), plan.cfg.max_preemptions, plan.now
        thr, victims = self.thresholds, plan.victims
        # The least time to a threshold; `now` is added to it alone, which gives the least of
        # `now` + each time (rounding is monotonic).
        soonest = math.inf
        for js, q in zip(running, run_q.tolist()):
            if best_waiting <= q < last and js.job.preemptible and js.preemptions < cap \
                    and js.id not in victims:
                gpus = js.job.request.num_gpus
                if gpus > 0:
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
        li = 0
        for js in _walk(pending, 0, bounds[1]):
            key = (js.job.submit_time, js.id)
            while li < len(lifted) and lifted[li][:2] < key:
                yield 0, lifted[li][2]
                li += 1
            yield 0, js
        for _, _, js in lifted[li:]:
            yield 0, js
        for q in range(1, len(bounds) - 1):
            for js in _walk(pending, bounds[q], bounds[q + 1]):
                if js.id not in promoted:
                    yield q, js

    def _first_of_queue(self, pending: Sequence[JobState], q: int) -> int:
        """Index of queue q's first job in the sorted pending queue."""
        if getattr(pending, "key", None) == self.order:  # a SortedKeyList by our order:
            return pending.bisect_key_left((q,))  # type: ignore[attr-defined]  # no key calls
        return bisect.bisect_left(pending, (q,), key=self.order)


def _next_limit(jobs: list[JobState], limits: list[float], cut: float,
                started: list[JobState]) -> float | None:
    """The earliest of the jobs' starvation `limits` after `cut`, of those not `started`."""
    if started:
        limits = limits.copy()
        for js in started:
            if js in jobs:  # by identity: a scan that reads no job
                limits[jobs.index(js)] = -math.inf  # never after `cut`
    return min(filter(cut.__lt__, limits), default=None)


def _walk(pending: Sequence[JobState], lo: int, hi: int) -> Iterator[JobState]:
    """pending[lo:hi], lazily: a pass reads only the start of a long segment."""
    islice = getattr(pending, "islice", None)  # a sorted container walks in O(1) a step
    if islice is not None:
        return iter(islice(lo, hi))
    if lo == 0:
        return itertools.islice(pending, hi)
    return (pending[i] for i in range(lo, hi))
