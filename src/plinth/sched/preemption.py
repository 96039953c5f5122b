"""Choosing preemption victims.

A policy lists the running jobs it is willing to preempt, least important first. This module
filters out those that are protected (not preemptible, inside their guaranteed runtime, or
preempted too often already), orders equally important ones so that the job with the least
unsaved work (the most recent checkpoint) goes first, and releases victims on a scratch copy
until the waiting job fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from plinth.core.resources import Allocation, Request
from plinth.sched.placement import PlacementConfig, place
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, Preempt, SchedConfig, Snapshot, Start


def guaranteed_runtime(js: JobState, cfg: SchedConfig) -> float:
    """How long this run is protected. It grows with each preemption (backoff)."""
    return cfg.min_runtime * cfg.preempt_backoff ** js.preemptions


def can_preempt(js: JobState, now: float, cfg: SchedConfig) -> bool:
    if not js.job.preemptible or js.preemptions >= cfg.max_preemptions:
        return False
    started = js.start_time if js.start_time is not None else now
    return now - started >= guaranteed_runtime(js, cfg)


def victim_order(importance: Callable[[JobState], object]) -> Callable[[JobState], tuple]:
    """Sort key: least important first, then least unsaved work, then newest checkpoint."""
    def key(js: JobState) -> tuple:
        ckpt = js.checkpoint_time if js.checkpoint_time is not None else float("-inf")
        return (importance(js), js.unsaved, -ckpt, js.id)
    return key


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
    scratch = work.copy()
    victims: list[JobState] = []
    short = req.gpu_milli_total - work.free_milli  # GPU share still missing, free share counted
    for js in candidates:
        if js.allocation is None or not can_preempt(js, now, cfg):
            continue
        scratch.release(js.allocation, js.job.request)
        victims.append(js)
        short -= js.allocation.gpu_milli_total
        if short > 0:
            continue  # cannot fit yet: skip the placement attempt
        alloc = place(scratch, req, pcfg)
        if alloc is not None:
            return prune_victims(work, req, victims, alloc, pcfg)
    return None


def prune_victims(work: ClusterState, req: Request, victims: list[JobState], alloc: Allocation,
           pcfg: PlacementConfig) -> tuple[list[JobState], ClusterState, Allocation]:
    """Drop victims that turned out unnecessary (most important first)."""
    keep = list(victims)
    for js in reversed(victims[:-1]):
        trial = [v for v in keep if v is not js]
        scratch = work.copy()
        for v in trial:
            scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
        a = place(scratch, req, pcfg)
        if a is not None:
            keep, alloc = trial, a
    scratch = work.copy()
    for v in keep:
        scratch.release(v.allocation, v.job.request)  # type: ignore[arg-type]
    return keep, scratch, alloc


# Never ask to be woken sooner than this after `now`: float rounding in the owner's bookkeeping
# could otherwise leave a threshold a hair uncrossed and make it call again at the same instant.
MIN_WAKE = 1e-3


class PreemptionPlan:
    """One pass's plan: the scratch state after the starts and preemptions decided so far."""

    def __init__(self, snap: Snapshot, now: float, d: Decisions, *, depth: int,
                 importance: Callable[[JobState], object], whom: str) -> None:
        self.snap, self.now, self.d = snap, now, d
        self.importance = importance  # victims go least important first
        self.whom = whom  # who may be preempted, for the reasons shown to users
        self.cfg = snap.config
        self.work = snap.state.copy()
        self.victims: dict[int, JobState] = {}
        self.started: list[tuple[JobState, Allocation]] = []
        self.tries_left = depth
        self.wake: float | None = None
        self._failed: dict[tuple[Request, object], str] = {}
        self._ranked: list[JobState] | None = None
        self._prefixes: dict[object, list[JobState]] = {}
        self._preemptible: dict[int, bool] = {}  # can_preempt, once per job per pass

    def try_start(self, js: JobState, reason: str) -> bool:
        """Start `js` on free resources if it fits."""
        alloc = place(self.work, js.job.request, self.cfg.placement)
        if alloc is None:
            return False
        self._start(js, alloc, reason)
        return True

    def try_preempt(self, js: JobState, may_preempt: Callable[[JobState], bool],
                    start_reason: Callable[[list[JobState]], str],
                    victim_reason: Callable[[JobState], str], key: object) -> str | None:
        """Start `js` by preempting running jobs that `may_preempt` allows, least important
        first. Returns None when it worked, else why not, in words for the user.

        `may_preempt` must hold for a prefix of the running jobs ranked by `importance` (true
        when both compare the same thing), so the scan stops at the first job it rejects.
        `key` names that prefix (the job's priority or queue): a request shape that failed
        against a key fails again for the rest of the pass, since starts only take resources
        and victims only leave the candidates, until a preemption frees more than it uses."""
        req = js.job.request
        if (req, key) in self._failed:
            return self._failed[req, key]
        if self.tries_left <= 0:
            return "preemption deferred to a later pass (per-pass limit reached)"
        prefix = self._prefixes.get(key)
        if prefix is None:  # the ranked prefix `may_preempt` allows, once per key per pass
            prefix = []
            for c in self._ranked_running():
                if not may_preempt(c):
                    break
                prefix.append(c)
            self._prefixes[key] = prefix
        cands = [c for c in prefix if c.id not in self.victims]
        if not cands:
            return f"no {self.whom} is running"
        self.tries_left -= 1
        victims, alloc, why = self._search(req, cands)
        if alloc is None:
            self._failed[req, key] = why
            return why
        self._failed.clear()
        for v in victims:
            self.work.release(v.allocation, v.job.request)  # type: ignore[arg-type]
            self.victims[v.id] = v
            self.d.preempts.append(Preempt(v.id, victim_reason(v)))
        self._start(js, alloc, start_reason(victims))
        return None

    def backfill_view(self) -> Snapshot:
        """The snapshot as EASY backfill must see it after this pass's decisions: victims are
        gone and the jobs started so far hold their GPUs (they count when it works out when
        the head's reservation begins)."""
        running = {i: js for i, js in self.snap.running.items() if i not in self.victims}
        for js, alloc in self.started:
            running[js.id] = dataclasses.replace(js, allocation=alloc, start_time=self.now,
                                                 rate=0.0)
        return dataclasses.replace(self.snap, running=running)

    def wake_at(self, *times: float | None) -> float | None:
        """The earliest of `times` and this plan's own wake time, never before now + MIN_WAKE."""
        known = [t for t in (self.wake, *times) if t is not None]
        return max(min(known), self.now + MIN_WAKE) if known else None

    # -- internals -------------------------------------------------------------------------
    def _ranked_running(self) -> list[JobState]:
        """Running jobs, least important first; sorted once per pass, and only if needed."""
        if self._ranked is None:
            self._ranked = sorted(self.snap.running.values(),
                                  key=victim_order(self.importance))
        return self._ranked

    def _start(self, js: JobState, alloc: Allocation, reason: str) -> None:
        self.work.allocate(alloc, js.job.request)
        self.started.append((js, alloc))
        self.d.starts.append(Start(js.id, alloc, reason))

    def _search(self, req: Request, cands: list[JobState]
                ) -> tuple[list[JobState], Allocation | None, str]:
        """One scan for victims. Release, on a scratch copy, the candidates that may be
        preempted now, in order, until `req` fits: those are the victims (pruned). If it still
        does not fit, go on with the candidates inside their guaranteed runtime: if it fits
        then, waiting helps, so say until when and ask to be woken then (no other event may
        come sooner). Non-preemptible jobs and jobs at the preemption cap never count.

        `plinth.sched.preemption.find_victims` does the first half alone; the second half,
        which tells a waiting job when its victims become preemptible, is what this adds."""
        cfg, now, work = self.cfg, self.now, self.work
        nothing = f"preempting every eligible {self.whom} would not make room"
        eligible: list[JobState] = []
        protected: list[JobState] = []
        memo = self._preemptible
        for c in cands:
            ok = memo.get(c.id)
            if ok is None:
                ok = memo[c.id] = can_preempt(c, now, cfg)
            if ok:
                eligible.append(c)
            elif c.job.preemptible and c.preemptions < cfg.max_preemptions:
                protected.append(c)
        short = req.gpu_milli_total - work.free_milli
        if short > sum(c.job.request.gpu_milli_total for c in eligible + protected):
            return [], None, nothing  # the common case in a busy cluster: no copy needed
        scratch = work.copy()
        released: list[JobState] = []
        for c in eligible + protected:
            scratch.release(c.allocation, c.job.request)  # type: ignore[arg-type]
            released.append(c)
            short -= c.job.request.gpu_milli_total
            if short > 0:
                continue  # not enough GPU share in total yet: skip the placement attempt
            alloc = place(scratch, req, cfg.placement)
            if alloc is None:
                continue
            if len(released) <= len(eligible):
                victims, _, alloc = prune_victims(work, req, released, alloc, cfg.placement)
                return victims, alloc, ""
            until = min((p.start_time if p.start_time is not None else now)
                        + guaranteed_runtime(p, cfg) for p in released[len(eligible):])
            self.wake = until if self.wake is None else min(self.wake, until)
            return [], None, (f"a {self.whom} it needs is inside its guaranteed runtime "
                              f"until t={until:.0f}s")
        return [], None, nothing
