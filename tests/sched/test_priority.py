"""Strict priority with preemption, on hand-checked one- and two-node clusters."""

from __future__ import annotations

import random

import pytest

from plinth.core.errors import SpecError
from plinth.core.resources import Cluster, Node, Request
from plinth.core.workload import Job
from plinth.sched.policies import make_policy
from plinth.sched.policies.priority import StrictPriority
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot
from plinth.sched.validate import apply_decisions, running_job, snapshot_for

NOW = 10_000.0


def make_cluster(nodes: int = 1, gpus: int = 4) -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 64_000, 256_000, "V100", gpus) for i in range(nodes)))


def make_job(jid: int, gpus: int, *, prio: int = 0, submit: float = 0.0,
             preemptible: bool = True, duration: float = 3600.0) -> Job:
    return Job(jid, submit, duration, Request(gpus=gpus), priority=prio, preemptible=preemptible)


def pending(job: Job, **kw) -> JobState:
    return JobState(job, pending_since=job.submit_time, **kw)


def running(state: ClusterState, job: Job, *, start: float = 0.0, **kw) -> JobState:
    return running_job(state, job, start=start, **kw)


def snapshot(policy, cluster, state, waiting, run, config=SchedConfig()) -> Snapshot:
    return snapshot_for(policy, cluster, state, waiting, run, config)


def apply(snap: Snapshot, d: Decisions) -> ClusterState:
    return apply_decisions(snap, d)


def setup(nodes=1, gpus=4):
    cl = make_cluster(nodes, gpus)
    return cl, ClusterState(cl), StrictPriority()


def test_order_is_priority_then_submit_then_id():
    pol = StrictPriority()
    a = pending(make_job(1, 1, prio=1, submit=5))
    b = pending(make_job(2, 1, prio=3, submit=9))
    c = pending(make_job(3, 1, prio=3, submit=2))
    assert [js.id for js in sorted([a, b, c], key=pol.order)] == [3, 2, 1]
    assert isinstance(make_policy("priority"), StrictPriority)


def test_preempts_lower_priority_and_names_both_jobs():
    cl, st, pol = setup()
    low = running(st, make_job(1, 4, prio=1))
    high = pending(make_job(12, 2, prio=5, submit=NOW))
    snap = snapshot(pol, cl, st, [high], [low])
    d = pol.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [1]
    assert d.preempts[0].reason == "preempted by job 12 (priority 5 > 1)"
    assert [s.job_id for s in d.starts] == [12]
    assert "preempted job 1" in d.starts[0].reason
    apply(snap, d)
    assert st.allocated_gpus == 4  # the snapshot's state is untouched


def test_never_preempts_equal_or_higher_priority():
    cl, st, pol = setup()
    same = running(st, make_job(1, 2, prio=5))
    higher = running(st, make_job(2, 2, prio=7))
    new = pending(make_job(3, 2, prio=5, submit=NOW))
    snap = snapshot(pol, cl, st, [new], [same, higher])
    d = pol.schedule(snap, NOW)
    assert not d.preempts and not d.starts
    assert "no lower-priority job is running" in d.waiting[3]
    assert d.wake_at is None


def test_respects_min_runtime_and_wakes_when_it_ends():
    cl, st, pol = setup()
    low = running(st, make_job(1, 4, prio=1), start=NOW - 100)  # protected for 300 s
    high = pending(make_job(2, 4, prio=5, submit=NOW))
    d = pol.schedule(snapshot(pol, cl, st, [high], [low]), NOW)
    assert not d.preempts and not d.starts
    assert d.wake_at == pytest.approx(NOW + 200)
    assert "guaranteed runtime until" in d.waiting[2]
    # At the wake time the same world preempts.
    d2 = pol.schedule(snapshot(pol, cl, st, [high], [low]), d.wake_at)
    assert [p.job_id for p in d2.preempts] == [1]


