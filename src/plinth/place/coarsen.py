"""Coarsening: fewer, larger nodes, so that placement takes seconds.

Three rules, each of which keeps the graph acyclic by construction:

1. Single-consumer chains: if u has exactly one out-edge, to v, merge u into v (any other path
   from u to v would need a second out-edge of u).
2. Single-producer nodes: if v has exactly one in-edge, from u, merge v into u (symmetric).
3. Adjacent fusion: walking a topological order, merge a node into the one just before it when an
   edge joins them; nothing lies between them in the order, so no path can go around the edge.

Rule 3 only runs until the graph has `target_nodes` nodes. All rules respect two caps so that a
merged node can still be placed and balanced: its memory (`max_node_bytes`) and its compute
(`max_node_us`). Backward ops are not in the graph: each follows its forward op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plinth.core.errors import PlinthError
from plinth.place.graph import OpGraph


@dataclass(slots=True)
class Coarse:
    """The coarse graph and, for each original node, the coarse node that holds it."""

    graph: OpGraph
    group: np.ndarray


class _Contractor:
    """Union of nodes over mutable adjacency sets of representatives."""

    def __init__(self, g: OpGraph, max_bytes: float, max_us: float) -> None:
        self.out = [set(s) for s in g.succs]
        self.inn = [set(p) for p in g.preds]
        self.alive = [True] * g.n
        self.rep = list(range(g.n))
        self.perm = g.perm_bytes.astype(np.float64).tolist()
        self.temp = g.temp_bytes.astype(np.float64).tolist()
        self.work = g.work_us.tolist()
        self.max_bytes, self.max_us = max_bytes, max_us
        self.count = g.n

    def fits(self, a: int, b: int) -> bool:
        mem = self.perm[a] + self.perm[b] + max(self.temp[a], self.temp[b])
        return mem <= self.max_bytes and self.work[a] + self.work[b] <= self.max_us

    def merge(self, a: int, b: int) -> None:
        """Fold b into a."""
        for s in self.out[b]:
            self.inn[s].discard(b)
            if s != a:
                self.inn[s].add(a)
                self.out[a].add(s)
        for p in self.inn[b]:
            self.out[p].discard(b)
            if p != a:
                self.out[p].add(a)
                self.inn[a].add(p)
        self.out[a].discard(b)
        self.inn[a].discard(b)
        self.out[b], self.inn[b] = set(), set()
        self.alive[b] = False
        self.rep[b] = a
        self.perm[a] += self.perm[b]
        self.temp[a] = max(self.temp[a], self.temp[b])
        self.work[a] += self.work[b]
        self.count -= 1

    def find(self, x: int) -> int:
        root = x
        while self.rep[root] != root:
            root = self.rep[root]
        while self.rep[x] != root:
            self.rep[x], x = root, self.rep[x]
        return root

    def chains(self) -> None:
        changed = True
        while changed:
            changed = False
            for u in range(len(self.alive)):
                while self.alive[u] and len(self.out[u]) == 1:
                    v = next(iter(self.out[u]))
                    if not self.fits(u, v):
                        break
                    self.merge(v, u)  # v keeps its other inputs; u joins it
                    changed = True
                while self.alive[u] and len(self.inn[u]) == 1:
                    p = next(iter(self.inn[u]))
                    if not self.fits(p, u):
                        break
                    self.merge(p, u)
                    changed = True

    def order(self) -> list[int]:
        """Topological order of the live representatives (Kahn; ties by lowest index)."""
        import heapq

        indeg = {u: len(self.inn[u]) for u in range(len(self.alive)) if self.alive[u]}
        heap = [u for u, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        seq = []
        while heap:
            u = heapq.heappop(heap)
            seq.append(u)
            for s in self.out[u]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(heap, s)
        if len(seq) != len(indeg):
            raise PlinthError("coarsen: contraction created a cycle (a bug; please report it)")
        return seq

    def fuse_adjacent(self, target: int) -> None:
        seq = self.order()
        i = 0
        while self.count > target and i + 1 < len(seq):
            a, b = seq[i], seq[i + 1]
            if b in self.out[a] and self.fits(a, b):
                self.merge(a, b)
                del seq[i + 1]
            else:
                i += 1


def coarsen(g: OpGraph, *, max_node_bytes: float = float("inf"),
            max_node_us: float = float("inf"), target_nodes: int | None = None) -> Coarse:
    """Apply the three rules and return the coarse graph with the node mapping."""
    c = _Contractor(g, max_node_bytes, max_node_us)
    c.chains()
    if target_nodes is not None and c.count > target_nodes:
        c.fuse_adjacent(target_nodes)
    seq = c.order()
    pos = np.full(g.n, -1, dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    group = pos[[c.find(x) for x in range(g.n)]]
    return Coarse(quotient(g, group, len(seq)), group)


def quotient(g: OpGraph, group: np.ndarray, k: int) -> OpGraph:
    """The graph of groups. Group ids must already be in a topological order of the quotient.
    A tensor crossing into a group is counted once however many members there consume it."""
    order = np.argsort(group, kind="stable")
    members: list[list[int]] = [[] for _ in range(k)]
    for x in order.tolist():
        members[group[x]].append(x)

    def total(a: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=a, minlength=k)

    temp = np.zeros(k, dtype=np.int64)
    np.maximum.at(temp, group, g.temp_bytes)
    gs, gd = group[g.src], group[g.dst]
    cross = gs != gd
    # Distinct (producer, destination group) pairs: each tensor is sent to a group once.
    trip = np.unique(np.stack([gs[cross], gd[cross], g.src[cross]], axis=1), axis=0) \
        if cross.any() else np.zeros((0, 3), dtype=np.int64)
    pairs, inv = np.unique(trip[:, :2], axis=0, return_inverse=True) if len(trip) else \
        (np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64))
    ebytes = np.bincount(inv.reshape(-1), weights=g.out_bytes[trip[:, 2]], minlength=len(pairs))
    sends = np.zeros(g.n, dtype=bool)
    sends[trip[:, 2]] = True
    out = np.bincount(group, weights=np.where(sends, g.out_bytes, 0), minlength=k)
    names = [g.names[m[0]] if len(m) == 1 else f"{g.names[m[0]]}..{g.names[m[-1]]}"
             for m in members]
    biggest = [max(m, key=lambda x: g.work_us[x]) for m in members]
    result = OpGraph(names, total(g.fwd_us), total(g.bwd_us),
                     np.rint(total(g.param_bytes)).astype(np.int64),
                     np.rint(total(g.act_bytes)).astype(np.int64), temp,
                     np.rint(out).astype(np.int64), pairs[:, 0], pairs[:, 1],
                     np.rint(ebytes).astype(np.int64),
                     [tuple(n for x in m for n in g.members[x]) for m in members],
                     [g.scopes[b] for b in biggest], tracer=g.tracer)
    result.validate()
    return result
