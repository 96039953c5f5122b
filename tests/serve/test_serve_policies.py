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


def test_oneshot_scales_up_at_once_and_down_after_the_window() -> None:
    p = make_policy("oneshot")
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


def test_mark_plans_every_five_minutes_from_the_forecast() -> None:
    p = make_policy("mark")
    ds = run(p, [snap(k, minutes=20, per_minute=(1200, 60, 600)) for k in range(1, 40)])
    plans = [i for i, d in enumerate(ds) if d is not None]
    assert plans == [0, 30]
    # 20 req/s × 0.18 s / 0.8 → 5; 1 req/s → 1; 10 req/s → 3.
    assert ds[0].replicas.tolist() == [5, 1, 3]


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
