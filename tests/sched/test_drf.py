"""Multi-tenant fair share (Kueue-style quotas ordered by DRF) on small hand-checked scenarios."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.resources import Cluster, Node, Request, TenantQuota
from plinth.core.workload import Job
from plinth.sched.placement import place
from plinth.sched.policies import make_policy
from plinth.sched.policies.drf import FairShare
from plinth.sched.quota import tenant_queues
from plinth.sched.state import ClusterState
from plinth.core.lifecycle import State
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot

NOW = 10_000.0
_ids = itertools.count(1)


def make_cluster(nodes: int = 2, gpus: int = 8, cpus: int = 64_000,
                 tenants: tuple[TenantQuota, ...] = ()) -> Cluster:
    return Cluster(tuple(Node(f"n{i}", cpus, 512_000, "V100", gpus) for i in range(nodes)),
                   tenants=tenants)


def job(tenant: str, gpus: int = 1, cpus: int = 1000, submit: float | None = None,
        priority: int = 0, duration: float = 3600.0) -> Job:
    i = next(_ids)
    return Job(i, float(i) if submit is None else submit, duration,
               Request(gpus=gpus, cpus_milli=cpus, memory_mib=1000), tenant=tenant,
               priority=priority)


def snapshot(cluster: Cluster, policy: FairShare, pending: list[Job],
             running: list[tuple[Job, float]] = (), cfg: SchedConfig | None = None) -> Snapshot:
    """`running` holds (job, start time) pairs; they are placed in the order given. Running
    jobs have made no progress yet, so each is expected to end its duration from now."""
    state = ClusterState(cluster)
    run = {}
    for j, started in running:
        alloc = place(state, j.request)
        assert alloc is not None, "scenario does not fit"
        state.allocate(alloc, j.request)
        run[j.id] = JobState(j, State.RUNNING, alloc, start_time=started,
                             first_start=started, rate=1.0)
    queue = sorted((JobState(j) for j in pending), key=policy.order)
    return Snapshot(cluster, state, queue, run, cfg or SchedConfig())


def apply(snap: Snapshot, d: Decisions) -> Counter:
    """Apply the decisions to a copy as the owner would (preempts first, then starts), check
    that nothing is over-committed, and return the GPUs each tenant then holds."""
    jobs = {js.id: js.job for js in snap.pending} | {i: js.job for i, js in snap.running.items()}
    work = snap.state.copy()
    held = Counter()
    for js in snap.running.values():
        held[js.job.tenant] += js.job.request.num_gpus
    for p in d.preempts:
        js = snap.running[p.job_id]
        work.release(js.allocation, js.job.request)
        held[js.job.tenant] -= js.job.request.num_gpus
    for s in d.starts:
        work.allocate(s.allocation, jobs[s.job_id].request)
        held[jobs[s.job_id].tenant] += jobs[s.job_id].request.num_gpus
    work.check()
    assert not {s.job_id for s in d.starts} & {p.job_id for p in d.preempts}
    return held


def quotas(**nominal: float) -> tuple[TenantQuota, ...]:
    return tuple(TenantQuota(name, g) for name, g in nominal.items())


# -- fairness --------------------------------------------------------------------------------

@pytest.mark.parametrize("configured", [True, False], ids=["quotas", "derived"])
def test_equal_quotas_get_equal_gpus_under_contention(configured: bool) -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8) if configured else ())
    pol = FairShare()
    # a submitted all its jobs first: FIFO would give it the whole cluster.
    pending = [job("a") for _ in range(20)] + [job("b") for _ in range(20)]
    snap = snapshot(cluster, pol, pending)
    d = pol.schedule(snap, NOW)
    assert apply(snap, d) == {"a": 8, "b": 8}
    assert not d.preempts
    waiting = [why for why in d.waiting.values()]
    assert waiting and all(w.startswith("Quota: ") for w in waiting)
    assert "a uses 8/8 nominal GPUs and cannot borrow 1 more (cohort default has 0 idle)" \
        in d.waiting[snap.pending[8].id]


def test_idle_tenant_quota_is_lent() -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("a") for _ in range(20)])
    d = pol.schedule(snap, NOW)
    assert apply(snap, d) == {"a": 16}
    reasons = [s.reason for s in d.starts]
    assert sum(r.startswith("Admitted: a within nominal quota") for r in reasons) == 8
    assert sum(r.startswith("Admitted (borrowing): a borrowing") for r in reasons) == 8
    assert "a borrowing 8 GPUs from cohort default (16/8 nominal with this job)" in reasons[-1]


def test_idle_tenant_submits_and_reclaims_its_quota() -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(16)]  # a borrows all of b's quota
    snap = snapshot(cluster, pol, [job("b") for _ in range(12)], running)
    d = pol.schedule(snap, NOW)
    held = apply(snap, d)
    # b gets exactly its nominal quota back; a keeps its own and is never pushed below it.
    assert held == {"a": 8, "b": 8}
    assert len(d.preempts) == 8
    # Each reason states a's borrowing at the moment of that preemption.
    assert d.preempts[0].reason == "Reclaimed by b: a was borrowing 8 GPUs (16/8 nominal)"
    assert d.preempts[-1].reason == "Reclaimed by b: a was borrowing 1 GPUs (9/8 nominal)"
    assert all("b reclaimed its nominal quota from a" in s.reason for s in d.starts)
    # b's jobs beyond its nominal quota wait for quota; the first holds it for when a's
    # jobs are expected to end, so that b's later jobs cannot take it first.
    why = [d.waiting[js.id] for js in snap.pending[8:]]
    assert why[0] == ("Quota: b uses 8/8 nominal GPUs and cannot borrow 1 more (cohort default "
                      "has 0 idle); first in line for b's quota, expected from "
                      f"t={NOW + 3600:.0f}s")
    assert why[1:] == ["Quota: b uses 8/8 nominal GPUs and cannot borrow 1 more "
                       "(cohort default has 0 idle)"] * 3


def test_reclaim_prefers_victims_with_least_unsaved_work() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(8)]
    snap = snapshot(cluster, pol, [job("b")], running)
    ids = sorted(snap.running)
    for i, jid in enumerate(ids):  # every job but one saved a checkpoint a while ago
        snap.running[jid].checkpointed = snap.running[jid].progress - (100 + i)
    snap.running[ids[5]].checkpointed = snap.running[ids[5]].progress - 1
    d = pol.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [ids[5]]
    apply(snap, d)


def test_never_preempts_a_tenant_within_its_quota() -> None:
    # c holds its 8 nominal GPUs and a borrows 4; b (nominal 4) only reclaims from a.
    cluster = make_cluster(nodes=2, tenants=quotas(a=4, b=4, c=8))
    pol = FairShare()
    running = [(job("c"), 0.0) for _ in range(8)] + [(job("a"), 0.0) for _ in range(8)]
    snap = snapshot(cluster, pol, [job("b") for _ in range(6)], running)
    d = pol.schedule(snap, NOW)
    assert {snap.running[p.job_id].job.tenant for p in d.preempts} == {"a"}
    assert apply(snap, d) == {"a": 4, "b": 4, "c": 8}


def test_reclaim_takes_from_the_most_over_quota_tenant_first() -> None:
    cluster = make_cluster(nodes=2, tenants=quotas(a=4, b=4, c=8))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(10)] + [(job("b"), 0.0) for _ in range(6)]
    snap = snapshot(cluster, pol, [job("c") for _ in range(6)], running)
    d = pol.schedule(snap, NOW)
    # a borrows 6 and b 2: a gives until both borrow the same, then they alternate.
    assert apply(snap, d) == {"a": 5, "b": 5, "c": 6}


def test_borrowing_limit_is_honoured() -> None:
    cluster = make_cluster(tenants=(TenantQuota("a", 8, borrowing_limit=4), TenantQuota("b", 8)))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("a") for _ in range(20)])
    d = pol.schedule(snap, NOW)
    assert apply(snap, d) == {"a": 12}
    assert d.waiting[snap.pending[12].id].startswith(
        "Quota: a uses 12/8 nominal GPUs; this job (1 GPUs) would borrow 5, "
        "over its borrowing limit of 4")


def test_job_larger_than_any_quota_says_it_can_never_run() -> None:
    cluster = make_cluster(tenants=(TenantQuota("a", 4, borrowing_limit=2), TenantQuota("b", 12)))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("a", gpus=8)])
    d = pol.schedule(snap, NOW)
    assert not d.starts
    why = d.waiting[snap.pending[0].id]
    assert "more than a can ever hold (4 nominal + 2 it may borrow)" in why


def test_drf_picks_lowest_dominant_share_including_cpu() -> None:
    # a holds 1 GPU but 48 of 64 CPUs (dominant share 0.75); b holds 3 GPUs (0.375).
    # 12 CPUs are free: only one of the two 10-CPU jobs fits, and DRF gives it to b.
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare()
    running = [(job("a", gpus=1, cpus=48_000), 0.0), (job("b", gpus=3, cpus=4000), 0.0)]
    ja, jb = job("a", cpus=10_000), job("b", cpus=10_000)
    snap = snapshot(cluster, pol, [ja, jb], running)
    d = pol.schedule(snap, NOW)
    assert [s.job_id for s in d.starts] == [jb.id]
    assert d.waiting[ja.id].startswith("Resources: 1 GPUs not free; a is within nominal quota "
                                       "(2/4 GPUs with this job); no other tenant in cohort "
                                       "default is borrowing")
    apply(snap, d)


def test_a_job_without_gpus_waits_for_cpus_not_for_0_gpus() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare()
    cpu_only = job("b", gpus=0, cpus=20_000)
    snap = snapshot(cluster, pol, [cpu_only], [(job("a", gpus=1, cpus=60_000), 0.0)])
    d = pol.schedule(snap, NOW)
    assert d.starts == [] and d.waiting[cpu_only.id].startswith(
        "Resources: 20 CPUs and 0.977 GiB of memory not free; b is within nominal quota")


def test_weights_split_borrowed_quota() -> None:
    # c is idle; a (weight 2) and b (weight 1) share c's 4 GPUs by weighted dominant share.
    cluster = make_cluster(nodes=3, gpus=4, tenants=(
        TenantQuota("a", 4, weight=2.0), TenantQuota("b", 4), TenantQuota("c", 4)))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("a") for _ in range(12)] + [job("b") for _ in range(12)])
    d = pol.schedule(snap, NOW)
    assert apply(snap, d) == {"a": 8, "b": 4}


def test_within_nominal_goes_before_a_lower_share_borrower() -> None:
    # b has the lower dominant share but would borrow; a's job is within its nominal quota.
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare()
    running = [(job("a", gpus=3, cpus=40_000), 0.0), (job("b", gpus=4), 0.0)]
    ja, jb = job("a"), job("b")
    d = pol.schedule(snapshot(cluster, pol, [jb, ja], running), NOW)
    assert [s.job_id for s in d.starts] == [ja.id]
    assert d.waiting[jb.id].startswith("Quota: b uses 4/4 nominal GPUs and cannot borrow 1 more")


# -- preemption guards -----------------------------------------------------------------------

def test_reclaim_honours_min_runtime() -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8))
    pol = FairShare()
    cfg = SchedConfig(min_runtime=300.0)
    running = [(job("a"), NOW - 100.0) for _ in range(16)]
    snap = snapshot(cluster, pol, [job("b") for _ in range(4)], running, cfg)
    d = pol.schedule(snap, NOW)
    assert not d.starts and not d.preempts
    assert d.wake_at == NOW + 200.0  # call again when a's jobs may be preempted
    why = d.waiting[snap.pending[0].id]
    assert "b is within nominal quota (1/8 GPUs with this job)" in why
    assert f"reclaim from a waits for their jobs' minimum runtime (until t={NOW + 200:.0f}s)" in why
    # Once the minimum runtime has passed, the same snapshot reclaims.
    d = pol.schedule(snap, NOW + 200.0)
    assert len(d.preempts) == 4 and len(d.starts) == 4
    apply(snap, d)


def test_non_preemptible_jobs_are_not_reclaimed() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(8)]
    snap = snapshot(cluster, pol, [job("b")], running)
    for js in snap.running.values():
        js.job.preemptible = False
    d = pol.schedule(snap, NOW)
    assert not d.preempts and not d.starts and d.wake_at is None
    assert "would not make room" in d.waiting[snap.pending[0].id]


def test_borrowing_job_never_preempts() -> None:
    # Quotas add up to more than the cluster: b lends quota that has no free GPU behind it.
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=8))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(4)] + [(job("b"), 0.0) for _ in range(4)]
    snap = snapshot(cluster, pol, [job("a")], running)
    d = pol.schedule(snap, NOW)
    assert not d.preempts and not d.starts
    assert "a borrowing job never preempts" in d.waiting[snap.pending[0].id]


def test_reclaim_counts_gpus_that_are_already_free() -> None:
    # 2 GPUs are free and a borrows 2: b's 4-GPU job needs both the free GPUs and a's.
    cluster = make_cluster(nodes=1, tenants=quotas(a=2, b=6))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("b", gpus=4)], [(job("a"), 0.0) for _ in range(4)]
                    + [(job("b"), 0.0) for _ in range(2)])
    d = pol.schedule(snap, NOW)
    assert len(d.preempts) == 2 and len(d.starts) == 1
    assert apply(snap, d) == {"a": 2, "b": 6}


def test_preemption_within_tenant_by_priority() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    running = [(job("a", priority=0), 0.0) for _ in range(4)] + \
        [(job("b", priority=0), 0.0) for _ in range(4)]
    urgent = job("a", gpus=2, priority=5)
    off = FairShare()
    d = off.schedule(snapshot(cluster, off, [urgent], running), NOW)
    assert not d.preempts and not d.starts
    on = FairShare(preempt_within_tenant=True)
    snap = snapshot(cluster, on, [urgent], running)
    d = on.schedule(snap, NOW)
    assert {snap.running[p.job_id].job.tenant for p in d.preempts} == {"a"}
    assert len(d.preempts) == 2 and [s.job_id for s in d.starts] == [urgent.id]
    assert d.preempts[0].reason == f"Preempted by job {urgent.id} of a: priority 5 over 0"
    assert apply(snap, d) == {"a": 4, "b": 4}


# -- invariants ------------------------------------------------------------------------------

_tenants = st.sampled_from("abc")
_jobs = st.tuples(_tenants, st.sampled_from([1, 1, 2, 4, 8]), st.sampled_from([600.0, 7200.0]))


@settings(max_examples=60, deadline=None)
@given(running=st.lists(st.tuples(_jobs, st.sampled_from([0.0, NOW - 60])), max_size=12),
       pending=st.lists(_jobs, max_size=30),
       nominal=st.tuples(*[st.sampled_from([0, 4, 8, 12])] * 3),
       limit=st.sampled_from([None, 0, 4]))
def test_decisions_keep_the_invariants(running, pending, nominal, limit) -> None:
    quotas_ = tuple(TenantQuota(n, g, borrowing_limit=limit) for n, g in zip("abc", nominal))
    cluster = make_cluster(nodes=3, tenants=quotas_)
    pol = FairShare()
    state = ClusterState(cluster)
    fits = []  # keep only the running jobs that fit, as the owner would have
    for (t, g, dur), started in running:
        j = job(t, gpus=g, duration=dur)
        if place(state, j.request) is not None:
            state.allocate(place(state, j.request), j.request)
            fits.append((j, started))
    snap = snapshot(cluster, pol, [job(t, gpus=g, duration=dur) for t, g, dur in pending], fits)
    before = apply(snap, Decisions())
    d = pol.schedule(snap, NOW)
    after = apply(snap, d)  # nothing over-committed
    nominal_of = {q.name: q.nominal_gpus for q in quotas_}
    for p in d.preempts:  # only borrowers lose jobs, only to reclaim, only past min runtime
        victim = snap.running[p.job_id]
        assert before[victim.job.tenant] > nominal_of[victim.job.tenant]
        assert p.reason.startswith("Reclaimed by ")
        assert NOW - victim.start_time >= snap.config.min_runtime
    # Each start keeps its tenant within nominal, or borrows within its limit and within
    # the cohort's quota (checked in order, with the victims' GPUs already given back).
    usage = before.copy()
    for p in d.preempts:
        usage[snap.running[p.job_id].job.tenant] -= snap.running[p.job_id].job.request.num_gpus
    by_id = {js.id: js.job for js in snap.pending}
    for s in d.starts:
        t, g = by_id[s.job_id].tenant, by_id[s.job_id].request.num_gpus
        if usage[t] + g > nominal_of[t]:
            assert limit is None or usage[t] + g - nominal_of[t] <= limit
            assert sum(usage.values()) + g <= sum(nominal)
        usage[t] += g
    assert usage == after
    examined = {s.job_id for s in d.starts} | set(d.waiting)
    assert examined == {js.id for js in snap.pending}  # small queue: every job gets a reason


# -- tenants and the queue -------------------------------------------------------------------

def test_unknown_tenant_only_borrows() -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8))
    pol = FairShare()
    running = [(job("a"), 0.0) for _ in range(4)]
    snap = snapshot(cluster, pol, [job("x") for _ in range(20)], running)
    d = pol.schedule(snap, NOW)
    assert apply(snap, d) == {"a": 4, "x": 12}  # everything a and b leave idle, no more
    assert all(s.reason.startswith("Admitted (borrowing): x borrowing") for s in d.starts)
    assert "Quota: x uses 12/0 nominal GPUs and cannot borrow 1 more" in d.waiting[
        snap.pending[12].id]


def test_derived_quotas_grow_with_new_tenants() -> None:
    cluster = make_cluster()
    pol = make_policy("drf")
    assert isinstance(pol, FairShare)
    pol.schedule(snapshot(cluster, pol, [job("a")]), NOW)
    assert [(q.name, q.nominal_gpus) for q in pol.quotas_for(cluster, set())] == [("a", 16)]
    pol.schedule(snapshot(cluster, pol, [job("b")]), NOW)
    assert [(q.name, q.nominal_gpus) for q in pol.quotas_for(cluster, set())] == \
        [("a", 8), ("b", 8)]


def test_tenant_queues_are_views_of_the_grouped_queue() -> None:
    pol = FairShare()
    snap = snapshot(make_cluster(), pol, [job(t) for t in "abcab" * 10])
    queues = tenant_queues(snap.pending)
    by_tenant = {t: [js for js in snap.pending if js.job.tenant == t] for t in "abc"}
    assert {t: list(q) for t, q in queues.items()} == by_tenant
    # A queue that is not grouped by tenant is still split correctly, by a full scan.
    ungrouped = sorted(snap.pending, key=lambda js: js.id)
    assert {t: list(q) for t, q in tenant_queues(ungrouped).items()} == by_tenant


def test_waiting_jobs_examined_per_tenant_are_bounded() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    pol = FairShare(depth=3)
    # a's jobs differ (by priority), so each waiting one costs a quota check: 3 are examined.
    # b's are alike, so after the first, each costs a look-up: backfill_depth are examined.
    snap = snapshot(cluster, pol, [job("a", gpus=2, priority=-k) for k in range(10)]
                    + [job("b", gpus=8) for _ in range(10)], cfg=SchedConfig(backfill_depth=5))
    d = pol.schedule(snap, NOW)
    # a starts 2 jobs within quota and borrows b's idle 4 GPUs for 2 more; b's 8-GPU jobs
    # would borrow the 4 that a now uses.
    assert len(d.starts) == 4
    tenant = {js.id: js.job.tenant for js in snap.pending}
    assert Counter(tenant[j] for j in d.waiting) == {"a": 3, "b": 5}
    b_waits = [why for j, why in d.waiting.items() if tenant[j] == "b"]
    assert b_waits[0].endswith(f"first in line for b's quota, expected from t={NOW + 3600:.0f}s")
    assert len(set(b_waits[1:])) == 1


def test_quota_hold_keeps_small_jobs_from_starving_a_big_one() -> None:
    # a's 8-GPU job needs quota that a 4-GPU job holds until t=NOW+7200. A 1-GPU job that ends
    # before then may go ahead; one that would still run then would delay the big job.
    cluster = make_cluster(nodes=1, tenants=quotas(a=8))
    running = [(job("a", gpus=4, duration=7200), 0.0)]
    big = job("a", gpus=8)
    short, long = job("a", duration=3600), job("a", duration=9000)
    pol = FairShare()
    d = pol.schedule(snapshot(cluster, pol, [big, short, long], running), NOW)
    assert [s.job_id for s in d.starts] == [short.id]
    assert d.waiting[big.id].endswith(f"first in line for a's quota, expected from "
                                      f"t={NOW + 7200:.0f}s")
    assert d.waiting[long.id] == (f"Quota: would delay job {big.id} of a, first in line for "
                                  f"its quota")
    off = FairShare(reserve=False)  # best effort: the big job may wait for ever
    d = off.schedule(snapshot(cluster, off, [big, short, long], running), NOW)
    assert [s.job_id for s in d.starts] == [short.id, long.id]


def test_a_job_behind_a_quota_hold_keeps_its_reason_as_the_hold_moves() -> None:
    # The held job's own reason says when; the jobs that would delay it say whom they wait
    # for, so their reason stands from pass to pass and the owner is not given it again.
    cluster = make_cluster(nodes=1, tenants=quotas(a=8))
    running = [(job("a", gpus=4, duration=7200), 0.0)]
    big, long = job("a", gpus=8), job("a", duration=9000)
    pol = FairShare()
    snap = snapshot(cluster, pol, [big, long], running)
    d = pol.schedule(snap, NOW)
    for js in snap.pending:  # as the owner applies a pass
        js.reason = d.waiting.get(js.id, js.reason)
    later = pol.schedule(snap, NOW + 60)  # the running job is expected to end 60 s later
    assert later.waiting[big.id].endswith(f"expected from t={NOW + 60 + 7200:.0f}s")
    assert long.id not in later.waiting
    assert next(js for js in snap.pending if js.job is long).reason == d.waiting[long.id]


def test_gpu_reservation_for_the_first_job_waiting_for_room() -> None:
    # Quota allows the 8-GPU job, but no node has 8 free GPUs until n0's 6-GPU job ends at
    # t=NOW+7200. Of n0's 2 free GPUs, one 1-GPU job may use one only if it ends by then.
    cluster = make_cluster(nodes=2, tenants=quotas(a=32))
    running = [(job("a", gpus=6, duration=7200), 0.0), (job("a", gpus=8, duration=9000), 0.0)]
    big = job("a", gpus=8)
    short, long = job("a", duration=3600), job("a", duration=9000)
    pol = FairShare()
    snap = snapshot(cluster, pol, [big, short, long], running)
    d = pol.schedule(snap, NOW)
    assert [s.job_id for s in d.starts] == [short.id]
    assert d.waiting[big.id].endswith(f"first in line, GPUs reserved from t={NOW + 7200:.0f}s")
    assert d.waiting[long.id] == (f"Resources: would delay job {big.id}, which has GPUs "
                                  f"reserved")
    apply(snap, d)


def test_strict_fifo_blocks_behind_the_head() -> None:
    cluster = make_cluster(nodes=1, tenants=quotas(a=8))
    pol = FairShare(strict_fifo=True)
    running = [(job("a", gpus=4, duration=7200), 0.0)]
    big, small = job("a", gpus=8), job("a", gpus=1)
    d = pol.schedule(snapshot(cluster, pol, [big, small], running), NOW)
    assert not d.starts and d.waiting[small.id] == f"Queue: behind job {big.id} of a (strict FIFO)"


def test_snapshot_is_left_unchanged() -> None:
    cluster = make_cluster(tenants=quotas(a=8, b=8))
    pol = FairShare()
    snap = snapshot(cluster, pol, [job("b") for _ in range(4)],
                    [(job("a"), 0.0) for _ in range(16)])
    before = snap.state.gpu_free_milli.copy()
    pol.schedule(snap, NOW)
    assert (snap.state.gpu_free_milli == before).all()


def test_big_queue_pass_completes() -> None:
    """20k pending jobs from 5 tenants on 512 GPUs, half of them busy."""
    names = [f"team-{i}" for i in range(5)]
    cluster = make_cluster(nodes=64, tenants=tuple(TenantQuota(n, 512 / 5) for n in names))
    pol = FairShare()
    running = [(job(names[i % 2], gpus=1 + i % 4), 0.0) for i in range(100)]
    pending = [job(names[i % 5], gpus=(1, 1, 2, 4, 8)[i % 5]) for i in range(20_000)]
    snap = snapshot(cluster, pol, pending, running)
    t0 = time.perf_counter()
    d = pol.schedule(snap, NOW)
    elapsed = time.perf_counter() - t0
    held = apply(snap, d)
    assert sum(held.values()) <= 512 and d.starts
    assert len(d.waiting) <= 5 * snap.config.backfill_depth
    print(f"drf pass over 20k pending: {elapsed * 1000:.1f} ms, {len(d.starts)} starts")


def test_a_job_is_not_blocked_by_its_own_quota_hold() -> None:
    """A tenant at its nominal quota whose next job must borrow holds its quota for that job;
    the hold must not then stop that very job from preempting a lower-priority job of its own
    tenant (found by the control plane's end-to-end preemption test)."""
    cluster = make_cluster(nodes=1, gpus=4)
    policy = FairShare(preempt_within_tenant=True)
    low = job("a", gpus=4, priority=0)
    high = job("a", gpus=1, priority=10, duration=7200.0)  # ends after the hold is due
    snap = snapshot(cluster, policy, [high], running=[(low, 0.0)],
                    cfg=SchedConfig(min_runtime=0.0))
    d = policy.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [low.id]
    assert [s.job_id for s in d.starts] == [high.id]


# -- shortcuts that must not change a decision ------------------------------------------------

@contextlib.contextmanager
def _without_shortcuts():
    """The reference pass: every job read one at a time through `admit` and the put-off
    branch, as before the run shortcuts existed."""
    from plinth.sched.policies import drf

    saved = drf._Pass.repeat_run, drf._Pass.put_off_run
    drf._Pass.repeat_run = lambda self, q, scan: None
    drf._Pass.put_off_run = lambda self, q, t, scan: None
    try:
        yield
    finally:
        drf._Pass.repeat_run, drf._Pass.put_off_run = saved


_shapes = [Request(gpus=1), Request(gpus=2), Request(gpus=4), Request(gpus=8)]


def _fitting(cluster: Cluster, running: list[tuple[str, int, float]]) -> list[tuple[Job, float]]:
    """Running jobs (tenant, GPUs, duration) started at 0, those that fit in the order given."""
    fits, state = [], ClusterState(cluster)
    for t, g, dur in running:
        j = job(t, gpus=g, cpus=0, duration=dur)
        a = place(state, j.request)
        if a is not None:
            state.allocate(a, j.request)
            fits.append((j, 0.0))
    return fits


@settings(max_examples=40, deadline=None)
@given(running=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([1, 2, 4]),
                                  st.sampled_from([600.0, 7200.0, 36000.0])), max_size=10),
       pending=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3),
                                  st.sampled_from([0, 0, 1]),
                                  st.sampled_from([600.0, 7200.0, 36000.0]),
                                  st.booleans()), min_size=1, max_size=60),
       nominal=st.tuples(*[st.sampled_from([0, 4, 8])] * 3),
       scan=st.sampled_from([3, 7, 500]), reserve=st.booleans())
