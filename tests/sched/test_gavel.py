"""Gavel: the max-min LP checked by hand, and the round-based leases driven round by round."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.clock import VirtualClock
from plinth.core.errors import SpecError
from plinth.core.lifecycle import State
from plinth.core.resources import Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.runtime import LaunchSpec, worker_launches
from plinth.core.spec import load_cluster
from plinth.core.workload import Job
from plinth.runtime.sim import SimRuntime
from plinth.sched import driver as one
from plinth.sched import lp
from plinth.sched import owner as o
from plinth.sched.lp import equal_share_throughput, feasible_mask, max_min_fairness
from plinth.sched.policies import make_policy
from plinth.sched.policies.gavel import Gavel
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot
from plinth.sched.validate import apply_decisions
from plinth.sim.engine import simulate
from plinth.sim.metrics import summarize
from plinth.sim.traces.synthetic import synthetic_jobs

CFG = SchedConfig()
ROUND = CFG.round_s
# Rows: a job 4x faster on a V100 than on a K80, and one only 1.2x faster.
T_FAST, T_FLAT = [4.0, 1.0], [1.2, 1.0]


# -- the LP --------------------------------------------------------------------------------

def test_lp_trades_v100_to_the_job_that_gains_most():
    # Two jobs of each kind on one V100 and one K80. Equal share: each job gets half a GPU,
    # split evenly, so T_equal = 0.5 * (4 + 1) / 2 = 1.25 and 0.5 * (1.2 + 1) / 2 = 0.55.
    # At the optimum the fast jobs run only on the V100 (a each) and the flat jobs fill the
    # K80 and the rest of the V100: rho_fast = 4a / 1.25, rho_flat = (1.2 (0.5 - a) + 0.5) / 0.55.
    # Equal rho gives a = 22 / 59.2 and t = 44 / 37.
    res = max_min_fairness(np.array([T_FAST, T_FAST, T_FLAT, T_FLAT]), np.ones(4),
                           np.array([1.0, 1.0]))
    assert res.t == pytest.approx(44 / 37, rel=1e-6)
    assert res.equal == pytest.approx([1.25, 1.25, 0.55, 0.55])
    assert res.X[:2, 1] == pytest.approx([0, 0], abs=1e-6)  # no K80 for the fast jobs
    assert res.X[2:, 1].sum() == pytest.approx(1.0, abs=1e-6)  # the whole K80 to flat jobs
    assert res.X[:2, 0].sum() == pytest.approx(44 / 59.2, abs=1e-5)
    assert res.rho == pytest.approx([44 / 37] * 4, rel=1e-5)


def test_lp_one_gpu_each_is_the_equal_share():
    # With one V100, one K80 and two jobs, each job's time is capped at 1 and both GPUs are
    # needed, so any trade helps one job exactly as much as it hurts the other: the max-min
    # optimum is the equal share itself (t = 1, half the time on each model).
    res = max_min_fairness(np.array([T_FAST, T_FLAT]), np.ones(2), np.array([1.0, 1.0]))
    assert res.t == pytest.approx(1.0, rel=1e-6)
    assert res.X == pytest.approx(np.full((2, 2), 0.5), abs=1e-5)


def test_lp_efficiency_stage_uses_spare_gpus():
    # Two V100s and two K80s for two jobs: both can run on a V100 all the time. Stage one only
    # pins the flat job (t = 1.2 / 1.1); stage two must still give the fast job its V100.
    res = max_min_fairness(np.array([T_FAST, T_FLAT]), np.ones(2), np.array([2.0, 2.0]))
    assert res.t == pytest.approx(1.2 / 1.1, rel=1e-6)
    assert res.X == pytest.approx(np.array([[1.0, 0.0], [1.0, 0.0]]), abs=1e-6)


def test_lp_weights_and_gangs():
    # Identical jobs on one GPU, weights 2:1 -> time 2/3 : 1/3.
    res = max_min_fairness(np.array([[1.0], [1.0]]), np.ones(2), np.array([1.0]),
                           weights=np.array([2.0, 1.0]))
    assert res.X[:, 0] == pytest.approx([2 / 3, 1 / 3], abs=1e-6)
    # A 4-GPU gang cannot use a model with 2 GPUs at all.
    mask = feasible_mask(np.ones((2, 2)), np.array([4.0, 1.0]), np.array([8.0, 2.0]))
    assert mask.tolist() == [[True, False], [True, True]]


def test_lp_jobs_with_no_usable_model_do_not_block_the_rest():
    allowed = np.array([[False, False], [True, True]])
    res = max_min_fairness(np.array([T_FAST, T_FLAT]), np.ones(2), np.array([1.0, 1.0]),
                           allowed=allowed)
    assert res.X[0].sum() == 0 and res.rho[0] == 0
    assert res.X[1].sum() == pytest.approx(1.0, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 4), st.integers(0, 2**31 - 1), st.booleans())
def test_lp_respects_capacity_time_and_fairness(n, m, seed, restrict):
    rng = np.random.default_rng(seed)
    T = rng.uniform(0.05, 3.0, (n, m))
    scale = rng.choice([0.25, 0.5, 1, 2, 4, 8], n)
    cap = rng.integers(1, 16, m).astype(float)
    allowed = rng.random((n, m)) < 0.7 if restrict else None
    res = max_min_fairness(T, scale, cap, allowed=allowed)
    X = res.X
    assert (X >= -1e-9).all() and (X <= 1 + 1e-9).all()
    assert (X.sum(axis=1) <= 1 + 1e-6).all()
    assert ((X * scale[:, None]).sum(axis=0) <= cap + 1e-6).all()
    mask = feasible_mask(T, scale, cap, allowed)
    assert (X[~mask] == 0).all()
    live = mask.any(axis=1)
    assert (res.rho[live] >= res.t * (1 - 1e-5) - 1e-7).all()
    if mask.all():
        # Sharing incentive: when every job may use every model, the equal share is feasible,
        # so nobody does worse than under it.
        assert res.t >= 1 - 1e-6
    eq = equal_share_throughput(T, scale, cap, mask)
    assert (eq[live] > 0).all()


# -- the platform's own owner, stepped by hand ----------------------------------------------

def make_cluster(v100: int = 1, k80: int = 1, gpus: int = 1) -> Cluster:
    nodes = [Node(f"v{i}", 64_000, 256_000, "V100", gpus) for i in range(v100)]
    nodes += [Node(f"k{i}", 64_000, 256_000, "K80", gpus) for i in range(k80)]
    return Cluster(tuple(nodes))


class Driver:
    """The owner (`plinth.sched.owner`) and the simulated runtime, stepped at chosen times by
    the one driver (`plinth.sched.driver`): each step delivers the jobs submitted by then and
    runs one pass. The owner applies the decisions (and checks its invariants: validate)
    exactly as the simulator and the control plane do; this also counts the passes each job
    spent on each model."""

    def __init__(self, cluster: Cluster, jobs: list[Job], policy, cfg=CFG):
        self.cluster, self.policy = cluster, policy
        self.owner = o.Owner(cluster, policy, cfg, validate=True, on_pass=self._seen)
        self.clock = VirtualClock()
        byid = {j.id: j for j in jobs}
        self.runtime = SimRuntime(cluster, cfg.work_model(cluster), byid, clock=self.clock)
        self.driver = one.Driver(self.owner, self.runtime, clock=self.clock, grace_s=10.0,
                        launch_spec=lambda ins: LaunchSpec(ins.job_id, ins.attempt, (), (
                            worker_launches(cluster, ins.allocation, byid[ins.job_id].request)),
                            ""))
        self.arrivals = sorted(jobs, key=lambda j: j.submit_time)
        self.on: dict[tuple[int, str], int] = {}  # (job, model) -> passes spent running there
        self._last: Decisions | None = None

    @property
    def jobs(self) -> dict[int, JobState]:
        return self.owner.jobs

    @property
    def state(self) -> ClusterState:
        return self.owner.state

    def running(self) -> dict[int, JobState]:
        return dict(self.owner.running)

    def _seen(self, d: Decisions, now: float) -> None:
        if self._last is None:  # the step's own pass, not the owner's follow-up
            self._last = d
        assert d.wake_at is None or d.wake_at > now

    def step(self, now: float) -> Decisions:
        events = []
        while self.arrivals and self.arrivals[0].submit_time <= now:
            events.append(o.Submitted(self.arrivals.pop(0)))
        self._last = None
        self.owner.request_pass()
        self.clock.to(now)
        self.driver.turn(events, now)
        for js in self.owner.running.values():
            self.on[(js.id, js.model)] = self.on.get((js.id, js.model), 0) + 1
        assert self._last is not None
        return self._last

    def finish(self, jid: int, now: float) -> None:
        """Job `jid` ends on its own (exit code 0)."""
        js = self.owner.jobs[jid]
        self.runtime.procs.pop(jid)
        self.owner.handle([o.Exited(jid, js.attempt, 0)], now, schedule=False)


def job(jid: int, jtype: str, gpus: int = 1, submit: float = 0.0, **kw) -> Job:
    return Job(jid, submit, 1e9, Request(gpus=gpus), job_type=jtype, **kw)


# -- the policy ----------------------------------------------------------------------------

def test_rounds_follow_the_allocation_over_time():
    # resnet50 is 9x faster on a V100 than on a K80, a3c only 1.7x.
    jobs = [job(0, "resnet50"), job(1, "resnet50"), job(2, "a3c"), job(3, "a3c")]
    pol = Gavel()
    owner = Driver(make_cluster(), jobs, pol)
    rounds = 300
    for r in range(rounds):
        owner.step(r * ROUND)
    X = {j.id: pol.allocation(j.id) for j in jobs}
    assert pol.fairness > 1.0  # better than the equal share for everybody
    for j in jobs:
        got = np.array([owner.on.get((j.id, m), 0) for m in ("V100", "K80")]) / rounds
        assert got == pytest.approx(X[j.id], abs=0.03), j.id
    assert X[0][1] < 1e-4 and X[1][1] < 1e-4  # resnet50 never on the K80
    on_k80 = sum(owner.on.get((j, "K80"), 0) for j in (2, 3))
    assert on_k80 / rounds == pytest.approx(1.0, abs=0.02)  # the K80 goes to a3c


def test_swaps_are_ordered_so_the_owner_never_over_commits():
    # Two jobs, one 8-GPU node of each model, each job 8 GPUs: every round they swap models,
    # a cycle that no order of resizes can apply; one side must be preempted and restarted.
    cluster = make_cluster(gpus=8)
    pol = Gavel()
    owner = Driver(cluster, [job(0, "resnet50", 8), job(1, "resnet50", 8)], pol)
    d = owner.step(0.0)
    assert [(s.job_id, s.model) for s in d.starts] == [(0, "V100"), (1, "K80")]
    restarts = 0
    for r in range(1, 12):
        d = owner.step(r * ROUND)
        restarted = {p.job_id for p in d.preempts} & {s.job_id for s in d.starts}
        assert len(restarted) == len(d.resizes) <= 1  # one restarts, the other moves
        restarts += len(restarted)
        assert {owner.jobs[0].model, owner.jobs[1].model} == {"V100", "K80"}
    assert restarts >= 4
    assert pol.allocation(0) == pytest.approx([0.5, 0.5], abs=1e-5)
    assert pol.received_share(0) == pytest.approx([0.5, 0.5], abs=0.1)


def test_only_a_move_on_a_cycle_is_restarted():
    # B and C swap GPUs (a cycle); A waits for one of B's GPUs (behind the cycle, not on it).
    cluster = make_cluster(v100=1, k80=0, gpus=8)
    state = ClusterState(cluster)
    req = {0: Request(gpus=1), 1: Request(gpus=2), 2: Request(gpus=2)}
    old = {0: (0,), 1: (1, 2), 2: (3, 4)}
    new = {0: (2,), 1: (3, 4), 2: (1, 5)}
    moves, jobs = [], {}
    for jid in (0, 1, 2):
        js = JobState(Job(jid, 0.0, 1e9, req[jid]), status=State.RUNNING,
                      allocation=Allocation((WorkerSlot(0, old[jid]),)))
        state.allocate(js.allocation, req[jid])
        jobs[jid] = js
        moves.append((js, Allocation((WorkerSlot(0, new[jid]),)), 0))
    pol = Gavel()
    pol._reset(cluster.models)
    pol._X = {j: np.array([1.0]) for j in jobs}
    d = Decisions()
    pol._order_moves(cluster, moves, d)
    assert [p.job_id for p in d.preempts] == [1] and [s.job_id for s in d.starts] == [1]
    assert sorted(r.job_id for r in d.resizes) == [0, 2]
    apply_decisions(Snapshot(cluster, state, [], jobs), d)  # the owner applies the swap


def test_decisions_never_over_commit_under_churn():
    rng = random.Random(7)
    cluster = Cluster(tuple(
        [Node(f"v{i}", 64_000, 512_000, "V100", 4, rack=f"r{i % 2}") for i in range(4)]
        + [Node(f"p{i}", 64_000, 512_000, "P100", 8) for i in range(2)]
        + [Node(f"k{i}", 64_000, 512_000, "K80", 8) for i in range(2)]))
    types = ["resnet50", "a3c", "lm", "transformer", "recommendation"]
    jobs = []
    for i in range(60):
        kind = rng.random()
        req = (Request(gpu_milli=rng.choice([250, 500]), gpu_memory_mib=2048) if kind < 0.2
               else Request(gpus=rng.choice([1, 2, 4]), workers=rng.choice([1, 1, 2])))
        jobs.append(Job(i, rng.uniform(0, 20 * ROUND), 1e9, req, job_type=rng.choice(types),
                        preemptible=rng.random() > 0.1))
    pol = Gavel(max_jobs=30)
    owner = Driver(cluster, jobs, pol)
    now = 0.0
    for _ in range(120):
        d = owner.step(now)
        for s in d.starts:
            assert s.model == cluster.nodes[s.allocation.slots[0].node].gpu_model
        # Finish a running job now and then, and wake at arrivals as well as at round ends.
        run = sorted(owner.running())
        if run and rng.random() < 0.3:
            owner.finish(rng.choice(run), now)
        now = min(d.wake_at or now + ROUND, now + rng.uniform(1, ROUND))


def test_mid_round_passes_only_fill_free_gpus():
    pol = Gavel()
    owner = Driver(make_cluster(v100=1, k80=1), [job(0, "a3c"), job(1, "a3c"),
                                               job(2, "a3c", submit=10.0)], pol)
    d = owner.step(0.0)
    assert len(d.starts) == 2 and d.wake_at == ROUND
    d = owner.step(10.0)  # a new job mid-round, cluster full: nobody moves
    assert not d and d.wake_at == ROUND
    assert "waiting for a lease" in d.waiting[2]
    d = owner.step(ROUND)  # the round ends: the newcomer has priority (never run)
    assert 2 in {s.job_id for s in d.starts} and len(d.preempts) == 1


def test_non_preemptible_jobs_hold_their_gpus():
    pol = Gavel()
    jobs = [job(0, "a3c", preemptible=False), job(1, "a3c", submit=1.0),
            job(2, "a3c", submit=1.0)]
    owner = Driver(make_cluster(v100=1, k80=1), jobs, pol)
    owner.step(0.0)
    for r in range(1, 10):
        owner.step(r * ROUND)  # the owner refuses to preempt or move it
    assert owner.on[(0, owner.jobs[0].model)] == 10
    assert sum(owner.on.get((j, m), 0) for j in (1, 2) for m in ("V100", "K80")) == 9


def test_lease_end_checkpoints_instead_of_losing_work():
    # One GPU, a job that ran a round without reaching a periodic checkpoint, and a newcomer
    # that has never run (infinite priority): the lease moves, and the job checkpoints as its
    # lease ends, so rotation loses no work.
    cfg = SchedConfig(checkpoint_interval=600.0)
    owner = Driver(make_cluster(v100=1, k80=0), [job(0, "a3c"), job(1, "a3c", submit=1.0)],
                  Gavel(), cfg)
    owner.step(0.0)
    owner.jobs[0].progress = ROUND  # unsaved: nothing checkpointed yet
    d = owner.step(ROUND)
    assert [(p.job_id, p.checkpoint) for p in d.preempts] == [(0, True)]
    assert [s.job_id for s in d.starts] == [1]


def test_active_window_and_lp_resolved_only_on_change(monkeypatch):
    calls = []
    real = lp.max_min_fairness

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr("plinth.sched.policies.gavel.max_min_fairness", counting)
    pol = Gavel(max_jobs=2)
    owner = Driver(make_cluster(), [job(0, "a3c"), job(1, "lm"), job(2, "lm", submit=1.0)], pol)
    d = owner.step(0.0)
    owner.step(ROUND)
    assert len(calls) == 1  # same active set: no new solve
    d = owner.step(2 * ROUND)
    assert d.waiting[2] == "outside Gavel's active window (the 2 oldest jobs)"
    assert len(calls) == 1
    owner.finish(0, 2 * ROUND + 5)
    d = owner.step(2 * ROUND + 5)  # mid-round: the newcomer fills the free GPU, no solve yet
    assert len(calls) == 1 and 2 in {s.job_id for s in d.starts}
    owner.step(3 * ROUND)
    assert len(calls) == 2
    owner.step(4 * ROUND)
    assert len(calls) == 2


def test_through_the_simulator_gavel_beats_fifo_on_a_heterogeneous_cluster():
    """Moving jobs to the GPU model they gain most on finishes the workload sooner and leaves
    no job as far behind its fair share. Three generated traces, so no lucky seed decides."""
    c = load_cluster("2x4xV100,2x4xP100,2x4xK80")
    for seed in (1, 2, 3):
        jobs = synthetic_jobs(150, seed=seed, load=1.5, cluster_gpus=8, heavy_tail=False)
        fifo = summarize(simulate(jobs, c, make_policy("fifo")))
        gavel = summarize(simulate(jobs, c, Gavel(), validate=True))
        assert gavel["completed"] == 150
        assert gavel["makespan_s"] < fifo["makespan_s"]
        assert gavel["ftf_rho_max"] < fifo["ftf_rho_max"]


def test_registry_builds_gavel():
    assert isinstance(make_policy("gavel", max_jobs=10), Gavel)
    with pytest.raises(SpecError, match="gavel.max_jobs"):
        Gavel(max_jobs=0)


# -- the LP over classes, its closed form for one model, and the solver paths -----------------

def _lp_case(seed: int, n: int, m: int):
    rng = np.random.default_rng(seed)
    kinds = rng.uniform(0.05, 3.0, (max(1, n // 3), m))
    T = kinds[rng.integers(len(kinds), size=n)]
    scale = rng.choice([0.5, 1, 2, 4], n)
    cap = rng.integers(1, 12, m).astype(float)
    return T, scale, cap


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 30), st.integers(1, 3))
def test_lp_over_classes_has_the_optimum_of_the_lp_over_jobs(seed, n, m):
    # Identical jobs are solved once, counted; the same LP with one row per job (no grouping:
    # counts of one) must reach the same fairness and the same total normalised throughput.
    T, scale, cap = _lp_case(seed, n, m)
    grouped = max_min_fairness(T, scale, cap)
    mask = feasible_mask(T, scale, cap)
    flat = lp._max_min_classes(T, scale, cap, np.ones(n), mask, np.ones(n), True)
    assert grouped.t == pytest.approx(flat.t, rel=1e-6, abs=1e-9)
    assert grouped.rho.sum() == pytest.approx(flat.rho.sum(), rel=1e-5, abs=1e-7)
    # Members of a class get the class's allocation.
    key = np.column_stack([T, scale])
    for row in np.unique(key, axis=0):
        same = (key == row).all(axis=1)
        assert np.ptp(grouped.X[same], axis=0) == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30))
def test_lp_closed_form_for_one_model_matches_the_solver(seed, n):
    T, scale, cap = _lp_case(seed, n, 1)
    counts = np.random.default_rng(seed).integers(1, 5, n).astype(float)
    closed = max_min_fairness(T, scale, cap, counts=counts)
    # A second model with no GPUs sends the same problem through HiGHS.
    T2, cap2 = np.column_stack([T, np.ones(n)]), np.append(cap, 0.0)
    solver = max_min_fairness(T2, scale, cap2, counts=counts)
    assert (solver.X[:, 1] == 0).all()
    assert closed.t == pytest.approx(solver.t, rel=1e-6, abs=1e-9)
    assert (closed.rho * counts).sum() == pytest.approx((solver.rho * counts).sum(), rel=1e-5,
                                                        abs=1e-7)
    assert (closed.X[:, 0] * scale * counts).sum() <= cap[0] + 1e-6
    assert (closed.X >= 0).all() and (closed.X <= 1 + 1e-9).all()


@pytest.mark.parametrize("seed, n, m", [(11, 40, 3), (14, 13, 3), (35, 5, 2), (18, 30, 2)])
def test_lp_direct_highs_and_linprog_agree(monkeypatch, seed, n, m):
    # The last three once ended stage 2's restart from stage 1's basis as "unknown".
    T, scale, cap = _lp_case(seed, n, m)
    direct = max_min_fairness(T, scale, cap)
    monkeypatch.setattr(lp, "_highs", None)  # scipy's linprog, as without the bindings
    slow = max_min_fairness(T, scale, cap)
    assert direct.t == pytest.approx(slow.t, rel=1e-6)
    assert direct.rho.sum() == pytest.approx(slow.rho.sum(), rel=1e-5)


# -- the throughput matrix comes from the config; rounds can be turned off -------------------

def test_allocation_follows_the_configured_matrix():
    from plinth.core.throughput import Throughputs

    jobs = [job(0, "A"), job(1, "B")]
    for fast, slow in (("A", "B"), ("B", "A")):
        # `fast` is 10x quicker on the V100, `slow` the same on both models.
        thr = Throughputs.from_table({fast: {"V100": 1.0, "K80": 0.1},
                                      slow: {"V100": 1.0, "K80": 1.0}})
        pol = Gavel()
        owner = Driver(make_cluster(v100=1, k80=1), jobs, pol, SchedConfig(throughputs=thr))
        owner.step(0.0)
        x = {t: pol.allocation(j.id) for t, j in zip("AB", jobs)}
        assert x[fast][0] > 0.99 and x[slow][1] > 0.99, x  # each on the model it gains most


def test_rounds_off_reallocates_at_every_event():
    jobs = [job(0, "a3c"), job(1, "a3c", submit=10.0)]
    for round_s, expect_preempt in ((360.0, False), (0.0, True)):
        owner = Driver(make_cluster(v100=1, k80=0), jobs, Gavel(), SchedConfig(round_s=round_s))
        d = owner.step(0.0)
        assert [s.job_id for s in d.starts] == [0]
        assert d.wake_at == (round_s or None)
        d = owner.step(10.0)  # the newcomer has never run: it has the higher priority
        assert bool(d.preempts) is expect_preempt
        if expect_preempt:
            assert [s.job_id for s in d.starts] == [1] and d.wake_at is None
