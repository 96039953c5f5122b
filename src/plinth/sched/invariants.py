"""The state owner's invariants, for tests and the simulator's validate mode.

Nothing is over-committed in either view; each view equals the sum of its jobs' allocations
(and, in the plan, the holds on nodes that left); gangs are whole; every job is in exactly the
one place its state says (a pending job in the policy's queue, or held: plinth.sched.holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plinth.core.lifecycle import State, StopReason
from plinth.sched.state import ClusterState
from plinth.sched.types import check_gang

if TYPE_CHECKING:
    from plinth.sched.owner import Owner


def check_owner(owner: Owner) -> None:
    """Raise AssertionError naming the first invariant of `owner` that does not hold."""
    owner.state.check()
    owner.held.check()
    plan, held = ClusterState(owner.cluster), ClusterState(owner.cluster)
    in_pending = {js.id for js in owner.pending}
    ending = {j for j, (r, _) in owner.stop_why.items() if r is not StopReason.PREEMPT}
    assert len(in_pending) == len(owner.pending), "a job is queued twice"
    for jid, js in owner.jobs.items():
        where = [name for name, box in (("pending", in_pending), ("held", owner.holds.jobs),
                                        ("running", owner.running),
                                        ("stopping-to-end", ending)) if jid in box]
        expect = {State.PENDING: ["held" if jid in owner.holds.jobs else "pending"],
                  State.RUNNING: ["running"]}.get(js.status)
        if js.status is State.STOPPING:
            expect = ["pending"] if owner.stop_why[jid][0] is StopReason.PREEMPT and \
                jid not in owner.next_start else \
                ([] if jid in owner.next_start else ["stopping-to-end"])
        if js.status.terminal:
            expect = []
        assert where == expect, f"job {jid} ({js.status.value}) is in {where}, not {expect}"
        if js.status is State.RUNNING:
            check_gang(js)
            plan.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
        if jid in owner.next_start:
            plan.allocate(owner.next_start[jid][0], js.job.request)
        if jid in owner.runs:
            held.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
    assert owner.ends.ids() == set(owner.running), "the index of expected ends drifted"
    assert set(owner.accounted) == set(owner.runs) & set(owner.running), \
        "the jobs a pass accounts drifted"
    for alloc, req in owner.down.holds:
        plan.allocate(alloc, req)
    for mine, want, name in ((owner.state, plan, "plan"), (owner.held, held, "held")):
        assert (mine.gpu_free_milli == want.gpu_free_milli).all(), f"{name} GPUs drifted"
        assert (mine.node_free_cpu == want.node_free_cpu).all(), f"{name} CPUs drifted"