def test_run_shortcuts_decide_as_one_job_at_a_time(running, pending, nominal, scan,
                                                   reserve) -> None:
    """Runs of look-alike jobs (shared or equal requests, mixed priorities and run times, so
    that runs break on every key part) get exactly the starts, preemptions and reasons that
    reading them one at a time gives."""
    quotas_ = tuple(TenantQuota(n, g) for n, g in zip("abc", nominal))
    cluster = make_cluster(nodes=2, tenants=quotas_)
    jobs = []
    for t, shape, prio, dur, shared in pending:
        i = next(_ids)
        req = _shapes[shape] if shared else Request(gpus=_shapes[shape].gpus)
        jobs.append(Job(i, float(i), dur, req, tenant=t, priority=prio))
    cfg = SchedConfig(backfill_depth=scan)
    fits = _fitting(cluster, running)

    def decide() -> tuple:
        pol = FairShare(reserve=reserve)
        d = pol.schedule(snapshot(cluster, pol, jobs, fits, cfg), NOW)
        return ([(s.job_id, s.allocation, s.reason) for s in d.starts],
                [(p.job_id, p.reason) for p in d.preempts], dict(d.waiting), d.wake_at)

    fast = decide()
    with _without_shortcuts():
        assert decide() == fast


def test_long_run_of_alike_jobs_is_cut_at_backfill_depth() -> None:
    """A run of 700 identical blocked jobs: the first `backfill_depth` get the first one's
    reason, the rest are not read; a different job right behind the cut is not read either."""
    cluster = make_cluster(nodes=1, tenants=quotas(a=8))
    req = Request(gpus=8)
    running = [(job("a", gpus=8, cpus=0), 0.0)]
    pending = [Job(next(_ids), float(k), 3600.0, req, tenant="a") for k in range(700)]
    pending.append(job("a", gpus=1, submit=10_000.0))
    pol = FairShare()
    d = pol.schedule(snapshot(cluster, pol, pending, running, SchedConfig(backfill_depth=500)),
                     NOW)
    assert not d.starts
    assert list(d.waiting) == [j.id for j in pending[:500]]
    assert len(set(d.waiting.values())) == 2  # the first (with its quota hold), then a repeat


