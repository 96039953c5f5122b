"""What every placer shares: the devices, the plan it returns, and memory accounting.

Memory on a device, as every placer and the simulator count it: parameters and their gradients,
activations kept for backward, each tensor received from another device (once), and the largest
scratch buffer of any op there (ops on a device run one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.core.errors import SpecError, UnplaceableError
from plinth.place.graph import OpGraph


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True, slots=True)
class Devices:
    """Identical-speed devices, each with its own memory cap (bytes)."""

    memory_bytes: tuple[int, ...]

    @staticmethod
    def uniform(count: int, memory_bytes: int) -> Devices:
        if count < 1:
            raise SpecError(f"--devices: must be at least 1 (got {count})")
        if memory_bytes <= 0:
            raise SpecError(f"--memory: must be more than 0 (got {memory_bytes})")
        return Devices((int(memory_bytes),) * count)

    @property
    def count(self) -> int:
        return len(self.memory_bytes)

    @property
    def memory(self) -> np.ndarray:
        return np.asarray(self.memory_bytes, dtype=np.float64)


@dataclass(slots=True)
class Placement:
    """A device per node, and the order the placer meant ops to run in (estimated start µs)."""

    algo: str
    device: np.ndarray
    order: np.ndarray
    reason: str = ""


def check_each_fits(g: OpGraph, devices: Devices) -> None:
    """A node bigger than every device can never be placed, however the graph is split."""
    need = g.perm_bytes + g.temp_bytes
    biggest = max(devices.memory_bytes)
    if g.n and need.max() > biggest:
        u = int(np.argmax(need))
        raise UnplaceableError(
            f"node {g.names[u]!r} needs {fmt_bytes(need[u])} but each device has "
            f"{fmt_bytes(biggest)} (--memory); it cannot fit even when the graph is fully split")


class Sent:
    """Bytes of each node's output already on each other device: a tensor received once is not
    sent again. A coarse node may send several tensors; each edge needs at most its own bytes."""

    def __init__(self, g: OpGraph) -> None:
        self.g = g
        self.sent: dict[tuple[int, int], int] = {}

    def extra(self, p: int, e: int, d: int) -> int:
        """Bytes edge `e` from `p` still has to bring to device `d`."""
        have = self.sent.get((p, d), 0)
        return int(max(0, min(self.g.edge_bytes[e], self.g.out_bytes[p] - have)))

    def add(self, p: int, d: int, nbytes: int) -> None:
        self.sent[(p, d)] = self.sent.get((p, d), 0) + nbytes


class Ledger:
    """Memory in use on each device while a placer assigns nodes."""

    def __init__(self, g: OpGraph, devices: Devices) -> None:
        self.g, self.mem = g, devices.memory
        self.perm = np.zeros(devices.count)   # params, grads, activations, received tensors
        self.temp = np.zeros(devices.count)   # largest scratch buffer
        self.sent = Sent(g)
        self.node_perm = g.perm_bytes.astype(np.float64)
        self.node_temp = g.temp_bytes.astype(np.float64)

    def received(self, u: int, d: int, device_of: np.ndarray) -> int:
        g = self.g
        return sum(self.sent.extra(p, e, d) for p, e in zip(g.preds[u], g.pred_edges[u])
                   if device_of[p] != d)

    def need(self, u: int, d: int, device_of: np.ndarray) -> float:
        """Memory device `d` would be using with `u` placed on it."""
        return (self.perm[d] + self.node_perm[u] + self.received(u, d, device_of)
                + max(self.temp[d], self.node_temp[u]))

    def fits(self, u: int, d: int, device_of: np.ndarray) -> bool:
        return self.need(u, d, device_of) <= self.mem[d]

    def commit(self, u: int, d: int, device_of: np.ndarray) -> None:
        g = self.g
        for p, e in zip(g.preds[u], g.pred_edges[u]):
            if device_of[p] != d:
                x = self.sent.extra(p, e, d)
                self.sent.add(p, d, x)
                self.perm[d] += x
        self.perm[d] += self.node_perm[u]
        self.temp[d] = max(self.temp[d], self.node_temp[u])

    def used(self) -> np.ndarray:
        return self.perm + self.temp

    def no_room(self, u: int, device_of: np.ndarray) -> UnplaceableError:
        d = int(np.argmin([self.need(u, d, device_of) - self.mem[d] for d in range(len(self.mem))]))
        return UnplaceableError(
            f"node {self.g.names[u]!r} needs {fmt_bytes(self.need(u, d, device_of) - self.used()[d])}"
            f" more but the emptiest device has {fmt_bytes(self.mem[d] - self.used()[d])} free "
            f"(--memory {fmt_bytes(self.mem[d])} x {len(self.mem)} devices); the model does not "
            "fit: add devices or memory")


def bottom_levels(g: OpGraph, cost_us: np.ndarray) -> np.ndarray:
    """Longest path (work plus transfer) from each node to an exit: a list-scheduling priority."""
    work = g.work_us
    level = work.copy()
    for u in range(g.n - 1, -1, -1):
        best = 0.0
        for s, e in zip(g.succs[u], g.succ_edges[u]):
            best = max(best, cost_us[e] + level[s])
        level[u] = work[u] + best
    return level
