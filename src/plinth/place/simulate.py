"""Step-time simulator: replay a placement of one training step (forward, then backward).

Each forward op runs on its device; its backward op runs on the same device once the backward ops
of all its consumers are done and their gradients have arrived. A device runs one op at a time, in
the order the placer intended (its estimated start times; topological order otherwise). Transfers
use one channel per device, so a device's sends and receives queue behind each other, and a
forward tensor received once is not sent again.

Memory per device over time: parameters and gradients from the start; an op's activations from its
forward start to its backward end; its scratch buffer while it runs; received tensors from arrival
to the end of the step. The peak is what `peak_bytes` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.place.algorithms.common import Sent
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph


@dataclass(slots=True)
class StepReport:
    makespan_us: float
    peak_bytes: np.ndarray
    busy_us: np.ndarray
    sent_bytes: int
    transfers: int

    @property
    def makespan_s(self) -> float:
        return self.makespan_us / 1e6


def _order(g: OpGraph, order: np.ndarray | None) -> np.ndarray:
    """The forward order: by intended start, ties by index; index order if that is not
    topological (a placer's estimate can be off)."""
    idx = np.arange(g.n)
    if order is None:
        return idx
    seq = np.lexsort((idx, np.asarray(order, dtype=np.float64)))
    pos = np.empty(g.n, dtype=np.int64)
    pos[seq] = idx
    return seq if np.all(pos[g.src] < pos[g.dst]) else idx


def simulate(g: OpGraph, device_of, comm: CommModel, devices: int, *,
             order: np.ndarray | None = None) -> StepReport:
    """Makespan and per-device peak memory of one training step under a placement."""
    device_of = np.asarray(device_of, dtype=np.int64)
    if len(device_of) != g.n or (g.n and (device_of.min() < 0 or device_of.max() >= devices)):
        raise ValueError("simulate: every node needs a device in [0, devices)")
    seq = _order(g, order)
    dev_free, chan_free = np.zeros(devices), np.zeros(devices)
    busy = np.zeros(devices)
    f_end, b_end = np.zeros(g.n), np.zeros(g.n)
    arrived: dict[tuple[int, int], float] = {}
    sent = Sent(g)
    events: list[list[tuple[float, float]]] = [[] for _ in range(devices)]
    params = np.bincount(device_of, weights=2.0 * g.param_bytes, minlength=devices)
    for d in range(devices):
        events[d].append((0.0, float(params[d])))
    moved, count = 0, 0

    def transfer(src: int, dst: int, ready: float, nbytes: int) -> tuple[float, float]:
        t0 = max(ready, chan_free[src], chan_free[dst])
        t1 = t0 + comm.cost_us(nbytes)
        chan_free[src] = chan_free[dst] = t1
        return t0, t1

    for u in seq.tolist():
        d = int(device_of[u])
        ready = 0.0
        for p, e in zip(g.preds[u], g.pred_edges[u]):
            dp = int(device_of[p])
            if dp == d:
                ready = max(ready, f_end[p])
                continue
            t = arrived.get((p, d), 0.0)
            extra = sent.extra(p, e, d)
            if extra > 0:
                t0, t1 = transfer(dp, d, f_end[p], extra)
                sent.add(p, d, extra)
                events[d].append((t0, float(extra)))
                arrived[(p, d)] = t = max(t, t1)
                moved, count = moved + extra, count + 1
            # Even with nothing left to send (a zero-byte edge), it waits for its producer.
            ready = max(ready, t, f_end[p])
        start = max(dev_free[d], ready)
        f_end[u] = dev_free[d] = start + g.fwd_us[u]
        busy[d] += g.fwd_us[u]
        events[d] += [(start, float(g.act_bytes[u] + g.temp_bytes[u])),
                      (f_end[u], -float(g.temp_bytes[u]))]
    for u in seq[::-1].tolist():
        d = int(device_of[u])
        ready = f_end[u]
        for s, e in zip(g.succs[u], g.succ_edges[u]):
            ds = int(device_of[s])
            if ds == d:
                ready = max(ready, b_end[s])
            else:  # the gradient of this edge's tensor comes back
                nbytes = int(g.edge_bytes[e])
                _, t1 = transfer(ds, d, b_end[s], nbytes)
                ready = max(ready, t1)
                moved, count = moved + nbytes, count + (nbytes > 0)
        start = max(dev_free[d], ready)
        b_end[u] = dev_free[d] = start + g.bwd_us[u]
        busy[d] += g.bwd_us[u]
        events[d] += [(start, float(g.temp_bytes[u])),
                      (b_end[u], -float(g.temp_bytes[u] + g.act_bytes[u]))]
    return StepReport(float(dev_free.max()) if g.n else 0.0, _peaks(events), busy, moved, count)


def _peaks(events: list[list[tuple[float, float]]]) -> np.ndarray:
    peaks = np.zeros(len(events))
    for d, ev in enumerate(events):
        a = np.asarray(ev, dtype=np.float64).reshape(-1, 2)
        k = np.lexsort((a[:, 1], a[:, 0]))  # at equal times, frees come first
        peaks[d] = np.cumsum(a[k, 1]).max(initial=0.0)
    return peaks


def critical_path_us(g: OpGraph) -> float:
    """Longest chain of compute through the step (forward, then backward): no placement on any
    number of devices can beat it."""
    f = g.fwd_us.copy()
    for v in range(g.n):
        if g.preds[v]:
            f[v] = g.fwd_us[v] + max(f[p] for p in g.preds[v])
    b = np.zeros(g.n)
    for u in range(g.n - 1, -1, -1):
        after = max((b[s] for s in g.succs[u]), default=0.0)
        b[u] = g.bwd_us[u] + max(after, f[u])
    return float(b.max()) if g.n else 0.0


def single_device(g: OpGraph, comm: CommModel) -> StepReport:
    """The whole step on one device with unlimited memory."""
    return simulate(g, np.zeros(g.n, dtype=np.int64), comm, 1)
