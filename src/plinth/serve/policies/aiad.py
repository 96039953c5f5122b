"""Additive increase, additive decrease on the observed latency.

Plinth's AIAD (`aiad`): +1 replica when the last window's p99 is over the SLO; −1 after
`calm_ticks` windows in a row with p99 under `low_frac` × SLO.

`aiad-faro` is the rule as Faro's baseline runs it (beomyeol/faro `AIADPolicy` with the 10-job
experiment's `autoscale_config.yaml`): the mean latency over the last 30 s against the SLO, +1
after 3 ticks in a row over it, −1 after 60 ticks in a row at or under it, and no new action for
a job whose replicas are still starting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.serve.policies.base import (
    DelayedState,
    delayed,
    fit_quota,
    no_drop,
    starting,
)
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


@dataclass(frozen=True, slots=True)
class AiadFaro:
    """AIAD as Faro runs it: 30 s mean latency, +1 after 30 s over, −1 after 600 s under."""

    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    name: str = "aiad-faro"

    def initial_state(self, n_jobs: int) -> DelayedState:
        return DelayedState.initial(n_jobs)

    def decide(self, snap: Snapshot, state: DelayedState) -> tuple[Decision | None,
                                                                 DelayedState]:
        _, up, down, new = delayed(snap, state, self.look_back_s, self.upscale_delay_s,
                                   self.downscale_delay_s)
        act = ~starting(snap)
        target = snap.replicas + (up & act) - (down & act)
        granted = fit_quota(snap.replicas, target, snap.quota)
        if np.array_equal(granted, snap.replicas):
            return None, new
        reason = f"aiad-faro: {int((up & act).sum())} up, {int((down & act).sum())} down"
        return Decision(granted, no_drop(snap.n), reason), new
