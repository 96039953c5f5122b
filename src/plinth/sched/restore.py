"""Taking back the jobs of an earlier owner after a restart: the control plane's recovery
(plinth.control.recovery) reads the store and hands each unfinished job to `Owner.restore`, or,
where its spec cannot be read back, to `Owner.refuse`. Whatever it finds (a launch that cannot
be taken back, a job that cannot be recovered) becomes a transition of the owner's, stored as
every other one is. Part of `plinth.sched.owner.Owner` (a base class of it, kept apart for
size): it uses the owner's state and its transitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plinth.core.lifecycle import State, StopReason, check_transition
from plinth.sched.accounting import Run
from plinth.sched.events import Transition
from plinth.sched.holds import Holds
from plinth.sched.types import JobState

if TYPE_CHECKING:
    from plinth.sched.owner import Owner


class Restoring:
    def restore(self: Owner, js: JobState, now: float, *, stop: StopReason | None = None,
                lost: str | None = None) -> None:
        """Take back a job an earlier owner had (the control plane's recovery). A PENDING job
        queues, or is held again if it never ran and waits on something; a RUNNING or STOPPING
        one (with `js.allocation`, `attempt` and `start_time`) holds its allocation in both
        views, as launched at `js.start_time`, unless its launch cannot be taken back (`lost`
        says why): then it is requeued as lost, or ends if it was being cancelled."""
        self.jobs[js.id] = js
        self._queued = None  # a first pass after a restart reads the whole queue
        job = js.job
        held = js.status is State.PENDING and js.attempt == 0 and Holds.needs_hold(job)
        if Holds.concerns(job):
            self.holds.submitted(job, held)
        if held:
            return
        if js.status is State.PENDING:
            self.pending.add(js)
            self._arrived = True
            return
        if lost is not None:
            if stop is StopReason.CANCEL:
                self._finish(js, State.CANCELLED, now, "cancelled",
                             f"cancelled; nothing was running ({lost})")
            else:
                self._requeue(js, now, "lost", lost)
            return
        alloc, req = js.allocation, job.request
        self.held.allocate(alloc, req)  # type: ignore[arg-type]
        start = js.start_time if js.start_time is not None else now
        self.runs[js.id] = Run(start, start, 1.0, 0.0, js.progress, js.attained, js.executed,
                                req.num_gpus)
        js.rate = 1.0
        if js.status is State.RUNNING:
            self.state.allocate(alloc, req)  # type: ignore[arg-type]
            self.running[js.id] = js
            self.accounted[js.id] = (js, self.runs[js.id], job.duration)
            self.ends.add(js, start, js.progress)
            if job.time_limit:
                self.deadlines[js.id] = start + job.time_limit
        else:
            self.stop_why[js.id] = (stop or StopReason.PREEMPT, False)
            if self.stop_why[js.id][0] is StopReason.PREEMPT:
                self.pending.add(js)

    def refuse(self: Owner, job_id: int, state: State, now: float, why: str) -> None:
        """A job an earlier owner had that cannot be taken back (its stored spec no longer
        passes the checks): it fails, by a transition like any other."""
        message = f"cannot recover: {why}"
        check_transition(job_id, state, State.FAILED)
        self._out.transitions.append(Transition(job_id, state, State.FAILED, now, "failed",
                                                message, {"end_time": now, "reason": message}))