def test_wakes_when_the_soonest_victims_to_leave_their_guaranteed_runtime_would_do():
    """Two protected victims, either enough alone: the one first in victim order (less
    unsaved work) is protected for 500 s more, the other for 200 s. The job can preempt the
    second after 200 s, so it asks to be woken then, not after 500 s."""
    cl, st, pol = setup(nodes=2)
    late = running(st, make_job(1, 4, prio=1), start=NOW - 100, preemptions=1,  # 600 s
                   progress=10, checkpointed=0)
    soon = running(st, make_job(2, 4, prio=1), start=NOW - 100, progress=90,  # 300 s
                   checkpointed=0)
    high = pending(make_job(3, 4, prio=5, submit=NOW))
    d = pol.schedule(snapshot(pol, cl, st, [high], [late, soon]), NOW)
    assert not d.preempts and d.wake_at == pytest.approx(NOW + 200)
    assert f"until t={NOW + 200:.0f}s" in d.waiting[3]
    d2 = pol.schedule(snapshot(pol, cl, st, [high], [late, soon]), d.wake_at)
    assert [p.job_id for p in d2.preempts] == [2]


def test_guaranteed_runtime_backs_off_with_each_preemption():
    cl, st, pol = setup()
    # Preempted twice: protected for 300 * 2**2 = 1200 s.
    low = running(st, make_job(1, 4, prio=1), start=NOW - 1000, preemptions=2)
    high = pending(make_job(2, 4, prio=5, submit=NOW))
    d = pol.schedule(snapshot(pol, cl, st, [high], [low]), NOW)
    assert not d.preempts
    assert d.wake_at == pytest.approx(NOW + 200)


def test_non_preemptible_and_capped_jobs_are_never_victims():
    cl, st, pol = setup()
    pinned = running(st, make_job(1, 2, prio=0, preemptible=False))
    capped = running(st, make_job(2, 2, prio=0), preemptions=SchedConfig().max_preemptions)
    high = pending(make_job(3, 2, prio=5, submit=NOW))
    snap = snapshot(pol, cl, st, [high], [pinned, capped])
    d = pol.schedule(snap, NOW)
    assert not d.preempts and not d.starts
    assert "would not make room" in d.waiting[3]
    assert d.wake_at is None  # waiting longer cannot help: no wake-up


def test_prefers_the_victim_with_the_most_recent_checkpoint():
    cl, st, pol = setup()
    stale = running(st, make_job(1, 2, prio=1), progress=5000, checkpointed=4000,
                    checkpoint_time=NOW - 1000)
    fresh = running(st, make_job(2, 2, prio=1), progress=5000, checkpointed=4900,
                    checkpoint_time=NOW - 100)
    high = pending(make_job(3, 2, prio=5, submit=NOW))
    d = pol.schedule(snapshot(pol, cl, st, [high], [stale, fresh]), NOW)
    assert [p.job_id for p in d.preempts] == [2]


def test_lowest_priority_victim_first_and_only_as_many_as_needed():
    cl, st, pol = setup(nodes=2)
    a = running(st, make_job(1, 2, prio=2))
    b = running(st, make_job(2, 2, prio=1))
    c = running(st, make_job(3, 2, prio=1))
    e = running(st, make_job(4, 2, prio=3))
    high = pending(make_job(5, 4, prio=5, submit=NOW))
    snap = snapshot(pol, cl, st, [high], [a, b, c, e])
    d = pol.schedule(snap, NOW)
    # Jobs 2 and 3 (priority 1) are on different nodes; a 4-GPU gang needs one whole node,
    # so the victims are the priority-1 job and its node-mate, never the priority-3 job.
    mate = b if b.allocation.nodes == a.allocation.nodes else c
    assert {p.job_id for p in d.preempts} == {a.id, mate.id}
    assert [s.job_id for s in d.starts] == [5]
    apply(snap, d)


def test_preempts_before_backfilling_a_lower_priority_job():
    cl, st, pol = setup()
    low = running(st, make_job(1, 2, prio=1))
    high = pending(make_job(2, 4, prio=5, submit=NOW))
    filler = pending(make_job(3, 2, prio=1, submit=NOW - 50, duration=60))
    snap = snapshot(pol, cl, st, [high, filler], [low])
    d = pol.schedule(snap, NOW)
    # Backfilling the short job first would leave the head unable to fit. The head needs the
    # 2 free GPUs plus the victim's 2: the shared find_victims misses this case.
    assert [p.job_id for p in d.preempts] == [1]
    assert [s.job_id for s in d.starts] == [2]
    assert 3 in d.waiting
    apply(snap, d)


