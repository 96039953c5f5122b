"""m-ETF: earliest-task-first list scheduling with memory limits.

Among the ops whose inputs are all computed and the devices with memory left for them, start the
op that can start earliest, counting the time to bring its inputs over. Ties go to the op with the
longest path to the end (then the lowest index, then the lowest device), so runs are repeatable.

Transfers occupy one channel per device: a send and a receive on a device run one after the other.
A tensor already on a device is not sent again. Memory is allocated as ops are placed (see
`common.Ledger`) and a device that is full takes no more ops.

The same scheduler serves m-SCT: given each op's favourite child, a device that just ran an op
waits for that child unless another op is urgent (see `m_sct`).
"""

from __future__ import annotations

import bisect

import numpy as np

from plinth.place.algorithms.common import (
    Devices,
    Ledger,
    Placement,
    bottom_levels,
    check_each_fits,
)
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph


class _State:
    def __init__(self, g: OpGraph, devices: Devices, comm: CommModel) -> None:
        self.g, self.D = g, devices.count
        self.cost = np.asarray(comm.cost_us(g.edge_bytes), dtype=np.float64).reshape(-1)
        self.comm = comm
        self.device_of = np.full(g.n, -1, dtype=np.int64)
        self.finish = np.zeros(g.n)
        self.start = np.zeros(g.n)
        self.dev_free = np.zeros(self.D)
        self.chan_free = np.zeros(self.D)
        self.arrived: list[dict[int, float]] = [{} for _ in range(g.n)]
        self.ledger = Ledger(g, devices)
        self.data_ready = np.zeros((g.n, self.D))   # when all inputs could be on each device
        self.need = np.zeros((g.n, self.D))         # memory needed there (an upper bound)

    def on_ready(self, u: int) -> None:
        """Fill the rows of `u` once all its inputs are computed."""
        g, row = self.g, np.zeros(self.D)
        need = np.full(self.D, float(self.ledger.node_perm[u]))
        for p, e in zip(g.preds[u], g.pred_edges[u]):
            r = np.full(self.D, self.finish[p] + self.cost[e])
            for d, t in self.arrived[p].items():
                r[d] = min(r[d], t)
            dp = self.device_of[p]
            r[dp] = self.finish[p]
            np.maximum(row, r, out=row)
            extra = np.full(self.D, float(g.edge_bytes[e]))
            extra[dp] = 0.0
            need += extra
        self.data_ready[u] = row
        self.need[u] = need

    def commit(self, u: int, d: int) -> None:
        g, ready_at = self.g, 0.0
        sent = self.ledger.sent
        for p, e in zip(g.preds[u], g.pred_edges[u]):
            dp = self.device_of[p]
            if dp == d:
                ready_at = max(ready_at, self.finish[p])
                continue
            extra = sent.extra(p, e, d)
            # Even with nothing left to send (a zero-byte edge, or a tensor already here) the
            # op cannot start before its input's producer has finished.
            t = max(self.arrived[p].get(d, 0.0), self.finish[p])
            if extra > 0:
                t0 = max(self.finish[p], self.chan_free[dp], self.chan_free[d])
                t = max(t, t0 + self.comm.cost_us(extra))
                self.chan_free[dp] = self.chan_free[d] = t
                self.arrived[p][d] = t
            ready_at = max(ready_at, t)
        self.ledger.commit(u, d, self.device_of)  # counts the received bytes as sent
        self.device_of[u] = d
        self.start[u] = max(self.dev_free[d], ready_at)
        self.finish[u] = self.start[u] + g.work_us[u]
        self.dev_free[d] = self.finish[u]


def list_schedule(g: OpGraph, devices: Devices, comm: CommModel, *, algo: str = "m-etf",
                  favourite: np.ndarray | None = None) -> Placement:
    """ETF list scheduling under memory caps; with `favourite`, the m-SCT variant."""
    check_each_fits(g, devices)
    st = _State(g, devices, comm)
    level = bottom_levels(g, st.cost)
    temp = g.temp_bytes.astype(np.float64)
    mem = devices.memory
    indeg = np.array([len(p) for p in g.preds], dtype=np.int64)
    ready = [u for u in range(g.n) if indeg[u] == 0]
    for u in ready:
        st.on_ready(u)
    reserved = np.full(st.D, -1, dtype=np.int64)   # m-SCT: the favourite child a device awaits
    waited = 0
    while ready:
        rows = np.asarray(ready)
        est = np.maximum(st.data_ready[rows], st.dev_free)
        used = st.ledger.perm[None, :] + st.need[rows] + np.maximum(st.ledger.temp, temp[rows, None])
        est[used > mem] = np.inf
        if not np.isfinite(est).any():
            # The need rows are upper bounds; check exactly before giving up.
            for i, u in enumerate(ready):
                for d in range(st.D):
                    if st.ledger.fits(u, d, st.device_of):
                        est[i, d] = max(st.data_ready[u, d], st.dev_free[d])
            if not np.isfinite(est).any():
                raise st.ledger.no_room(ready[int(np.argmax(level[rows]))], st.device_of)
        if favourite is not None and (reserved >= 0).any():
            masked = _reserve(est, rows, reserved, st.data_ready)
            if np.isfinite(masked).any():
                waited += int((masked != est).any())
                est = masked
        i, d = _pick(est, level[rows])
        u = ready.pop(i)
        st.commit(u, d)
        if favourite is not None:
            reserved[reserved == u] = -1
            child = favourite[u]
            if child >= 0 and st.device_of[child] < 0:
                reserved[d] = child
        for s in g.succs[u]:
            indeg[s] -= 1
            if indeg[s] == 0:
                st.on_ready(s)
                bisect.insort(ready, s)
    makespan = float(st.finish.max()) if g.n else 0.0
    reason = f"list schedule, estimated {makespan / 1e3:,.1f} ms per step"
    if favourite is not None:
        reason += f"; devices held for a favourite child {waited} times"
    return Placement(algo, st.device_of, st.start, reason)


def _pick(est: np.ndarray, level: np.ndarray) -> tuple[int, int]:
    """Earliest start; ties to the longest remaining path, then the first op and device."""
    best = est.min()
    ii, dd = np.nonzero(est <= best + 1e-9 * max(1.0, abs(best)))
    k = int(np.lexsort((dd, ii, -level[ii]))[0])
    return int(ii[k]), int(dd[k])


def _reserve(est: np.ndarray, rows: np.ndarray, reserved: np.ndarray,
             data_ready: np.ndarray) -> np.ndarray:
    """Keep a held device for its favourite child, or for an urgent op: one whose inputs would be
    on every device by the time it could start here, so that holding it back gains nothing."""
    out = est.copy()
    latest = data_ready[rows].max(axis=1)
    for d in np.nonzero(reserved >= 0)[0]:
        allowed = (rows == reserved[d]) | (latest <= est[:, d])
        out[~allowed, d] = np.inf
    return out


def m_etf(g: OpGraph, devices: Devices, comm: CommModel) -> Placement:
    """Place `g` with memory-aware earliest-task-first list scheduling."""
    return list_schedule(g, devices, comm, algo="m-etf")