def test_tenant_queues_of_a_sorted_container_need_no_scan() -> None:
    from sortedcontainers import SortedKeyList

    pol = FairShare()
    snap = snapshot(make_cluster(), pol, [job(t) for t in ["b", "a", "ab", "a\0", "c"] * 7])
    by_tenant = tenant_queues(snap.pending)
    queue = SortedKeyList(snap.pending, key=pol.order)
    fast = tenant_queues(queue, key=pol.order)
    assert {t: list(q) for t, q in fast.items()} == {t: list(q) for t, q in by_tenant.items()}
    assert list(fast) == ["a", "a\0", "ab", "b", "c"]
    # Kept by another order, the container is split by the checked search instead.
    other = SortedKeyList(snap.pending, key=lambda js: (js.job.submit_time, js.id))
    assert {t: list(q) for t, q in tenant_queues(other, key=pol.order).items()} == \
        {t: list(q) for t, q in by_tenant.items()}


def test_platform_quotas_share_the_rest_among_tenants_without_one() -> None:
    from plinth.sched.quota import platform_quotas

    rows = [{"name": "a", "gpus": 6.0, "borrowing_limit": 0.0},
            {"name": "default", "gpus": None, "borrowing_limit": None},
            {"name": "c", "gpus": None, "borrowing_limit": 1.0}]
    got = {q.name: (q.nominal_gpus, q.borrowing_limit) for q in platform_quotas(rows, 16)}
    assert got == {"a": (6.0, 0.0), "default": (5.0, None), "c": (5.0, 1.0)}
    # Quotas that take the whole cluster (or more) leave nothing; none set: DRF derives them.
    assert {q.name: q.nominal_gpus for q in platform_quotas(rows, 4)}["default"] == 0.0
    assert platform_quotas([r | {"gpus": None} for r in rows], 16) == ()
    # A quota of 1 of 4 GPUs for `a`: `default`'s 3-GPU job starts on its own nominal quota.
    # Held to 0 nominal GPUs, it could borrow only a's idle GPU and did not start.
    rows = [{"name": "a", "gpus": 1.0, "borrowing_limit": None},
            {"name": "default", "gpus": None, "borrowing_limit": None}]
    for tenants, starts in ((platform_quotas(rows, 4), 1),
                            ((TenantQuota("a", 1.0), TenantQuota("default", 0.0)), 0)):
        cluster = make_cluster(nodes=1, gpus=4, tenants=tenants)
        policy = FairShare()
        d = policy.schedule(snapshot(cluster, policy, [job("default", gpus=3)]), NOW)
        assert len(d.starts) == starts, d.waiting


