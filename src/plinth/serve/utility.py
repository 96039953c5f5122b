"""Utilities per job and the cluster objectives built from them.

A job's precise utility is a step: the fraction of its requests answered within the SLO. That is
flat almost everywhere, so an optimiser learns nothing from it. Faro "sloppifies" it into
U = min(1, (SLO / latency)^α), which is 1 while the modelled tail latency meets the SLO and falls
smoothly after.

Dropping a fraction d = 1 − a of requests shortens the queue but costs a penalty P(d), a
piecewise-linear staircase that rises fast once more than a few per cent are dropped; the effective
utility is U(aλ)·(1 − P(d)). The best admission rate for given replicas is found on a grid, so the
solver still optimises over replica counts only.

Objectives, all maximised over the vector u of job utilities:
- sum: Σu;
- fair: min u − max u;
- hybrid ("fairsum"): Σu + n·(min u − max u + 1).
The continuous solver uses a smooth min and max (log-sum-exp) so that fair and hybrid have gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.core.errors import SpecError
from plinth.serve.latency import latency

OBJECTIVES = ("sum", "fair", "hybrid")

# The drop penalty P(d): knots of a piecewise-linear staircase (d, P). P(d) >= d, since a dropped
# request is an SLO violation in any case.
PENALTY_D = np.array([0.0, 0.02, 0.05, 0.10, 0.20, 0.50, 1.0])
PENALTY_P = np.array([0.0, 0.03, 0.10, 0.25, 0.50, 0.90, 1.0])
ADMIT_GRID = np.array([1.0, 0.99, 0.98, 0.96, 0.94, 0.92, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5])
SMOOTH_K = 40.0  # sharpness of the smooth min/max used by the continuous solver


def precise_utility(latencies_s: np.ndarray, slo_s: float) -> float:
    """The fraction of requests within the SLO (1.0 for no requests)."""
    lat = np.asarray(latencies_s, dtype=float)
    return 1.0 if lat.size == 0 else float(np.mean(lat <= slo_s))


def relaxed_utility(latency_s: np.ndarray, slo_s: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """min(1, (SLO / latency)^α), vectorised; never NaN for positive inputs."""
    ratio = np.asarray(slo_s, float) / np.maximum(np.asarray(latency_s, float), 1e-12)
    return np.minimum(1.0, ratio**alpha)


def drop_penalty(drop: np.ndarray) -> np.ndarray:
    """P(d) for a dropped fraction d in [0, 1]."""
    return np.interp(np.clip(drop, 0.0, 1.0), PENALTY_D, PENALTY_P)


@dataclass(frozen=True, slots=True)
class JobModel:
    """What the solver knows of each job. Arrays have one row per job.

    lam: forecast arrival rate (req/s) for each minute of the horizon, shape (n, H).
    c_now, ramp: cold-start-aware planning (off unless both are given). Replicas added beyond
    c_now serve only for the last (1 − ramp) of the first minute (ramp = cold start / 60 s), so
    a plan that leans on new replicas pays for their start.
    """

    lam: np.ndarray
    service_s: np.ndarray
    slo_s: np.ndarray
    alpha: float = 1.0
    drop: bool = False
    c_now: np.ndarray | None = None
    ramp: float = 0.0

    def __post_init__(self) -> None:
        if self.lam.ndim != 2 or self.lam.shape[0] != self.service_s.shape[0]:
            raise SpecError(f"lam: shape {self.lam.shape} does not match {len(self.service_s)} jobs")
        if not np.all(np.isfinite(self.lam)) or np.any(self.lam < 0):
            raise SpecError("lam: forecast arrival rates must be finite and >= 0")
        bad = np.nonzero(self.slo_s <= self.service_s)[0]
        if bad.size:
            j = int(bad[0])
            raise SpecError(f"slo: job {j} has SLO {self.slo_s[j]:.3f} s, not above its service "
                            f"time {self.service_s[j]:.3f} s")

    @property
    def n(self) -> int:
        return int(self.service_s.shape[0])

    def subset(self, idx: np.ndarray) -> JobModel:
        c_now = None if self.c_now is None else self.c_now[idx]
        return JobModel(self.lam[idx], self.service_s[idx], self.slo_s[idx], self.alpha, self.drop,
                        c_now, self.ramp)

    def utilities(self, c: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """u_j(c_j) for each job (or the jobs in idx), averaged over the horizon. `c` may hold
        k candidate vectors end to end (length k·n); the result then has the same length."""
        return self.utilities_and_admit(c, idx)[0]

    def utilities_and_admit(self, c: np.ndarray,
                            idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        lam, p, slo = (self.lam, self.service_s, self.slo_s) if idx is None else (
            self.lam[idx], self.service_s[idx], self.slo_s[idx])
        c = np.asarray(c, float)
        now = None if self.c_now is None or self.ramp <= 0 else (
            self.c_now if idx is None else self.c_now[idx])
        if c.size != p.size:  # several candidate vectors stacked end to end: tile the jobs
            reps = c.size // p.size
            lam, p, slo = np.tile(lam, (reps, 1)), np.tile(p, reps), np.tile(slo, reps)
            now = None if now is None else np.tile(now, reps)
        ch = np.repeat(c[:, None], lam.shape[1], axis=1)  # replicas in each minute of the horizon
        if now is not None:  # added replicas start part-way through the first minute
            ch[:, 0] = np.minimum(c, now) + np.maximum(c - now, 0.0) * (1.0 - min(self.ramp, 1.0))
        if not self.drop:
            lat = latency(lam, ch, p[:, None])
            u = relaxed_utility(lat, slo[:, None], self.alpha).mean(axis=1)
            return u, np.ones_like(u)
        a = ADMIT_GRID[None, None, :]
        lat = latency(lam[:, :, None] * a, ch[:, :, None], p[:, None, None])
        u = relaxed_utility(lat, slo[:, None, None], self.alpha).mean(axis=1)  # (n, G)
        u = u * (1.0 - drop_penalty(1.0 - ADMIT_GRID))[None, :]
        best = np.argmax(u, axis=1)  # ties go to the first grid point, i.e. the least dropping
        return u[np.arange(u.shape[0]), best], ADMIT_GRID[best]


def objective(u: np.ndarray, kind: str) -> float:
    """The exact cluster objective of the utility vector u."""
    if kind == "sum":
        return float(u.sum())
    if kind == "fair":
        return float(u.min() - u.max())
    if kind == "hybrid":
        return float(u.sum() + u.size * (u.min() - u.max() + 1.0))
    raise SpecError(f"objective: unknown {kind!r}; choose one of {', '.join(OBJECTIVES)}")


def objective_rows(u: np.ndarray, kind: str) -> np.ndarray:
    """The objective of each row of a (k, n) matrix of utility vectors."""
    if kind == "sum":
        return u.sum(axis=1)
    spread = u.min(axis=1) - u.max(axis=1)
    if kind == "fair":
        return spread
    if kind == "hybrid":
        return u.sum(axis=1) + u.shape[1] * (spread + 1.0)
    raise SpecError(f"objective: unknown {kind!r}; choose one of {', '.join(OBJECTIVES)}")


def smooth_objective(u: np.ndarray, kind: str) -> tuple[float, np.ndarray]:
    """A smooth stand-in for the objective and its gradient with respect to u."""
    if kind == "sum":
        return float(u.sum()), np.ones_like(u)
    k = SMOOTH_K
    wmin = np.exp(-k * (u - u.min()))
    wmin /= wmin.sum()
    wmax = np.exp(k * (u - u.max()))
    wmax /= wmax.sum()
    smin = u.min() - np.log(np.exp(-k * (u - u.min())).sum()) / k
    smax = u.max() + np.log(np.exp(k * (u - u.max())).sum()) / k
    if kind == "fair":
        return float(smin - smax), wmin - wmax
    if kind == "hybrid":
        n = u.size
        return float(u.sum() + n * (smin - smax + 1.0)), 1.0 + n * (wmin - wmax)
    raise SpecError(f"objective: unknown {kind!r}; choose one of {', '.join(OBJECTIVES)}")
