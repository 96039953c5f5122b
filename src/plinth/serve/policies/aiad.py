"""Additive increase, additive decrease on the observed tail latency.

+1 replica when the last window's p99 is over the SLO; −1 after `calm_ticks` windows in a row
with p99 under `low_frac` × SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.serve.policies.base import fit_quota, no_drop
from plinth.serve.types import Decision, Snapshot


@dataclass(frozen=True, slots=True)
class Aiad:
    """AIAD: +1 when p99 > SLO, −1 after 3 windows with p99 < 0.5 × SLO."""

    low_frac: float = 0.5
    calm_ticks: int = 3
    name: str = "aiad"

    def initial_state(self, n_jobs: int) -> np.ndarray:
        return np.zeros(n_jobs, np.int64)

    def decide(self, snap: Snapshot, calm: np.ndarray) -> tuple[Decision | None, np.ndarray]:
        over = snap.window_p99_s > snap.slo_s
        low = snap.window_p99_s < self.low_frac * snap.slo_s
        calm = np.where(low, calm + 1, 0)
        down = (calm >= self.calm_ticks) & (snap.replicas > 1)
        target = snap.replicas + over.astype(np.int64) - down.astype(np.int64)
        calm = np.where(down, 0, calm)
        if np.array_equal(target, snap.replicas):
            return None, calm
        granted = fit_quota(snap.replicas, target, snap.quota)
        if np.array_equal(granted, snap.replicas):  # the cluster is full: nothing changes
            return None, calm
        reason = f"aiad: {int(over.sum())} over the SLO, {int(down.sum())} calm"
        return Decision(granted, no_drop(snap.n), reason), calm
