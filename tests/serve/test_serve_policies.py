"""Every policy driven tick by tick with an integer fake clock: nothing sleeps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.errors import SpecError
from plinth.serve.controller import Controller, DecisionError, check_decision
from plinth.serve.policies import POLICIES, make_policy
from plinth.serve.policies.base import fair_share, fit_quota
from plinth.serve.types import Decision, Snapshot

N = 3


def snap(k: int, *, replicas=(1, 1, 1), quota: int = 12, p99=(0.1, 0.1, 0.1),
         ongoing=(0, 0, 0), arrivals=(0, 0, 0), minutes: int | None = None,
         per_minute=(300, 300, 300)) -> Snapshot:
    """The snapshot at tick k (now = 10·k seconds)."""
    now = 10.0 * k
    m = int(now // 60) if minutes is None else minutes
    hist = np.repeat(np.array(per_minute, np.int64)[:, None], m, axis=1)
    r = np.array(replicas, np.int64)
    return Snapshot(now, ("a", "b", "c"), np.full(N, 0.72), np.full(N, 0.18), quota, r, r.copy(),
                    hist, 10.0, np.array(arrivals), np.array(p99, float), np.array(ongoing))


def run(policy, snaps):
    state = policy.initial_state(N)
    out = []
    for s in snaps:
        d, state = policy.decide(s, state)
        if d is not None:
            check_decision(d, s)
        out.append(d)
    return out


def test_ray_serve_waits_30s_up_and_600s_down() -> None:
    p = make_policy("ray-serve")
    ups = run(p, [snap(k, ongoing=(10, 0, 0)) for k in range(1, 4)])
    assert ups[0] is None and ups[1] is None
    assert ups[2].replicas.tolist() == [5, 1, 1]  # ceil(10 / 2) after 30 s
    state = p.initial_state(N)
    downs = []
    for k in range(1, 62):
        d, state = p.decide(snap(k, replicas=(5, 1, 1), ongoing=(0, 0, 0)), state)
        downs.append(d)
    first = next(i for i, d in enumerate(downs) if d is not None)
    assert first == 59  # the 60th tick: 600 s of wanting fewer
    assert downs[first].replicas.tolist() == [1, 1, 1]


def test_oneshot_scales_by_latency_ratio_after_30s_over_and_600s_under() -> None:
    p = make_policy("oneshot")
    state = p.initial_state(N)
    over = [snap(k, replicas=(3, 2, 2), p99=(1.44, 0.1, 0.1), arrivals=(50, 50, 50))
            for k in range(1, 4)]
    ds = []
    for s in over:
        d, state = p.decide(s, state)
        ds.append(d)
    # Mean latency (here the p99: the snapshot reports no mean) at 2 × SLO for 3 ticks: × 2.
    assert ds[0] is None and ds[1] is None
    assert ds[2].replicas.tolist() == [6, 2, 2] and "1 up" in ds[2].reason
    # 60 ticks at a quarter of the SLO: replicas fall to ceil(r / 4), not one at a time.
    state = p.initial_state(N)
    seen = []
    for k in range(1, 61):
        d, state = p.decide(snap(k, replicas=(8, 4, 4), p99=(0.18, 0.18, 0.18),
                                 arrivals=(50, 50, 50)), state)
        seen.append(d)
    assert all(d is None for d in seen[:59])
    assert seen[59].replicas.tolist() == [2, 1, 1]
    # A job whose replicas are still starting gets no new action.
    state = p.initial_state(N)
    for k in range(1, 4):
        s = snap(k, replicas=(4, 2, 2), p99=(1.44, 0.1, 0.1), arrivals=(50, 50, 50))
        s = Snapshot(s.now, s.jobs, s.slo_s, s.service_s, s.quota, s.replicas,
                     np.array([2, 2, 2]), s.history, s.window_s, s.window_arrivals,
                     s.window_p99_s, s.ongoing)
        d, state = p.decide(s, state)
    assert d is None


def test_mean_latency_look_back_weights_windows_by_arrivals() -> None:
    p = make_policy("oneshot")
    state = p.initial_state(N)
    counts = []
    for k, (mean, n) in enumerate([(2.0, 10), (0.1, 90), (0.1, 0), (0.1, 0)], 1):
        s = snap(k, replicas=(2, 2, 2), arrivals=(n, n, n))
        s = Snapshot(s.now, s.jobs, s.slo_s, s.service_s, s.quota, s.replicas, s.ready,
                     s.history, s.window_s, s.window_arrivals, s.window_p99_s, s.ongoing,
                     np.full(N, mean))
        _, state = p.decide(s, state)
        counts.append(int(state.count[0]))
    # 2.0 s > SLO: a tick over. Then (2.0·10 + 0.1·90) / 100 = 0.29 s: under, twice (the empty
    # window adds nothing); then the 2.0 s window has left the 30 s look-back: 0.1 s.
    assert counts == [1, -1, -2, -3]


def test_hpa_scales_up_at_once_and_down_after_the_window() -> None:
    p = make_policy("hpa")
    # 100 req in 10 s of 0.18 s work = 1.8 busy replicas; / 0.7 → 3 replicas.
    (d,) = run(p, [snap(1, arrivals=(100, 0, 0))])
    assert d.replicas.tolist() == [3, 1, 1]
    state = p.initial_state(N)
    _, state = p.decide(snap(1, replicas=(3, 1, 1), arrivals=(100, 0, 0)), state)
    seen = []
    for k in range(2, 40):
        d, state = p.decide(snap(k, replicas=(3, 1, 1), arrivals=(10, 0, 0)), state)
        seen.append(d)
    first = next(i for i, d in enumerate(seen) if d is not None)
    assert first + 2 > 30  # not before the 5-minute stabilisation window has passed


def test_aiad_adds_on_violation_and_removes_after_calm() -> None:
    p = make_policy("aiad")
    (d,) = run(p, [snap(1, replicas=(2, 2, 2), p99=(1.0, 0.5, 0.1))])
    assert d.replicas.tolist() == [3, 2, 2]
    ds = run(p, [snap(k, replicas=(2, 2, 2), p99=(0.5, 0.5, 0.1)) for k in range(1, 4)])
    assert ds[0] is None and ds[1] is None and ds[2].replicas.tolist() == [2, 2, 1]


def test_mark_plans_at_one_minute_then_every_five_from_the_forecast() -> None:
    p = make_policy("mark")
    ds = run(p, [snap(k, minutes=20, per_minute=(1100, 60, 600)) for k in range(1, 40)])
    plans = [i for i, d in enumerate(ds) if d is not None]
    assert plans == [5, 29]  # now = 60 s and 300 s
    # λ · p / SLO at the 0.6 forecast quantile (a little above the flat history):
    # 18.6 req/s × 0.18 / 0.72 → 5; 1.1 req/s → 1; 10.2 req/s → 3.
    assert ds[5].replicas.tolist() == [5, 1, 3]


def test_mark_adds_one_after_three_ticks_over_and_grants_in_job_order() -> None:
    p = make_policy("mark", look_back_s=10.0)  # one window, so each tick is over or under
    state = p.initial_state(N)
    _, state = p.decide(snap(6, minutes=1, per_minute=(60, 60, 60)), state)  # the first plan
    out = []
    for k, hot in zip(range(7, 12), (True, False, True, False, True), strict=True):
        d, state = p.decide(snap(k, replicas=(1, 1, 1), p99=(1.0 if hot else 0.1, 0.1, 0.1),
                                 arrivals=(50, 50, 50), minutes=1, per_minute=(60, 60, 60)),
                            state)
        out.append(d)
    # Ticks under the SLO do not reset the count: the third tick over adds one.
    assert all(d is None for d in out[:4]) and out[4].replicas.tolist() == [2, 1, 1]
    # Wishes beyond the quota: the first jobs in order get theirs, the last is left short.
    d, _ = p.decide(snap(30, replicas=(1, 1, 1), quota=8, minutes=20,
                         per_minute=(1100, 1100, 1100)), p.initial_state(N))
    assert d.replicas.tolist() == [5, 2, 1]


def test_fair_share_once() -> None:
    ds = run(make_policy("fairshare"), [snap(k, quota=11) for k in range(1, 4)])
    assert ds[0].replicas.tolist() == [4, 4, 3] and ds[1] is None and ds[2] is None


def test_faro_plans_with_history_then_fixes_between_plans() -> None:
    p = make_policy("faro-fairsum")
    (d,) = run(p, [snap(1, minutes=0)])
    assert d is None  # nothing to forecast from yet
    state = p.initial_state(N)
    d, state = p.decide(snap(6, minutes=20, per_minute=(3000, 600, 60)), state)
    assert d is not None and d.replicas.sum() <= 12 and d.solver_ms > 0
    assert d.replicas[0] > d.replicas[2]  # the busiest job gets the most
    planned = np.array([4, 2, 1])  # leaves free replicas for the fixer
    out = []
    for k in range(7, 10):
        d, state = p.decide(snap(k, replicas=tuple(planned), minutes=20, p99=(2.0, 0.1, 0.1),
                                 per_minute=(3000, 600, 60)), state)
        out.append(d)
    assert out[0] is None and out[1] is None
    assert out[2].replicas[0] == planned[0] + 1 and "fixer" in out[2].reason
    # With no free replica the fixer moves one from the calmest job (p99 < SLO / 2) ...
    state = p.initial_state(N)
    _, state = p.decide(snap(6, minutes=20), state)
    full = run_from(p, state, [snap(k, replicas=(4, 4, 4), minutes=20, p99=(2.0, 0.3, 0.1))
                               for k in range(7, 10)])
    assert full[2].replicas.tolist() == [5, 4, 3] and "taken from c" in full[2].reason
    # ... and does nothing when no job is calm, or when borrowing is off.
    for policy, p99 in ((p, (2.0, 0.5, 0.6)), (make_policy("faro-fairsum", borrow=False),
                                               (2.0, 0.1, 0.1))):
        state = policy.initial_state(N)
        _, state = policy.decide(snap(6, minutes=20), state)
        full = run_from(policy, state, [snap(k, replicas=(4, 4, 4), minutes=20, p99=p99)
                                        for k in range(7, 12)])
        assert all(d is None for d in full)


def test_faros_first_plan_waits_for_a_whole_minute_with_traffic() -> None:
    """A service started before its clients: minutes without a request are no forecast, nor
    is the minute the traffic began in (a part of one), so the first plan comes once the
    minute after it has closed, not 5 minutes later."""
    p = make_policy("faro-fairsum")
    state = p.initial_state(N)
    idle, state = p.decide(snap(12, minutes=2, per_minute=(0, 0, 0)), state)
    assert idle is None
    began = snap(19, minutes=3, per_minute=(0, 0, 0))
    began.history[:, -1] = (300, 60, 6)  # the clients started late in the third minute
    part, state = p.decide(began, state)
    assert part is None or "fixer" in part.reason
    busy = snap(25, minutes=4, per_minute=(0, 0, 0))
    busy.history[:, -2] = (300, 60, 6)
    busy.history[:, -1] = (3000, 600, 60)  # the fourth: a whole minute
    d, state = p.decide(busy, state)
    assert d is not None and "fixer" not in d.reason and d.replicas[0] > d.replicas[2]


def test_faro_plans_from_the_first_minute_when_traffic_was_there_from_the_start() -> None:
    """The replay's case: the history begins busy, so the first closed minute is whole."""
    d, _ = make_policy("faro-fairsum").decide(snap(7, minutes=1), make_policy(
        "faro-fairsum").initial_state(N))
    assert d is not None and "fixer" not in d.reason


