"""MArk-style predictive scaling with additive increase, as Faro configures it for its baseline.

Faro's MArk (beomyeol/faro, the `hybrid` controller of `pred_darts` and `ai` in the 10-job
experiment): every 5 minutes (the first time after one minute) it forecasts each job's next
7 minutes at quantile 0.6, takes the peak rate λ (req/s) and sets replicas = ceil(λ · p / SLO)
with p the processing time and the SLO in the same unit (Faro: 180 ms and 720 ms, so one replica
per 4 req/s, an offered load of 0.72 CPU at a 180 ms request). Between plans an additive
increase reacts: +1 for a job whose mean latency over the last 30 s has been over the SLO at
3 ticks since its last action (the counters restart at each plan), never −1; a job whose new replicas are still
starting is left alone. Jobs plan on their own; the cluster grants what fits, in job order
(`first_come`, as Faro's executor: shrinking jobs first, then the growing ones one after another,
so a job late in the order can be starved when the wishes exceed the quota).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plinth.serve.policies.base import TICK_S, fit_in_order, fit_quota, look_back, no_drop, starting
from plinth.serve.predict import HoltForecaster
from plinth.serve.types import Decision, Snapshot


@dataclass(slots=True)
class MarkState:
    last_plan: float
    recent: tuple[np.ndarray, ...]
    count: np.ndarray


@dataclass(frozen=True, slots=True)
class Mark:
    """MArk as in Faro: ceil(forecast peak × p / SLO) every 5 min, +1 on 30 s over the SLO."""

    quantile: float = 0.6
    period_s: float = 300.0
    first_s: float = 60.0
    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    first_come: bool = True  # grant the quota in job order, as Faro's executor does
    forecaster: HoltForecaster = field(default_factory=HoltForecaster)
    name: str = "mark"

    def initial_state(self, n_jobs: int) -> MarkState:
        return MarkState(-np.inf, (), np.zeros(n_jobs, np.int64))

    def decide(self, snap: Snapshot, state: MarkState) -> tuple[Decision | None, MarkState]:
        lat, recent = look_back(state.recent, snap, max(1, round(self.look_back_s / TICK_S)))
        # Plans at first_s, then at every multiple of period_s (Faro: 60 s, 300 s, 600 s, …).
        due = snap.now >= self.first_s and (not np.isfinite(state.last_plan) or (
            snap.now // self.period_s > state.last_plan // self.period_s))
        if due and snap.history.shape[1] > 0:
            fc = self.forecaster.quantiles(snap.history, [self.quantile])[:, :, 0]
            peak = fc.max(axis=1) / 60.0
            desired = np.maximum(np.ceil(peak * snap.service_s / snap.slo_s - 1e-9), 1)
            fit = fit_in_order if self.first_come else fit_quota
            granted = fit(snap.replicas, desired.astype(np.int64), snap.quota)
            new = MarkState(snap.now, recent, np.zeros(snap.n, np.int64))
            return Decision(granted, no_drop(snap.n), "mark: forecast peak × p / SLO"), new
        # Faro's additive increase counts ticks over the SLO since its last action (a tick under
        # it does not reset the count), and skips jobs that are still scaling.
        count = state.count + ((lat > snap.slo_s) & ~starting(snap))
        up = count >= self.upscale_delay_s // TICK_S
        count = np.where(up, 0, count)
        new = MarkState(state.last_plan, recent, count)
        granted = fit_quota(snap.replicas, snap.replicas + up, snap.quota)
        if np.array_equal(granted, snap.replicas):
            return None, new
        return Decision(granted, no_drop(snap.n), f"mark: +1 for {int(up.sum())} over the SLO"), new
