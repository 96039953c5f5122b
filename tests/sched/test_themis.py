"""Themis finish-time fairness: rho by hand, leases to the worst rho, the fairness knob."""

from __future__ import annotations

import random

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.core.resources import Cluster, Node, Request
from plinth.core.spec import load_cluster
from plinth.core.workload import Job
from plinth.core.lifecycle import State
from plinth.sched.placement import place_and_allocate
from plinth.sched.policies import make_policy
from plinth.sched.policies.themis import Themis
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot
from plinth.sched.validate import apply_decisions
from plinth.sim.engine import simulate
from plinth.sim.metrics import summarize
from plinth.sim.traces.synthetic import synthetic_jobs

CFG = SchedConfig()
ROUND = CFG.round_s


def v100s(gpus: int = 1, nodes: int = 1) -> Cluster:
    return Cluster(tuple(Node(f"v{i}", 64_000, 256_000, "V100", gpus) for i in range(nodes)))


def job(jid: int, duration: float, gpus: int = 1, submit: float = 0.0, **kw) -> Job:
    return Job(jid, submit, duration, Request(gpus=gpus), job_type="a3c", **kw)


def running(state: ClusterState, j: Job, *, start: float = 0.0, progress: float = 0.0,
            rate: float = 1.0) -> JobState:
    js = JobState(j, status=State.RUNNING, start_time=start, first_start=start,
                  progress=progress, rate=rate, model="V100")
    js.allocation = place_and_allocate(state, j.request)
    assert js.allocation is not None, "test setup: running job does not fit"
    return js


def snapshot(pol, cluster, state, waiting, run, cfg=CFG) -> Snapshot:
    return Snapshot(cluster, state, sorted(waiting, key=pol.order), {js.id: js for js in run},
                    cfg)


def apply(snap: Snapshot, d: Decisions) -> ClusterState:
    return apply_decisions(snap, d)


def snap_job(snap: Snapshot, jid: int) -> JobState:
    return next(js for js in snap.pending if js.id == jid)


def test_rho_by_hand():
    cluster = v100s(gpus=4)
    state = ClusterState(cluster)
    b = running(state, job(1, 4000.0, gpus=4), progress=400.0, rate=0.5)
    a = JobState(job(0, 1000.0))
    rho = Themis().rho([a, b], 500.0, 2, cluster)
    # a: ideal 1000 x max(1, 2 x 1 / 4) = 1000; shared 500 + 1000 / 1.0 = 1500.
    # b: ideal 4000 x max(1, 2 x 4 / 4) = 8000; shared 500 + 3600 / 0.5 = 7700.
    assert rho == pytest.approx([1.5, 7700 / 8000])


def test_waiting_jobs_are_rated_at_the_mean_speed_of_their_gpus():
    cluster = Cluster((Node("v", 8000, 64000, "V100", 1), Node("k", 8000, 64000, "K80", 3)))
    js = JobState(Job(0, 0.0, 1000.0, Request(gpus=1), job_type="resnet50"))
    # resnet50: V100 1.0, K80 0.11 -> mean over four GPUs (1.0 + 3 x 0.11) / 4 = 0.3325.
    rho = Themis().rho([js], 0.0, 1, cluster)
    assert rho[0] == pytest.approx((1000 / 0.3325) / 1000)


def test_lease_goes_to_the_worst_rho():
    cluster = v100s()
    state = ClusterState(cluster)
    b = running(state, job(1, 10_000.0), progress=1000.0)
    a = JobState(job(0, 1000.0))
    pol = Themis()
    snap = snapshot(pol, cluster, state, [a], [b])
    d = pol.schedule(snap, 1000.0)
    # rho_a = (1000 + 1000) / (1000 x 2) = 1.0 > rho_b = (1000 + 9000) / (10000 x 2) = 0.5
    assert [p.job_id for p in d.preempts] == [1] and [s.job_id for s in d.starts] == [0]
    assert "rho 1.00 > 0.50" in d.preempts[0].reason
    assert d.starts[0].model == "V100" and d.wake_at == 1000.0 + ROUND
    apply(snap, d)


def test_guaranteed_runtime_is_honoured():
    cluster = v100s()
    state = ClusterState(cluster)
    b = running(state, job(1, 10_000.0), start=900.0, progress=100.0)  # ran 100 s < 300 s
    a = JobState(job(0, 1000.0))
    pol = Themis()
    d = pol.schedule(snapshot(pol, cluster, state, [a], [b]), 1000.0)
    assert not d and "no lease can be reclaimed" in d.waiting[0]
    # Not preemptible at all: the same, however long it has run.
    state = ClusterState(cluster)
    b = running(state, job(1, 10_000.0, preemptible=False), progress=1000.0)
    d = Themis().schedule(snapshot(pol, cluster, state, [a], [b]), 1000.0)
    assert not d


def test_only_the_offered_jobs_may_preempt():
    cluster = v100s()
    state = ClusterState(cluster)
    r = running(state, job(1, 100_000.0), progress=1000.0)
    worst = JobState(job(0, 500.0))
    middle = JobState(job(2, 2000.0))
    pol = Themis(fairness_knob=0.8)  # 3 jobs -> ceil(0.2 x 3) = 1 offered
    snap = snapshot(pol, cluster, state, [worst, middle], [r])
    d = pol.schedule(snap, 1000.0)
    assert [s.job_id for s in d.starts] == [0] and [p.job_id for p in d.preempts] == [1]
    assert "went to the 1 jobs" in d.waiting[2]
    apply(snap, d)


