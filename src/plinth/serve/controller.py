"""The control loop's functional core, shared line for line by the simulator and the real path.

`Controller.step(snapshot)` asks the policy for a decision, checks it (whole replica counts, at
least one per job, within the quota, admission rates in [0, 1], no NaN) and records why it was
made in a bounded log. The caller, simulated or real, carries the decision out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from plinth.core.errors import PlinthError
from plinth.serve.policies.base import Policy
from plinth.serve.types import Decision, Snapshot


class DecisionError(PlinthError):
    """A policy returned a decision that cannot be carried out (a bug in the policy)."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    now: float
    replicas: tuple[int, ...]
    reason: str


class Controller:
    """Holds one policy's state between ticks; everything else comes in through snapshots."""

    def __init__(self, policy: Policy, n_jobs: int, *, log_size: int = 1000) -> None:
        self.policy = policy
        self.state: Any = policy.initial_state(n_jobs)
        self.log: deque[LogEntry] = deque(maxlen=log_size)
        self.solver_ms: list[float] = []

    def step(self, snap: Snapshot) -> Decision | None:
        decision, self.state = self.policy.decide(snap, self.state)
        if decision is None:
            return None
        check_decision(decision, snap)
        if decision.solver_ms > 0:
            self.solver_ms.append(decision.solver_ms)
        self.log.append(LogEntry(snap.now, tuple(int(r) for r in decision.replicas),
                                 decision.reason))
        return decision


def check_decision(d: Decision, snap: Snapshot) -> None:
    r = np.asarray(d.replicas)
    a = np.asarray(d.admit, float)
    where = f"{d.reason!r} at t={snap.now:g}s"
    if r.shape != (snap.n,) or a.shape != (snap.n,):
        raise DecisionError(f"{where}: expected {snap.n} replica counts and admission rates")
    if not np.issubdtype(r.dtype, np.integer):
        raise DecisionError(f"{where}: replica counts must be whole numbers, got {r.tolist()}")
    if r.min() < 1:
        raise DecisionError(f"{where}: every job needs a replica, got {r.tolist()}")
    if int(r.sum()) > snap.quota:
        raise DecisionError(f"{where}: {int(r.sum())} replicas exceed the quota {snap.quota}")
    if not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > 1:
        raise DecisionError(f"{where}: admission rates must lie in [0, 1], got {a.tolist()}")
