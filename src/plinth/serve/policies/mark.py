"""MArk/Cocktail-style predictive proportional scaling.

Every planning period, forecast the next minutes (median of the same forecaster Faro uses), take
the peak, and provision replicas = ceil(peak rate × service time / target utilisation). Jobs plan
on their own; the cluster grants what fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plinth.serve.policies.base import fit_quota, no_drop
from plinth.serve.predict import HoltForecaster
from plinth.serve.types import Decision, Snapshot


@dataclass(frozen=True, slots=True)
class Mark:
    """Predictive proportional (MArk): ceil(forecast peak × service time / 0.8) every 5 min."""

    target_util: float = 0.8
    period_s: float = 300.0
    forecaster: HoltForecaster = field(default_factory=HoltForecaster)
    name: str = "mark"

    def initial_state(self, n_jobs: int) -> float:
        return -np.inf  # when it last planned

    def decide(self, snap: Snapshot, last: float) -> tuple[Decision | None, float]:
        if snap.history.shape[1] == 0 or snap.now - last < self.period_s:
            return None, last
        peak = self.forecaster.quantiles(snap.history, [0.5])[:, :, 0].max(axis=1) / 60.0
        desired = np.maximum(np.ceil(peak * snap.service_s / self.target_util - 1e-9), 1)
        granted = fit_quota(snap.replicas, desired.astype(np.int64), snap.quota)
        return Decision(granted, no_drop(snap.n), "mark: forecast peak / target"), snap.now
