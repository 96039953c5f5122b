"""m-SCT: small-communication-time scheduling with favourite children.

A linear program, relaxed from the integer one, decides for each edge (i, j) whether j is i's
favourite child (x_ij = 0: j runs right after i on the same device, no transfer) or not
(x_ij = 1: pays the transfer). An op has at most one favourite child and at most one favourite
parent. The relaxation is solved with HiGHS and rounded at 1/2; the list scheduler then holds a
device that finished an op for that op's favourite child unless another op becomes urgent.

    minimise w
    s_j >= s_i + p_i + c_ij x_ij        for every edge (i, j)
    w   >= s_i + p_i                    for every exit i
    sum_j x_ij >= outdeg(i) - 1,  sum_i x_ij >= indeg(j) - 1,  0 <= x <= 1,  s >= 0
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from plinth.place.algorithms.common import Devices, Placement
from plinth.place.algorithms.m_etf import list_schedule
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph


def sct_lp(g: OpGraph, comm: CommModel) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve the relaxation: returns (x per edge, start per node, lower bound on the makespan).
    Raises RuntimeError if HiGHS does not find an optimum."""
    n, m = g.n, len(g.src)
    p = g.work_us
    c = np.asarray(comm.cost_us(g.edge_bytes), dtype=np.float64).reshape(-1)
    unit = max(float(p.max()) if n else 1.0, 1e-9)  # well-scaled numbers for the solver
    p, c = p / unit, c / unit
    nv = n + m + 1                       # s (n), x (m), w
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    e = np.arange(m)
    # s_i - s_j + c_e x_e <= -p_i
    rows += [np.r_[r + e, r + e, r + e]]
    cols += [np.r_[g.src, g.dst, n + e]]
    vals += [np.r_[np.ones(m), -np.ones(m), c]]
    rhs.append(-p[g.src])
    r += m
    exits = np.array([u for u in range(n) if not g.succs[u]], dtype=np.int64)
    k = np.arange(len(exits))
    rows += [np.r_[r + k, r + k]]
    cols += [np.r_[exits, np.full(len(exits), n + m)]]
    vals += [np.r_[np.ones(len(exits)), -np.ones(len(exits))]]
    rhs.append(-p[exits])
    r += len(exits)
    for lists in (g.succ_edges, g.pred_edges):
        for edges in lists:
            if len(edges) >= 2:
                rows.append(np.full(len(edges), r))
                cols.append(n + np.asarray(edges))
                vals.append(-np.ones(len(edges)))
                rhs.append(np.array([-(len(edges) - 1.0)]))
                r += 1
    a = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(r, nv))
    cost = np.zeros(nv)
    cost[-1] = 1.0
    bounds = np.zeros((nv, 2))
    bounds[:, 1] = np.inf
    bounds[n:n + m, 1] = 1.0
    res = linprog(cost, A_ub=a, b_ub=np.concatenate(rhs), bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS: {res.message}")
    return res.x[n:n + m], res.x[:n] * unit, float(res.x[-1] * unit)


def favourite_children(g: OpGraph, x: np.ndarray) -> np.ndarray:
    """Round the relaxation at 1/2, keeping at most one favourite child and parent per op."""
    fav = np.full(g.n, -1, dtype=np.int64)
    has_parent = np.zeros(g.n, dtype=bool)
    for e in np.argsort(x, kind="stable"):
        if x[e] >= 0.5:
            break
        u, v = int(g.src[e]), int(g.dst[e])
        if fav[u] < 0 and not has_parent[v]:
            fav[u] = v
            has_parent[v] = True
    return fav


def m_sct(g: OpGraph, devices: Devices, comm: CommModel) -> Placement:
    """Place `g` with the LP's favourite children guiding list scheduling."""
    if len(g.src) == 0:
        return list_schedule(g, devices, comm, algo="m-sct")
    x, _, bound = sct_lp(g, comm)
    fav = favourite_children(g, x)
    plan = list_schedule(g, devices, comm, algo="m-sct", favourite=fav)
    plan.reason += (f"; relaxed LP makespan {bound / 1e3:,.1f} ms, "
                    f"{int((fav >= 0).sum())} favourite children")
    return plan
