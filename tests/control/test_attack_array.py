"""Issue 36, finding 4, attacked on a real `plinth up`: one tenant submits `array: 0-9999%1` of
a trivial command (10,000 tasks, at most one with the scheduler at a time). Before the fix every
step of the control loop looked at every held task (and expanded the array's indices for each),
so other tenants' jobs waited seconds, cancelling the array ran at 0.1 task/s, and SIGTERM no
longer stopped the server. Here the other tenant's jobs must run, the control loop must look at
each held task about once (not once per step), SIGTERM must stop the server with the array
held, and cancelling the array must finish. No timing is asserted (that is
bench/array_hold.py); a stalled server fails these by the generous timeouts alone."""

from __future__ import annotations

import signal

import httpx
import pytest
from plinth_platform import Platform, tenant_platform

from plinth.client import Client

pytestmark = pytest.mark.slow

RES = {"cpus": 0.1, "memory": "64Mi"}
TASKS = 10_000
UNFINISHED = ["pending", "running", "stopping"]


def trivial(name: str) -> dict:
    return {"name": name, "command": ["true"], "resources": RES}


def reaches_running(p: Platform, wait_for, name: str) -> None:
    """The other tenant submits a trivial job; it must be started (and then end)."""
    with p.client(p.tokens["other"]) as other:
        job = other.submit(trivial(name))
        wait_for(lambda: other.job(job)["start_time"] is not None, timeout=120,
                 what=f"the other tenant's job {name} running")
        other.wait(job, timeout=120)


def held_jobs_examined(p: Platform) -> float:
    """The control plane's own count of held jobs it has looked at (/metrics)."""
    r = httpx.get(f"{p.url}/metrics", headers={"Authorization": f"Bearer {p.token}"},
                  timeout=60)
    r.raise_for_status()
    [line] = [x for x in r.text.splitlines()
              if x.startswith("plinth_held_jobs_examined_total ")]
    return float(line.split()[1])


@pytest.fixture
def attacked():
    """A control plane (as root: each tenant its own Unix user) with tenants `flood` and
    `other`, each with a token of its own."""
    with tenant_platform("flood", "other") as p:
        yield p


def test_a_ten_thousand_task_array_at_one_a_time_stalls_no_one(attacked, wait_for) -> None:
    p = attacked
    with Client(p.url, p.tokens["flood"], timeout=120) as flood:
        head = flood.submit({**trivial("flood"), "array": f"0-{TASKS - 1}%1"})
    for i in range(3):
        reaches_running(p, wait_for, f"other-{i}")
    # Each held task is looked at when it is held and when it is let go; a step after one
    # task ends looks at the next one only, not at the 9,999 still held.
    examined = held_jobs_examined(p)
    with p.client() as admin:
        released = TASKS - admin.jobs_page(array=head, states=["pending"], limit=1)[1]
    assert examined <= TASKS + released + 1, (examined, released)

    # SIGTERM with the array held: the server stops (it used to go on forever).
    proc, p.proc = p.proc, None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it when done
    p.start()  # it recovers the held array
    with Client(p.url, p.tokens["flood"], timeout=120) as flood:
        assert flood.job(head + TASKS - 1)["reason"] == (
            f"held: array {head} runs at most 1 tasks at a time")
        flood.cancel(head, array=True)  # `plinth cancel ARRAY`: every task, in one call
        wait_for(lambda: flood.jobs_page(array=head, states=UNFINISHED, limit=1)[1] == 0,
                 timeout=120, what="every task of the array cancelled")
        last = flood.job(head + TASKS - 1)
        assert (last["state"], last["reason"]) == ("cancelled", "cancelled by the user while held")
    reaches_running(p, wait_for, "other-after")
