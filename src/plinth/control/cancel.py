"""Cancelling jobs together: every task of an array at once, as `scancel ARRAY` does.

Every job, held or not (the owner holds both: plinth.sched.holds), gets its Cancelled in one
`Owner.handle`, whose transitions are written in one transaction. So cancelling a 10,000-task
array is one pass over its tasks under the loop's lock, not one scheduling turn per task (issue
36: it ran at 0.1 task/s); and no held task of the array goes to the scheduler in between, since
the holds are looked at only after every cancel of the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from plinth.core.lifecycle import State
from plinth.sched import owner as o

if TYPE_CHECKING:
    from plinth.control.service import ControlPlane


def cancel_jobs(cp: ControlPlane, job_ids: Iterable[int]
                ) -> tuple[dict[int, str], dict[int, o.Rejected]]:
    """(each cancelled job's state afterwards, the owner's refusal of each job it did not
    cancel: not found, or already finished)."""
    with cp._lock:
        return _cancel(cp, cp.take_incoming(), job_ids)


def cancel_array(cp: ControlPlane, array_id: int) -> dict[int, str]:
    """Cancel every unfinished task of an array; returns each one's state afterwards."""
    with cp._lock:
        submitted = cp.take_incoming()  # tasks just submitted are cancelled too
        tasks = [j for j, spec in cp.specs.items() if spec.array_id == array_id]
        return _cancel(cp, submitted, tasks)[0]


def _cancel(cp: ControlPlane, submitted: list[o.Event], job_ids: Iterable[int]
            ) -> tuple[dict[int, str], dict[int, o.Rejected]]:
    """Submissions not yet taken in go to the owner first, then the cancels, in one step."""
    now = cp.clock()
    ids = list(dict.fromkeys(job_ids))
    wanted = set(ids)
    out = cp.owner.handle([*submitted, *(o.Cancelled(j) for j in ids)], now, schedule=False)
    refused = {r.event.job_id: r for r in out.rejected
               if type(r.event) is o.Cancelled and r.event.job_id in wanted}
    cp.driver.carry_out(out, now)
    states = {}
    for job_id in ids:
        if job_id not in refused:
            js = cp.owner.jobs.get(job_id)
            states[job_id] = js.status.value if js is not None else State.CANCELLED.value
    cp.notify()  # the loop looks at what the cancels freed
    return states, refused
