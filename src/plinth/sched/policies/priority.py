"""Strict priority with preemption.

The pending queue is kept in (-priority, submit time, id) order. A pass has three phases:

1. Walk the queue from the top. Start each job that fits; if it does not, try to make room by
   preempting strictly lower-priority running jobs (lowest priority first, then the least
   unsaved work). Stop at the first job that cannot start either way: it is the head.
2. Hand the head and everything behind it to EASY backfill, so the head gets a reservation and
   only jobs that do not delay it jump ahead.
3. Jobs behind the head that still wait and whose priority is below the head's may also preempt
   (still only strictly lower priority). Equal-priority jobs do not, so they cannot overtake the
   head inside its own class; a lower class can, since the head may preempt it back later.

Preemption comes before backfill on purpose: backfilling first could hand the free GPUs to a
low-priority job and leave the high-priority head unable to fit even after preempting.

The number of jobs that try preemption per pass is bounded (`preempt_depth`), since each try
copies the cluster state. When a try fails only because victims are inside their guaranteed
runtime, the pass asks to be woken when that protection ends.

`PreemptionPlan` is shared with Tiresias: it is the pass's scratch state plus the bookkeeping
of who was preempted for whom.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from plinth.core.errors import SpecError
from plinth.core.resources import Allocation, Request
from plinth.sched.backfill import easy_backfill
from plinth.sched.placement import place
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import can_preempt, guaranteed_runtime, prune_victims, victim_order
from plinth.sched.types import Decisions, JobState, Preempt, Snapshot, Start

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


class StrictPriority(Policy):
    """Higher `priority` first; preempts strictly lower priority, never equal or higher."""

    name = "priority"
    preemptive = True

    def __init__(self, *, backfill: bool = True, preempt_depth: int = 8) -> None:
        if preempt_depth < 0:
            raise SpecError(f"priority.preempt_depth: must not be negative, got {preempt_depth}")
        self.backfill = backfill
        self.preempt_depth = preempt_depth

    def order(self, js: JobState) -> tuple:
        return (-js.job.priority, js.job.submit_time, js.job.id)

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        # Victims: lowest priority first, then least unsaved work (newest checkpoint).
        plan = PreemptionPlan(snap, now, d, depth=self.preempt_depth,
                              importance=lambda v: v.job.priority, whom="lower-priority job")
        pending = snap.pending  # may be long: read lazily, never copied
        notes: dict[int, str] = {}

        head = len(pending)
        for i, js in enumerate(pending):  # phase 1
            if plan.try_start(js, f"priority {js.job.priority}"):
                continue
            why = self._preempt_for(plan, js)
            if why is not None:
                notes[js.id], head = why, i
                break
        if head == len(pending):
            d.wake_at = plan.wake_at()
            return d
        # Phases 2 and 3 look at no more than backfill_depth jobs past the head.
        depth = snap.config.backfill_depth
        rest = list(pending[head:head + depth + 1])

        if self.backfill:  # phase 2
            easy_backfill(plan.backfill_view(), now, plan.work, rest, d, "priority")
        else:
            d.waiting[rest[0].id] = "Resources: first in line (no backfill)"
            for js in rest[1:]:
                d.waiting[js.id] = f"Resources: waiting behind job {rest[0].id}"
        top = rest[0].job.priority
        started = {s.job_id for s in d.starts}
        # The queue is sorted by priority, so once a job's priority is at or below every
        # running job's, no job further down has anyone to preempt.
        lowest = min((v.job.priority for i, v in snap.running.items() if i not in plan.victims),
                     default=None)
        for js in rest[1:]:  # phase 3
            if plan.tries_left <= 0 or lowest is None or js.job.priority <= lowest:
                break
            if js.id in started or js.job.priority >= top:
                continue
            why = self._preempt_for(plan, js)
            if why is None:
                d.waiting.pop(js.id, None)
            else:
                notes[js.id] = why
        for jid, why in notes.items():
            if jid in d.waiting:
                d.waiting[jid] += f"; preemption: {why}"
            else:
                d.waiting[jid] = f"Resources: {why}"
        d.wake_at = plan.wake_at()
        return d

    @staticmethod
    def _preempt_for(plan: PreemptionPlan, js: JobState) -> str | None:
        p = js.job.priority
        return plan.try_preempt(
            js, lambda v: v.job.priority < p,
            lambda vs: f"priority {p}: preempted job{'s' * (len(vs) > 1)} "
                       + ", ".join(str(v.id) for v in vs),
            lambda v: f"preempted by job {js.id} (priority {p} > {v.job.priority})",
            key=p,
        )
