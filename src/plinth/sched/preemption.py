"""Choosing preemption victims.

A policy lists the running jobs it is willing to preempt, least important first. This module
filters out those that are protected (not preemptible, inside their guaranteed runtime, or
preempted too often already), orders equally important ones so that the job with the least
unsaved work (the most recent checkpoint) goes first, and releases victims on a scratch copy
until the waiting job fits.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from plinth.core.resources import MILLI, Allocation, Request
from plinth.sched.placement import FreedWhole, PlacementConfig, place, placeable
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, SchedConfig, Snapshot, Start


def guaranteed_runtime(js: JobState, cfg: SchedConfig) -> float:
    """How long this run is protected. It grows with each preemption (backoff)."""
    return guaranteed_runtime_for(js.preemptions, cfg)


def guaranteed_runtime_for(preemptions: int, cfg: SchedConfig) -> float:
    """`guaranteed_runtime` of a job preempted `preemptions` times."""
    return cfg.min_runtime * cfg.preempt_backoff ** preemptions


def can_preempt(js: JobState, now: float, cfg: SchedConfig) -> bool:
    if not js.job.preemptible or js.preemptions >= cfg.max_preemptions:
        return False
    started = js.start_time if js.start_time is not None else now
    return now - started >= guaranteed_runtime(js, cfg)


def victim_order(importance: Callable[[JobState], object]) -> Callable[[JobState], tuple]:
    """Sort key: least important first, then least unsaved work, then newest checkpoint."""
    def key(js: JobState) -> tuple:
        return _victim_key(importance(js), js)
    return key


def _victim_key(importance: object, js: JobState) -> tuple:
    """`victim_order`'s key, given the job's importance."""
    ckpt = js.checkpoint_time if js.checkpoint_time is not None else float("-inf")
    return (importance, js.unsaved, -ckpt, js.id)


def find_victims(
    work: ClusterState,
    req: Request,
    candidates: Iterable[JobState],
    now: float,
    cfg: SchedConfig,
    placement: PlacementConfig | None = None,
) -> tuple[list[JobState], ClusterState, Allocation] | None:
    """Victims (in the order given) whose release lets `req` fit, the scratch state with them
    released, and the allocation found. None if even all eligible candidates do not suffice.
    `work` itself is left unchanged."""
    pcfg = placement or cfg.placement
    released = Released(work, req, pcfg)
    short = req.gpu_milli_total - work.free_milli  # GPU share still missing, free share counted
    for js in candidates:
        if js.allocation is None or not can_preempt(js, now, cfg):
            continue
        released.add(js)
        short -= js.allocation.gpu_milli_total
        if short > 0:
            continue  # cannot fit yet: skip the placement attempt
        if released.fits():
            return prune_victims(work, req, released.jobs, pcfg)
    return None


def prune_victims(work: ClusterState, req: Request, victims: list[JobState],
                  pcfg: PlacementConfig) -> tuple[list[JobState], ClusterState, Allocation]:
    """Drop victims that turned out unnecessary (most important first; the last one found is
    always needed). `req` must fit with all `victims` released. Returns the victims kept, the
    state with them released, and where `req` goes there.

    Trials only ask whether `req` fits without one more victim (`Released`); the final state
    is built the way every search builds it (`work`, then releases in victim order) and placed
    on once, so the allocation is the one a search over the kept victims finds."""
    keep = list(victims)
    for js in reversed(victims[:-1]):
        trial = Released(work, req, pcfg)
        for v in keep:
            if v is not js:
                trial.add(v)
        if trial.fits():
            keep.remove(js)
    scratch = work.copy()
    for v in keep:
        scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
    alloc = place(scratch, req, pcfg)
    if alloc is None:
        raise AssertionError(f"prune_victims: {req} does not fit with victims "
                             f"{[v.id for v in keep]} released")
    return keep, scratch, alloc


class Released:
    """`work` with some running jobs released, to ask whether `req` would then fit. The
    releases are counted (`FreedWhole`) while the request and every allocation allow it, which
    needs no state copy; otherwise they are made on a copy of `work`. `work` is unchanged."""

    __slots__ = ("freed", "jobs", "pcfg", "req", "scratch", "work")

    def __init__(self, work: ClusterState, req: Request, pcfg: PlacementConfig) -> None:
        self.work, self.req, self.pcfg = work, req, pcfg
        self.jobs: list[JobState] = []
        self.freed = FreedWhole(work) if FreedWhole.countable(req, pcfg) else None
        self.scratch = None if self.freed is not None else work.copy()

    def add(self, js: JobState) -> None:
        self.jobs.append(js)
        if self.freed is not None:
            if self.freed.add(js.allocation):  # type: ignore[arg-type]
                return
            self.freed = None  # a GPU share: count no more, release them all on a copy
            self.scratch = self.work.copy()
            for j in self.jobs:
                self.scratch.release(j.allocation, j.job.request)  # type: ignore[arg-type]
            return
        self.scratch.release(js.allocation, js.job.request)  # type: ignore[union-attr]

    def fits(self) -> bool:
        if self.freed is not None:
            return self.freed.fits(self.req)
        return placeable(self.scratch, self.req, self.pcfg)  # type: ignore[arg-type]


# Never ask to be woken sooner than this after `now`: float rounding in the owner's bookkeeping
# could otherwise leave a threshold a hair uncrossed and make it call again at the same instant.
MIN_WAKE = 1e-3


class PreemptionPlan:
    """One pass's plan: the scratch state after the starts and preemptions decided so far.

    `importance` maps the running jobs (a list) to an array of numbers, computed once per pass
    and only if a preemption is tried: victims go least important first, and a job preempts
    only jobs of importance below a bound (see `try_preempt`)."""

    def __init__(self, snap: Snapshot, now: float, d: Decisions, *, depth: int,
                 importance: Callable[[Sequence[JobState]], np.ndarray], whom: str,
                 running: list[JobState] | None = None) -> None:
        """`running`: the running jobs in the order `importance` is given them (by default
        the snapshot's), for a policy that has their importance at hand already."""
        self.snap, self.now, self.d = snap, now, d
        self.importance = importance
        self.whom = whom  # who may be preempted, for the reasons shown to users
        self.cfg = snap.config
        self.work = snap.state.copy()
        self.victims: dict[int, JobState] = {}
        self.started: list[tuple[JobState, Allocation]] = []
        self.tries_left = depth
        self.wake: float | None = None
        self._failed: dict[tuple[Request, object], str] = {}
        self._running: list[JobState] | None = running
        self._levels: np.ndarray | None = None
        self._candidates_below: dict[object, _Candidates] = {}

    def try_start(self, js: JobState, reason: str) -> bool:
        """Start `js` on free resources if it fits."""
        req = js.job.request
        if req.gpu_milli_total > self.work.free_milli:
            return False  # not that much GPU share free in all: no placement is tried
        alloc = place(self.work, req, self.cfg.placement)
        if alloc is None:
            return False
        self._start(js, alloc, reason)
        return True

    def try_preempt(self, js: JobState, below: float,
                    start_reason: Callable[[list[JobState]], str],
                    victim_reason: Callable[[JobState], str]) -> str | None:
        """Start `js` by preempting running jobs of importance below `below`, least important
        first. Returns None when it worked, else why not, in words for the user.

        A request shape that failed against a bound fails again for the rest of the pass,
        since starts only take resources and victims only leave the candidates, until a
        preemption frees more than it uses."""
        req = js.job.request
        if (req, below) in self._failed:
            return self._failed[req, below]
        if self.tries_left <= 0:
            return "preemption deferred to a later pass (per-pass limit reached)"
        cands = self._candidates_below.get(below)
        if cands is None:
            cands = self._candidates_below[below] = self._candidates(below)
        if not cands.any_live(self.victims):
            return f"no {self.whom} is running"
        self.tries_left -= 1
        victims, alloc, why = self._search(req, cands)
        if alloc is None:
            self._failed[req, below] = why
            return why
        self._failed.clear()
        for v in victims:
            self.work.release(v.allocation, v.job.request)  # type: ignore[arg-type]
            self.victims[v.id] = v
            self.d.preempts.append(Preempt(v.id, victim_reason(v)))
        self._start(js, alloc, start_reason(victims))
        return None

    def tries(self) -> tuple[int, dict[tuple[Request, object], str]]:
        """The searches left and those failed so far, for `resume`."""
        return self.tries_left, dict(self._failed)

    def resume(self, tries: tuple[int, dict[tuple[Request, object], str]]) -> None:
        """Go on from another plan's `tries`, on the state it had (nothing started or
        preempted since)."""
        self.tries_left, self._failed = tries[0], dict(tries[1])

    def lowest(self) -> float | None:
        """The least importance among running jobs not preempted in this pass, or None."""
        running, levels = self._ranking()
        if self.victims:
            keep = np.fromiter((js.id not in self.victims for js in running), bool, len(running))
            levels = levels[keep]
        return levels.min().item() if levels.size else None

    def wake_at(self, *times: float | None) -> float | None:
        """The earliest of `times` and this plan's own wake time, never before now + MIN_WAKE."""
        known = [t for t in (self.wake, *times) if t is not None]
        return max(min(known), self.now + MIN_WAKE) if known else None

    # -- internals -------------------------------------------------------------------------
    def _ranking(self) -> tuple[list[JobState], np.ndarray]:
        """The running jobs and their importance, once per pass and only when needed."""
        if self._levels is None:
            if self._running is None:
                self._running = list(self.snap.running.values())
            self._levels = np.asarray(self.importance(self._running))
        return self._running, self._levels  # type: ignore[return-value]

    def _candidates(self, below: float) -> _Candidates:
        """The running jobs of importance below `below`, as victim candidates. Only these are
        read, so a pass that finds none pays one vectorised comparison."""
        running, levels = self._ranking()
        idx = (levels < below).nonzero()[0]
        return _Candidates([running[i] for i in idx.tolist()], levels[idx].tolist(), self.now,
                           self.cfg)

    def _start(self, js: JobState, alloc: Allocation, reason: str) -> None:
        self.work.allocate(alloc, js.job.request)
        self.started.append((js, alloc))
        self.d.starts.append(Start(js.id, alloc, reason))

    def _search(self, req: Request, cands: _Candidates
                ) -> tuple[list[JobState], Allocation | None, str]:
        """One scan for victims. Release, on a scratch copy, the candidates that may be
        preempted now, in order, until `req` fits: those are the victims (pruned). If it still
        does not fit, go on with the candidates inside their guaranteed runtime, the soonest
        out of it first: if it fits then, waiting helps, so say from when (the first time
        enough of them may be preempted) and ask to be woken then. Non-preemptible jobs and
        jobs at the preemption cap never count.

        `plinth.sched.preemption.find_victims` does the first half alone; the second half,
        which tells a waiting job when its victims become preemptible, is what this adds.
        The scan skips at once past the candidates that cannot yet free enough GPU share in
        total (`_Candidates.freed`)."""
        cfg, work = self.cfg, self.work
        nothing = f"preempting every eligible {self.whom} would not make room"
        order, freed, n_eligible = cands.scan(self.victims)
        need = req.gpu_milli_total - work.free_milli
        if not order or need > freed[-1]:
            return [], None, nothing  # the common case in a busy cluster: no copy needed
        if n_eligible and need <= freed[n_eligible - 1]:  # (else they free too little share)
            k = cands.first_fit(req, work, cfg.placement, order[:n_eligible],
                                freed[:n_eligible], need)
            if k < n_eligible:
                victims, _, alloc = prune_victims(
                    work, req, [cands.jobs[i] for i in order[:k + 1]], cfg.placement)
                return victims, alloc, ""
        if n_eligible == len(order):
            return [], None, nothing
        # Those that may be preempted now do not make room. Waiting helps if all of them and
        # those protected for now would: it fits once enough of the protected ones, taken as
        # their guaranteed runtimes end (the order a scan has them in), have joined the first.
        k = cands.first_fit(req, work, cfg.placement, order, freed, need)
        if k == len(order):
            return [], None, nothing
        until = cands.until[order[k]]
        self.wake = until if self.wake is None else min(self.wake, until)
        return [], None, (f"a {self.whom} it needs is inside its guaranteed runtime "
                          f"until t={until:.0f}s")


def _first_fit(work: ClusterState, req: Request, pcfg: PlacementConfig, jobs: list[JobState],
               order: list[int], freed: list[int], need: int) -> int:
    """Releasing `jobs` in `order`, the position in `order` of the one after whose release
    `req` first fits; len(order) if it never does. `freed[k]` is the GPU share the first
    k + 1 free, `need` the share missing now."""
    # Until the released share reaches what is missing, no placement is tried: add those
    # candidates at once, then one at a time.
    first = bisect.bisect_left(freed, need) if need > 0 else 0
    scratch = Released(work, req, pcfg)
    for i in order[:first]:
        scratch.add(jobs[i])
    for k in range(first, len(order)):
        scratch.add(jobs[order[k]])
        if scratch.fits():
            return k
    return len(order)


class _Candidates:
    """Running jobs a plan may preempt for one bound, read once per pass (`now` and the
    config are fixed for a pass). Only jobs that may ever be preempted (preemptible, under
    the preemption cap) are kept, in the order a search releases them: those that may be
    preempted now (`can_preempt`) first, in victim order (`victim_order`), then those inside
    their guaranteed runtime, the soonest out of it first; with the GPU share each holds and
    until when its guaranteed runtime protects it. The others never make room and are only
    counted."""

    __slots__ = ("freed", "jobs", "milli", "n_eligible", "order", "others", "shared", "until")

    def __init__(self, jobs: list[JobState], levels: list[float], now: float,
                 cfg: SchedConfig) -> None:
        cap = cfg.max_preemptions
        guaranteed = [guaranteed_runtime_for(k, cfg) for k in range(max(cap, 0))]
        eligible, protected = [], []
        for js, level in zip(jobs, levels):
            k = js.preemptions
            if k < cap and js.job.preemptible:  # (most running jobs are at the cap)
                started = now if js.start_time is None else js.start_time
                g = guaranteed[k]
                if now - started < g:
                    protected.append((started + g, js))
                    continue
                # `_victim_key`; ids are unique, so nothing after them is compared.
                ckpt = js.checkpoint_time
                eligible.append((level, js.progress - js.checkpointed,
                                 math.inf if ckpt is None else -ckpt, js.id, js, started + g))
        eligible.sort()
        # The protected ones only ever join a scan by when they may be preempted: a search
        # asks only from when waiting would help, the same whichever order jobs with the
        # same end of guaranteed runtime come in (releasing more never makes room scarcer).
        protected.sort(key=operator.itemgetter(0))
        self.others = len(jobs) - len(eligible) - len(protected)
        self.jobs = [r[4] for r in eligible] + [js for _, js in protected]
        self.until = [r[5] for r in eligible] + [t for t, _ in protected]
        requests = [js.job.request for js in self.jobs]
        self.n_eligible = len(eligible)
        self.milli = [req.gpu_milli_total for req in requests]
        # The scan with no victims yet: every candidate, and the GPU share each prefix frees.
        self.order = list(range(len(self.jobs)))
        self.freed = list(itertools.accumulate(self.milli))
        # Those holding GPU shares. The others hold whole GPUs, as many as they asked for
        # (`check_gang`, an invariant of the owner).
        self.shared = {i for i, req in enumerate(requests) if req.gpu_milli}

    def first_fit(self, req: Request, work: ClusterState, pcfg: PlacementConfig,
                  order: list[int], freed: list[int], need: int) -> int:
        """`_first_fit` of these candidates in `order`, counted where that is exact."""
        k = self.counted_fit(req, work, pcfg, order, freed)
        return _first_fit(work, req, pcfg, self.jobs, order, freed, need) if k is None else k

    def counted_fit(self, req: Request, work: ClusterState, pcfg: PlacementConfig,
                    order: list[int], freed: list[int]) -> int | None:
        """`_first_fit` by counting, where that is exact; else None. A gang of one-GPU workers
        that asks for nothing else fits on a cluster of one GPU model as soon as it has as
        many whole GPUs free, wherever they are (see `FreedWhole.fits`); that count holds
        while no job released holds a GPU share."""
        if (req.gpus != 1 or req.gpu_models or req.preferred_gpu_model is not None
                or len(work.cluster.models) != 1 or not FreedWhole.countable(req, pcfg)):
            return None
        missing = MILLI * (req.workers - int(work.free_whole_by_model[0]))
        k = bisect.bisect_left(freed, missing) if missing > 0 else 0
        if self.shared and not self.shared.isdisjoint(order[:k + 1]):
            return None
        return min(k, len(order))

    def any_live(self, victims: dict[int, JobState]) -> bool:
        """Whether some job below the bound is not preempted yet in this pass."""
        return bool(self.others) or any(js.id not in victims for js in self.jobs)

    def scan(self, victims: dict[int, JobState]) -> tuple[list[int], list[int], int]:
        """`order`, `freed` and `n_eligible` without the jobs preempted in this pass."""
        if not victims:
            return self.order, self.freed, self.n_eligible
        jobs = self.jobs
        order = [i for i in self.order if jobs[i].id not in victims]
        freed = list(itertools.accumulate(self.milli[i] for i in order))
        n_eligible = sum(1 for i in order if i < self.n_eligible)
        return order, freed, n_eligible
