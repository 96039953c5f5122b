"""Tiresias discretised 2D-LAS, on hand-checked one- and two-node clusters."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest

from plinth.core.errors import SpecError
from plinth.core.resources import Cluster, Node, Request
from plinth.core.workload import Job
from plinth.sched.placement import placeable
from plinth.sched.policies import make_policy
from plinth.sched.policies.tiresias import Tiresias
from plinth.sched.state import ClusterState
from plinth.sched.types import Decisions, JobState, SchedConfig, Snapshot
from plinth.sched.validate import apply_decisions, running_job, snapshot_for

NOW = 100_000.0


def make_cluster(nodes: int = 1, gpus: int = 4) -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 64_000, 256_000, "V100", gpus) for i in range(nodes)))


def make_job(jid: int, gpus: int, *, submit: float = 0.0, preemptible: bool = True) -> Job:
    return Job(jid, submit, 86_400.0, Request(gpus=gpus), preemptible=preemptible)


def pending(job: Job, *, attained: float = 0.0, executed: float | None = None,
            since: float | None = None) -> JobState:
    gpus = job.request.num_gpus
    return JobState(job, attained=attained,
                    executed=attained / gpus if executed is None else executed,
                    pending_since=job.submit_time if since is None else since)


def running(state: ClusterState, job: Job, *, attained: float = 0.0, start: float = 0.0,
            **kw) -> JobState:
    return running_job(state, job, start=start, attained=attained,
                       executed=attained / job.request.num_gpus, **kw)


def snapshot(policy, cluster, state, waiting, run, config=SchedConfig()) -> Snapshot:
    return snapshot_for(policy, cluster, state, waiting, run, config)


def apply(snap: Snapshot, d: Decisions) -> ClusterState:
    return apply_decisions(snap, d)


def setup(nodes=1, gpus=4, **options):
    cl = make_cluster(nodes, gpus)
    return cl, ClusterState(cl), Tiresias(**options)


def test_queue_index_and_order():
    pol = Tiresias()  # thresholds 3600 and 36000 GPU-seconds
    assert [pol.queue_of(a) for a in (0, 3599.9, 3600, 35_999, 36_000, 1e9)] == [0, 0, 1, 1, 2, 2]
    old_big = pending(make_job(1, 4, submit=0), attained=40_000)
    mid = pending(make_job(2, 1, submit=5), attained=5_000)
    new = pending(make_job(3, 8, submit=9))
    assert [js.id for js in sorted([old_big, mid, new], key=pol.order)] == [3, 2, 1]
    assert isinstance(make_policy("tiresias", thresholds=[10, 20]), Tiresias)
    with pytest.raises(SpecError, match="thresholds"):
        Tiresias(thresholds=[100, 50])


def test_lower_queue_first_and_work_conserving():
    cl, st, pol = setup(starve_factor=None)
    busy = running(st, make_job(1, 1, submit=0), attained=100, start=NOW - 100)
    served = pending(make_job(2, 1, submit=10), attained=5_000)  # queue 1
    fresh = pending(make_job(3, 2, submit=50))  # queue 0
    huge = pending(make_job(4, 4, submit=20))  # queue 0, does not fit: must not block
    snap = snapshot(pol, cl, st, [served, fresh, huge], [busy])
    d = pol.schedule(snap, NOW)
    assert [s.job_id for s in d.starts] == [3, 2]
    assert d.starts[0].reason == "tiresias: queue 0"
    assert "queue 0" in d.waiting[4] and not d.preempts  # busy is in queue 0 too
    apply(snap, d)


def test_preempts_a_job_in_a_lower_queue_for_a_new_job():
    cl, st, pol = setup()
    long = running(st, make_job(1, 4), attained=40_000)  # queue 2
    new = pending(make_job(7, 2, submit=NOW))
    snap = snapshot(pol, cl, st, [new], [long])
    d = pol.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [1]
    assert d.preempts[0].reason.startswith("preempted by job 7 (queue 0 < queue 2")
    assert [s.job_id for s in d.starts] == [7]
    apply(snap, d)


def test_most_served_queue_is_preempted_first_never_the_same_queue():
    cl, st, pol = setup()
    q1 = running(st, make_job(1, 2), attained=5_000)
    q2 = running(st, make_job(2, 2), attained=50_000)
    snap = snapshot(pol, cl, st, [pending(make_job(3, 2, submit=NOW))], [q1, q2])
    d = pol.schedule(snap, NOW)
    assert [p.job_id for p in d.preempts] == [2]

    cl, st, pol = setup()
    peer = running(st, make_job(1, 4), attained=10)  # queue 0, like the newcomer
    d = pol.schedule(snapshot(pol, cl, st, [pending(make_job(2, 2, submit=NOW))], [peer]), NOW)
    assert not d.preempts and "no running job is in a lower queue" in d.waiting[2]


def test_respects_guaranteed_runtime_and_non_preemptible_jobs():
    cl, st, pol = setup(nodes=2)
    young = running(st, make_job(1, 4), attained=40_000, start=NOW - 100)
    pinned = running(st, make_job(2, 4, preemptible=False), attained=40_000)
    snap = snapshot(pol, cl, st, [pending(make_job(3, 4, submit=NOW))], [young, pinned])
    d = pol.schedule(snap, NOW)
    assert not d.preempts and not d.starts
    assert "guaranteed runtime" in d.waiting[3]
    assert d.wake_at == pytest.approx(NOW + 200)  # min_runtime 300 s ends then


def test_demotion_wake_at_is_the_earliest_threshold_crossing():
    cl, st, pol = setup(nodes=2, thresholds=(3600, 36_000))
    a = running(st, make_job(1, 2), attained=1_000)  # crosses 3600 in 2600/2 = 1300 s
    b = running(st, make_job(2, 2), attained=2_000)  # crosses 3600 in 1600/2 = 800 s
    # c crosses first (600/4 = 150 s) but can never be a victim, so it does not count.
    c = running(st, make_job(3, 4, preemptible=False), attained=3_000)
    wait = pending(make_job(4, 4, submit=NOW))  # queue 0, cannot preempt queue-0 jobs
    snap = snapshot(pol, cl, st, [wait], [a, b, c])
    d = pol.schedule(snap, NOW)
    assert not d.starts and not d.preempts
    assert d.wake_at == pytest.approx(NOW + 800)
    # Without anyone waiting, a demotion changes nothing: no wake-up.
    d = pol.schedule(snapshot(pol, cl, st, [], [a, b, c]), NOW)
    assert d.wake_at is None


def test_demotion_wake_counts_jobs_started_this_pass():
    cl, st, pol = setup(thresholds=(1000, 5000), starve_factor=None)
    holder = running(st, make_job(1, 2), attained=10)  # crosses 1000 in 990/2 = 495 s
    starter = pending(make_job(2, 2, submit=1), attained=900)  # crosses in 100/2 = 50 s
    blocked = pending(make_job(3, 4, submit=2))
    snap = snapshot(pol, cl, st, [starter, blocked], [holder])
    d = pol.schedule(snap, NOW)
    assert [s.job_id for s in d.starts] == [2]
    assert d.wake_at == pytest.approx(NOW + 50)


def test_starving_job_is_promoted_and_preempts():
    cl, st, pol = setup(starve_factor=8.0)
    hog = running(st, make_job(1, 4), attained=5_000)  # queue 1
    # Queue 1 too; ran 1000 s on 4 GPUs, pending since t=1000: promoted at 1000 + 8 * 1000.
    starved = pending(make_job(2, 4, submit=0), attained=4_000, since=1_000)
    before = snapshot(pol, cl, st, [starved], [hog])
    d = pol.schedule(before, 8_000)
    assert not d.preempts
    assert d.wake_at == pytest.approx(9_000)  # promotion, before hog's demotion at 15 750
    d = pol.schedule(before, 9_000)
    assert [p.job_id for p in d.preempts] == [1]
    assert "promoted from queue 1" in d.starts[0].reason
    apply(before, d)


def test_promoted_job_competes_in_queue_0_by_submit_time():
    cl, st, pol = setup()
    running(st, make_job(1, 2), attained=10)
    fresh = pending(make_job(2, 2, submit=500))  # queue 0
    starved = pending(make_job(3, 2, submit=0), attained=4_000, since=0)  # queue 1
    for now, first in ((7_000, 2), (16_000, 3)):  # ran 2000 s: promoted from t = 8 * 2000
        snap = snapshot(pol, cl, st, [fresh, starved], [])
        d = pol.schedule(snap, now)
        assert [s.job_id for s in d.starts] == [first]
        apply(snap, d)


def test_starvation_guard_ignores_jobs_that_never_ran_and_can_be_off():
    pol = Tiresias()
    assert pol.starve_limit(pending(make_job(1, 4), attained=0)) is None
    off = Tiresias(starve_factor=None)
    assert off.starve_limit(pending(make_job(1, 4), attained=9_000, since=0)) is None


def test_random_worlds_never_over_commit_or_preempt_same_queue():
    rng = random.Random(11)
    for _ in range(300):
        cl, st, pol = setup(nodes=2, gpus=4, thresholds=(500, 5_000))
        run, jid = [], 0
        for _ in range(rng.randint(0, 6)):
            jid += 1
            job = make_job(jid, rng.choice([1, 2, 4]), preemptible=rng.random() < 0.8)
            if st.whole_free_gpus() >= job.request.gpus:
                js = running(st, job, attained=rng.choice([0, 100, 1_000, 9_000]),
                             start=NOW - rng.choice([50, 500, 5_000]))
                run.append(js)
        waiting = [pending(make_job(jid + k, rng.choice([1, 2, 4, 8]), submit=NOW - k),
                           attained=rng.choice([0, 0, 600, 6_000]),
                           since=NOW - rng.choice([10, 10_000, 100_000]))
                   for k in range(1, rng.randint(1, 6))]
        snap = snapshot(pol, cl, st, waiting, run)
        d = pol.schedule(snap, NOW)
        apply(snap, d)
        if d.preempts:
            best = min(0 if "promoted" in s.reason else pol.queue_of(
                next(js for js in waiting if js.id == s.job_id).attained) for s in d.starts)
            assert all(pol.queue_of(snap.running[p.job_id].attained) > best for p in d.preempts)
        assert d.wake_at is None or d.wake_at > NOW


def _decisions(d: Decisions) -> tuple:
    return ([(s.job_id, s.allocation, s.reason) for s in d.starts],
            [(p.job_id, p.reason) for p in d.preempts], dict(d.waiting), d.wake_at)


@pytest.mark.parametrize("seed", range(25))
def test_a_sorted_container_queue_decides_as_a_sorted_list(seed):
    """The owner keeps the queue in a SortedKeyList, which a pass walks by its own index
    (queue boundaries, promoted jobs merged into queue 0); a plain sorted list is walked by
    position. Both must give the same pass, promotions and preemptions included."""
    from sortedcontainers import SortedKeyList

    rng = random.Random(seed)
    cl, st, pol = setup(nodes=2, gpus=4, thresholds=(500, 5_000), scan_depth=6, starve_scan=3)
    run = []
    for jid in range(1, 6):
        job = make_job(jid, rng.choice([1, 2]))
        if st.whole_free_gpus() >= job.request.gpus:
            run.append(running(st, job, attained=rng.choice([0, 600, 9_000]),
                               start=NOW - rng.choice([50, 5_000])))
    waiting = [pending(make_job(100 + k, rng.choice([1, 2, 4]),
                                submit=NOW - rng.randint(1, 90_000)),
                       attained=rng.choice([0, 0, 600, 6_000]),
                       since=NOW - rng.choice([10, 50_000, 100_000]))
               for k in range(rng.randint(1, 25))]
    snap = snapshot(pol, cl, st, waiting, run)
    assert isinstance(snap.pending, list)
    as_list = _decisions(pol.schedule(snap, NOW))
    snap.pending = SortedKeyList(snap.pending, key=pol.order)
    assert _decisions(pol.schedule(snap, NOW)) == as_list


@contextmanager
def _without_shortcuts():
    """The reference pass: every starvation limit read job by job in every pass (none kept
    from the last pass) and the next one found by filtering them all, every victim scan
    filtered as when victims of this pass are left out, and every victim search trying
    placements, not counting GPUs."""
    from plinth.sched import preemption
    from plinth.sched.policies.tiresias import _Oldest

    saved = (_Oldest.unchanged, _Oldest.next_after, preemption._Candidates.scan,
             preemption._Candidates.counted_fit)
    scan = preemption._Candidates.scan
    nobody = {-1: None}  # leaves no job out, but takes the filtering path
    _Oldest.unchanged = lambda self, queue, q: False
    _Oldest.next_after = lambda self, cut, started: min(
        (t for js, t in zip(self.jobs, self.limits) if t > cut and js not in started),
        default=None)
    preemption._Candidates.scan = lambda self, victims: scan(self, victims or nobody)
    preemption._Candidates.counted_fit = lambda self, *args: None
    try:
        yield
    finally:
        (_Oldest.unchanged, _Oldest.next_after, preemption._Candidates.scan,
         preemption._Candidates.counted_fit) = saved


_shapes = [Request(gpus=1), Request(gpus=1, workers=2), Request(gpus=1, workers=4),
           Request(gpus=1, workers=8), Request(gpus=2), Request(gpus=4), Request(gpu_milli=500)]


def _random_world(seed: int) -> tuple[Tiresias, Snapshot]:
    """A pass's world: queues, gang shapes, GPU shares, protected, capped and non-preemptible
    jobs, promotions and several preemptions in one pass."""
    rng = random.Random(seed)
    cl, st, pol = setup(nodes=3, gpus=4, thresholds=(500, 5_000), preempt_depth=rng.choice([1, 8]))
    cap = SchedConfig().max_preemptions
    run = []
    for jid in range(1, rng.randint(1, 14)):
        job = Job(jid, 0.0, 86_400.0, rng.choice(_shapes), preemptible=rng.random() < 0.85)
        if placeable(st, job.request):
            js = running(st, job, attained=rng.choice([0, 100, 600, 9_000]),
                         start=NOW - rng.choice([50, 500, 5_000]),
                         preemptions=rng.choice([0, 0, 1, 3, cap]))
            js.progress = rng.uniform(0, 900)
            js.checkpointed = rng.choice([0.0, js.progress / 2])
            js.checkpoint_time = rng.choice([None, NOW - 400, NOW - 100])
            run.append(js)
    waiting = [pending(Job(100 + k, NOW - rng.randint(1, 90_000), 86_400.0,
                           rng.choice(_shapes[:6])),
                       attained=rng.choice([0, 0, 600, 6_000]),
                       since=NOW - rng.choice([10, 2_000, 50_000, 100_000]))
               for k in range(rng.randint(1, 20))]
    return pol, snapshot(pol, cl, st, waiting, run)


@pytest.mark.parametrize("seed", range(60))
def test_shortcuts_decide_as_the_filtering_path(seed):
    """The next starvation limit found without reading the jobs again, victim scans
    precomputed for a pass without victims yet, and victim searches for one-GPU gangs that
    count GPUs give the same starts, preemptions, reasons and wake-up (`_random_world`)."""
    pol, snap = _random_world(seed)
    fast = _decisions(pol.schedule(snap, NOW))
    with _without_shortcuts():
        assert _decisions(pol.schedule(snap, NOW)) == fast


@pytest.mark.parametrize("seed", range(60))
def test_only_a_changed_reason_is_written(seed):
    """A pass leaves out of `waiting` exactly the jobs that hold the reason it gives them
    already: on jobs holding some of those reasons (and some other ones) it decides as on
    jobs holding none, and each job ends up with the same reason once the owner applies it."""
    pol, snap = _random_world(seed)
    fresh = pol.schedule(snap, NOW)  # no job holds a reason yet: every one is written
    rng = random.Random(seed)
    for js in snap.pending:
        if js.id in fresh.waiting and rng.random() < 0.6:
            js.reason = fresh.waiting[js.id]
        elif rng.random() < 0.3:
            js.reason = "Resources: some earlier reason"
    held = {js.id: js.reason for js in snap.pending}
    d = pol.schedule(snap, NOW)
    assert _decisions(d)[:2] == _decisions(fresh)[:2] and d.wake_at == fresh.wake_at
    assert all(held[jid] != why for jid, why in d.waiting.items())
    assert {jid: d.waiting.get(jid, held[jid]) for jid in fresh.waiting} == fresh.waiting


def test_next_limit_leaves_out_started_jobs_and_due_limits():
    from plinth.sched.policies.tiresias import _Oldest

    rng = random.Random(5)
    cut = NOW + 1e-3
    for _ in range(200):
        jobs = [pending(make_job(k, 1), since=rng.choice([NOW - 5.0, NOW, NOW + 1.0]),
                        executed=rng.choice([0.0, 0.0, rng.uniform(0, 9e3)]))
                for k in range(rng.randint(1, 8))]
        oldest = _Oldest([], 1, jobs, 8.0)
        limits = [js.pending_since + 8.0 * js.executed for js in jobs]
        started = rng.sample(jobs, rng.randint(0, len(jobs))) + [pending(make_job(99, 1))]
        for left_out in (started, []):
            want = min((t for js, t in zip(jobs, limits) if t > cut and js not in left_out),
                       default=None)
            assert oldest.next_after(cut, left_out) == want
        assert sorted(js.id for js in oldest.due(cut)) == \
            sorted(js.id for js, t in zip(jobs, limits) if t <= cut)


@pytest.mark.parametrize("seed", range(6))
def test_a_replay_decides_as_the_reference_in_every_pass(seed):
    """A whole replay through the owner (jobs preempted, requeued, promoted and started
    again, starvation limits kept between passes while a queue is unchanged) makes the same
    decisions in every pass as the reference pass."""
    from plinth.sim.engine import simulate

    rng = random.Random(seed)
    cl = make_cluster(2, 4)
    jobs = [Job(k, rng.uniform(0, 20_000), rng.choice([60.0, 900.0, 4_000.0, 20_000.0]),
                rng.choice(_shapes[:6]), preemptible=rng.random() < 0.9) for k in range(60)]

    def replay() -> list[tuple]:
        pol = Tiresias(thresholds=(300, 3_000), starve_factor=2.0, starve_scan=5, scan_depth=8)
        inner, seen = pol.schedule, []

        def recorded(snap: Snapshot, now: float) -> Decisions:
            d = inner(snap, now)
            seen.append((now, _decisions(d)))
            return d

        pol.schedule = recorded  # type: ignore[method-assign]
        simulate(jobs, cl, pol, SchedConfig(min_runtime=120.0))
        return seen

    fast = replay()
    with _without_shortcuts():
        assert replay() == fast


class _ReadsAll(Tiresias):
    reads_arrivals = False  # told nothing of arrivals: every pass reads the whole queue


@pytest.mark.parametrize("seed", range(6))
def test_passes_after_arrivals_decide_as_passes_over_the_whole_queue(seed):
    """After a pass that started and preempted nothing, a pass that follows arrivals alone
    sets the waiting jobs aside and walks the new ones from where that pass left queue 0. A
    busy replay (gangs, preemptions, promotions, a small search budget in half the seeds)
    starts and preempts the same jobs at the same times as one whose every pass reads the
    whole queue, and sets jobs aside in many of its passes."""
    from plinth.sim.engine import simulate

    rng = random.Random(seed)
    cl = make_cluster(2, 4)
    jobs = [Job(k, rng.uniform(0, 30_000), rng.choice([60.0, 900.0, 4_000.0, 20_000.0]),
                rng.choice(_shapes[:6]), preemptible=rng.random() < 0.9) for k in range(200)]
    options = dict(thresholds=(300, 3_000), starve_factor=2.0, starve_scan=5, scan_depth=8,
                   preempt_depth=1 if seed % 2 else 8)

    def replay(policy: Tiresias) -> tuple[list[tuple], int]:
        inner, seen, aside = policy.schedule, [], []
        arrivals = policy._arrivals

        def recorded(snap: Snapshot, now: float) -> Decisions:
            d = inner(snap, now)
            seen.append((now, [(s.job_id, s.allocation) for s in d.starts],
                         [p.job_id for p in d.preempts]))
            return d

        def counted(*args):  # type: ignore[no-untyped-def]
            d = arrivals(*args)
            aside.append(d is not None)
            return d

        policy.schedule = recorded  # type: ignore[method-assign]
        policy._arrivals = counted  # type: ignore[method-assign]
        simulate(jobs, cl, policy, SchedConfig(min_runtime=120.0))
        return seen, sum(aside)

    passes, set_aside = replay(Tiresias(**options))
    reference, none = replay(_ReadsAll(**options))
    assert passes == reference
    assert none == 0 and set_aside >= (1 if seed % 2 else 50)


def test_passes_after_arrivals_alone_decide_as_whole_passes():
    """Random worlds (`_random_world`, scan depths of 2, 5 and 100): a pass that starts and
    preempts nothing, then one to
    three new jobs queued a second later and nothing else changed. Wherever the pass after
    them sets the waiting jobs aside, it starts and preempts what a whole pass on the same
    snapshot does, and leaves the owner the same earliest wake-up (the first pass's counted
    for both, as the owner keeps it)."""
    import dataclasses

    aside = 0
    for seed in range(3000):
        pol, snap = _random_world(seed)
        pol.scan_depth = (2, 5, 100)[seed % 3]  # (where the walk breaks off matters too)
        first = pol.schedule(snap, NOW)
        if first.starts or first.preempts:
            continue  # (nothing carried: the next pass is a whole one)
        rng = random.Random(seed)
        new = [pending(Job(500 + k, NOW + 1, 86_400.0, rng.choice(_shapes[:6])))
               for k in range(rng.randint(1, 3))]
        snap.pending.extend(new)  # type: ignore[attr-defined]
        snap.pending.sort(key=pol.order)  # type: ignore[attr-defined]
        later = dataclasses.replace(snap, arrived=new)
        carried = pol._carry
        d = pol.schedule(later, NOW + 1)
        if pol._carry is None or carried is None:
            continue  # (not set aside)
        kept = pol._carry
        whole = pol.schedule(dataclasses.replace(later, arrived=None), NOW + 1)
        pol._carry = kept
        aside += 1
        assert _decisions(d)[:2] == _decisions(whole)[:2]

        def earliest(t: float | None) -> float | None:
            return min((x for x in (first.wake_at, t) if x is not None), default=None)
        assert earliest(d.wake_at) == earliest(whole.wake_at)
    assert aside >= 400


def test_a_new_job_beyond_the_scan_depth_is_not_read_in_a_pass_after_arrivals():
    """Two 4-GPU jobs wait in queue 0 with a scan depth of 1; a one-GPU job arrives, which
    could have a protected victim 250 s from now. A whole pass stops before it, so the pass
    that sets the waiting jobs aside must too: it asks for no wake-up of its own (the first
    pass's, the victim's demotion, stands)."""
    import dataclasses

    cl, st, pol = setup(nodes=1, gpus=4, thresholds=(500, 5_000), scan_depth=1)
    pinned = running(st, make_job(1, 3, preemptible=False), start=NOW - 100)
    victim = running(st, make_job(2, 1), attained=600, start=NOW - 50)
    big = [pending(make_job(jid, 4, submit=NOW - 60 + jid)) for jid in (3, 4)]
    snap = snapshot(pol, cl, st, big, [pinned, victim])
    first = pol.schedule(snap, NOW)
    assert not first.starts and first.wake_at == pytest.approx(NOW + 4_400)
    victim.attained += 1  # (as the owner brings it up to date a second later)
    new = pending(make_job(5, 1, submit=NOW + 1))
    snap.pending.append(new)  # type: ignore[attr-defined]
    later = dataclasses.replace(snap, arrived=[new])
    set_aside = pol._arrivals(later, NOW + 1, pol._carry)
    whole = pol.schedule(dataclasses.replace(later, arrived=None), NOW + 1)
    assert set_aside is not None and not set_aside.waiting and set_aside.wake_at is None
    assert 5 not in whole.waiting and whole.wake_at == first.wake_at
