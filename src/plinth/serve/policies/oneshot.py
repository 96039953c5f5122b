"""Ratio scaling on the observed latency ("Oneshot", as Faro defines it), and Kubernetes HPA.

Oneshot is the baseline of the Faro paper (beomyeol/faro, `OneshotPolicy` with the 10-job
experiment's `autoscale_config.yaml`): every 10 s it reads each job's mean latency over the last
30 s; after 3 ticks in a row over the SLO (30 s) it sets replicas = ceil(replicas × latency / SLO),
and after 60 ticks in a row at or under it (600 s) it does the same, which then scales down in
proportion (a job with no requests falls to one replica). A job whose new replicas are still
starting gets no new action, and a scale-up takes only what the quota has free.

`Hpa` is the Kubernetes HPA rule on utilisation instead: desired = ceil(ready × utilisation /
target), where utilisation is the offered load per ready replica over the last window (arrivals ×
mean service time / (window × ready)). Changes within the 10 % tolerance are ignored, and a
scale-down uses the largest wish of the last 5 minutes (HPA's stabilisation window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.serve.policies.base import TICK_S, DelayedState, delayed, fit_quota, no_drop, starting
from plinth.serve.types import Decision, Snapshot


@dataclass(frozen=True, slots=True)
class Oneshot:
    """Faro's Oneshot: ceil(replicas × mean latency / SLO), after 30 s over or 600 s under."""

    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    name: str = "oneshot"

    def initial_state(self, n_jobs: int) -> DelayedState:
        return DelayedState.initial(n_jobs)

    def decide(self, snap: Snapshot, state: DelayedState) -> tuple[Decision | None, DelayedState]:
        lat, up, down, new = delayed(snap, state, self.look_back_s, self.upscale_delay_s,
                                     self.downscale_delay_s)
        act = (up | down) & ~starting(snap)
        factor = lat / snap.slo_s
        want = np.maximum(np.ceil(snap.replicas * factor - 1e-9), 1).astype(np.int64)
        target = np.where(act, want, snap.replicas)
        granted = fit_quota(snap.replicas, target, snap.quota)
        if np.array_equal(granted, snap.replicas):
            return None, new
        reason = (f"oneshot: {int((act & up).sum())} up, {int((act & down).sum())} down by "
                  f"latency / SLO")
        return Decision(granted, no_drop(snap.n), reason), new


@dataclass(frozen=True, slots=True)
class Hpa:
    """Kubernetes HPA: ceil(replicas × utilisation / 0.7), 10 % tolerance, 5 min down window."""

    target_util: float = 0.7
    tolerance: float = 0.1
    stabilise_s: float = 300.0
    name: str = "hpa"

    def initial_state(self, n_jobs: int) -> list[np.ndarray]:
        return []

    def decide(self, snap: Snapshot, state: list[np.ndarray]) -> tuple[Decision | None, list]:
        ready = np.maximum(snap.ready, 1)
        util = snap.window_arrivals * snap.service_s / (snap.window_s * ready)
        ratio = util / self.target_util
        desired = np.ceil(ready * ratio - 1e-9).astype(np.int64)
        desired = np.where(np.abs(ratio - 1.0) <= self.tolerance, snap.replicas, desired)
        desired = np.maximum(desired, 1)
        keep = max(1, round(self.stabilise_s / TICK_S))
        recent = (state + [desired])[-keep:]
        # Up at once; down only as far as the largest recent wish.
        target = np.where(desired >= snap.replicas, desired, np.max(recent, axis=0))
        if np.array_equal(target, snap.replicas):
            return None, recent
        granted = fit_quota(snap.replicas, target, snap.quota)
        if np.array_equal(granted, snap.replicas):  # the cluster is full: nothing changes
            return None, recent
        return Decision(granted, no_drop(snap.n), "hpa: proportional to load"), recent
