"""The latency model against textbook Erlang C, and the utility functions' invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.errors import SpecError
from plinth.serve.latency import RHO_MAX, erlang_c, erlang_c_recursive, latency
from plinth.serve.utility import (
    JobModel,
    drop_penalty,
    objective,
    precise_utility,
    relaxed_utility,
    smooth_objective,
)


def test_erlang_c_known_value() -> None:
    # A textbook M/M/2 with a = 1 (ρ = 0.5): C = 1/3.
    assert erlang_c(np.array(2.0), np.array(1.0)) == pytest.approx(1 / 3, rel=1e-12)
    assert erlang_c(np.array(1.0), np.array(0.7)) == pytest.approx(0.7, rel=1e-12)


@pytest.mark.parametrize("c", [1, 2, 5, 13, 40])
def test_erlang_c_matches_recursion(c: int) -> None:
    for a in np.linspace(0.05, 0.97 * c, 7):
        assert erlang_c(np.array(float(c)), np.array(a)) == pytest.approx(
            erlang_c_recursive(c, float(a)), rel=1e-9)


def test_erlang_c_matches_brute_force_mmc() -> None:
    # Stationary distribution of the M/M/c birth-death chain, truncated far out.
    c, lam, mu = 4, 3.0, 1.0
    k = np.arange(400)
    w = np.array([np.prod([lam / (mu * min(i, c)) for i in range(1, n + 1)]) for n in k[:400]])
    pi = w / w.sum()
    assert erlang_c(np.array(float(c)), np.array(lam / mu)) == pytest.approx(pi[c:].sum(),
                                                                             rel=1e-9)


def test_latency_is_service_time_without_load_and_grows_with_it() -> None:
    p = 0.18
    assert latency(np.array(0.0), np.array(3.0), p) == pytest.approx(p)
    lam = np.linspace(0, 60, 200)
    lat = latency(lam, np.full_like(lam, 5.0), p)
    assert np.all(np.isfinite(lat))
    assert np.all(np.diff(lat) >= -1e-12)
    assert lat[-1] > 10 * p  # far above ρ_max it keeps rising


def test_latency_above_cap_is_inflated_proportionally() -> None:
    c, p = 4.0, 0.2
    cap = RHO_MAX * c / p
    at_cap = latency(np.array(cap), np.array(c), p)
    assert latency(np.array(2 * cap), np.array(c), p) == pytest.approx(2 * at_cap)


def test_latency_fractional_c_between_integers_and_zero_is_finite() -> None:
    lam, p = 10.0, 0.2
    lo, mid, hi = latency(np.array([lam] * 3), np.array([3.0, 3.5, 4.0]), p)
    assert hi <= mid <= lo
    zero = latency(np.array(lam), np.array(0.0), p)
    assert np.isfinite(zero) and zero > lo


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 200.0), st.floats(0.0, 50.0), st.floats(0.01, 2.0), st.floats(0.5, 4.0))
def test_relaxed_utility_bounded_and_monotone_in_replicas(lam, c, p, alpha) -> None:
    slo = 4 * p
    cs = np.array([c, c + 0.5, c + 1.0])
    u = relaxed_utility(latency(np.full(3, lam), cs, p), slo, alpha)
    assert np.all((u >= 0) & (u <= 1)) and not np.any(np.isnan(u))
    assert u[0] <= u[1] + 1e-12 <= u[2] + 2e-12


def test_relaxed_utility_is_one_within_slo() -> None:
    assert relaxed_utility(np.array([0.1, 0.5, 1.0]), 0.5).tolist() == [1.0, 1.0, 0.5]
    assert precise_utility(np.array([0.1, 0.5, 1.0, 2.0]), 0.5) == 0.5
    assert precise_utility(np.array([]), 0.5) == 1.0


def test_drop_penalty_staircase() -> None:
    d = np.linspace(0, 1, 101)
    pen = drop_penalty(d)
    assert pen[0] == 0 and pen[-1] == 1
    assert np.all(np.diff(pen) >= 0) and np.all(pen >= d - 1e-12)


def test_drop_variant_drops_only_when_overloaded() -> None:
    lam = np.array([[1.0] * 3, [22.0] * 3])  # 4 replicas of 0.18 s carry ~21 req/s
    m = JobModel(lam, np.array([0.18, 0.18]), np.array([0.72, 0.72]), drop=True)
    u, admit = m.utilities_and_admit(np.array([4.0, 4.0]))
    assert admit[0] == 1.0 and admit[1] < 1.0
    plain = JobModel(lam, m.service_s, m.slo_s).utilities(np.array([4.0, 4.0]))
    assert u[1] > plain[1]  # shedding a little load beats a queue that overflows the SLO


def test_objectives() -> None:
    u = np.array([1.0, 0.5, 0.8])
    assert objective(u, "sum") == pytest.approx(2.3)
    assert objective(u, "fair") == pytest.approx(-0.5)
    assert objective(u, "hybrid") == pytest.approx(2.3 + 3 * 0.5)
    for kind in ("sum", "fair", "hybrid"):
        val, grad = smooth_objective(u, kind)
        assert val <= objective(u, kind) + 1e-9 and grad.shape == u.shape
    with pytest.raises(SpecError, match="objective"):
        objective(u, "max")


def test_job_model_rejects_slo_below_service_time() -> None:
    with pytest.raises(SpecError, match="slo: job 1"):
        JobModel(np.ones((2, 3)), np.array([0.1, 0.5]), np.array([0.7, 0.4]))
    with pytest.raises(SpecError, match="lam"):
        JobModel(np.full((1, 3), np.nan), np.array([0.1]), np.array([0.7]))


def test_cold_start_aware_model_discounts_only_added_replicas() -> None:
    lam = np.full((2, 7), 10.0)
    kw = {"service_s": np.full(2, 0.18), "slo_s": np.full(2, 0.72)}
    plain = JobModel(lam, **kw)
    aware = JobModel(lam, **kw, c_now=np.array([1.0, 3.0]), ramp=35.0 / 60.0)
    c = np.array([3.0, 3.0])  # job 0 adds two replicas, job 1 keeps its three
    u_plain, u_aware = plain.utilities(c), aware.utilities(c)
    assert u_aware[0] < u_plain[0]  # its first minute runs mostly on one replica
    assert u_aware[1] == u_plain[1]
    # Stacked candidates and subsets see the same discount.
    both = aware.utilities(np.concatenate([c, c]))
    np.testing.assert_allclose(both, np.concatenate([u_aware, u_aware]))
    np.testing.assert_allclose(aware.subset(np.array([0])).utilities(c[:1]), u_aware[:1])
