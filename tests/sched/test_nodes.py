"""Nodes that leave the cluster and come back (plinth.sched.nodes), through the owner."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_owner import Chaos, cluster, job, launches, owner

from plinth.core.resources import MILLI, Request
from plinth.core.workload import Job
from plinth.sched import owner as o
from plinth.core.lifecycle import State


def on(w: o.Owner, job_id: int) -> set[int]:
    return {s.node for s in w.jobs[job_id].allocation.slots}


def test_a_node_that_leaves_is_not_placed_on_until_it_is_back():
    w = owner(c=cluster(nodes=2, gpus=2))
    w.handle([o.Submitted(job(1, gpus=2)), o.Submitted(job(2, gpus=2))], 0.0)
    assert on(w, 1) == {0} and on(w, 2) == {1}
    # Node 1 leaves while job 2 runs there, and a job pinned to it waits.
    w.handle([o.Submitted(Job(3, 1.0, 100.0, Request(gpus=1, nodes=("n1",))))], 1.0)
    w.set_down(frozenset({1}))
    out = w.handle([o.Lost(2, 1, "rank 0: its node died")], 2.0)
    assert [(t.job_id, t.new, t.kind) for t in out.transitions] == [(2, State.PENDING, "lost")]
    assert launches(out) == [] and w.jobs[3].status is State.PENDING
    # What job 2 released on node 1 is held, not free: only node 0's GPUs count.
    assert w.state.free_milli == 0 and w.held.free_milli == 2 * MILLI
    w.handle([o.Exited(1, 1, 0)], 3.0)  # node 0 frees: job 2 goes there, not to node 1
    assert w.jobs[2].status is State.RUNNING and on(w, 2) == {0}
    assert w.jobs[3].status is State.PENDING
    out = w.handle([], 4.0)
    assert launches(out) == []
    w.set_down(frozenset())  # back
    out = w.handle([], 5.0)
    assert launches(out) == [3] and on(w, 3) == {1}
    assert w.down.holds == []


def test_a_start_planned_on_a_victims_gpus_is_not_launched_once_their_node_has_left():
    """A high-priority job is planned on the GPUs a preempted victim still holds; the victim's
    node leaves before it exits. The job goes back to the queue (lost before its launch) and
    is launched elsewhere later, never on the departed node."""
    w = owner("priority", c=cluster(nodes=2, gpus=2))
    w.handle([o.Submitted(job(1, gpus=2, priority=0)), o.Submitted(job(2, gpus=2, priority=0))],
             0.0)
    assert on(w, 1) == {0} and on(w, 2) == {1}
    out = w.handle([o.Submitted(job(3, gpus=2, t=1.0, priority=10))], 40.0)
    victim = out.instructions[0].job_id
    assert launches(out) == [] and w.jobs[3].status is State.RUNNING  # waits for the release
    gone = on(w, victim).pop()
    w.set_down(frozenset({gone}))
    out = w.handle([o.Exited(victim, 1, 143)], 41.0)
    assert launches(out) == [] and w.jobs[3].status is State.PENDING
    assert [t.kind for t in out.transitions if t.job_id == 3] == ["lost"]
    w.set_down(frozenset())
    out = w.handle([], 42.0)
    assert 3 in launches(out)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 20))
def test_nothing_is_launched_on_a_node_that_left_under_random_events(seed, n):
    """Nodes leave and return at random among random submissions, ends and preemptions: no
    launch lands on a node that is down, and the owner's invariants (validate=True) hold,
    the holds on down nodes included."""
    rng = random.Random(seed)
    w = owner(Chaos(seed), cluster(nodes=3, gpus=2))
    live: dict[int, int] = {}
    pending = [Job(i, 0.0, 100.0, Request(gpus=rng.choice([1, 2]), workers=rng.choice([1, 2])),
                   preemptible=rng.random() < 0.8) for i in range(n)]
    for step in range(150):
        t = float(step)
        if rng.random() < 0.1:
            w.set_down(frozenset(i for i in range(3) if rng.random() < 0.4))
        events: list = []
        if pending and rng.random() < 0.5:
            events.append(o.Submitted(pending.pop()))
        if live and rng.random() < 0.4:
            jid = rng.choice(sorted(live))
            a = live.pop(jid)
            events.append(o.Exited(jid, a, 0) if rng.random() < 0.5 else o.Lost(jid, a))
        out = w.handle(events, t)
        for ins in out.instructions:
            if type(ins) is o.Launch:
                assert w.down.nodes.isdisjoint(ins.allocation.nodes), (ins, w.down.nodes)
                live[ins.job_id] = ins.attempt
            else:
                live.pop(ins.job_id, None)
                w.handle([o.Exited(ins.job_id, ins.attempt, 143)], t)
