"""The simulator: terminal states, determinism, preemption costs, and policy comparisons."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core import Cluster, Job, Node, Request
from plinth.core.errors import UnplaceableError
from plinth.runtime.sim_behaviour import SimBehaviour
from plinth.sched.policies import make_policy
from plinth.sched.policies.base import Policy
from plinth.core.lifecycle import State
from plinth.sched.types import Decisions, Preempt, SchedConfig
from plinth.sim.engine import simulate
from plinth.sim.metrics import summarize
from plinth.sim.traces.synthetic import synthetic_jobs

GREEDY = ["fifo", "sjf"]


def cluster(nodes=4, gpus=8, model="V100") -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 64_000, 512_000, model, gpus, rack=f"r{i // 2}")
                         for i in range(nodes)))


def job(i, t, d, gpus=1, workers=1, **kw) -> Job:
    return Job(i, t, d, Request(gpus=gpus, workers=workers), **kw)


def test_fifo_hand_checked_timeline():
    c = cluster(nodes=1)
    jobs = [job(0, 0, 100, workers=8), job(1, 10, 50, workers=4), job(2, 20, 30, workers=4)]
    r = simulate(jobs, c, make_policy("fifo"), validate=True)
    ends = {js.id: js.end_time for js in r.jobs}
    assert ends == {0: 100, 1: 150, 2: 130}  # 1 and 2 share the node after job 0 ends
    assert r.jobs[1].first_start == 100 and r.jobs[2].first_start == 100
    m = summarize(r)
    assert m["makespan_s"] == 150 and m["jobs"] == 3
    assert m["avg_jct_s"] == pytest.approx((100 + 140 + 110) / 3)
    assert m["gpu_utilization"] == pytest.approx((8 * 100 + 4 * 50 + 4 * 30) / (8 * 150))


def test_easy_backfill_lets_short_jobs_jump_but_never_delays_the_head():
    c = cluster(nodes=1)
    jobs = [job(0, 0, 100, workers=6),   # leaves 2 GPUs free
            job(1, 1, 50, workers=8),    # head: must wait for job 0 (t=100)
            job(2, 2, 90, workers=2),    # ends at 92 < 100: backfills
            job(3, 3, 500, workers=2)]   # would delay job 1: waits
    r = simulate(jobs, c, make_policy("fifo"), validate=True)
    s = {js.id: js.first_start for js in r.jobs}
    assert s[2] == 2 and s[1] == 100 and s[3] >= 150


def test_sjf_hand_checked_order():
    c = cluster(nodes=1)
    jobs = [job(0, 0, 100, workers=8),  # holds the node until t=100
            job(1, 1, 300, workers=8), job(2, 2, 50, workers=8), job(3, 3, 200, workers=8)]
    r = simulate(jobs, c, make_policy("sjf"), validate=True)
    s = {js.id: js.first_start for js in r.jobs}
    assert (s[2], s[3], s[1]) == (100, 150, 350)  # shortest first once the node frees


def test_unplaceable_job_is_an_error_naming_it_before_anything_runs():
    jobs = [job(0, 0, 10), job(1, 5, 10, workers=40, name="huge", source_line=7)]
    with pytest.raises(UnplaceableError, match=r"huge \(trace line 7\).*asks for 40 GPUs"):
        simulate(jobs, cluster(nodes=2), make_policy("fifo"))
    r = simulate(jobs, cluster(nodes=2), make_policy("fifo"), reject_unfit=True)
    assert [js.status for js in r.jobs] == [State.SUCCEEDED, State.REJECTED]


class PreemptOnce(Policy):
    """A FIFO that preempts job 0 once at t=50, to check the cost model."""

    name = "preempt-once"

    def __init__(self, checkpoint=False):
        self.fifo = make_policy("fifo")
        self.done = False
        self.checkpoint = checkpoint

    def schedule(self, snap, now):
        if not self.done and now >= 50 and 0 in snap.running:
            self.done = True
            return Decisions(preempts=[Preempt(0, "test", self.checkpoint)])
        d = self.fifo.schedule(snap, now)
        d.wake_at = 50 if not self.done else None
        return d


def test_preemption_loses_unsaved_work_and_pays_restore_overhead():
    cfg = SchedConfig(checkpoint_interval=20, restore_overhead=5, min_runtime=0)
    r = simulate([job(0, 0, 100)], cluster(nodes=1), PreemptOnce(), cfg, validate=True)
    js = r.jobs[0]
    # Preempted at 50 with progress 50, checkpoint at 40: 10 s lost. Restarts at 50, pays 5 s,
    # then runs the remaining 60 s: ends at 115.
    assert js.preemptions == 1 and r.preemptions == 1
    assert r.lost_work_s == pytest.approx(10)
    assert js.end_time == pytest.approx(115)


def test_preemption_with_a_checkpoint_loses_nothing():
    cfg = SchedConfig(checkpoint_interval=20, restore_overhead=5, min_runtime=0)
    r = simulate([job(0, 0, 100)], cluster(nodes=1), PreemptOnce(checkpoint=True), cfg)
    assert r.lost_work_s == 0 and r.jobs[0].end_time == pytest.approx(105)


def _run(policy, jobs, c, **kw):
    return simulate(jobs, c, make_policy(policy), SchedConfig(**kw), validate=True)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(GREEDY),
       frac=st.sampled_from([0.0, 0.5]))
def test_every_job_ends_in_exactly_one_terminal_state(seed, policy, frac):
    jobs = synthetic_jobs(60, seed=seed, load=1.5, cluster_gpus=16, fractional=frac)
    r = _run(policy, jobs, cluster(nodes=2))
    assert len(r.jobs) == len(jobs)
    assert {js.id for js in r.jobs} == {j.id for j in jobs}
    for js in r.jobs:
        assert js.status is State.SUCCEEDED
        assert js.end_time >= js.first_start >= js.job.submit_time
        assert js.progress == pytest.approx(js.job.duration)


@pytest.mark.parametrize("policy", GREEDY)
def test_same_seed_same_results(policy):
    c = cluster(nodes=2)
    a = summarize(_run(policy, synthetic_jobs(300, seed=7, cluster_gpus=16), c))
    b = summarize(_run(policy, synthetic_jobs(300, seed=7, cluster_gpus=16), c))
    for k in ("sim_wall_s",):
        a.pop(k), b.pop(k)
    assert a == b


def test_sjf_oracle_beats_fifo_on_average_jct():
    c = cluster(nodes=2)
    jobs = synthetic_jobs(600, seed=3, load=1.2, cluster_gpus=16)
    fifo = summarize(_run("fifo", jobs, c))
    sjf = summarize(_run("sjf", jobs, c))
    assert sjf["avg_jct_s"] < fifo["avg_jct_s"]


def test_strict_fifo_without_backfill_blocks_behind_the_head():
    c = cluster(nodes=1)
    jobs = [job(0, 0, 100, workers=6), job(1, 1, 50, workers=8), job(2, 2, 10, workers=2)]
    r = simulate(jobs, c, make_policy("fifo", backfill=False), validate=True)
    s = {js.id: js.first_start for js in r.jobs}
    assert s == {0: 0, 1: 100, 2: 150}  # job 2 would fit at t=2 but may not pass job 1


def test_a_replay_honours_dependencies_and_array_throttles():
    """A trace with a dependency and a throttled array, replayed under the owner's holds as
    the platform runs it: the dependent job waits for its dependency (afterok) and for the
    whole array (an array's id stands for its tasks); at most two tasks run at once (%2),
    though the cluster has room for all; a job whose afterok dependency failed is cancelled."""
    c = cluster(nodes=1)  # 8 GPUs: room for everything at once
    array = [job(10 + i, 0, 100, array_id=10, array_limit=2) for i in range(5)]
    jobs = [job(1, 0, 50),
            job(2, 0, 30, retries=0),
            *array,
            job(3, 0, 10, dependencies=(("afterok", 1), ("afterok", 10))),
            job(4, 5, 10, dependencies=(("afterok", 2),)),
            job(5, 5, 10, dependencies=(("afternotok", 2),))]
    fails = {2}  # job 2 exits 1: afterok on it can never be met
    r = simulate(jobs, c, make_policy("fifo"), validate=True,
                 behaviour=lambda j, a: SimBehaviour(exit_code=1) if j.id in fails else None)
    by = {js.id: js for js in r.jobs}
    starts = sorted((by[t.id].first_start, by[t.id].end_time) for t in array)
    assert starts == [(0, 100), (0, 100), (100, 200), (100, 200), (200, 300)]
    assert all(sum(s <= t < e for s, e in starts) <= 2 for t, _ in starts)
    assert by[3].first_start == 300 and by[3].status is State.SUCCEEDED
    assert by[2].status is State.FAILED and by[5].first_start == 30
    assert by[4].status is State.CANCELLED and by[4].first_start is None
    assert by[4].reason == "dependency never satisfied: afterok:2 (job 2 ended failed)"
    assert by[4].end_time == 30  # cancelled as its dependency failed, not later
