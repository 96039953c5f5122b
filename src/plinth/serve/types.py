"""The data that flows between the serving runtime (simulated or real), the controller and the
policies. Hot state is numpy arrays with one entry per job, in a fixed job order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a policy sees at time `now` (seconds since the start)."""

    now: float
    jobs: tuple[str, ...]
    slo_s: np.ndarray
    service_s: np.ndarray  # mean service time per request on one replica
    quota: int  # replicas the whole cluster can run (1 CPU each)
    replicas: np.ndarray  # int: current target per job, including replicas still starting
    ready: np.ndarray  # int: replicas that serve now
    history: np.ndarray  # int (jobs, minutes): arrivals in each complete minute, oldest first
    window_s: float  # length of the last observation window
    window_arrivals: np.ndarray  # requests that arrived in the window
    window_p99_s: np.ndarray  # p99 latency of those requests (0 when there were none)
    ongoing: np.ndarray  # requests in the system now (queued + in service)
    # Mean latency of the window's requests (a dropped one counts as 10 × SLO); None where the
    # runtime does not report it, and policies that use it fall back to the p99.
    window_mean_s: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.jobs)

    @property
    def free(self) -> int:
        return int(self.quota - self.replicas.sum())


@dataclass(frozen=True, slots=True)
class Decision:
    """Target replicas (and admission rate) per job, with the reason shown to the user."""

    replicas: np.ndarray
    admit: np.ndarray
    reason: str
    solver_ms: float = field(default=0.0)
