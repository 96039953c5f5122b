"""Ray Serve's default autoscaling policy, per job.

desired = ceil(ongoing requests / target_ongoing_requests), averaged over a 30 s look-back. A job
scales up only after wanting more for `upscale_delay_s`, and down only after wanting fewer for
`downscale_delay_s` (Ray Serve's defaults: target 2, 30 s, 600 s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.serve.policies.base import TICK_S, fit_quota, no_drop
from plinth.serve.types import Decision, Snapshot


@dataclass(slots=True)
class RayServeState:
    ongoing: list[np.ndarray]  # the last look-back samples
    up: np.ndarray  # seconds the job has wanted more replicas
    down: np.ndarray  # seconds it has wanted fewer


@dataclass(frozen=True, slots=True)
class RayServe:
    """Ray Serve default: ongoing requests / target (2), delays 30 s up and 600 s down."""

    target_ongoing: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_s: float = 30.0
    name: str = "ray-serve"

    def initial_state(self, n_jobs: int) -> RayServeState:
        return RayServeState([], np.zeros(n_jobs), np.zeros(n_jobs))

    def decide(self, snap: Snapshot, state: RayServeState) -> tuple[Decision | None, RayServeState]:
        keep = max(1, round(self.look_back_s / TICK_S))
        samples = (state.ongoing + [snap.ongoing.astype(float)])[-keep:]
        avg = np.mean(samples, axis=0)
        desired = np.maximum(np.ceil(avg / self.target_ongoing - 1e-9), 1).astype(np.int64)
        cur = snap.replicas
        up = np.where(desired > cur, state.up + TICK_S, 0.0)
        down = np.where(desired < cur, state.down + TICK_S, 0.0)
        target = cur.copy()
        go_up = up >= self.upscale_delay_s
        go_down = down >= self.downscale_delay_s
        target[go_up] = desired[go_up]
        target[go_down] = desired[go_down]
        new_state = RayServeState(samples, np.where(go_up, 0.0, up), np.where(go_down, 0.0, down))
        if not (go_up.any() or go_down.any()):
            return None, new_state
        granted = fit_quota(cur, target, snap.quota)
        if np.array_equal(granted, cur):  # the cluster is full: nothing changes
            return None, new_state
        reason = f"ray-serve: {int(go_up.sum())} up, {int(go_down.sum())} down"
        return Decision(granted, no_drop(snap.n), reason), new_state
