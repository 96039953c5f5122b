"""Cluster-wide replica allocation: choose integer replicas per job under a quota.

The steps follow Faro:
1. solve the continuous relaxation (real c per job, Σc ≤ quota) with scipy's SLSQP, warm-started
   from the current counts;
2. round up;
3. repair: while over the quota, remove the replica whose loss hurts the objective least;
4. trim: remove replicas that do not change their job's utility;
5. give leftover replicas, one at a time, to the job whose gain is largest.
The answer is never worse than the current counts put through steps 3–5 ("the rounded start").

Above `HIER_JOBS` jobs the problem is decomposed: jobs are grouped by load, the quota is split
over the groups (each group's replicas divided among its jobs in proportion to their load), and
then each group is solved on its own share. Both levels are small SLSQP problems.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import ThreadpoolController

from plinth.core.errors import SpecError
from plinth.serve.utility import JobModel, objective, objective_rows, smooth_objective

HIER_JOBS = 20
FD_STEP = 1e-3
# SLSQP works on tiny matrices; a multi-threaded BLAS only adds hand-offs between threads (5-10x
# slower on a busy machine), so solves run with one BLAS thread.
_BLAS = ThreadpoolController()


@dataclass(frozen=True, slots=True)
class Solution:
    replicas: np.ndarray  # int, one per job
    utilities: np.ndarray  # the modelled utility of each job at `replicas`
    admit: np.ndarray  # admission rate per job (1.0 unless the objective drops requests)
    value: float  # the exact objective at `replicas`
    start_value: float  # the objective of the rounded start
    repaired: bool  # step 3 had to remove replicas: the relaxation wanted more than the quota
    hierarchical: bool
    solve_ms: float
    reason: str


def check_quota(n_jobs: int, quota: int, min_replicas: int = 1) -> None:
    if quota < n_jobs * min_replicas:
        raise SpecError(f"quota: {quota} replicas cannot give {n_jobs} jobs {min_replicas} "
                        f"replica each")


def _continuous(model: JobModel, kind: str, quota: float, start: np.ndarray,
                lo: float = 1.0) -> np.ndarray:
    """Step 1: maximise the smooth objective over real c in [lo, quota], Σc ≤ quota."""
    n = model.n
    x0 = np.clip(np.asarray(start, float), lo, quota)
    if x0.sum() > quota:  # scale the warm start into the feasible set
        x0 = lo + (x0 - lo) * (quota - lo * n) / max(x0.sum() - lo * n, 1e-12)

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        # Utilities are separable in c, so one extra vectorised evaluation gives every du_j/dc_j.
        both = model.utilities(np.concatenate([x, x + FD_STEP]))
        u, du = both[:n], (both[n:] - both[:n]) / FD_STEP
        val, dval = smooth_objective(u, kind)
        return -val, -dval * du

    res = minimize(fun, x0, jac=True, method="SLSQP", bounds=[(lo, quota)] * n,
                   constraints=[{"type": "ineq", "fun": lambda x: quota - x.sum(),
                                 "jac": lambda x: -np.ones_like(x)}],
                   options={"maxiter": 100, "ftol": 1e-6})
    x = res.x if np.all(np.isfinite(res.x)) else x0
    return np.clip(x, lo, quota)


def _value(model: JobModel, c: np.ndarray, kind: str) -> float:
    return objective(model.utilities(c.astype(float)), kind)


def _with_one_changed(u: np.ndarray, u_new: np.ndarray, kind: str) -> np.ndarray:
    """The objective after replacing u_j by u_new_j, one job at a time (row j)."""
    rows = np.repeat(u[None, :], u.size, axis=0)
    np.fill_diagonal(rows, u_new)
    return objective_rows(rows, kind)


def _integer_steps(model: JobModel, c: np.ndarray, kind: str, quota: int,
                   min_replicas: int) -> tuple[np.ndarray, bool]:
    """Steps 3–5 on integer counts. Returns the counts and whether a repair was needed."""
    c = np.maximum(c.astype(np.int64), min_replicas)
    repaired = False
    while c.sum() > quota:  # 3. repair
        repaired = True
        u = model.utilities(c.astype(float))
        after = _with_one_changed(u, model.utilities((c - 1).astype(float)), kind)
        after[c <= min_replicas] = -np.inf
        c[int(np.argmax(after))] -= 1
    # 4. trim replicas whose job is just as well off without them.
    while True:
        u = model.utilities(c.astype(float))
        u_less = model.utilities((c - 1).astype(float))
        useless = (u_less >= u - 1e-9) & (c > min_replicas)
        if not useless.any():
            break
        c[useless] -= 1
    # 5. leftovers go, one at a time, to the job that gains most.
    while c.sum() < quota:
        u = model.utilities(c.astype(float))
        u_more = model.utilities((c + 1).astype(float))
        gain = _with_one_changed(u, u_more, kind) - objective(u, kind)
        # For fair objectives only the worst job gains, so ties are broken by own utility gain.
        own = u_more - u
        j = int(np.lexsort((-own, -gain))[0])
        # Never lower the objective; at no objective gain, only help the job itself.
        if gain[j] < -1e-12 or (gain[j] <= 1e-12 and own[j] <= 1e-12):
            break
        c[j] += 1
    return c, repaired


def _solve_flat(model: JobModel, kind: str, quota: int, start: np.ndarray,
                min_replicas: int) -> tuple[np.ndarray, bool]:
    x = _continuous(model, kind, float(quota), start, float(min_replicas))
    return _integer_steps(model, np.ceil(x - 1e-6), kind, quota, min_replicas)


def _groups(model: JobModel, n_groups: int) -> list[np.ndarray]:
    """Jobs sorted by load and dealt into contiguous groups of similar load."""
    load = model.lam.mean(axis=1) * model.service_s
    order = np.argsort(-load, kind="stable")
    return [g for g in np.array_split(order, n_groups) if g.size]


def _solve_hier(model: JobModel, kind: str, quota: int, start: np.ndarray,
                min_replicas: int) -> tuple[np.ndarray, bool]:
    n = model.n
    groups = _groups(model, max(2, math.ceil(math.sqrt(n))))
    load = model.lam.mean(axis=1) * model.service_s + 1e-6
    share = [load[g] / load[g].sum() for g in groups]
    sizes = np.array([g.size for g in groups], float)

    def spread(totals: np.ndarray) -> np.ndarray:
        c = np.empty(n)
        for g, w, tot, size in zip(groups, share, totals, sizes, strict=True):
            c[g] = min_replicas + w * max(tot - size * min_replicas, 0.0)
        return c

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        k = x.size
        cs = np.concatenate([spread(x)] + [spread(x + FD_STEP * np.eye(k)[i]) for i in range(k)])
        u_all = model.utilities(cs).reshape(k + 1, n)
        val, _ = smooth_objective(u_all[0], kind)
        grads = np.array([smooth_objective(u_all[i + 1], kind)[0] for i in range(k)])
        return -val, -(grads - val) / FD_STEP

    x0 = np.array([max(float(start[g].sum()), g.size * min_replicas) for g in groups])
    lo = sizes * min_replicas
    if x0.sum() > quota:
        x0 = lo + (x0 - lo) * (quota - lo.sum()) / max(x0.sum() - lo.sum(), 1e-12)
    res = minimize(fun, x0, jac=True, method="SLSQP", bounds=list(zip(lo, [quota] * len(lo),
                                                                         strict=True)),
                   constraints=[{"type": "ineq", "fun": lambda x: quota - x.sum(),
                                 "jac": lambda x: -np.ones_like(x)}],
                   options={"maxiter": 100, "ftol": 1e-6})
    totals = res.x if np.all(np.isfinite(res.x)) else x0
    # Integer group quotas: floor, then the largest remainders, never below one replica per job.
    base = np.maximum(np.floor(totals), lo).astype(np.int64)
    while base.sum() > quota:
        base[int(np.argmax(base - lo))] -= 1
    rest = quota - int(base.sum())
    for i in np.argsort(-(totals - np.floor(totals)), kind="stable")[:rest]:
        base[i] += 1
    c = np.empty(n, np.int64)
    repaired = False
    for g, gq in zip(groups, base, strict=True):
        sub = model.subset(g)
        cg, rep = _solve_flat(sub, kind, int(gq), spread(totals)[g], min_replicas)
        c[g] = cg
        repaired |= rep
    # The groups were solved apart: a last cluster-wide pass of steps 3–5.
    c, rep = _integer_steps(model, c, kind, quota, min_replicas)
    return c, repaired or rep


def solve(model: JobModel, *, kind: str, quota: int, current: np.ndarray,
          min_replicas: int = 1, hierarchical: bool | None = None) -> Solution:
    """Replicas per job maximising the objective `kind` under `quota` (pure: no clock, no rng)."""
    t0 = time.perf_counter()  # measurement only; the answer does not depend on it
    n = model.n
    check_quota(n, quota, min_replicas)
    current = np.asarray(current, float)
    if current.shape != (n,) or not np.all(np.isfinite(current)):
        raise SpecError(f"current: expected {n} finite replica counts, got {current.tolist()}")
    hier = n > HIER_JOBS if hierarchical is None else hierarchical
    start, _ = _integer_steps(model, np.ceil(np.maximum(current, min_replicas)), kind, quota,
                              min_replicas)
    start_value = _value(model, start, kind)
    with _BLAS.limit(limits=1, user_api="blas"):
        c, repaired = (_solve_hier if hier else _solve_flat)(model, kind, quota, current,
                                                             min_replicas)
    value = _value(model, c, kind)
    reason = f"{kind} objective {value:.3f} (start {start_value:.3f})"
    if value < start_value - 1e-9:
        c, value, reason = start, start_value, f"kept the rounded start ({start_value:.3f})"
    if repaired:
        reason += "; demand exceeds the quota"
    u, admit = model.utilities_and_admit(c.astype(float))
    return Solution(c, u, admit, value, start_value, repaired, hier,
                    (time.perf_counter() - t0) * 1000.0, reason)


def solve_raising_quantile(model_at: Callable[[float], JobModel], *, q: float, q_max: float = 0.9, step: float = 0.1,
                           kind: str, quota: int, current: np.ndarray,
                           min_replicas: int = 1) -> tuple[Solution, float]:
    """Solve at forecast quantile q; while replicas would sit idle, raise q by `step` (up to
    `q_max`) and solve again. A raised answer is kept only if it still meets every job's SLO
    (all modelled utilities 1); otherwise the last such answer stands. `model_at(q)` builds the
    JobModel for quantile q. Returns the solution and the quantile it was solved at."""
    best = solve(model_at(q), kind=kind, quota=quota, current=current, min_replicas=min_replicas)
    used = q
    total_ms = best.solve_ms
    while int(best.replicas.sum()) < quota and used + step <= q_max + 1e-9:
        q_next = round(used + step, 6)
        sol = solve(model_at(q_next), kind=kind, quota=quota, current=best.replicas,
                    min_replicas=min_replicas)
        total_ms += sol.solve_ms
        if not np.all(sol.utilities >= 1.0 - 1e-9):
            break
        best, used = sol, q_next
    reason = f"{best.reason}; forecast quantile {used:.1f}"
    return Solution(best.replicas, best.utilities, best.admit, best.value, best.start_value,
                    best.repaired, best.hierarchical, total_ms, reason), used
