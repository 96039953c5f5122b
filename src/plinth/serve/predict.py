"""Probabilistic forecasts of per-minute request counts, for all jobs at once.

Faro used N-HiTS, a neural forecaster. In the same "sloppified" spirit Plinth uses a much cheaper
model: damped-trend exponential smoothing (Holt's method with a damped trend) on the square root of
the counts. The square root makes Poisson-like noise roughly constant in size, so one residual
spread per job gives usable quantiles: the h-step quantile is (m_h + z_q·σ·√(1 + (h−1)a²))², where
m_h is the damped-trend point forecast, σ the spread of the one-step errors over the window and a
the level smoothing weight. It needs no training, runs in microseconds for a hundred jobs, and is
plain numpy, so it is deterministic and has no extra dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from plinth.core.errors import SpecError


@dataclass(frozen=True, slots=True)
class HoltForecaster:
    """Damped-trend Holt smoothing on √counts. `window` minutes of history, `horizon` ahead."""

    window: int = 30
    horizon: int = 7
    level_w: float = 0.7  # a: weight of the newest point in the level
    trend_w: float = 0.01  # b: weight of the newest slope in the trend
    damping: float = 0.9  # φ: the trend fades by this factor each minute

    def __post_init__(self) -> None:
        if self.window < 15:
            raise SpecError(f"window: {self.window} minutes; at least 15 are needed")
        if self.horizon < 1:
            raise SpecError(f"horizon: {self.horizon}; at least 1 minute")
        for name in ("level_w", "trend_w", "damping"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise SpecError(f"{name}: {v} is not in (0, 1]")

    def quantiles(self, history: np.ndarray, qs: np.ndarray | list[float]) -> np.ndarray:
        """Forecast counts for the next `horizon` minutes at each quantile.

        history: (n_jobs, T) counts, oldest first (only the last `window` are used).
        Returns (n_jobs, horizon, len(qs)), non-decreasing along the last axis.
        """
        qs = np.asarray(qs, dtype=float)
        if np.any((qs <= 0) | (qs >= 1)):
            raise SpecError(f"quantile: {qs.tolist()} must lie strictly between 0 and 1")
        hist = np.asarray(history, dtype=float)
        if hist.ndim != 2:
            raise SpecError(f"history: expected (jobs, minutes), got shape {hist.shape}")
        n, t = hist.shape
        if t == 0:
            return np.zeros((n, self.horizon, qs.size))
        y = np.sqrt(np.maximum(hist[:, -self.window:], 0.0))
        a, b, phi = self.level_w, self.trend_w, self.damping
        level = y[:, 0].copy()
        trend = np.zeros(n)
        sq_err = np.zeros(n)
        for k in range(1, y.shape[1]):
            pred = level + phi * trend
            err = y[:, k] - pred
            sq_err += err * err
            new_level = pred + a * err
            trend = phi * trend + b * (new_level - level - phi * trend)
            level = new_level
        steps = max(y.shape[1] - 1, 1)
        # At least the Poisson spread of √counts (1/2), so a flat history is not over-trusted.
        sigma = np.maximum(np.sqrt(sq_err / steps), 0.5)
        h = np.arange(1, self.horizon + 1)
        damp = np.cumsum(phi**h)
        mean = level[:, None] + trend[:, None] * damp[None, :]
        spread = sigma[:, None] * np.sqrt(1.0 + (h - 1) * a * a)[None, :]
        z = norm.ppf(qs)
        root = mean[:, :, None] + spread[:, :, None] * z[None, None, :]
        return np.maximum(root, 0.0) ** 2


def naive_forecast(history: np.ndarray, horizon: int) -> np.ndarray:
    """The naive baseline: the last minute repeated, shape (n_jobs, horizon)."""
    hist = np.asarray(history, dtype=float)
    last = hist[:, -1] if hist.shape[1] else np.zeros(hist.shape[0])
    return np.repeat(last[:, None], horizon, axis=1)


def forecast_errors(counts: np.ndarray, model: HoltForecaster, *, every: int = 5,
                    start: int | None = None) -> dict[str, float]:
    """Mean absolute error of the median forecast and of the naive one, over rolling origins.

    counts: (minutes, jobs). Origins every `every` minutes, from `start` (default: the window).
    Also reports how often the 0.9 quantile covers the truth.
    """
    counts = np.asarray(counts, dtype=float)
    t0 = model.window if start is None else start
    h = model.horizon
    err_m, err_n, cover, total = 0.0, 0.0, 0.0, 0
    for origin in range(t0, counts.shape[0] - h + 1, every):
        hist = counts[:origin].T
        truth = counts[origin:origin + h].T
        qf = model.quantiles(hist, [0.5, 0.9])
        err_m += float(np.abs(qf[:, :, 0] - truth).sum())
        err_n += float(np.abs(naive_forecast(hist, h) - truth).sum())
        cover += float((truth <= qf[:, :, 1]).sum())
        total += truth.size
    if total == 0:
        raise SpecError(f"forecast: the trace has {counts.shape[0]} minutes; need more than "
                        f"{t0 + h}")
    mean_count = float(counts[t0:].mean()) or 1.0
    return {"mae_model": err_m / total, "mae_naive": err_n / total,
            "mae_ratio": (err_m / max(err_n, 1e-12)), "coverage_q90": cover / total,
            "mean_count": mean_count, "points": total}
