"""Kubernetes HPA-style proportional scaling ("Oneshot").

desired = ceil(ready × utilisation / target), where utilisation is the offered load per ready
replica over the last window (arrivals × mean service time / (window × ready)). Changes within the
10 % tolerance are ignored, and a scale-down uses the largest wish of the last 5 minutes (HPA's
stabilisation window), so one quiet window does not shed replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.serve.policies.base import TICK_S, fit_quota, no_drop
from plinth.serve.types import Decision, Snapshot


@dataclass(frozen=True, slots=True)
class Oneshot:
    """HPA-style: ceil(replicas × utilisation / target 0.7), 10 % tolerance, 5 min down window."""

    target_util: float = 0.7
    tolerance: float = 0.1
    stabilise_s: float = 300.0
    name: str = "oneshot"

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
        return Decision(granted, no_drop(snap.n), "oneshot: proportional to load"), recent
