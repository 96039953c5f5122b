"""The policy interface and the helpers every policy shares.

A policy is pure: `decide(snapshot, state) -> (decision or None, state)`. All it knows of time is
`snapshot.now`; it keeps its memory (streaks, last planning time) in the state it returns, never in
itself, so one policy object can drive any number of runs and tests can replay it tick by tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from plinth.serve.types import Decision, Snapshot

TICK_S = 10.0  # how often the controller calls a policy


class Policy(Protocol):
    name: str

    def initial_state(self, n_jobs: int) -> Any: ...

    def decide(self, snap: Snapshot, state: Any) -> tuple[Decision | None, Any]: ...


def fair_share(n_jobs: int, quota: int) -> np.ndarray:
    """quota / n replicas each; the remainder goes to the first jobs."""
    base = np.full(n_jobs, quota // n_jobs, dtype=np.int64)
    base[: quota - int(base.sum())] += 1
    return base


def fit_quota(current: np.ndarray, desired: np.ndarray, quota: int,
              min_replicas: int = 1) -> np.ndarray:
    """What a cluster with `quota` replicas grants to jobs that scale on their own.

    Shrinking jobs shrink at once. Growing jobs share the free replicas one at a time, the job
    furthest below its wish first, as pending replicas would be scheduled when capacity frees up.
    """
    current = np.asarray(current, np.int64)
    want = np.maximum(np.asarray(desired, np.int64), min_replicas)
    out = np.minimum(current, want)
    free = quota - int(out.sum())
    short = want - out
    while free > 0 and short.max() > 0:
        j = int(np.argmax(short))
        out[j] += 1
        short[j] -= 1
        free -= 1
    return out


def fit_in_order(current: np.ndarray, desired: np.ndarray, quota: int,
                 min_replicas: int = 1) -> np.ndarray:
    """What Faro's executor grants: shrinking jobs shrink first, then growing jobs take what is
    free in job order, first come, first served (a later job can get nothing)."""
    current = np.asarray(current, np.int64)
    want = np.maximum(np.asarray(desired, np.int64), min_replicas)
    out = np.minimum(current, want)
    free = quota - int(out.sum())
    for j in np.nonzero(want > out)[0]:
        add = min(int(want[j] - out[j]), max(free, 0))
        out[j] += add
        free -= add
    return out


def no_drop(n: int) -> np.ndarray:
    return np.ones(n)


def mean_latency(snap: Snapshot) -> np.ndarray:
    """The window's mean latency per job, or its p99 where the runtime reports no mean."""
    return snap.window_p99_s if snap.window_mean_s is None else snap.window_mean_s


def look_back(recent: tuple[np.ndarray, ...], snap: Snapshot,
              ticks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Mean latency over the last `ticks` windows, weighted by their arrivals (0 with none), as
    Faro's baselines read it (a 30 s look-back, 3 ticks). `recent` holds rows of
    (arrivals, mean) and is returned with this window's row added."""
    row = np.stack([snap.window_arrivals.astype(float), mean_latency(snap)])
    recent = (recent + (row,))[-ticks:]
    n = sum(r[0] for r in recent)
    total = sum(r[0] * r[1] for r in recent)
    return np.where(n > 0, total / np.maximum(n, 1.0), 0.0), recent


def streaks(count: np.ndarray, over: np.ndarray) -> np.ndarray:
    """Faro's up/down counters: +k after k ticks in a row over the target, −k after k under."""
    return np.where(over, np.where(count < 0, 1, count + 1), np.where(count > 0, -1, count - 1))


@dataclass(slots=True)
class DelayedState:
    """What Faro's delayed policies (AIAD as Faro runs it, Oneshot) keep between ticks."""

    recent: tuple[np.ndarray, ...]  # the look-back's (arrivals, mean latency) rows
    count: np.ndarray  # +k: k ticks in a row over the SLO; −k: k at or under it

    @classmethod
    def initial(cls, n_jobs: int) -> DelayedState:
        return cls((), np.zeros(n_jobs, np.int64))


def delayed(snap: Snapshot, state: DelayedState, look_back_s: float, upscale_delay_s: float,
            downscale_delay_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, DelayedState]:
    """One tick of Faro's delays: (mean latency over the look-back, jobs due to go up, jobs
    due to go down, the next state). A job's streak restarts once it is due."""
    lat, recent = look_back(state.recent, snap, max(1, round(look_back_s / TICK_S)))
    count = streaks(state.count, lat > snap.slo_s)
    up = count >= upscale_delay_s // TICK_S
    down = -count >= downscale_delay_s // TICK_S
    return lat, up, down, DelayedState(recent, np.where(up | down, 0, count))


def starting(snap: Snapshot) -> np.ndarray:
    """Jobs with replicas still starting: Faro's executor takes no new action for them."""
    return snap.replicas > snap.ready
