"""m-TOPO: fill devices one after another in topological order.

Each device takes nodes up to a cap of (total memory / devices + the largest node), which spreads
the model evenly; if that leaves nodes over, a second pass fills each device to its full memory.
"""

from __future__ import annotations

import numpy as np

from plinth.place.algorithms.common import Devices, Ledger, Placement, check_each_fits
from plinth.place.comm import CommModel
from plinth.place.graph import OpGraph


def _fill(g: OpGraph, devices: Devices, caps: np.ndarray) -> tuple[np.ndarray, int | None, Ledger]:
    device_of = np.full(g.n, -1, dtype=np.int64)
    ledger = Ledger(g, devices)
    d = 0
    for u in range(g.n):
        while d < devices.count and ledger.need(u, d, device_of) > caps[d]:
            d += 1
        if d == devices.count:
            return device_of, u, ledger
        ledger.commit(u, d, device_of)
        device_of[u] = d
    return device_of, None, ledger


def m_topo(g: OpGraph, devices: Devices, comm: CommModel) -> Placement:
    """Place `g` in topological order (node index order) under per-device caps."""
    check_each_fits(g, devices)
    largest = float((g.perm_bytes + g.temp_bytes).max()) if g.n else 0.0
    even = g.total_bytes() / devices.count + largest
    caps = np.minimum(devices.memory, even)
    device_of, stuck, ledger = _fill(g, devices, caps)
    reason = f"topological fill, cap {even / 2**20:,.0f} MiB per device"
    if stuck is not None:
        device_of, stuck, ledger = _fill(g, devices, devices.memory)
        reason = "topological fill to full device memory (the even cap left nodes over)"
        if stuck is not None:
            raise ledger.no_room(stuck, device_of)
    return Placement("m-topo", device_of, np.arange(g.n, dtype=np.float64), reason)