def test_equal_shares_add_up_so_a_tenant_can_borrow_the_whole_cluster() -> None:
    """4 GPUs among 3 tenants: shares rounded one by one (1.333 each) left a cohort of 3.999
    GPUs, and a 4-GPU gang waited forever on an idle cluster ("more than team-0 can ever
    hold"). The shares add up to the cluster, and the gang runs."""
    from plinth.sched.quota import derive_quotas, equal_shares
    from plinth.sim.engine import simulate

    assert equal_shares(4, 3) == [1.334, 1.333, 1.333]
    assert sum(round(s * 1000) for s in equal_shares(256, 15)) == 256_000
    cluster = Cluster((Node("n0", 64_000, 256_000, "V100", 4),))
    assert sum(round(q.nominal_gpus * 1000) for q in derive_quotas(cluster, "abc")) == 4000
    jobs = [Job(i, float(i), 60.0, Request(gpus=1, workers=1 + 3 * (i == 3)), tenant=t)
            for i, t in enumerate(["a", "b", "c", "a"])]
    res = simulate(jobs, cluster, make_policy("drf"), SchedConfig(), validate=True)
    assert len(res.jobs) == 4  # the 4-GPU gang of tenant a ran once the others ended


@settings(max_examples=40, deadline=None)
@given(running=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([1, 2, 4]),
                                  st.sampled_from([600.0, 7200.0, 36000.0])), max_size=10),
       pending=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3),
                                  st.sampled_from([600.0, 7200.0, 36000.0])),
                        min_size=1, max_size=40),
       nominal=st.tuples(*[st.sampled_from([0, 4, 8])] * 3),
       scan=st.sampled_from([3, 500]), later=st.sampled_from([0.0, 60.0, 50_000.0]))
