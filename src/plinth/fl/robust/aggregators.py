"""Byzantine-robust aggregation rules as pure numpy functions over an (n_clients, d) array.

Every rule returns an :class:`AggregateResult` with the aggregate, the rows it relied on and a
reason string. ``weights`` (e.g. num_examples) are used where the rule has a natural weighted
form (Multi-Krum's final average, trimmed mean of the kept rows is unweighted by design).

- Krum / Multi-Krum (Blanchard et al., NeurIPS 2017): score_i = sum of squared distances to its
  n - f - 2 nearest others; pairwise distances come from one Gram matrix (BLAS), not a pair loop.
- Bulyan (El Mhamdi et al., ICML 2018): select theta = n - 2f rows by repeated Krum, then per
  coordinate average the beta = theta - 2f values closest to the median. Needs n >= 4f + 3.
- Coordinate-wise median and trimmed mean (Yin et al., ICML 2018).
- Centered clipping (Karimireddy et al., ICML 2021): v <- v + mean_i clip_tau(x_i - v), iterated.
- FLTrust (Cao et al., NDSS 2021): trust score ReLU(cos(g_i, g_0)) against a server update g_0
  from a small clean root set; each g_i is rescaled to ||g_0|| before the weighted average.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits


@dataclass(frozen=True, slots=True)
class AggregateResult:
    vector: np.ndarray
    selected: np.ndarray  # indices of rows that shaped the result
    reason: str


def _check(updates: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    u = np.asarray(updates, dtype=np.float64)
    if u.ndim != 2 or u.shape[0] == 0:
        raise ValueError(f"updates must be a non-empty (n_clients, d) array, got shape {u.shape}")
    if not np.all(np.isfinite(u)):
        bad = np.flatnonzero(~np.all(np.isfinite(u), axis=1)).tolist()
        raise ValueError(
            f"updates of rows {bad[:10]} contain NaN or inf; filter them with robust.checks first"
        )
    w = np.ones(u.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (u.shape[0],) or np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
        raise ValueError(
            f"weights must be {u.shape[0]} finite non-negative numbers with a positive sum"
        )
    return u, w


def pairwise_sq_distances(updates: np.ndarray) -> np.ndarray:
    """Squared L2 distances between rows via the Gram matrix: |a|^2 + |b|^2 - 2 a.b."""
    with threadpool_limits(limits=1, user_api="blas"):
        gram = updates @ updates.T
    sq = np.diag(gram)
    dist = sq[:, None] + sq[None, :] - 2.0 * gram
    np.maximum(dist, 0.0, out=dist)  # rounding can give tiny negatives
    np.fill_diagonal(dist, 0.0)
    return dist


def krum_scores(updates: np.ndarray, f: int) -> np.ndarray:
    n = updates.shape[0]
    m = n - f - 2
    if m < 1:
        raise ValueError(f"Krum needs n > f + 2, got n={n}, f={f}")
    dist = pairwise_sq_distances(updates)
    np.fill_diagonal(dist, np.inf)
    nearest = np.partition(dist, m - 1, axis=1)[:, :m]
    return nearest.sum(axis=1)


def multi_krum(
    updates: np.ndarray, *, f: int, m: int = 1, weights: np.ndarray | None = None
) -> AggregateResult:
    """Average (weighted) of the ``m`` rows with the lowest Krum score; m=1 is Krum."""
    u, w = _check(updates, weights)
    if not 1 <= m <= u.shape[0]:
        raise ValueError(f"m must be in [1, {u.shape[0]}], got {m}")
    scores = krum_scores(u, f)
    chosen = np.argsort(scores, kind="stable")[:m]
    ww = w[chosen]
    vec = (ww @ u[chosen]) / ww.sum() if ww.sum() > 0 else u[chosen].mean(axis=0)
    return AggregateResult(
        vec,
        np.sort(chosen),
        f"{'krum' if m == 1 else 'multi-krum'}: kept {m} of {u.shape[0]} with f={f}",
    )


def krum(updates: np.ndarray, *, f: int, weights: np.ndarray | None = None) -> AggregateResult:
    return multi_krum(updates, f=f, m=1, weights=weights)


def coordinate_median(updates: np.ndarray, weights: np.ndarray | None = None) -> AggregateResult:
    u, _ = _check(updates, weights)
    return AggregateResult(np.median(u, axis=0), np.arange(u.shape[0]), "coordinate-wise median")


def trimmed_mean(
    updates: np.ndarray, *, trim: int, weights: np.ndarray | None = None
) -> AggregateResult:
    """Per coordinate, drop the ``trim`` largest and ``trim`` smallest values and average the rest."""
    u, _ = _check(updates, weights)
    n = u.shape[0]
    if not 0 <= 2 * trim < n:
        raise ValueError(f"trim must satisfy 0 <= 2*trim < n, got trim={trim}, n={n}")
    s = np.sort(u, axis=0)
    return AggregateResult(
        s[trim : n - trim].mean(axis=0), np.arange(n), f"trimmed mean, {trim} cut per side"
    )


def bulyan(updates: np.ndarray, *, f: int, weights: np.ndarray | None = None) -> AggregateResult:
    u, _ = _check(updates, weights)
    n = u.shape[0]
    if n < 4 * f + 3:
        raise ValueError(f"Bulyan needs n >= 4f + 3, got n={n}, f={f}")
    theta = n - 2 * f
    beta = theta - 2 * f
    remaining = np.arange(n)
    dist_full = pairwise_sq_distances(u)
    chosen = []
    for _ in range(theta):
        k = remaining.size
        d = dist_full[np.ix_(remaining, remaining)].copy()
        np.fill_diagonal(d, np.inf)
        mm = max(k - f - 2, 1)
        scores = np.partition(d, mm - 1, axis=1)[:, :mm].sum(axis=1)
        pick = int(np.argmin(scores))
        chosen.append(remaining[pick])
        remaining = np.delete(remaining, pick)
    sel = u[np.array(chosen)]
    med = np.median(sel, axis=0)
    order = np.argsort(np.abs(sel - med), axis=0, kind="stable")[:beta]
    vec = np.take_along_axis(sel, order, axis=0).mean(axis=0)
    return AggregateResult(
        vec, np.sort(np.array(chosen)), f"bulyan: theta={theta}, beta={beta}, f={f}"
    )


def centered_clipping(
    updates: np.ndarray,
    *,
    center: np.ndarray,
    tau: float,
    iterations: int = 3,
    weights: np.ndarray | None = None,
) -> AggregateResult:
    """Start from ``center`` (e.g. last round's aggregate or momentum) and clip deviations to ``tau``."""
    u, w = _check(updates, weights)
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    v = np.asarray(center, dtype=np.float64).copy()
    if v.shape != (u.shape[1],):
        raise ValueError(f"center must have shape ({u.shape[1]},), got {v.shape}")
    ww = w / w.sum()
    for _ in range(iterations):
        diff = u - v
        norms = np.linalg.norm(diff, axis=1)
        scale = np.minimum(1.0, tau / np.maximum(norms, 1e-300))
        v = v + (ww * scale) @ diff
    return AggregateResult(
        v, np.arange(u.shape[0]), f"centered clipping: tau={tau}, {iterations} iterations"
    )


def fltrust(
    updates: np.ndarray, *, server_update: np.ndarray, weights: np.ndarray | None = None
) -> AggregateResult:
    u, _ = _check(updates, weights)
    g0 = np.asarray(server_update, dtype=np.float64)
    n0 = np.linalg.norm(g0)
    if g0.shape != (u.shape[1],) or n0 == 0 or not np.isfinite(n0):
        raise ValueError("server_update must be a finite non-zero vector of the update's length")
    norms = np.linalg.norm(u, axis=1)
    cos = (u @ g0) / (np.maximum(norms, 1e-300) * n0)
    trust = np.maximum(cos, 0.0)
    if trust.sum() == 0:
        return AggregateResult(
            np.zeros(u.shape[1]),
            np.array([], dtype=int),
            "fltrust: no update agrees with the server update",
        )
    rescaled = u * (n0 / np.maximum(norms, 1e-300))[:, None]
    vec = (trust @ rescaled) / trust.sum()
    return AggregateResult(
        vec, np.flatnonzero(trust > 0), f"fltrust: {int(np.sum(trust > 0))} of {u.shape[0]} trusted"
    )


def fedavg(updates: np.ndarray, weights: np.ndarray | None = None) -> AggregateResult:
    """Plain weighted mean (the non-robust baseline)."""
    u, w = _check(updates, weights)
    return AggregateResult((w @ u) / w.sum(), np.arange(u.shape[0]), "weighted mean")
