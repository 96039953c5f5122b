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
are solved by HiGHS on sparse matrices built without Python loops, through the HiGHS bindings
that scipy ships when it has them (stage 2 then starts from stage 1's basis), else linprog.

Identical jobs (same throughput row, scale, weight and allowed models) are solved as one class:
averaging any optimum over the members of a class is feasible and keeps both objectives, so the
LP over classes, each counted `counts[c]` times, has the same optimum, and every member gets the
class's allocation. A real workload has a few job types and gang sizes, so 1,000 active jobs make
a few dozen classes. With a single GPU model both stages have a closed form (water-filling, then
a fractional knapsack), used instead of the solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

try:  # the HiGHS bindings scipy ships (those of the `highspy` package); linprog otherwise
    from scipy.optimize._highspy import _core as _highs

    if not all(hasattr(_highs, n) for n in ("_Highs", "HighsLp", "MatrixFormat")):
        _highs = None  # pragma: no cover - another scipy layout
except ImportError:  # pragma: no cover - a scipy without them
    _highs = None

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
                           mask: np.ndarray, *, n_jobs: float | None = None) -> np.ndarray:
    """Throughput of each job under an equal share of the cluster (Gavel's baseline).

    With C GPUs and N jobs, a job is owed C/N GPUs. A job that needs scale[j] GPUs therefore
    runs min(1, C / (N * scale[j])) of the time, spread over the models it may use in
    proportion to their size. This allocation is itself feasible when every job may use every
    model, so the optimum t is then at least 1: no job does worse than its fair share.
    N is the number of rows unless `n_jobs` says otherwise (rows standing for classes of jobs).
    """
    if T.shape[0] == 0:
        return np.zeros(0)
    n = T.shape[0] if n_jobs is None else n_jobs
    total = capacity.sum()
    usable = np.where(mask, capacity[None, :], 0.0)
    usable_total = usable.sum(axis=1)
    share = np.minimum(1.0, total / (n * np.maximum(scale, 1e-12)))
    mean_speed = np.divide((T * usable).sum(axis=1), usable_total,
                           out=np.zeros(T.shape[0]), where=usable_total > 0)
    return share * mean_speed