def run_from(policy, state, snaps):
    out = []
    for s in snaps:
        d, state = policy.decide(s, state)
        out.append(d)
    return out


def test_every_registered_policy_stays_within_bounds() -> None:
    rng = np.random.default_rng(7)
    for name in POLICIES:
        p = make_policy(name)
        ctl = Controller(p, N)
        replicas = np.array([1, 1, 1])
        for k in range(1, 80):
            s = snap(k, replicas=tuple(replicas), quota=9, minutes=max(k // 6, 0),
                     p99=tuple(rng.uniform(0, 2, N)), ongoing=tuple(rng.integers(0, 30, N)),
                     arrivals=tuple(rng.integers(0, 300, N)),
                     per_minute=tuple(rng.integers(0, 3000, N)))
            d = ctl.step(s)
            if d is not None:
                replicas = d.replicas
                assert 1 <= replicas.min() and replicas.sum() <= 9, name
        assert len(ctl.log) > 0, name


def test_unknown_policy_and_bad_decisions() -> None:
    with pytest.raises(SpecError, match="--policy: unknown policy 'nope'"):
        make_policy("nope")
    s = snap(1, quota=4)
    with pytest.raises(DecisionError, match="exceed the quota 4"):
        check_decision(Decision(np.array([2, 2, 1]), np.ones(3), "test"), s)
    with pytest.raises(DecisionError, match="every job needs a replica"):
        check_decision(Decision(np.array([2, 0, 1]), np.ones(3), "test"), s)
    with pytest.raises(DecisionError, match="admission"):
        check_decision(Decision(np.array([1, 1, 1]), np.array([1, np.nan, 1]), "test"), s)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=8), st.data())