def test_reasons_left_out_are_the_ones_jobs_already_have(running, pending, nominal, scan,
                                                         later) -> None:
    """A pass leaves a job out of `waiting` only when the job already has that reason: with
    the reasons of a first pass applied, as the owner does, a second pass leaves every job
    with the reason (and makes the starts and preemptions) that the reference gives, which
    is the same pass on jobs that have no reason yet, so that every reason is written."""
    import dataclasses

    quotas_ = tuple(TenantQuota(n, g) for n, g in zip("abc", nominal))
    cluster = make_cluster(nodes=2, tenants=quotas_)
    jobs = [job(t, gpus=_shapes[shape].gpus, duration=dur) for t, shape, dur in pending]
    fits = _fitting(cluster, running)
    cfg = SchedConfig(backfill_depth=scan)
    pol = FairShare()
    snap = snapshot(cluster, pol, jobs, fits, cfg)
    first = pol.schedule(snap, NOW)
    for js in snap.pending:
        js.reason = first.waiting.get(js.id, "")

    def second(reasons: bool) -> tuple:
        queue = [dataclasses.replace(js, reason=js.reason if reasons else "")
                 for js in snap.pending]
        d = FairShare().schedule(dataclasses.replace(snap, pending=queue), NOW + later)
        held = {js.id: d.waiting.get(js.id, js.reason) for js in snap.pending}
        return ([(s.job_id, s.allocation, s.reason) for s in d.starts],
                [(p.job_id, p.reason) for p in d.preempts], d.wake_at, held, len(d.waiting))

    *kept, short = second(reasons=True)
    *reference, full = second(reasons=False)
    assert kept == reference
    assert short <= full


