"""Forecast quantiles, and the solver: quota, never worse than the rounded start, hierarchy."""

from __future__ import annotations

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.serve.predict import HoltForecaster, forecast_errors, naive_forecast
from plinth.serve.solver import HIER_JOBS, solve, solve_raising_quantile
from plinth.serve.utility import JobModel, objective


def _history(n: int, t: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.uniform(100, 1500, n)[:, None]
    wave = 1 + 0.3 * np.sin(np.arange(t)[None, :] / 20 + rng.uniform(0, 6, n)[:, None])
    return rng.poisson(base * wave)


def test_forecast_quantiles_are_ordered_and_shaped() -> None:
    f = HoltForecaster()
    qs = [0.1, 0.5, 0.6, 0.7, 0.9]
    out = f.quantiles(_history(6, 40), qs)
    assert out.shape == (6, 7, 5)
    assert np.all(np.diff(out, axis=2) >= 0) and np.all(out >= 0)
    # Uncertainty grows with the horizon.
    assert np.all(np.diff(out[:, :, -1] - out[:, :, 0], axis=1) >= -1e-9)


def test_forecast_edges() -> None:
    f = HoltForecaster()
    assert f.quantiles(np.zeros((3, 0)), [0.5]).shape == (3, 7, 1)
    flat = f.quantiles(np.full((1, 30), 400), [0.5])[0, :, 0]
    assert flat == pytest.approx(np.full(7, 400.0), rel=1e-6)
    with pytest.raises(SpecError, match="window"):
        HoltForecaster(window=10)
    with pytest.raises(SpecError, match="quantile"):
        f.quantiles(np.ones((1, 20)), [1.0])
    assert naive_forecast(np.array([[1, 2, 9]]), 3).tolist() == [[9.0, 9.0, 9.0]]


def test_forecast_error_report_against_naive() -> None:
    counts = _history(4, 120).T
    e = forecast_errors(counts, HoltForecaster())
    assert e["points"] > 0 and e["mae_model"] > 0 and e["mae_naive"] > 0
    assert 0.5 <= e["coverage_q90"] <= 1.0


def _model(n: int, load: float = 1.0, seed: int = 1, drop: bool = False) -> JobModel:
    rng = np.random.default_rng(seed)
    lam = rng.uniform(2, 25, (n, 1)) * load * np.ones((1, 7))
    return JobModel(lam, np.full(n, 0.18), np.full(n, 0.72), drop=drop)


@pytest.mark.parametrize("kind", ["sum", "fair", "hybrid"])
@pytest.mark.parametrize("load", [0.5, 1.0, 2.0])
def test_solver_respects_quota_and_beats_rounded_start(kind: str, load: float) -> None:
    m = _model(8, load)
    quota = 32
    start = np.array([1, 1, 1, 1, 1, 1, 1, 25], float)
    sol = solve(m, kind=kind, quota=quota, current=start)
    assert sol.replicas.sum() <= quota and sol.replicas.min() >= 1
    assert np.issubdtype(sol.replicas.dtype, np.integer)
    assert sol.value >= sol.start_value - 1e-9
    assert sol.value == pytest.approx(objective(m.utilities(sol.replicas.astype(float)), kind))
    assert not np.any(np.isnan(sol.utilities))


def test_solver_uses_free_replicas_when_they_help_and_leaves_them_when_not() -> None:
    light = _model(4, 0.05)
    sol = solve(light, kind="sum", quota=40, current=np.full(4, 10.0))
    assert sol.replicas.sum() < 40  # useless replicas are trimmed
    assert np.all(sol.utilities == 1.0)
    heavy = _model(4, 4.0)
    sol = solve(heavy, kind="sum", quota=40, current=np.ones(4))
    assert sol.replicas.sum() == 40 and sol.repaired and sol.utilities.min() < 1.0


def test_hierarchical_decomposition_above_twenty_jobs() -> None:
    small = solve(_model(HIER_JOBS), kind="hybrid", quota=100, current=np.full(HIER_JOBS, 5.0))
    assert not small.hierarchical
    n = 60
    m = _model(n, seed=3)
    big = solve(m, kind="hybrid", quota=240, current=np.full(n, 4.0))
    assert big.hierarchical
    assert big.replicas.sum() <= 240 and big.value >= big.start_value - 1e-9
    flat = solve(m, kind="hybrid", quota=240, current=np.full(n, 4.0), hierarchical=False)
    assert big.value >= 0.9 * flat.value  # the decomposition loses little


def test_quota_below_one_replica_per_job() -> None:
    with pytest.raises(SpecError, match="quota: 3 replicas cannot give 4 jobs"):
        solve(_model(4), kind="sum", quota=3, current=np.ones(4))
    with pytest.raises(SpecError, match="current"):
        solve(_model(4), kind="sum", quota=8, current=np.array([1.0, np.nan, 1.0, 1.0]))


def test_drop_objective_admits_less_only_when_short_of_replicas() -> None:
    # 21 req/s of 0.18 s requests needs a little over 4 replicas; each job can have 4.
    m = JobModel(np.full((4, 7), 21.0), np.full(4, 0.18), np.full(4, 0.72), drop=True)
    sol = solve(m, kind="sum", quota=16, current=np.full(4, 2.0))
    assert sol.admit.min() < 1.0 and sol.admit.max() <= 1.0
    roomy = solve(_model(4, 0.2, drop=True), kind="sum", quota=40, current=np.full(4, 2.0))
    assert np.all(roomy.admit == 1.0)


def test_raising_quantile_when_replicas_idle() -> None:
    base = _model(4, 0.3)

    def at(q: float) -> JobModel:  # a higher quantile forecasts more load
        return JobModel(base.lam * (1 + 2 * (q - 0.5)), base.service_s, base.slo_s)

    sol, q = solve_raising_quantile(at, q=0.5, kind="sum", quota=60, current=np.full(4, 2.0))
    assert q == pytest.approx(0.9)
    assert sol.replicas.sum() >= solve(at(0.5), kind="sum", quota=60,
                                       current=np.full(4, 2.0)).replicas.sum()
    tight, q = solve_raising_quantile(at, q=0.5, kind="sum", quota=10, current=np.full(4, 2.0))
    assert tight.replicas.sum() <= 10 and q < 0.9
