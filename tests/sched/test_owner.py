"""The one owner of scheduling state: events in, transitions and instructions out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.resources import Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.workload import Job
from plinth.sched import owner as o
from plinth.core.lifecycle import IllegalTransition, State, StopReason, check_transition
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.sched.types import Decisions, Preempt, Resize, SchedConfig, Start

CFG = SchedConfig(min_runtime=0.0)


def cluster(nodes: int = 1, gpus: int = 4, model: str = "V100") -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 64_000, 256_000, model, gpus) for i in range(nodes)))


def job(i: int, gpus: int = 1, t: float = 0.0, **kw) -> Job:
    return Job(i, t, 100.0, Request(gpus=gpus), **kw)


def owner(policy: str | Policy = "fifo", c: Cluster | None = None, **kw) -> o.Owner:
    p = make_policy(policy) if isinstance(policy, str) else policy
    return o.Owner(c or cluster(), p, CFG, validate=True, **kw)


def launches(out: o.Output) -> list[int]:
    return [i.job_id for i in out.instructions if type(i) is o.Launch]


def stops(out: o.Output) -> list[o.Stop]:
    return [i for i in out.instructions if type(i) is o.Stop]


def test_a_job_from_submit_to_success_is_a_chain_of_legal_transitions():
    w = owner()
    out = w.handle([o.Submitted(job(1))], 0.0)
    assert launches(out) == [1]
    assert [(t.old, t.new, t.kind) for t in out.transitions] == [
        (State.PENDING, State.RUNNING, "started")]
    w.handle([o.Started(1, 1, 0.0)], 0.0)
    out = w.handle([o.Exited(1, 1, 0)], 50.0)
    assert [(t.old, t.new) for t in out.transitions] == [(State.RUNNING, State.SUCCEEDED)]
    js = w.jobs[1]
    assert js.status is State.SUCCEEDED and js.end_time == 50.0 and js.executed == 50.0
    assert w.state.used_milli == 0 and w.held.used_milli == 0
    for t in out.transitions:
        check_transition(t.job_id, t.old, t.new)  # the table the store enforces too


def test_the_lifecycle_table_refuses_an_illegal_move():
    with pytest.raises(IllegalTransition, match="job 3: cannot go from succeeded to running"):
        check_transition(3, State.SUCCEEDED, State.RUNNING)


def test_a_start_on_gpus_a_stopping_job_still_holds_waits_for_its_exit():
    w = owner("priority", cluster(gpus=1))
    w.handle([o.Submitted(job(1, priority=0))], 0.0)
    w.handle([o.Started(1, 1, 0.0)], 0.0)
    out = w.handle([o.Submitted(job(2, priority=5, t=1.0))], 1.0)
    # The plan gave the GPU to job 2 at once, but its processes must wait for job 1's to end.
    assert [(s.job_id, s.reason) for s in stops(out)] == [(1, StopReason.PREEMPT)]
    assert launches(out) == [] and w.jobs[2].status is State.RUNNING
    assert w.jobs[2].reason == o.WAITING_FOR_RELEASE
    assert w.jobs[1] in w.pending  # planned pending again already
    out = w.handle([o.Exited(1, 1, 143)], 3.0)
    assert launches(out) == [2]
    assert [(t.job_id, t.kind) for t in out.transitions] == [(1, "preempted"), (2, "launched")]
    assert w.jobs[1].status is State.PENDING and w.jobs[1].preemptions == 1


def test_a_move_is_checkpoint_then_stop_and_a_launch_of_the_next_attempt():
    c = Cluster((Node("a", 8_000, 64_000, "A100", 1), Node("v", 8_000, 64_000, "V100", 1)))

    class MoveOnce(Policy):
        name = "move-once"

        def schedule(self, snap, now):
            if not snap.running:
                return Decisions(starts=[Start(1, Allocation((WorkerSlot(1, (1,)),)), "go")])
            return Decisions(resizes=[Resize(1, Allocation((WorkerSlot(0, (0,)),)), "faster")])

    w = owner(MoveOnce(), c)
    out = w.handle([o.Submitted(job(1))], 0.0)
    w.handle([o.Started(1, 1, 0.0)], 0.0)
    w.request_pass()
    out = w.handle([], 10.0)
    assert [(s.job_id, s.attempt, s.checkpoint) for s in stops(out)] == [(1, 1, True)]
    assert launches(out) == []
    w.handle([o.CheckpointSaved(1, 1, 10.0, step=7)], 10.0, schedule=False)
    assert w.jobs[1].checkpoint_step == 7 and w.jobs[1].checkpointed == 10.0
    out = w.handle([o.Exited(1, 1, 143)], 11.0, schedule=False)
    (launch,) = [i for i in out.instructions if type(i) is o.Launch]
    assert (launch.attempt, launch.model, launch.allocation.slots[0].node) == (2, "A100", 0)
    assert [(t.old, t.new, t.kind) for t in out.transitions] == [
        (State.STOPPING, State.PENDING, "preempted"), (State.PENDING, State.RUNNING, "started")]
    js = w.jobs[1]
    assert js.status is State.RUNNING and js.preemptions == 0 and js.progress == 10.0


def test_a_swap_of_two_jobs_applies_although_no_order_of_moves_could():
    c = cluster(gpus=2)
    a0, a1 = Allocation((WorkerSlot(0, (0,)),)), Allocation((WorkerSlot(0, (1,)),))

    class Swap(Policy):
        name = "swap"

        def schedule(self, snap, now):
            if not snap.running:
                return Decisions(starts=[Start(1, a0, "a"), Start(2, a1, "b")])
            return Decisions(resizes=[Resize(1, a1, "swap"), Resize(2, a0, "swap")])

    w = owner(Swap(), c)
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)
    w.request_pass()
    out = w.handle([], 5.0)
    assert sorted(s.job_id for s in stops(out)) == [1, 2] and launches(out) == []
    out = w.handle([o.Exited(1, 1, 143)], 6.0, schedule=False)
    assert launches(out) == []  # job 1's new GPU is still held by job 2
    out = w.handle([o.Exited(2, 1, 143)], 7.0, schedule=False)
    assert sorted(launches(out)) == [1, 2]
    assert w.jobs[1].allocation == a1 and w.jobs[2].allocation == a0


def test_a_checkpoint_report_from_a_job_that_is_not_running_is_one_line_and_changes_nothing():
    w = owner(c=cluster(gpus=1))
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)
    before = (w.jobs[2].checkpointed, w.jobs[2].checkpoint_step, w.jobs[2].status)
    out = w.handle([o.CheckpointSaved(2, 1, 1.0, step=5), o.CheckpointSaved(9, 1, 1.0)], 1.0)
    assert [r.code for r in out.rejected] == ["stale", "not-found"]
    assert out.rejected[0].message == ("job 2: checkpoint report for attempt 1 ignored: the "
                                       "job is pending, attempt 0, not launched")
    assert "\n" not in out.rejected[0].message and out.rejected[1].message == "job 9 not found"
    assert (w.jobs[2].checkpointed, w.jobs[2].checkpoint_step, w.jobs[2].status) == before
    assert w.jobs[1].status is State.RUNNING  # what was accepted is untouched


def test_reports_from_an_earlier_attempt_are_stale():
    w = owner()
    w.handle([o.Submitted(job(1, retries=1))], 0.0)
    w.handle([o.Exited(1, 1, 3)], 1.0)  # failed: retried as attempt 2
    assert w.jobs[1].attempt == 2
    out = w.handle([o.Exited(1, 1, 0)], 2.0)
    assert [r.code for r in out.rejected] == ["stale"] and w.jobs[1].status is State.RUNNING


def test_cancel_while_pending_running_and_stopping_and_after_the_end():
    w = owner("priority", cluster(gpus=1))
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)
    out = w.handle([o.Cancelled(2)], 1.0)
    assert w.jobs[2].status is State.CANCELLED and not out.instructions
    out = w.handle([o.Cancelled(1)], 2.0)
    assert [(s.job_id, s.reason) for s in stops(out)] == [(1, StopReason.CANCEL)]
    assert w.jobs[1].status is State.STOPPING
    out = w.handle([o.Cancelled(1)], 2.5)  # cancelled again while stopping: nothing new
    assert not out.instructions and not out.rejected
    w.handle([o.Exited(1, 1, 143)], 3.0)
    assert w.jobs[1].status is State.CANCELLED
    out = w.handle([o.Cancelled(1), o.Cancelled(42)], 4.0)
    assert [r.code for r in out.rejected] == ["conflict", "not-found"]


def test_a_preempted_job_cancelled_while_it_stops_ends_cancelled_not_requeued():
    w = owner("priority", cluster(gpus=1))
    w.handle([o.Submitted(job(1))], 0.0)
    w.handle([o.Submitted(job(2, priority=9, t=1.0))], 1.0)
    w.handle([o.Cancelled(1)], 1.5)
    w.handle([o.Exited(1, 1, 143)], 2.0)
    assert w.jobs[1].status is State.CANCELLED and w.jobs[1] not in w.pending


def test_time_limit_stops_the_job_and_ends_it_timed_out():
    w = owner()
    w.handle([o.Submitted(job(1, time_limit=30.0))], 0.0)
    assert w.next_timer() == 30.0
    out = w.handle([], 30.0)
    assert [(s.job_id, s.reason) for s in stops(out)] == [(1, StopReason.TIMEOUT)]
    w.handle([o.Exited(1, 1, 143)], 31.0)
    assert w.jobs[1].status is State.TIMEOUT


def test_lost_processes_requeue_and_a_launch_failure_fails():
    w = owner(c=cluster(gpus=2))
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)
    w.handle([o.Lost(1, 1, "node vanished")], 1.0)
    assert w.jobs[1].attempt == 2 and w.jobs[1].status is State.RUNNING  # requeued, restarted
    w.handle([o.LaunchFailed(2, 1, "command[0]: 'nope' is not an executable")], 1.0)
    assert w.jobs[2].status is State.FAILED and "nope" in w.jobs[2].reason


def test_victims_are_the_most_recently_checkpointed_jobs():
    w = owner("priority", cluster(gpus=2))
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)
    w.handle([o.Started(1, 1, 0.0), o.Started(2, 1, 0.0)], 0.0)
    w.handle([o.CheckpointSaved(2, 1, 90.0, step=9), o.CheckpointSaved(1, 1, 20.0, step=2)],
             95.0)
    out = w.handle([o.Submitted(job(3, priority=5, t=100.0))], 100.0)
    assert [s.job_id for s in stops(out)] == [2]  # least work since its last checkpoint


class Chaos(Policy):
    """Random but legal decisions, to push the owner through every path."""

    name = "chaos"
    preemptive = True

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.fifo = make_policy("fifo")

    def schedule(self, snap, now):
        d = self.fifo.schedule(snap, now)
        run = sorted(snap.running)
        if run and self.rng.random() < 0.4:
            victim = self.rng.choice(run)
            if snap.running[victim].job.preemptible:
                d.preempts.append(Preempt(victim, "chaos", checkpoint=self.rng.random() < 0.5))
        return d


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 25))
def test_no_lost_job_and_no_over_commit_under_random_events(seed, n):
    rng = random.Random(seed)
    w = owner(Chaos(seed), cluster(nodes=2, gpus=2))  # validate=True checks every step
    jobs = [Job(i, 0.0, 100.0, Request(gpus=rng.choice([1, 2]), workers=rng.choice([1, 2])),
                retries=rng.choice([0, 1]), preemptible=rng.random() < 0.8) for i in range(n)]
    live: dict[int, int] = {}  # launched job -> attempt
    t = 0.0
    pending = list(jobs)
    for _ in range(200):
        t += 1.0
        events: list = []
        if pending and rng.random() < 0.5:
            events.append(o.Submitted(pending.pop()))
        if live and rng.random() < 0.5:
            jid = rng.choice(sorted(live))
            kind = rng.random()
            a = live.pop(jid)
            events.append(o.Exited(jid, a, 0) if kind < 0.5 else o.Exited(jid, a, 1)
                          if kind < 0.7 else o.Lost(jid, a) if kind < 0.8 else
                          o.CheckpointSaved(jid, a, t, step=int(t)))
            if kind >= 0.8:
                live[jid] = a
        if rng.random() < 0.1 and w.jobs:
            events.append(o.Cancelled(rng.choice(sorted(w.jobs))))
        out = w.handle(events, t)
        for ins in out.instructions:
            if type(ins) is o.Launch:
                live[ins.job_id] = ins.attempt
            elif rng.random() < 0.7:  # most stops end at once, some later
                live.pop(ins.job_id, None)
                w.handle([o.Exited(ins.job_id, ins.attempt, 143)], t)
    # Drain: every job must reach exactly one terminal state.
    for j in pending:
        w.handle([o.Submitted(j)], t)
    for _ in range(400):
        t += 1.0
        running = [js for js in w.jobs.values() if js.id in w.runs]
        if not running and not w.pending and not w.waiting_launch:
            break
        events = [o.Exited(js.id, js.attempt, 0 if js.status is State.RUNNING else 143)
                  for js in running]
        w.request_pass()
        w.handle(events, t)
    assert sorted(w.jobs) == sorted(j.id for j in jobs)
    assert all(js.status.terminal for js in w.jobs.values()), \
        {js.id: js.status.value for js in w.jobs.values() if not js.status.terminal}
    assert w.state.used_milli == 0 and w.held.used_milli == 0


class _Recorder(Policy):
    """FIFO that records what each pass was told had arrived."""

    name = "recorder"
    preemptive = True  # a pass on every arrival
    reads_arrivals = True

    def __init__(self) -> None:
        self.seen: list[list[int] | None] = []

    def schedule(self, snap, now):
        self.seen.append(None if snap.arrived is None else [js.id for js in snap.arrived])
        return make_policy("fifo").schedule(snap, now)


def test_a_pass_is_told_which_jobs_arrived_when_nothing_else_changed():
    rec = _Recorder()
    w = owner(rec, cluster(gpus=1))
    w.handle([o.Submitted(job(1)), o.Submitted(job(2))], 0.0)  # 1 starts, 2 waits
    w.handle([o.Started(1, 1, 0.0)], 0.0)
    w.handle([o.Submitted(job(3)), o.Submitted(job(4))], 5.0)
    w.handle([o.Submitted(job(5)), o.Cancelled(5)], 6.0)  # cancelled before the pass
    assert rec.seen[1:] == [[3, 4], []]
    w.handle([o.Exited(1, 1, 0), o.Submitted(job(6))], 10.0)  # 1 freed its GPU: anything
    assert rec.seen[-1] is None
    w.request_pass()
    w.handle([o.Submitted(job(7))], 11.0)
    assert rec.seen[-1] is None



def test_a_launch_the_cluster_failed_is_requeued_and_runs_again():
    """A runtime that says Unavailable (a node not ready yet, or gone) requeues the job."""
    w = owner(c=cluster(gpus=2))
    w.handle([o.Submitted(job(1))], 0.0)
    w.handle([o.LaunchFailed(1, 1, "Ray could not reserve it", requeue=True)], 1.0)
    assert w.jobs[1].attempt == 2 and w.jobs[1].status is State.RUNNING  # requeued, restarted


def test_nodes_that_join_are_placed_on_and_the_plan_keeps_what_runs():
    from plinth.sched.invariants import check_owner

    w = owner(c=cluster(nodes=1, gpus=2))
    w.handle([o.Submitted(job(1, gpus=2)), o.Submitted(job(2, gpus=2))], 0.0)
    assert (w.jobs[1].status, w.jobs[2].status) == (State.RUNNING, State.PENDING)
    bigger = Cluster((*w.cluster.nodes, Node("n1", 64_000, 256_000, "V100", 2)))
    w.add_nodes(bigger, make_policy("fifo"))
    check_owner(w)
    w.handle([], 1.0)
    assert w.jobs[2].status is State.RUNNING
    assert [s.node for s in w.jobs[2].allocation.slots] == [1]  # on the new node
    assert w.jobs[1].allocation.slots[0].node == 0
    check_owner(w)
    with pytest.raises(ValueError, match="keep the old nodes"):
        w.add_nodes(cluster(nodes=1, gpus=4), make_policy("fifo"))