# -- passes after which only jobs arrived (Snapshot.arrived) ------------------------------------

def _owner(policy: FairShare, nodes: int = 1):
    from plinth.sched import owner as o
    w = o.Owner(make_cluster(nodes=nodes), policy, SchedConfig(min_runtime=0.0), validate=True)
    reads: list[list[int]] = []
    arrivals = policy.arrivals

    def counted(snap):  # the real method, with the jobs it hands the pass noted
        queues = arrivals(snap)
        reads.append(sorted(js.id for q in queues.values() for js in q))
        return queues

    policy.arrivals = counted  # type: ignore[method-assign]
    return o, w, reads


def _launch(o, w, out, now):
    ids = [i.job_id for i in out.instructions if type(i) is o.Launch]
    if ids:
        w.handle([o.Started(i, w.jobs[i].attempt, now) for i in ids], now)
    return ids


def test_after_arrivals_only_the_new_jobs_are_read_against_the_reservation() -> None:
    o, w, reads = _owner(FairShare(quotas=quotas(a=16)))  # the GPUs are short, not quota
    big, wide = job("a", gpus=6, duration=100.0, submit=0.0), job("a", gpus=8, submit=0.0)
    assert _launch(o, w, w.handle([o.Submitted(big), o.Submitted(wide)], 0.0), 0.0) == [big.id]
    assert "reserved from t=100s" in w.jobs[wide.id].reason
    long, short = job("a", gpus=2, duration=500.0, submit=10.0), \
        job("a", gpus=2, duration=50.0, submit=10.0)
    started = _launch(o, w, w.handle([o.Submitted(long), o.Submitted(short)], 10.0), 10.0)
    # Read alone: the two new jobs, not the one set aside; the short one ends before the
    # reserved GPUs are due, the long one would delay the wide job.
    assert reads == [sorted([long.id, short.id])]
    assert started == [short.id]
    assert w.jobs[long.id].reason.startswith(f"Resources: would delay job {wide.id}")
    # Once a job ends, the whole queue is read again.
    w.handle([o.Exited(short.id, 1, 0)], 60.0)
    assert len(reads) == 1


