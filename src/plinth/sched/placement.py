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

from collections.abc import Iterable
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
    if models is None and state.known_unplaceable(req):
        return None
    cluster = state.cluster
    if req.nodes:
        alloc = _place_pinned(state, req)
    elif cfg.fractional == "fgd" and cfg.profile is not None and req.workers == 1:
        # FGD hook: a single pod (fractional, whole-GPU or CPU-only) is scored against every
        # allowed model's nodes at once, so FGD also picks the node type (see plinth.sched.fgd).
        from plinth.sched.fgd import place_pod

        alloc = place_pod(state, req, cfg.profile, models)
    elif req.gpus == 0 and req.gpu_milli == 0:
        alloc = _place_cpu_only(state, req)
    else:
        alloc = None
        for mid in _model_ids(cluster, req, models):
            if req.fractional:
                alloc = _place_fraction(state, req, mid, cfg)
            else:
                fit = _whole_fit(state, req, mid)
                if fit is not None:
                    alloc = (_place_spread(state, req, mid) if fit == SPREAD
                             else _whole_slots(state, req, [(fit, req.workers)]))
            if alloc is not None:
                break
    if alloc is None and models is None:
        state.mark_unplaceable(req)
    return alloc


def placeable(state: ClusterState, req: Request, cfg: PlacementConfig = DEFAULT_PLACEMENT
              ) -> bool:
    """Whether `place(state, req, cfg)` would find an allocation, without building it.

    Victim searches ask this after every release; for whole-GPU gangs it is a count over the
    bucket index instead of a placement (other shapes are placed and the result dropped)."""
    if req.nodes or req.fractional or (req.gpus == 0 and req.gpu_milli == 0) or (
            cfg.fractional == "fgd" and cfg.profile is not None and req.workers == 1):
        return place(state, req, cfg) is not None
    if state.known_unplaceable(req):
        return False
    for mid in _model_ids(state.cluster, req, None):
        if _whole_fit(state, req, mid) is not None:
            return True
    state.mark_unplaceable(req)
    return False


def place_and_allocate(state: ClusterState, req: Request,
                       cfg: PlacementConfig = DEFAULT_PLACEMENT,
                       models: tuple[str, ...] | None = None) -> Allocation | None:
    alloc = place(state, req, cfg, models)
    if alloc is not None:
        state.allocate(alloc, req)
    return alloc