def test_fairness_knob_sets_how_many_are_offered():
    cluster = v100s(gpus=1, nodes=3)
    state = ClusterState(cluster)
    run = [running(state, job(10 + i, 100_000.0), progress=1000.0) for i in range(3)]
    waiting = [JobState(job(i, 500.0 + 100 * i)) for i in range(3)]
    for f, offered in ((1.0, 1), (0.5, 3), (0.0, 3)):
        pol = Themis(fairness_knob=f)
        snap = snapshot(pol, cluster, state, waiting, run)
        d = pol.schedule(snap, 1000.0)
        # Six jobs: f = 1 offers to one, f = 0.5 to three, f = 0 to all six.
        assert len(d.starts) == len(d.preempts) == offered
        apply(snap, d)


def test_mid_round_passes_do_not_preempt():
    cluster = v100s()
    state = ClusterState(cluster)
    pol = Themis()
    a = JobState(job(0, 100_000.0))
    d = pol.schedule(snapshot(pol, cluster, state, [a], []), 0.0)
    assert [s.job_id for s in d.starts] == [0]
    b = running(state, job(0, 100_000.0), start=0.0, progress=10.0)
    late = JobState(job(1, 10.0, submit=5.0))
    d = pol.schedule(snapshot(pol, cluster, state, [late], [b]), 340.0)
    assert not d and "waiting for the next round" in d.waiting[1]
    d = pol.schedule(snapshot(pol, cluster, state, [late], [b]), ROUND)
    assert [p.job_id for p in d.preempts] == [0] and [s.job_id for s in d.starts] == [1]


def test_placement_prefers_consolidation_then_speed():
    cluster = Cluster((
        Node("v0", 8000, 64000, "V100", 2), Node("v1", 8000, 64000, "V100", 2),
        Node("k0", 8000, 64000, "K80", 4)))
    pol = Themis(fairness_knob=0.0)
    state = ClusterState(cluster)
    big, small = JobState(job(0, 1000.0, gpus=4)), JobState(job(1, 1000.0, gpus=2))
    snap = snapshot(pol, cluster, state, [big, small], [])
    d = pol.schedule(snap, 0.0)
    model = {s.job_id: s.model for s in d.starts}
    assert model == {0: "K80", 1: "V100"}  # 4 GPUs on one K80 node beat two V100 nodes
    apply(snap, d)


def test_decisions_never_over_commit_under_churn():
    rng = random.Random(3)
    cluster = Cluster(tuple(
        [Node(f"v{i}", 64_000, 512_000, "V100", 4) for i in range(3)]
        + [Node(f"k{i}", 64_000, 512_000, "K80", 8) for i in range(2)]))
    jobs = {}
    for i in range(50):
        req = (Request(gpu_milli=500, gpu_memory_mib=1024) if rng.random() < 0.2
               else Request(gpus=rng.choice([1, 2, 4]), workers=rng.choice([1, 2])))
        jobs[i] = JobState(Job(i, rng.uniform(0, 10 * ROUND), rng.uniform(300, 5_000), req,
                               job_type=rng.choice(["resnet50", "a3c", "lm"]),
                               preemptible=rng.random() > 0.1))
    pol = Themis(max_jobs=20)
    state = ClusterState(cluster)
    now = 0.0
    for _ in range(200):
        run = {i: js for i, js in jobs.items() if js.status is State.RUNNING}
        for js in run.values():  # progress at the job's rate
            js.progress = min(js.job.duration, js.progress + 60.0 * js.rate)
        pend = [js for js in jobs.values()
                if js.status is State.PENDING and js.job.submit_time <= now]
        snap = snapshot(pol, cluster, state, pend, list(run.values()))
        d = pol.schedule(snap, now)
        state = apply(snap, d)
        for p in d.preempts:
            jobs[p.job_id].status, jobs[p.job_id].allocation = State.PENDING, None
        for s in d.starts:
            js = jobs[s.job_id]
            js.status, js.allocation, js.model, js.start_time = (
                State.RUNNING, s.allocation, s.model, now)
            js.rate = 1.0 if s.model == "V100" else 0.6
        for js in list(run.values()):
            if js.progress >= js.job.duration and js.status is State.RUNNING:
                state.release(js.allocation, js.job.request)
                js.status, js.allocation = State.SUCCEEDED, None
        now += 60.0
    assert sum(js.status is State.SUCCEEDED for js in jobs.values()) > 20
    assert np.isfinite(pol.rho(list(jobs.values()), now, 50, cluster)).all()


def test_through_the_simulator_themis_narrows_the_worst_finish_time_fairness():
    c = load_cluster("2x4xV100,2x4xP100,2x4xK80")
    fifo, themis = [], []
    for seed in (1, 2, 3):
        jobs = synthetic_jobs(150, seed=seed, load=1.5, cluster_gpus=8, heavy_tail=False)
        fifo.append(summarize(simulate(jobs, c, make_policy("fifo")))["ftf_rho_max"])
        r = summarize(simulate(jobs, c, Themis(), validate=True))
        assert r["completed"] == 150
        themis.append(r["ftf_rho_max"])
    assert np.mean(themis) < np.mean(fifo)


def test_registry_and_validation():
    assert isinstance(make_policy("themis", fairness_knob=0.5), Themis)
    with pytest.raises(SpecError, match="themis.fairness_knob"):
        Themis(fairness_knob=1.5)
    with pytest.raises(SpecError, match="themis.reclaim_depth"):
        Themis(reclaim_depth=-1)
