"""Gavel's heterogeneity-aware max-min fairness as a linear program (Narayanan et al., OSDI'20).

Pure numerics: arrays in, arrays out, nothing about jobs or clusters. The policy in
`plinth.sched.policies.gavel` turns its snapshot into these arrays.

Variables are time fractions X[j, m] (job j runs on GPU model m that share of the time).

    maximise   t
    subject to sum_m X[j, m]                <= 1        a job runs on one model at a time
               sum_j X[j, m] * scale[j]     <= cap[m]   no model is over-committed
               rho[j] = sum_m Tn[j, m] X[j, m] >= t * w[j]
               0 <= X[j, m] <= 1, X[j, m] = 0 where job j cannot use model m

with Tn[j, m] = T[j, m] / T_equal[j]: throughput normalised by what the job would get under an
equal share of the cluster, so that rho[j] = 1 means "as good as my 1/N share" (see
`equal_share_throughput`). Every job gets the same normalised rate, so a job that gains 4x from a
V100 and one that gains 1.2x end up trading: the first takes V100 time, the second K80 time.

A max-min optimum is rarely unique, and the vertex a simplex solver returns can leave GPUs idle
(any job above the minimum may get less than it could). A second LP therefore keeps t at its
optimum and maximises the sum of rho, which makes the allocation Pareto-efficient. Both stages
are solved by HiGHS on sparse matrices built without Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

# Stage 2 keeps t a hair below its optimum so that round-off cannot make the LP infeasible.
_T_SLACK = 1e-7


@dataclass(frozen=True, slots=True)
class MaxMinResult:
    X: np.ndarray  # (N, M) time fractions
    t: float  # the fairness value reached: min_j rho[j] / w[j]
    rho: np.ndarray  # (N,) normalised throughput of each job
    equal: np.ndarray  # (N,) T_equal, the throughput under an equal share


def feasible_mask(T: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                  allowed: np.ndarray | None = None) -> np.ndarray:
    """Pairs (j, m) a job can use at all: allowed, useful (T > 0), and the model has enough
    GPUs for the whole gang."""
    ok = (T > 0) & (scale[:, None] <= capacity[None, :] + 1e-9)
    return ok if allowed is None else ok & allowed


def equal_share_throughput(T: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                           mask: np.ndarray) -> np.ndarray:
    """Throughput of each job under an equal share of the cluster (Gavel's baseline).

    With C GPUs and N jobs, a job is owed C/N GPUs. A job that needs scale[j] GPUs therefore
    runs min(1, C / (N * scale[j])) of the time, spread over the models it may use in
    proportion to their size. This allocation is itself feasible when every job may use every
    model, so the optimum t is then at least 1: no job does worse than its fair share.
    """
    n = T.shape[0]
    if n == 0:
        return np.zeros(0)
    total = capacity.sum()
    usable = np.where(mask, capacity[None, :], 0.0)
    usable_total = usable.sum(axis=1)
    share = np.minimum(1.0, total / (n * np.maximum(scale, 1e-12)))
    mean_speed = np.divide((T * usable).sum(axis=1), usable_total,
                           out=np.zeros(n), where=usable_total > 0)
    return share * mean_speed


def max_min_fairness(T: np.ndarray, scale: np.ndarray, capacity: np.ndarray, *,
                     weights: np.ndarray | None = None, allowed: np.ndarray | None = None,
                     efficient: bool = True) -> MaxMinResult:
    """Solve Gavel's max-min fairness LP. Jobs with no usable model get X = 0 and rho = 0 and
    do not constrain t; the caller should keep them out of the active set."""
    T = np.asarray(T, dtype=float)
    n, m = T.shape
    scale = np.asarray(scale, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    mask = feasible_mask(T, scale, capacity, allowed)
    equal = equal_share_throughput(T, scale, capacity, mask)
    X = np.zeros((n, m))
    live = mask.any(axis=1) & (equal > 0)
    if not live.any():
        return MaxMinResult(X, 0.0, np.zeros(n), equal)

    # One variable per usable pair, then t. Rows: time (N), capacity (M), fairness (N).
    pairs = np.flatnonzero((mask & live[:, None]).ravel())
    jp, mp = pairs // m, pairs % m
    k = pairs.size
    tn = np.zeros((n, m))
    tn[live] = T[live] / equal[live, None]
    coef = tn[jp, mp]
    cols = np.arange(k)
    jobs = np.flatnonzero(live)
    rows = np.concatenate([jp, n + mp, n + m + jp, n + m + jobs])
    cidx = np.concatenate([cols, cols, cols, np.full(jobs.size, k)])
    vals = np.concatenate([np.ones(k), scale[jp], -coef, w[jobs]])
    A = sp.csr_array((vals, (rows, cidx)), shape=(2 * n + m, k + 1))
    b = np.concatenate([np.ones(n), capacity, np.zeros(n)])
    bounds = np.zeros((k + 1, 2))
    bounds[:k, 1] = 1.0
    bounds[k, 1] = np.inf

    c = np.zeros(k + 1)
    c[k] = -1.0
    first = _solve(c, A, b, bounds, "max-min fairness")
    t = float(first[k])
    z = first
    if efficient:
        bounds[k] = max(0.0, t * (1 - _T_SLACK) - 1e-12)
        c = np.zeros(k + 1)
        c[:k] = -coef / n  # mean rho: scaled so the objective stays O(1)
        z = _solve(c, A, b, bounds, "max-min efficiency stage")
    X[jp, mp] = np.clip(z[:k], 0.0, 1.0)
    rho = (tn * X).sum(axis=1)
    return MaxMinResult(X, t, rho, equal)


def _solve(c: np.ndarray, A: sp.csr_array, b: np.ndarray, bounds: np.ndarray,
           what: str) -> np.ndarray:
    res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0 or res.x is None:
        # The LP is always feasible (X = 0, t = 0) and bounded (X <= 1), so this is a bug or
        # a NaN in the inputs: fail loudly rather than schedule on garbage.
        raise RuntimeError(f"{what} LP failed: {res.message}")
    return res.x