def test_lower_class_preempts_while_the_head_is_blocked():
    cl, st, pol = setup()
    big = running(st, make_job(1, 2, prio=9))
    low = running(st, make_job(2, 2, prio=0))
    head = pending(make_job(3, 4, prio=5, submit=NOW))  # blocked by the priority-9 job
    mid = pending(make_job(4, 2, prio=3, submit=NOW))
    twin = pending(make_job(5, 2, prio=5, submit=NOW + 1))  # same class as the head
    snap = snapshot(pol, cl, st, [head, mid, twin], [big, low])
    d = pol.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [2]
    assert d.preempts[0].reason == "preempted by job 4 (priority 3 > 0)"
    assert [s.job_id for s in d.starts] == [4]
    assert "would not make room" in d.waiting[3]
    # Job 5 may not overtake the head of its own class by preempting.
    assert 5 not in {s.job_id for s in d.starts}
    apply(snap, d)


def test_preempt_depth_bounds_the_tries_per_pass():
    cl, st, _ = setup()
    pol = StrictPriority(preempt_depth=0)
    low = running(st, make_job(1, 4, prio=1))
    high = pending(make_job(2, 4, prio=5, submit=NOW))
    d = pol.schedule(snapshot(pol, cl, st, [high], [low]), NOW)
    assert not d.preempts and "per-pass limit" in d.waiting[2]
    with pytest.raises(SpecError, match="preempt_depth"):
        StrictPriority(preempt_depth=-1)


def test_plain_easy_backfill_without_lower_priority_work():
    cl, st, pol = setup()
    run = running(st, make_job(1, 2, prio=5, duration=1000), start=NOW)
    head = pending(make_job(2, 4, prio=5, submit=1))
    short = pending(make_job(3, 2, prio=5, submit=2, duration=500))
    long = pending(make_job(4, 2, prio=5, submit=3, duration=5000))
    snap = snapshot(pol, cl, st, [head, short, long], [run])
    d = pol.schedule(snap, NOW)
    assert [s.job_id for s in d.starts] == [3]  # ends before the head's reservation
    assert "first in line" in d.waiting[2] and not d.preempts
    apply(snap, d)


def test_random_worlds_never_over_commit_or_invert_priority():
    rng = random.Random(7)
    for _ in range(300):
        cl, st, pol = setup(nodes=2, gpus=4)
        run, jid = [], 0
        for _ in range(rng.randint(0, 6)):
            jid += 1
            job = make_job(jid, rng.choice([1, 2, 4]), prio=rng.randint(0, 3),
                           preemptible=rng.random() < 0.8)
            if st.whole_free_gpus() >= job.request.gpus:
                js = running(st, job, start=NOW - rng.choice([50, 500, 5000]),
                             preemptions=rng.randint(0, 9))
                if js.allocation is not None:
                    run.append(js)
        waiting = [pending(make_job(jid + k, rng.choice([1, 2, 4, 8]), prio=rng.randint(0, 3),
                                    submit=NOW - k)) for k in range(1, rng.randint(1, 6))]
        snap = snapshot(pol, cl, st, waiting, run)
        d = pol.schedule(snap, NOW)
        apply(snap, d)
        if d.preempts:
            top = max(js.job.priority for js in waiting if js.id in {s.job_id for s in d.starts})
            assert all(snap.running[p.job_id].job.priority < top for p in d.preempts)
        assert d.wake_at is None or d.wake_at > NOW


# -- the shared machinery, against the plain formulas it replaces --------------------------

def _prune_reference(work, req, victims):
    """Drop unnecessary victims by rebuilding the state for every trial (the plain way)."""
    from plinth.sched.placement import place

    keep = list(victims)
    for js in reversed(victims[:-1]):
        trial = [v for v in keep if v is not js]
        scratch = work.copy()
        for v in trial:
            scratch.release(v.allocation, v.job.request)
        if place(scratch, req) is not None:
            keep = trial
    scratch = work.copy()
    for v in keep:
        scratch.release(v.allocation, v.job.request)
    return keep, place(scratch, req)


