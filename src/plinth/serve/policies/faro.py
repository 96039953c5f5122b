"""Faro: cluster-wide, SLO-aware replica allocation.

Every `period_s` (5 min) the planner forecasts each job's arrivals for the next 7 minutes at
quantile q, turns them into relaxed utilities through the queueing latency model, and solves for
the replicas that maximise the cluster objective under the quota (raising q while replicas would
sit idle). Between plans a reactive fixer checks every tick: a job whose p99 latency is over its
SLO for `fix_after` ticks in a row gets one more replica. The planner hands out the whole quota
when that helps, so there is often no free replica; the fixer then moves one from a job whose last
p99 was under `donor_frac` × its SLO (the calmest first), as an additive-increase step that keeps
the cluster within its quota. (`borrow=False` restricts it to free replicas.) With
`cold_start_s` > 0 the planner knows that replicas it adds serve only after that long, so the first
minute of the horizon counts them in part (off by default: it did not measure better, see
docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from plinth.serve.policies.base import no_drop
from plinth.serve.predict import HoltForecaster
from plinth.serve.solver import solve_raising_quantile
from plinth.serve.types import Decision, Snapshot
from plinth.serve.utility import JobModel


@dataclass(slots=True)
class FaroState:
    last_plan: float
    streak: np.ndarray  # ticks in a row over the SLO
    admit: np.ndarray


@dataclass(frozen=True, slots=True)
class Faro:
    """Faro: forecast, relaxed utilities, cluster-wide solver; plus a +1 reactive fixer."""

    objective: str = "hybrid"
    drop: bool = False
    quantile: float = 0.6
    alpha: float = 1.0
    period_s: float = 300.0
    fix_after: int = 3
    borrow: bool = True
    donor_frac: float = 0.5
    cold_start_s: float = 0.0  # > 0: plan knowing that added replicas start this late
    forecaster: HoltForecaster = field(default_factory=HoltForecaster)
    name: str = "faro-fairsum"

    def initial_state(self, n_jobs: int) -> FaroState:
        return FaroState(-np.inf, np.zeros(n_jobs, np.int64), np.ones(n_jobs))

    def plan(self, snap: Snapshot, current: np.ndarray) -> Decision:
        quants = np.round(np.arange(self.quantile, 0.9 + 1e-9, 0.1), 6)
        fc = self.forecaster.quantiles(snap.history, quants)  # (jobs, horizon, quantiles)

        def model_at(q: float) -> JobModel:
            k = int(np.argmin(np.abs(quants - q)))
            return JobModel(fc[:, :, k] / 60.0, snap.service_s, snap.slo_s, self.alpha, self.drop,
                            current, self.cold_start_s / 60.0)

        sol, _ = solve_raising_quantile(model_at, q=self.quantile, kind=self.objective,
                                        quota=snap.quota, current=current)
        admit = sol.admit if self.drop else no_drop(snap.n)
        return Decision(sol.replicas, admit, f"{self.name}: {sol.reason}", sol.solve_ms)

    def decide(self, snap: Snapshot, state: FaroState) -> tuple[Decision | None, FaroState]:
        if snap.now - state.last_plan >= self.period_s and _whole_minute_of_traffic(snap.history):
            d = self.plan(snap, snap.replicas.astype(float))
            return d, FaroState(snap.now, np.zeros(snap.n, np.int64), d.admit)
        over = snap.window_p99_s > snap.slo_s
        streak = np.where(over, state.streak + 1, 0)
        fix = np.nonzero(streak >= self.fix_after)[0]
        fix = fix[np.argsort(-streak[fix], kind="stable")]  # worst streak first
        ratio = snap.window_p99_s / snap.slo_s
        donors = np.nonzero((ratio < self.donor_frac) & (snap.replicas > 1))[0] if (
            self.borrow) else np.zeros(0, np.int64)
        donors = donors[np.argsort(ratio[donors], kind="stable")]
        free = max(snap.free, 0)
        fix = fix[: free + donors.size]
        if fix.size == 0:
            return None, FaroState(state.last_plan, streak, state.admit)
        target = snap.replicas.copy()
        target[fix] += 1
        taken = donors[: max(fix.size - free, 0)]
        target[taken] -= 1
        streak[fix] = 0
        reason = f"{self.name} fixer: +1 for {', '.join(snap.jobs[j] for j in fix)}"
        if taken.size:
            reason += f", taken from {', '.join(snap.jobs[j] for j in taken)}"
        return Decision(target, state.admit, reason), FaroState(state.last_plan, streak,
                                                                 state.admit)


def _whole_minute_of_traffic(history: np.ndarray) -> bool:
    """Whether the closed minutes hold one whole minute of traffic to plan from. A plan from
    a service's idle minutes (started before its clients) would hold it at its minimum until
    the next plan, 5 minutes on; so would one from the minute its traffic began in, which after
    idle minutes is a part of one (seen on the real path: a first plan at minute 1 or at minute
    5, by when in the minute the clients started)."""
    busy = history.any(axis=0)
    if not busy.any():
        return False
    first = int(np.argmax(busy))
    return first == 0 or history.shape[1] - first >= 2