def test_a_new_job_that_reclaims_quota_lets_the_pass_use_what_its_victim_freed() -> None:
    # b borrows all 8 GPUs with one job; a's new 2-GPU job reclaims them, and the 6 left over
    # go to a job of b's that waited: the pass is done again over the whole queue.
    o, w, reads = _owner(FairShare(quotas=quotas(a=4, b=4)))
    hog = job("b", gpus=8, duration=1000.0, submit=0.0)
    _launch(o, w, w.handle([o.Submitted(hog)], 0.0), 0.0)
    waits = job("b", gpus=2, duration=100.0, submit=1.0)
    assert _launch(o, w, w.handle([o.Submitted(waits)], 1.0), 1.0) == []
    new = job("a", gpus=2, duration=100.0, submit=5.0)
    out = w.handle([o.Submitted(new)], 5.0)
    assert [s.job_id for s in out.instructions if type(s) is o.Stop] == [hog.id]
    w.handle([o.Exited(hog.id, 1, 143)], 5.0)
    assert w.jobs[new.id].status is State.RUNNING
    assert w.jobs[waits.id].status is State.RUNNING  # read again after the reclaim
    assert reads[-1] == [new.id]


# -- a tenant whose quota is spent (`_Pass.spent`) ------------------------------------------------

def _counted(policy: FairShare, snap: Snapshot) -> Snapshot:
    """`snap` with its queue kept as the owner keeps it: the policy's own, which counts each
    tenant's jobs that ask for no GPU."""
    import dataclasses
    return dataclasses.replace(snap, pending=policy.pending_queue(snap.pending))


