"""The hot, mutable usage state of a cluster: numpy arrays plus a bucket index.

Placement reads it, `allocate` and `release` change it. Policies plan on a `copy()` so the
snapshot they were given stays untouched.
"""

from __future__ import annotations

import numpy as np

from plinth.core.resources import MILLI, Allocation, Cluster, Request


class ClusterState:
    __slots__ = (
        "_capacity",
        "_failed",
        "_gpu_mem_cap",
        "buckets",
        "cluster",
        "free_whole_by_model",
        "gpu_free_mem",
        "gpu_free_milli",
        "model_gpus",
        "model_nodes",
        "node_free_cpu",
        "node_free_mem",
        "node_free_whole",
        "used_milli",
    )

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        g = cluster.total_gpus
        self.gpu_free_milli = np.full(g, MILLI, dtype=np.int64)
        cap = np.concatenate(
            [np.full(n.num_gpus, n.model.memory_mib if n.num_gpus else 0, dtype=np.int64)
             for n in cluster.nodes]
        )
        self._gpu_mem_cap = cap
        self._capacity = g * MILLI  # free_milli is read in every hot loop: keep it one subtraction
        self.gpu_free_mem = cap.copy()
        self.node_free_cpu = np.array([n.cpus_milli for n in cluster.nodes], dtype=np.int64)
        self.node_free_mem = np.array([n.memory_mib for n in cluster.nodes], dtype=np.int64)
        self.node_free_whole = np.array([n.num_gpus for n in cluster.nodes], dtype=np.int64)
        nm = len(cluster.models)
        self.free_whole_by_model = np.zeros(nm, dtype=np.int64)
        # buckets[model][k]: the nodes of that model with exactly k whole GPUs free.
        width = max(n.num_gpus for n in cluster.nodes) + 1
        self.buckets: list[list[set[int]]] = [[set() for _ in range(width)] for _ in range(nm)]
        for i, n in enumerate(cluster.nodes):
            m = cluster.node_model_id[i]
            if m >= 0:
                self.buckets[m][n.num_gpus].add(i)
                self.free_whole_by_model[m] += n.num_gpus
        # Request shapes that failed to place since the last release: placement only gets
        # harder as resources are allocated, so a shape that failed stays failed.
        self._failed: set[Request] = set()
        self.used_milli = 0  # GPU share allocated, in milli-GPUs, kept by allocate/release
        # Per GPU model: its nodes' indices with their rack ids, and its GPUs (as a slice
        # when contiguous, as usual, so that reading them copies nothing), in index order.
        # They never change, so copies share them (placement reads them on every try
        # instead of masking the whole cluster).
        self.model_nodes: list[tuple[np.ndarray, np.ndarray]] = []
        self.model_gpus: list[slice | np.ndarray] = []  # a slice where they are contiguous
        gpu_model = cluster.node_model_id[cluster.gpu_node]
        for m in range(nm):
            nodes = np.flatnonzero(cluster.node_model_id == m)
            self.model_nodes.append((nodes, cluster.node_rack_id[nodes]))
            gpus = np.flatnonzero(gpu_model == m)
            if gpus.size and gpus[-1] - gpus[0] + 1 == gpus.size:  # contiguous: a view
                self.model_gpus.append(slice(int(gpus[0]), int(gpus[-1]) + 1))
            else:
                self.model_gpus.append(gpus)

    def copy(self) -> ClusterState:
        new = object.__new__(ClusterState)
        new.cluster = self.cluster
        new._gpu_mem_cap = self._gpu_mem_cap
        new._capacity = self._capacity
        new.model_nodes, new.model_gpus = self.model_nodes, self.model_gpus
        for name in ("gpu_free_milli", "gpu_free_mem", "node_free_cpu", "node_free_mem",
                     "node_free_whole", "free_whole_by_model"):
            setattr(new, name, getattr(self, name).copy())
        new.buckets = [[set(b) for b in per_model] for per_model in self.buckets]
        new._failed = set(self._failed)
        new.used_milli = self.used_milli
        return new

    # -- queries ---------------------------------------------------------------------------
    @property
    def capacity_milli(self) -> int:
        return self._capacity

    @property
    def free_milli(self) -> int:
        return self._capacity - self.used_milli

    @property
    def allocated_gpus(self) -> float:
        """GPUs in use, counting fractional shares by their share."""
        return self.used_milli / MILLI

    def known_unplaceable(self, req: Request) -> bool:
        # An empty memo (just after a release) answers without hashing the request.
        return bool(self._failed) and req in self._failed

    def mark_unplaceable(self, req: Request) -> None:
        self._failed.add(req)

    def whole_free_gpus(self, models: tuple[str, ...] = ()) -> int:
        if not models:
            return sum(self.free_whole_by_model.tolist())  # (a few models: faster than numpy)
        ids = [i for i, m in enumerate(self.cluster.models) if m in models]
        return int(self.free_whole_by_model[ids].sum())

    # -- changes ---------------------------------------------------------------------------
    def fits(self, alloc: Allocation, req: Request) -> bool:
        """Whether `alloc` can be allocated now. The control plane asks before it starts a job
        on GPUs that a preempted job may still be releasing."""
        slots = alloc.slots
        c, m = req.cpus_milli, req.memory_mib
        fm = self.gpu_free_milli
        if len(slots) == 1:  # the common case, read directly: one node, distinct GPUs
            s = slots[0]
            n = s.node
            if (c or m) and (self.node_free_cpu.item(n) < c or self.node_free_mem.item(n) < m):
                return False
            milli, gmem = s.milli, s.gpu_memory_mib
            if gmem:
                fmem = self.gpu_free_mem
                for g in s.gpus:
                    if fm.item(g) < milli or fmem.item(g) < gmem:
                        return False
                return True
            for g in s.gpus:
                if fm.item(g) < milli:
                    return False
            return True
        if not c and not m:
            # A gang of whole GPUs asking nothing else (Philly's, one slot a GPU): each GPU
            # must be wholly free and asked for once.
            gpus: list[int] = []
            for s in slots:
                if s.milli != MILLI or s.gpu_memory_mib:
                    break
                gpus += s.gpus
            else:
                if len(set(gpus)) != len(gpus):
                    return False
                for g in gpus:
                    if fm.item(g) != MILLI:
                        return False
                return True
        # Several slots: workers per node, and what each GPU is asked for in all (the slots
        # of a gang of fractions may share a GPU). Free GPU memory is never negative, so GPUs
        # asked for no memory need no memory check.
        workers: dict[int, int] = {}
        milli: dict[int, int] = {}
        gmem: dict[int, int] = {}
        for slot in slots:
            n = slot.node
            workers[n] = workers.get(n, 0) + 1
            sm, sg = slot.milli, slot.gpu_memory_mib
            for g in slot.gpus:
                milli[g] = milli.get(g, 0) + sm
                if sg:
                    gmem[g] = gmem.get(g, 0) + sg
        ncpu, nmem, fmem = self.node_free_cpu, self.node_free_mem, self.gpu_free_mem
        return (all(ncpu.item(n) >= k * c and nmem.item(n) >= k * m for n, k in workers.items())
                and all(fm.item(g) >= v for g, v in milli.items())
                and all(fmem.item(g) >= v for g, v in gmem.items()))

    def allocate(self, alloc: Allocation, req: Request) -> None:
        self._apply(alloc, req, -1)

    def release(self, alloc: Allocation, req: Request) -> None:
        self._apply(alloc, req, +1)
        self._failed.clear()

    def _apply(self, alloc: Allocation, req: Request, sign: int) -> None:
        # Hot path (every start, stop and victim search): plain ints and locals, each array
        # element read with `.item` and written back as a Python int (numpy scalar arithmetic
        # costs several times more), and the bucket index moved once per run of slots on one
        # node (a gang's one-GPU workers are one slot each, mostly on the same nodes).
        fm, fmem = self.gpu_free_milli, self.gpu_free_mem
        ncpu, nmem = self.node_free_cpu, self.node_free_mem
        cpu, mem = sign * req.cpus_milli, sign * req.memory_mib
        used = 0
        moving, moved = -1, 0  # the node whose whole-GPU count changes, and by how much
        for slot in alloc.slots:
            n = slot.node
            if cpu:
                ncpu[n] = ncpu.item(n) + cpu
            if mem:
                nmem[n] = nmem.item(n) + mem
            gpus = slot.gpus
            if not gpus:
                continue
            milli, gmem = sign * slot.milli, sign * slot.gpu_memory_mib
            used += milli * len(gpus)
            whole = 0
            for g in gpus:
                old = fm.item(g)
                new = old + milli
                if new < 0:
                    raise AssertionError(f"GPU {g} over-committed by {alloc}")
                if new > MILLI:
                    raise AssertionError(f"GPU {g} released twice by {alloc}")
                fm[g] = new
                if gmem:
                    left = fmem.item(g) + gmem
                    fmem[g] = left
                    if left < 0:
                        raise AssertionError(f"GPU {g} memory over-committed by {alloc}")
                if old == MILLI:
                    whole -= 1
                elif new == MILLI:
                    whole += 1
            if whole:
                if n != moving:
                    if moved:
                        self._move_bucket(moving, moved)
                    moving, moved = n, 0
                moved += whole
        if moved:
            self._move_bucket(moving, moved)
        self.used_milli -= used

    def _move_bucket(self, n: int, delta: int) -> None:
        m = self.cluster.node_model_list[n]
        old = self.node_free_whole.item(n)
        per_model = self.buckets[m]
        per_model[old].discard(n)
        self.node_free_whole[n] = old + delta
        per_model[old + delta].add(n)
        by_model = self.free_whole_by_model
        by_model[m] = by_model.item(m) + delta

    def check(self) -> None:
        """Invariants, for tests: nothing over-committed, the index matches the arrays."""
        assert (self.gpu_free_milli >= 0).all() and (self.gpu_free_milli <= MILLI).all()
        assert (self.gpu_free_mem >= 0).all() and (self.gpu_free_mem <= self._gpu_mem_cap).all()
        assert (self.node_free_cpu >= 0).all() and (self.node_free_mem >= 0).all()
        whole = np.bincount(self.cluster.gpu_node, weights=self.gpu_free_milli == MILLI,
                            minlength=len(self.cluster.nodes)).astype(np.int64)
        assert (whole == self.node_free_whole).all(), "bucket index out of date"
        assert self.used_milli == self.capacity_milli - int(self.gpu_free_milli.sum())
