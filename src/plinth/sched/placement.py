"""Placement: where a job's workers go, all or nothing.

- Whole-GPU gangs are consolidated: one node if any node can hold the gang (best fit, from a
  bucket index of nodes by free GPU count), else the fewest nodes inside one rack, else the
  fewest nodes across racks. Spread gangs run slower (`locality_factor`).
- Fractional workers are packed best-fit onto the fullest GPU that still has the SM share and
  GPU memory they ask for, so no GPU is ever over-committed. `fractional="fgd"` (with a
  `profile`) instead puts each single pod, fractional, whole-GPU or CPU-only, on the GPU or node
  that least increases fragmentation, and each worker of a fractional gang on such a GPU (see
  `plinth.sched.fgd`).

Every function here is pure with respect to its inputs except where it says it allocates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from plinth.core.resources import MILLI, Allocation, Cluster, Request, WorkerSlot

if TYPE_CHECKING:
    from plinth.sched.fgd import WorkloadProfile
    from plinth.sched.state import ClusterState


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    fractional: str = "bestfit"  # "bestfit" or "fgd"
    spread_node_penalty: float = 0.10  # slowdown when a gang spans nodes in one rack
    spread_rack_penalty: float = 0.25  # slowdown when a gang spans racks
    profile: WorkloadProfile | None = None  # the expected pod mix, for fgd


DEFAULT_PLACEMENT = PlacementConfig()


def place(state: ClusterState, req: Request, cfg: PlacementConfig = DEFAULT_PLACEMENT,
          models: tuple[str, ...] | None = None) -> Allocation | None:
    """Find an allocation for the whole gang in `state`, or None. Does not allocate.

    `models` narrows the GPU models to try, in order (a heterogeneity-aware policy passes the
    one it chose); by default the preferred model comes first, then the cluster's order.
    """
    if state.known_unplaceable(req) and models is None:
        return None
    cluster = state.cluster
    if cfg.fractional == "fgd" and cfg.profile is not None and req.workers == 1:
        # FGD hook: a single pod (fractional, whole-GPU or CPU-only) is scored against every
        # allowed model's nodes at once, so FGD also picks the node type (see plinth.sched.fgd).
        from plinth.sched.fgd import place_pod

        alloc = place_pod(state, req, cfg.profile, models)
    elif req.gpus == 0 and req.gpu_milli == 0:
        alloc = _place_cpu_only(state, req)
    else:
        order = models if models is not None else _model_order(cluster, req)
        alloc = None
        for m in order:
            mid = cluster.models.index(m)
            if req.fractional:
                alloc = _place_fraction(state, req, mid, cfg)
            else:
                alloc = _place_whole(state, req, mid)
            if alloc is not None:
                break
    if alloc is None and models is None:
        state.mark_unplaceable(req)
    return alloc


def place_and_allocate(state: ClusterState, req: Request,
                       cfg: PlacementConfig = DEFAULT_PLACEMENT,
                       models: tuple[str, ...] | None = None) -> Allocation | None:
    alloc = place(state, req, cfg, models)
    if alloc is not None:
        state.allocate(alloc, req)
    return alloc


def never_fits(cluster: Cluster, req: Request) -> str | None:
    """Why `req` cannot run even on the empty cluster, or None if it can."""
    from plinth.sched.state import ClusterState

    models = [m for m in cluster.models if req.allows(m)]
    if (req.gpus or req.gpu_milli) and not models:
        return f"no GPU of an allowed model {list(req.gpu_models)} in the cluster"
    total = sum(cluster.gpus_of_model(m) for m in models)
    if req.num_gpus > total:
        return f"asks for {req.num_gpus:g} GPUs, the cluster has {total}"
    if place(ClusterState(cluster), req) is None:
        return "does not fit the empty cluster (per-node CPU, memory or GPU memory too small)"
    return None


def locality_factor(cluster: Cluster, alloc: Allocation, cfg: PlacementConfig = DEFAULT_PLACEMENT
                    ) -> float:
    """Relative speed of a gang given how widely it is spread: 1.0 on one node."""
    nodes = alloc.nodes
    if len(nodes) <= 1:
        return 1.0
    racks = {cluster.nodes[n].rack for n in nodes}
    penalty = cfg.spread_rack_penalty if len(racks) > 1 else cfg.spread_node_penalty
    return 1.0 / (1.0 + penalty)


# -- internals ------------------------------------------------------------------------------

def _model_order(cluster: Cluster, req: Request) -> list[str]:
    order = [m for m in cluster.models if req.allows(m)]
    if req.preferred_gpu_model in order:
        order.remove(req.preferred_gpu_model)
        order.insert(0, req.preferred_gpu_model)
    return order


def _free_whole_gpus(state: ClusterState, n: int, count: int) -> list[int]:
    first, size = state.cluster.node_gpu_range[n]
    row = state.gpu_free_milli[first:first + size].tolist()
    return [first + i for i, free in enumerate(row) if free == MILLI][:count]


def _whole_slots(state: ClusterState, req: Request, plan: list[tuple[int, int]]) -> Allocation:
    """Turn (node, workers) pairs into worker slots of `req.gpus` whole GPUs each."""
    slots = []
    for n, workers in plan:
        gpus = _free_whole_gpus(state, n, workers * req.gpus)
        for w in range(workers):
            slots.append(WorkerSlot(n, tuple(gpus[w * req.gpus:(w + 1) * req.gpus])))
    return Allocation(tuple(slots))


def _place_whole(state: ClusterState, req: Request, mid: int) -> Allocation | None:
    need = req.gpus * req.workers
    if state.free_whole_by_model[mid] < need:
        return None
    buckets = state.buckets[mid]
    cpu, mem = req.cpus_milli * req.workers, req.memory_mib * req.workers
    # Best fit on one node: the node with the fewest free GPUs that still holds the gang.
    for k in range(need, len(buckets)):
        for n in buckets[k]:
            if state.node_free_cpu[n] >= cpu and state.node_free_mem[n] >= mem:
                return _whole_slots(state, req, [(n, req.workers)])
    if req.workers == 1:
        return None
    return _place_spread(state, req, mid)


def _place_spread(state: ClusterState, req: Request, mid: int) -> Allocation | None:
    cluster = state.cluster
    nodes = np.flatnonzero(cluster.node_model_id == mid)
    cap = state.node_free_whole[nodes] // req.gpus
    if req.cpus_milli:
        cap = np.minimum(cap, state.node_free_cpu[nodes] // req.cpus_milli)
    if req.memory_mib:
        cap = np.minimum(cap, state.node_free_mem[nodes] // req.memory_mib)
    if cap.sum() < req.workers:
        return None
    racks = cluster.node_rack_id[nodes]
    rack_cap = np.bincount(racks, weights=cap)
    best = None  # (nodes needed, spare capacity, rack): fewest nodes, then best fit
    for rack in np.flatnonzero(rack_cap >= req.workers):
        caps = np.sort(cap[racks == rack])[::-1]
        needed = int(np.searchsorted(np.cumsum(caps), req.workers)) + 1
        key = (needed, rack_cap[rack] - req.workers, rack)
        best = key if best is None or key < best else best
    if best is not None:
        keep = racks == best[2]
        nodes, cap = nodes[keep], cap[keep]
    order = np.argsort(-cap, kind="stable")  # fewest nodes: largest capacity first
    plan, left = [], req.workers
    for i in order:
        take = int(min(cap[i], left))
        if take <= 0:
            break
        plan.append((int(nodes[i]), take))
        left -= take
        if left == 0:
            break
    return _whole_slots(state, req, plan)


def _place_fraction(state: ClusterState, req: Request, mid: int, cfg: PlacementConfig
                    ) -> Allocation | None:
    cluster = state.cluster
    work = state if req.workers == 1 else state.copy()
    slots = []
    for _ in range(req.workers):
        mask = (work.gpu_free_milli >= req.gpu_milli) & (work.gpu_free_mem >= req.gpu_memory_mib)
        node_ok = cluster.node_model_id == mid
        if req.cpus_milli:
            node_ok = node_ok & (work.node_free_cpu >= req.cpus_milli)
        if req.memory_mib:
            node_ok = node_ok & (work.node_free_mem >= req.memory_mib)
        mask &= node_ok[cluster.gpu_node]
        cand = np.flatnonzero(mask)
        if cand.size == 0:
            return None
        if cfg.fractional == "fgd" and cfg.profile is not None:
            from plinth.sched.fgd import choose_gpu

            g = choose_gpu(work, req, cand, cfg.profile)
        else:
            g = int(cand[np.argmin(work.gpu_free_milli[cand])])
        slot = WorkerSlot(int(cluster.gpu_node[g]), (g,), req.gpu_milli, req.gpu_memory_mib)
        slots.append(slot)
        if req.workers > 1:
            work.allocate(Allocation((slot,)), req)
    return Allocation(tuple(slots))


def _place_cpu_only(state: ClusterState, req: Request) -> Allocation | None:
    ok = (state.node_free_cpu >= req.cpus_milli) & (state.node_free_mem >= req.memory_mib)
    nodes = np.flatnonzero(ok)
    if nodes.size == 0:
        return None
    # Best fit on CPU: the node with the least free CPU that still fits.
    n = int(nodes[np.argmin(state.node_free_cpu[nodes])])
    if req.workers == 1:
        return Allocation((WorkerSlot(n, (), 0),))
    work = state.copy()
    slots = []
    for _ in range(req.workers):
        ok = (work.node_free_cpu >= req.cpus_milli) & (work.node_free_mem >= req.memory_mib)
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return None
        n = int(nodes[np.argmin(work.node_free_cpu[nodes])])
        slot = WorkerSlot(n, (), 0)
        work.allocate(Allocation((slot,)), req)
        slots.append(slot)
    return Allocation(tuple(slots))
