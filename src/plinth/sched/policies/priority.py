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

The pass's scratch state and the bookkeeping of who was preempted for whom is
`plinth.sched.preemption.PreemptionPlan`, shared with Tiresias.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plinth.core.errors import SpecError
from plinth.sched.backfill import HeadPlacements, easy_backfill
from plinth.sched.policies.base import Policy
from plinth.sched.preemption import PreemptionPlan
from plinth.sched.types import Decisions, JobState, Snapshot


class StrictPriority(Policy):
    """Higher `priority` first; preempts strictly lower priority, never equal or higher."""

    name = "priority"
    preemptive = True

    def __init__(self, *, backfill: bool = True, preempt_depth: int = 8) -> None:
        if preempt_depth < 0:
            raise SpecError(f"priority.preempt_depth: must not be negative, got {preempt_depth}")
        self.backfill = backfill
        self.preempt_depth = preempt_depth
        self.memo = HeadPlacements()  # the head's placement at its shadow time, between passes

    def order(self, js: JobState) -> tuple:
        return (-js.job.priority, js.job.submit_time, js.job.id)

    def schedule(self, snap: Snapshot, now: float) -> Decisions:
        d = Decisions()
        # Victims: lowest priority first, then least unsaved work (newest checkpoint).
        plan = PreemptionPlan(snap, now, d, depth=self.preempt_depth, importance=_priorities,
                              whom="lower-priority job")
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
            easy_backfill(snap, now, plan.work, rest, d, "priority", planned=plan.started,
                          gone=plan.victims, memo=self.memo)
        else:
            d.waiting[rest[0].id] = "Resources: first in line (no backfill)"
            for js in rest[1:]:
                d.waiting[js.id] = f"Resources: waiting behind job {rest[0].id}"
        top = rest[0].job.priority
        started = {s.job_id for s in d.starts}
        # The queue is sorted by priority, so once a job's priority is at or below every
        # running job's, no job further down has anyone to preempt.
        lowest = plan.lowest()
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
            js, p,
            lambda vs: f"priority {p}: preempted job{'s' * (len(vs) > 1)} "
                       + ", ".join(str(v.id) for v in vs),
            lambda v: f"preempted by job {js.id} (priority {p} > {v.job.priority})",
        )


def _priorities(running: Sequence[JobState]) -> np.ndarray:
    """Victim importance: the job's priority (lowest is preempted first)."""
    return np.fromiter((js.job.priority for js in running), np.int64, len(running))