def test_fit_quota_within_bounds(current, data) -> None:
    n = len(current)
    desired = data.draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
    quota = data.draw(st.integers(max(n, 1), 60))
    cur = np.minimum(np.array(current), 1 + quota // n)
    got = fit_quota(cur, np.array(desired), quota)
    assert got.min() >= 1
    assert got.sum() <= max(quota, int(np.minimum(cur, np.maximum(desired, 1)).sum()))
    assert np.all(got <= np.maximum(np.array(desired), 1) + 0)  # never more than asked
    assert fair_share(n, quota).sum() == quota


def test_aiad_faro_waits_30s_up_and_600s_down_on_the_mean() -> None:
    p = make_policy("aiad-faro")
    ds = run(p, [snap(k, replicas=(2, 2, 2), p99=(1.0, 0.5, 0.5), arrivals=(50, 50, 50))
                 for k in range(1, 4)])
    assert ds[0] is None and ds[1] is None and ds[2].replicas.tolist() == [3, 2, 2]
    ds = run(p, [snap(k, replicas=(2, 2, 2), p99=(0.5, 0.5, 0.5), arrivals=(50, 50, 50))
                 for k in range(1, 61)])
    assert all(d is None for d in ds[:59]) and ds[59].replicas.tolist() == [1, 1, 1]
