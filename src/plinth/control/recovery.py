"""After a (re)start: the owner rebuilt from the store, and one line saying what was found.

Pending jobs queue again (or are held again, if they wait on dependencies or an array's turn);
running ones are re-adopted if their processes are still the same, else requeued as lost (a
launch the control plane died before storing is found through the runtime's own record,
`Runtime.find`, so that it is neither lost nor left running unwatched); a job that ended while
no control plane watched it gets its exit code and end time from its exit file; a job whose
stored spec no longer passes the checks fails alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from plinth.control.store import Event
from plinth.core.jobspec import JobSpec
from plinth.core.lifecycle import State, StopReason
from plinth.core.resources import Allocation
from plinth.core.runtime import Handle
from plinth.core.spec import TRUSTED, validation_message
from plinth.sched.types import JobState

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane


@dataclass(slots=True)
class Recovery:
    """What `recover` found in the store after a (re)start, for the one line `plinth up` prints."""

    pending: int = 0  # queued again
    readopted: int = 0  # still running: watched again
    ended: int = 0  # ended while the control plane was down: their exit is read back
    lost: int = 0  # gone without a trace, or never launched: requeued
    cancelled: int = 0  # cancelled before anything ran: finished

    def summary(self) -> str:
        parts = [f"{n} {what}" for n, what in (
            (self.pending, "pending"), (self.readopted, "running re-adopted"),
            (self.ended, "ended while down"), (self.lost, "lost and requeued"),
            (self.cancelled, "cancelled")) if n]
        return ("recovered " + ", ".join(parts)) if parts else "recovered: no unfinished jobs"



def recover(cp: ControlPlane) -> None:
    """Rebuild the owner from the store after a (re)start: pending jobs queue again (or are
    held again); running ones are re-adopted if their processes are still the same, else
    requeued as lost. What it finds becomes the owner's transitions, stored at the first step
    (`ControlPlane.recover` takes it at once)."""
    now = cp.clock()
    owner, found = cp.owner, cp.recovery
    for row in cp.store.active_jobs():
        try:
            spec = JobSpec.model_validate(row["spec"], context=TRUSTED)  # accepted once
        except ValidationError as e:  # stored by an older version that checked less
            _fail_unreadable(cp, row, validation_message("spec", e, JobSpec), now)
            found.lost += 1
            continue
        if row["array_id"] is not None:
            spec = spec.model_copy(update={"array_id": row["array_id"]})
        job = spec.job(row["id"], row["tenant"], row["submit_time"])
        cp.specs[job.id] = spec
        js = JobState(job, pending_since=row["submit_time"], attempt=row["attempt"],
                      preemptions=row["preemptions"],
                      checkpoint_step=row.get("checkpoint_step"),
                      checkpoint_time=row.get("checkpoint_time"))
        state = State(row["state"])
        if state is State.PENDING:
            found.pending += 1
            owner.restore(js, now)  # held again if it never ran and waits on something
            continue
        js.status = state
        alloc = Allocation.from_dict(row["allocation"]) if row["allocation"] else None
        stop = StopReason(row["stop_reason"]) if row["stop_reason"] else None
        stored = row["handle"]
        if stored is None and alloc is not None:
            # Killed during the launch, before storing its handle: the runtime's own record.
            launched = cp.runtime.find(job.id, row["attempt"], len(alloc.slots))
            if launched is not None:
                stored = launched.to_dict()
                cp.store.update_job(job.id, handle=stored)
        if stored is None or alloc is None or not owner.held.fits(alloc, job.request):
            # Killed between recording the start and launching, or the nodes changed: it is
            # requeued as lost, or ends if it was being cancelled.
            why = ("control plane restarted before the launch was recorded"
                   if stored is None else "allocation no longer fits")
            if stop is StopReason.CANCEL:
                found.cancelled += 1
            else:
                found.lost += 1
            owner.restore(js, now, stop=stop, lost=why)
            continue
        js.allocation = alloc
        js.start_time = js.first_start = row["start_time"]
        owner.restore(js, now, stop=stop)
        handle = cp.launches.handles[job.id] = Handle.from_dict(stored)
        if cp.runtime.adopt(handle):
            found.readopted += 1
            cp.store.add_events([Event(job.id, "re-adopted", "after a control plane restart: "
                                       "processes still running (pid and start time match)")],
                                now)
            if state is State.STOPPING:
                cp.runtime.stop(job.id, js.attempt, cp.grace_s)
        else:  # the runtime queued an EXITED or LOST event; the loop handles it
            found.ended += 1
    for array_id in list(owner.holds.tallies):  # what its tasks that ended before did
        states, started = cp.store.array_summary(array_id)
        owner.holds.seed(array_id, any(s.terminal and s is not State.SUCCEEDED for s in states),
                         started)


def _fail_unreadable(cp: ControlPlane, row: dict, why: str, now: float) -> None:
    """A job whose stored spec no longer passes the checks: it fails (its processes, if
    any, are stopped), and the others are recovered as usual."""
    state = State(row["state"])
    if row["handle"] is not None and state.active:
        handle = Handle.from_dict(row["handle"])
        if cp.runtime.adopt(handle):
            cp.runtime.stop(handle.job_id, handle.attempt, cp.grace_s)
    cp.owner.refuse(row["id"], state, now, why)