def test_a_tenant_that_can_borrow_nothing_more_is_read_no_further() -> None:
    # a holds its 4 nominal GPUs and borrows 4 of b's: the cohort's 8 are all used.
    cluster = make_cluster(nodes=1, tenants=quotas(a=4, b=4))
    running = [(job("a", gpus=4, cpus=0, duration=600.0), 0.0),
               (job("a", gpus=4, cpus=0, duration=600.0), 0.0)]
    queue = [job("a", gpus=1, duration=d) for d in (100.0, 200.0, 300.0, 400.0)]
    pol = FairShare()
    d = pol.schedule(_counted(pol, snapshot(cluster, pol, queue, running)), NOW)
    assert not d.starts
    assert list(d.waiting) == [queue[0].id]  # the rest keep the reasons they had
    # A job that asks for no GPU behind them is not spent: the queue is read on to it.
    cpu_only = job("a", gpus=0, duration=50.0)
    d = pol.schedule(_counted(pol, snapshot(cluster, pol, [*queue, cpu_only], running)), NOW)
    assert [s.job_id for s in d.starts] == [cpu_only.id]


@settings(max_examples=60, deadline=None)
@given(running=st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([1, 2, 4]),
                                  st.sampled_from([600.0, 7200.0, 36000.0])), max_size=10),
       pending=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0, 1, 2, 4, 8]),
                                  st.sampled_from([0, 1]),
                                  st.sampled_from([600.0, 7200.0, 36000.0])),
                        min_size=1, max_size=40),
       nominal=st.tuples(*[st.sampled_from([0, 4, 8])] * 3),
       limit=st.sampled_from([None, 0, 2]), reserve=st.booleans())
def test_reading_no_further_than_a_spent_tenant_changes_no_decision(running, pending, nominal,
                                                                    limit, reserve) -> None:
    """With the owner's counting queue (spent tenants read no further) and with a plain
    sorted list (every job read), a pass makes the same starts, preemptions and wake-up, and
    the reasons it gives are the reference's."""
    quotas_ = tuple(TenantQuota(n, g, borrowing_limit=limit) for n, g in zip("abc", nominal))
    cluster = make_cluster(nodes=2, tenants=quotas_)
    jobs = [job(t, gpus=g, cpus=1000, priority=p, duration=dur) for t, g, p, dur in pending]
    fits = _fitting(cluster, running)

    def decide(counted: bool) -> tuple:
        pol = FairShare(reserve=reserve)
        snap = snapshot(cluster, pol, jobs, fits)
        d = pol.schedule(_counted(pol, snap) if counted else snap, NOW)
        return ([(s.job_id, s.allocation, s.reason) for s in d.starts],
                [(p.job_id, p.reason) for p in d.preempts], d.wake_at), d.waiting

    fast, some = decide(counted=True)
    reference, every = decide(counted=False)
    assert fast == reference
    assert some.items() <= every.items()
