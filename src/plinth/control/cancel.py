"""Cancelling jobs together: every task of an array at once, as `scancel ARRAY` does.

Held jobs (plinth.control.holds: the owner has not seen them) end here, in one store
transaction; every other one gets its Cancelled in one `Owner.handle`, whose transitions are
written in one transaction too. So cancelling a 10,000-task array is one pass over its tasks
under the loop's lock, not one scheduling turn per task (issue 36: it ran at 0.1 task/s).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from plinth.control.store import Transition
from plinth.core.lifecycle import State
from plinth.sched import owner as o

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane

HELD = "cancelled by the user while held"


def cancel_jobs(cp: ControlPlane, job_ids: Iterable[int]
                ) -> tuple[dict[int, str], dict[int, o.Rejected]]:
    """(each cancelled job's state afterwards, the owner's refusal of each job it did not
    cancel: not found, or already finished)."""
    with cp._lock:
        now = cp.clock()
        events = cp.incoming_to_holds()
        ids = list(dict.fromkeys(job_ids))
        held = [j for j in ids if j in cp.holds.jobs]
        for job_id in held:
            cp.holds.ended(job_id, cp.specs.pop(job_id, None))
        cp.store.transitions([Transition(j, State.PENDING, State.CANCELLED, now, "cancelled",
                                         HELD, {"end_time": now, "reason": HELD})
                              for j in held])
        gone = set(held)
        rest = [j for j in ids if j not in gone]
        out = cp.owner.handle([*events, *(o.Cancelled(j) for j in rest)], now, schedule=False)
        cp.driver.carry_out(out, now)
        states = dict.fromkeys(held, State.CANCELLED.value)
        refused = {r.event.job_id: r for r in out.rejected
                   if type(r.event) is o.Cancelled and r.event.job_id in rest}
        for job_id in rest:
            if job_id not in refused:
                js = cp.owner.jobs.get(job_id)
                states[job_id] = js.status.value if js is not None else State.CANCELLED.value
        if cp.holds.dirty:  # new submissions, or jobs that waited on these: the loop looks
            cp.notify()
        return states, refused


def cancel_array(cp: ControlPlane, array_id: int) -> dict[int, str]:
    """Cancel every unfinished task of an array; returns each one's state afterwards."""
    with cp._lock:
        cp.incoming_to_holds()  # tasks just submitted are cancelled too
        tasks = [j for j, spec in cp.specs.items() if spec.array_id == array_id]
        return cancel_jobs(cp, tasks)[0]
