"""The policy interface and the helpers every policy shares.

A policy is pure: `decide(snapshot, state) -> (decision or None, state)`. All it knows of time is
`snapshot.now`; it keeps its memory (streaks, last planning time) in the state it returns, never in
itself, so one policy object can drive any number of runs and tests can replay it tick by tick.
"""

from __future__ import annotations

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


def no_drop(n: int) -> np.ndarray:
    return np.ones(n)