@pytest.mark.parametrize("seed", range(40))
def test_prune_victims_keeps_what_rebuilding_every_trial_keeps(seed):
    from plinth.sched.placement import DEFAULT_PLACEMENT, place
    from plinth.sched.preemption import prune_victims

    rng = random.Random(seed)
    cl = make_cluster(nodes=3, gpus=8)
    state = ClusterState(cl)
    jobs = []
    for jid in range(1, 40):
        req = (Request(gpu_milli=rng.choice([300, 500])) if rng.random() < 0.2 else
               Request(gpus=rng.choice([1, 2]), workers=rng.choice([1, 2, 3])))
        a = place(state, req)
        if a is not None:
            state.allocate(a, req)
            jobs.append(JobState(Job(jid, 0.0, 3600.0, req), allocation=a))
    req = Request(gpus=rng.choice([1, 2, 4]), workers=rng.choice([1, 2, 4]))
    rng.shuffle(jobs)
    scratch, victims = state.copy(), []
    for js in jobs:  # victims in this order until req fits, as a search finds them
        scratch.release(js.allocation, js.job.request)
        victims.append(js)
        if place(scratch, req) is not None:
            break
    else:
        pytest.skip("does not fit even with every job released")
    keep, after, alloc = prune_victims(state, req, victims, DEFAULT_PLACEMENT)
    ref_keep, ref_alloc = _prune_reference(state, req, victims)
    assert [v.id for v in keep] == [v.id for v in ref_keep] and alloc == ref_alloc
    after.allocate(alloc, req)
    after.check()


def test_expected_ends_are_the_scalar_formula():
    import numpy as np

    from plinth.sched.ends import RunningEnds

    def expected_ends(now, jobs, oracle, fresh=False):  # by the owner's index, in job order
        index = RunningEnds() if fresh else RunningEnds.of({js.id: js for js in jobs}, now)
        ends = {js.id: end for end, js in index.ordered(now, oracle,
                                                        fresh=jobs if fresh else ())}
        return np.array([ends[js.id] for js in jobs])

    rng = random.Random(7)
    jobs = []
    for jid in range(200):
        job = Job(jid, 0.0, rng.uniform(1, 1e5), Request(gpus=1),
                  time_limit=rng.choice([None, rng.uniform(1, 1e5)]))
        jobs.append(JobState(job, progress=rng.uniform(0, 1.2e5),
                             rate=rng.choice([0.0, 0.5, 1.0, rng.uniform(0.1, 3)])))
    now = 12_345.678
    got = expected_ends(now, jobs, oracle=False)
    assert got.tolist() == [now + js.remaining_estimate / (js.rate if js.rate > 0 else 1.0)
                            for js in jobs]
    assert expected_ends(now, jobs, oracle=True).tolist() == \
        [now + js.remaining / (js.rate if js.rate > 0 else 1.0) for js in jobs]
    assert expected_ends(now, jobs, oracle=False, fresh=True).tolist() == \
        [now + js.remaining_estimate for js in jobs]


def test_victims_below_a_bound_come_in_victim_order():
    from plinth.sched.preemption import (PreemptionPlan, can_preempt, guaranteed_runtime,
                                         victim_order)

    rng = random.Random(3)
    cl, state, policy = setup(nodes=4, gpus=8)
    run = []
    for jid in range(1, 30):
        js = running(state, make_job(jid, 1, prio=rng.randint(0, 4)),
                     start=rng.choice([0.0, NOW - 10]))
        js.progress, js.checkpointed = rng.choice([(900.0, 600.0), (700.0, 600.0), (50.0, 0.0)])
        js.checkpoint_time = rng.choice([None, 100.0, 200.0])
        run.append(js)
    snap = snapshot(policy, cl, state, [], run)
    plan = PreemptionPlan(snap, NOW, Decisions(), depth=8,
                          importance=lambda jobs: [js.job.priority for js in jobs],
                          whom="job")
    key = victim_order(lambda js: js.job.priority)
    cfg = snap.config
    for bound in range(6):
        # Those that may be preempted now first, in victim order; then the protected ones by
        # when their guaranteed runtime ends (ties in the order they run in).
        below = [js for js in run if js.job.priority < bound]
        want = sorted((js for js in below if can_preempt(js, NOW, cfg)), key=key) + sorted(
            (js for js in below if not can_preempt(js, NOW, cfg)),
            key=lambda js: js.start_time + guaranteed_runtime(js, cfg))
        assert plan._candidates(bound).jobs == want
    assert plan.lowest() == min(js.job.priority for js in run)