def max_min_fairness(T: np.ndarray, scale: np.ndarray, capacity: np.ndarray, *,
                     weights: np.ndarray | None = None, allowed: np.ndarray | None = None,
                     counts: np.ndarray | None = None, efficient: bool = True) -> MaxMinResult:
    """Solve Gavel's max-min fairness LP. Jobs with no usable model get X = 0 and rho = 0 and
    do not constrain t; the caller should keep them out of the active set.

    With `counts`, row i stands for counts[i] identical jobs (a class); otherwise identical rows
    are grouped here. Either way the result has one row per input row."""
    T = np.asarray(T, dtype=float)
    n, m = T.shape
    scale = np.asarray(scale, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    mask = feasible_mask(T, scale, capacity, allowed)
    if counts is None and n > 1:
        cls, rep = _classes(np.column_stack([T, scale, w, mask]))
        if rep.size < n:
            res = _max_min_classes(T[rep], scale[rep], capacity, w[rep], mask[rep],
                                   np.bincount(cls).astype(float), efficient)
            return MaxMinResult(res.X[cls], res.t, res.rho[cls], res.equal[cls])
    cnt = np.ones(n) if counts is None else np.asarray(counts, dtype=float)
    return _max_min_classes(T, scale, capacity, w, mask, cnt, efficient)


def _classes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group equal rows of `key`: (class of each row, first row of each class), classes in
    first-seen order so that ties between classes break by row order as they would unsplit."""
    order = np.lexsort(key.T[::-1])
    k = key[order]
    new = np.ones(len(k), dtype=bool)
    new[1:] = (k[1:] != k[:-1]).any(axis=1)
    sorted_cls = np.cumsum(new) - 1
    first = np.full(int(sorted_cls[-1]) + 1, len(k))
    np.minimum.at(first, sorted_cls, order)
    by_first = np.argsort(first)
    remap = np.empty_like(by_first)
    remap[by_first] = np.arange(by_first.size)
    cls = np.empty(len(k), dtype=np.intp)
    cls[order] = remap[sorted_cls]
    return cls, first[by_first]


def _max_min_classes(T: np.ndarray, scale: np.ndarray, capacity: np.ndarray, w: np.ndarray,
                     mask: np.ndarray, counts: np.ndarray, efficient: bool) -> MaxMinResult:
    n, m = T.shape
    n_jobs = float(counts.sum())
    equal = equal_share_throughput(T, scale, capacity, mask, n_jobs=n_jobs)
    X = np.zeros((n, m))
    live = mask.any(axis=1) & (equal > 0) & (counts > 0)
    if not live.any():
        return MaxMinResult(X, 0.0, np.zeros(n), equal)
    tn = np.zeros((n, m))
    tn[live] = T[live] / equal[live, None]
    if m == 1:
        t = _one_model(tn[:, 0], scale, float(capacity[0]), w, counts, live, X[:, 0],
                       efficient)
        return MaxMinResult(X, t, tn[:, 0] * X[:, 0], equal)

    # One variable per usable pair, then t. Rows: time (N), capacity (M), fairness (N).
    pairs = np.flatnonzero((mask & live[:, None]).ravel())
    jp, mp = pairs // m, pairs % m
    k = pairs.size
    coef = tn[jp, mp]
    cols = np.arange(k)
    jobs = np.flatnonzero(live)
    rows = np.concatenate([jp, n + mp, n + m + jp, n + m + jobs])
    cidx = np.concatenate([cols, cols, cols, np.full(jobs.size, k)])
    vals = np.concatenate([np.ones(k), scale[jp] * counts[jp], -coef, w[jobs]])
    A = sp.csr_array((vals, (rows, cidx)), shape=(2 * n + m, k + 1))
    b = np.concatenate([np.ones(n), capacity, np.zeros(n)])
    bounds = np.zeros((k + 1, 2))
    bounds[:k, 1] = 1.0
    bounds[k, 1] = np.inf

    c = np.zeros(k + 1)
    c[k] = -1.0
    c2 = None
    if efficient:
        c2 = np.zeros(k + 1)
        c2[:k] = -coef * counts[jp] / n_jobs  # mean rho: scaled so the objective stays O(1)
    t, z = _two_stages(c, c2, sp.csc_array(A), b, bounds)
    X[jp, mp] = np.clip(z[:k], 0.0, 1.0)
    rho = (tn * X).sum(axis=1)
    return MaxMinResult(X, t, rho, equal)


def _t_floor(t: float) -> float:
    return max(0.0, t * (1 - _T_SLACK) - 1e-12)


def _one_model(a: np.ndarray, scale: np.ndarray, cap: float, w: np.ndarray,
               counts: np.ndarray, live: np.ndarray, x: np.ndarray, efficient: bool) -> float:
    """Both stages for one GPU model, in closed form; fills `x` and returns t.

    rho[j] = a[j] x[j] with x[j] in [0, 1]. The smallest x reaching t is t w / a, so
    t = min(min a / w, cap / sum(count s w / a)) (water level). The efficiency stage keeps
    x >= t w / a and spends the capacity left where it buys the most rho per GPU, a / s
    (a fractional knapsack), which is what the LP's optimum does."""
    j = np.flatnonzero(live)
    aj, sj, wj, cj = a[j], scale[j], w[j], counts[j]
    need = (cj * sj * wj / aj).sum()
    t = float(min((aj / wj).min(), cap / need if need > 0 else np.inf))
    lo = (_t_floor(t) if efficient else t) * wj / aj
    xj = np.minimum(lo, 1.0)
    if efficient:
        left = cap - float((cj * sj * xj).sum())
        gain = aj / sj
        for i in np.lexsort((np.arange(j.size), -gain)).tolist():
            if left <= 1e-12:
                break
            per = cj[i] * sj[i]  # GPUs per unit of x for the whole class
            take = min(1.0 - xj[i], left / per)
            if take > 0:
                xj[i] += take
                left -= take * per
    x[j] = xj
    return t


def _two_stages(c1: np.ndarray, c2: np.ndarray | None, A: sp.csc_array, b: np.ndarray,
                bounds: np.ndarray) -> tuple[float, np.ndarray]:
    """Stage 1 maximises t (the last variable); stage 2, if `c2` is given, minimises c2 with t
    held at its optimum. Returns (t, solution of the last stage)."""
    if _highs is None:
        first = _solve(c1, A, b, bounds, "max-min fairness")
        t = float(first[-1])
        if c2 is None:
            return t, first
        bounds = bounds.copy()
        bounds[-1] = _t_floor(t)
        return t, _solve(c2, A, b, bounds, "max-min efficiency stage")
    # HiGHS called directly: linprog validates and converts its inputs on every call, which
    # costs several times the solve of these small LPs, and cannot restart stage 2 from stage
    # 1's basis (only the objective and one bound change, so stage 2 takes a few pivots).
    h = _highs._Highs()
    h.setOptionValue("output_flag", False)
    lp = _highs.HighsLp()
    lp.num_row_, lp.num_col_ = A.shape
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = c1, bounds[:, 0], bounds[:, 1]
    lp.row_lower_, lp.row_upper_ = np.full(A.shape[0], -np.inf), b
    lp.a_matrix_.format_ = _highs.MatrixFormat.kColwise
    lp.a_matrix_.num_row_, lp.a_matrix_.num_col_ = A.shape
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    h.passModel(lp)
    first = _run(h, "max-min fairness")
    t = float(first[-1])
    if c2 is None:
        return t, first
    k = A.shape[1]
    h.changeColsCost(k, np.arange(k, dtype=np.int32), c2)
    h.changeColBounds(k - 1, _t_floor(t), np.inf)
    return t, _run(h, "max-min efficiency stage")


def _run(h: object, what: str) -> np.ndarray:
    h.run()  # type: ignore[attr-defined]
    status = h.getModelStatus()  # type: ignore[attr-defined]
    if status != _highs.HighsModelStatus.kOptimal:  # type: ignore[union-attr]
        # A restart from the previous basis can end short of a verdict ("unknown") when the
        # pinned t sits on a tolerance edge; a solve from scratch settles it.
        h.clearSolver()  # type: ignore[attr-defined]
        h.run()  # type: ignore[attr-defined]
        status = h.getModelStatus()  # type: ignore[attr-defined]
    if status != _highs.HighsModelStatus.kOptimal:  # type: ignore[union-attr]
        raise RuntimeError(f"{what} LP failed: "
                           f"{h.modelStatusToString(status)}")  # type: ignore[attr-defined]
    return np.array(h.getSolution().col_value)  # type: ignore[attr-defined]


def _solve(c: np.ndarray, A: sp.csr_array, b: np.ndarray, bounds: np.ndarray,
           what: str) -> np.ndarray:
    res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method="highs")
    if res.status != 0 or res.x is None:
        # The LP is always feasible (X = 0, t = 0) and bounded (X <= 1), so this is a bug or
        # a NaN in the inputs: fail loudly rather than schedule on garbage.
        raise RuntimeError(f"{what} LP failed: {res.message}")
    return res.x