class FreedWhole:
    """Whole GPUs that releasing some whole-GPU allocations would free on `state`, counted
    without copying the state or releasing anything: enough to say whether a plain gang
    (whole GPUs, no CPU or memory asked) would then fit, exactly as `placeable` on the state
    with them released would say.

    Victim searches release candidates one at a time and ask after each; counting instead of
    releasing saves a state copy and a release per candidate. A GPU of a whole-GPU slot is
    held by that job alone, so releasing it leaves it whole and free."""

    __slots__ = ("_gain", "_model_gain", "state")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._gain: dict[int, int] = {}  # node -> whole GPUs freed on it
        self._model_gain = [0] * len(state.cluster.models)

    @staticmethod
    def countable(req: Request, cfg: PlacementConfig) -> bool:
        """Whether `fits` answers for `req` (else ask `placeable` on a released copy)."""
        return (req.gpus > 0 and not req.cpus_milli and not req.memory_mib and not req.nodes
                and not (cfg.fractional == "fgd" and cfg.profile is not None
                         and req.workers == 1))

    def add(self, alloc: Allocation) -> bool:
        """Count `alloc` as released; False (and nothing counted) if it holds a GPU share."""
        slots = alloc.slots
        for slot in slots:
            if slot.gpus and slot.milli != MILLI:
                return False
        models, gain, model_gain = self.state.cluster.node_model_list, self._gain, self._model_gain
        for slot in slots:
            if slot.gpus:
                n, k = slot.node, len(slot.gpus)
                gain[n] = gain.get(n, 0) + k
                model_gain[models[n]] += k
        return True

    def fits(self, req: Request) -> bool:
        """`placeable(state with the counted allocations released, req)`, for a countable
        request (see `_whole_fit`: one node that holds it all, else spread)."""
        state, g, need = self.state, req.gpus, req.gpus * req.workers
        models, free = state.cluster.node_model_list, state.node_free_whole
        for mid in _model_ids(state.cluster, req, None):
            if int(state.free_whole_by_model[mid]) + self._model_gain[mid] < need:
                continue
            buckets = state.buckets[mid]
            top = next((k for k in range(len(buckets) - 1, -1, -1) if buckets[k]), 0)
            touched = [(int(free[n]), int(free[n]) + d) for n, d in self._gain.items()
                       if models[n] == mid]
            if max([top] + [after for _, after in touched]) >= need:
                return True  # some node holds the whole gang
            if req.workers == 1:
                continue
            room = sum((k // g) * len(buckets[k]) for k in range(g, len(buckets)))
            room += sum(after // g - before // g for before, after in touched)
            if room >= req.workers:
                return True
        return False


def never_fits(cluster: Cluster, req: Request) -> str | None:
    """Why `req` cannot run even on the empty cluster, or None if it can."""
    from plinth.sched.state import ClusterState

    unknown = [n for n in req.nodes if n not in cluster.node_index]
    if unknown:
        return f"no node named {unknown[0]!r} in the cluster"
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


def _model_ids(cluster: Cluster, req: Request, models: tuple[str, ...] | None
               ) -> Iterable[int]:
    """Indices into `cluster.models` to try, in order (see `place`)."""
    if models is None and not req.gpu_models and req.preferred_gpu_model is None:
        return range(len(cluster.models))  # the common request: every model, cluster order
    order = models if models is not None else _model_order(cluster, req)
    return [cluster.models.index(m) for m in order]


def _free_whole_gpus(state: ClusterState, n: int, count: int) -> list[int]:
    first, size = state.cluster.node_gpu_range[n]
    row = state.gpu_free_milli[first:first + size].tolist()
    return [first + i for i, free in enumerate(row) if free == MILLI][:count]


def _whole_slots(state: ClusterState, req: Request, plan: list[tuple[int, int]]) -> Allocation:
    """Turn (node, workers) pairs into worker slots of `req.gpus` whole GPUs each."""
    slots = []
    one = state.cluster.gpu_slots if req.gpus == 1 else None
    for n, workers in plan:
        gpus = _free_whole_gpus(state, n, workers * req.gpus)
        if one is not None:
            slots += [one[g] for g in gpus]
            continue
        for w in range(workers):
            slots.append(WorkerSlot(n, tuple(gpus[w * req.gpus:(w + 1) * req.gpus])))
    return Allocation(tuple(slots))


SPREAD = -1  # `_whole_fit`: the gang fits only spread over several nodes


def _whole_fit(state: ClusterState, req: Request, mid: int) -> int | None:
    """How a whole-GPU gang fits on model `mid`: the node that holds it all (best fit: the
    fewest free GPUs that still hold the gang, from the bucket index), SPREAD, or None."""
    need = req.gpus * req.workers
    if state.free_whole_by_model[mid] < need:
        return None
    buckets = state.buckets[mid]
    cpu, mem = req.cpus_milli * req.workers, req.memory_mib * req.workers
    for k in range(need, len(buckets)):
        nodes = buckets[k]
        if not nodes:
            continue
        if not cpu and not mem:
            return min(nodes)  # ties by node index: the same whatever the set's history
        for n in sorted(nodes):
            if state.node_free_cpu[n] >= cpu and state.node_free_mem[n] >= mem:
                return n
    if req.workers == 1:
        return None
    if not req.cpus_milli and not req.memory_mib:
        # Each node holds (free GPUs // GPUs per worker) workers: count them by bucket.
        g = req.gpus
        room = sum((k // g) * len(buckets[k]) for k in range(g, len(buckets)))
    else:
        room = int(_spread_capacity(state, req, state.model_nodes[mid][0]).sum())
    return SPREAD if room >= req.workers else None


def _spread_capacity(state: ClusterState, req: Request, nodes: np.ndarray) -> np.ndarray:
    """Workers of `req` each of `nodes` can hold now."""
    cap = state.node_free_whole[nodes] // req.gpus
    if req.cpus_milli:
        cap = np.minimum(cap, state.node_free_cpu[nodes] // req.cpus_milli)
    if req.memory_mib:
        cap = np.minimum(cap, state.node_free_mem[nodes] // req.memory_mib)
    return cap


def _place_spread(state: ClusterState, req: Request, mid: int) -> Allocation | None:
    """The fewest nodes inside one rack (then the least spare room, then the first rack),
    else the fewest nodes across racks; largest capacity first, ties by node index."""
    nodes, racks = state.model_nodes[mid]
    cap = _spread_capacity(state, req, nodes)
    want = req.workers
    if cap.sum() < want:
        return None
    rack_cap = np.bincount(racks, weights=cap)
    fit = np.flatnonzero(rack_cap >= want)
    if fit.size == 1:  # one rack can hold the gang: nothing to compare
        keep = racks == fit[0]
        nodes, cap = nodes[keep], cap[keep]
    elif fit.size > 1:
        # For every rack that can hold the gang at once (vectorised: one pass whatever the
        # number of racks): sort its nodes by capacity, largest first, and count how many
        # it takes to reach `want`.
        ok = rack_cap[racks] >= want
        r, c = racks[ok], cap[ok]
        o = np.lexsort((-c, r))
        r, c = r[o], c[o]
        first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        group = np.repeat(np.arange(first.size), np.diff(np.r_[first, r.size]))
        cum = np.cumsum(c)
        within = cum - (cum[first] - c[first])[group]
        needed = np.bincount(group, weights=within < want) + 1
        rack_ids = r[first]
        best = rack_ids[np.lexsort((rack_ids, rack_cap[rack_ids] - want, needed))[0]]
        keep = racks == best
        nodes, cap = nodes[keep], cap[keep]
    order = np.argsort(-cap, kind="stable")  # fewest nodes: largest capacity first
    plan, left = [], want
    for n, c in zip(nodes[order].tolist(), cap[order].tolist()):
        take = min(c, left)
        if take <= 0:
            break
        plan.append((n, take))
        left -= take
        if left == 0:
            break
    return _whole_slots(state, req, plan)


def _place_fraction(state: ClusterState, req: Request, mid: int, cfg: PlacementConfig
                    ) -> Allocation | None:
    cluster = state.cluster
    work = state if req.workers == 1 else state.copy()
    slots = []
    span = state.model_gpus[mid]  # only this model's GPUs, in index order
    for _ in range(req.workers):
        # The GPUs with enough SM share left (in a busy cluster, few), then among those the
        # ones with the memory and whose node has the CPU and memory: the same set, in
        # index order, as one mask over all, for a fraction of the work.
        cand = np.flatnonzero(work.gpu_free_milli[span] >= req.gpu_milli)
        cand = cand + span.start if isinstance(span, slice) else span[cand]
        if req.gpu_memory_mib:
            cand = cand[work.gpu_free_mem[cand] >= req.gpu_memory_mib]
        if req.cpus_milli:
            cand = cand[work.node_free_cpu[cluster.gpu_node[cand]] >= req.cpus_milli]
        if req.memory_mib:
            cand = cand[work.node_free_mem[cluster.gpu_node[cand]] >= req.memory_mib]
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


def _place_pinned(state: ClusterState, req: Request) -> Allocation | None:
    """A request limited to named nodes (a unit that must share a node with another): each
    worker on the first of them with room, best fit among the GPUs of that node."""
    cluster = state.cluster
    ids = [cluster.node_index[n] for n in req.nodes if n in cluster.node_index]
    work = state if req.workers == 1 else state.copy()
    slots = []
    for _ in range(req.workers):
        slot = next((s for n in ids if (s := _slot_on(work, req, n)) is not None), None)
        if slot is None:
            return None
        slots.append(slot)
        if req.workers > 1:
            work.allocate(Allocation((slot,)), req)
    return Allocation(tuple(slots))


def _slot_on(state: ClusterState, req: Request, n: int) -> WorkerSlot | None:
    """One worker of `req` on node `n`, or None if it has no room."""
    if state.node_free_cpu[n] < req.cpus_milli or state.node_free_mem[n] < req.memory_mib:
        return None
    if not (req.gpus or req.gpu_milli):
        return WorkerSlot(n, (), 0)
    cluster = state.cluster
    if not req.allows(cluster.nodes[n].gpu_model):
        return None
    if req.gpus:
        gpus = _free_whole_gpus(state, n, req.gpus)
        return WorkerSlot(n, tuple(gpus)) if len(gpus) == req.gpus else None
    first, size = cluster.node_gpu_range[n]
    cand = first + np.flatnonzero(state.gpu_free_milli[first:first + size] >= req.gpu_milli)
    if req.gpu_memory_mib:
        cand = cand[state.gpu_free_mem[cand] >= req.gpu_memory_mib]
    if cand.size == 0:
        return None
    g = int(cand[np.argmin(state.gpu_free_milli[cand])])
    return WorkerSlot(n, (g,), req.gpu_milli, req.gpu_memory_mib)
