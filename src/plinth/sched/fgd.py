"""Fragmentation gradient descent (FGD): put each pod where it fragments the cluster least.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23. Best fit packs a pod onto the fullest GPU, which can strand
slivers of GPU that no pod of the expected mix can use. FGD instead measures, for a *target
workload* (the mix of pod shapes the cluster expects, a `WorkloadProfile`), how much of a node's
free GPU share is unusable:

- a shape that cannot run on the node at all (CPU, memory, GPU count or GPU model) leaves all of
  the node's free GPU share as fragment;
- a shape that can run leaves as fragment the free share of the GPUs that cannot hold its
  per-GPU demand (for a fractional pod: GPUs with less free share or GPU memory than it asks;
  for a whole-GPU pod: the partly used GPUs).

A node's fragmentation is the popularity-weighted sum over shapes, F_n = sum_m p_m F_n(m), and
FGD places a pod on the candidate (a GPU for a fractional pod, a node otherwise) that increases
F_n the least. Ties go to best fit, then to the lowest index, so placement is deterministic.

Everything is vectorised over the candidates. Two things keep it cheap. Shapes fall into a few
*GPU classes* (per-GPU demand, GPU memory, GPU count): what a GPU contributes depends only on the
class, and the per-shape CPU, memory and model checks depend only on the node. And nodes in the
same state (all the empty nodes of a model, say) fragment alike, so each such *kind* is scored
once. The cost is (node kinds x shapes) + (distinct candidate GPUs x classes), never
(GPUs x shapes).

Weights are integers (pod counts), so fragmentation is summed exactly in int64 and equal scores
are true ties rather than rounding noise.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from plinth.core.errors import SpecError
from plinth.core.resources import MILLI, Allocation, Cluster, Request, WorkerSlot

if TYPE_CHECKING:
    from plinth.sched.state import ClusterState

# Non-integer weights are scaled to this total and rounded, to keep the arithmetic exact.
_WEIGHT_SCALE = 1 << 20


def pod_shape(req: Request) -> Request:
    """The shape of one pod (one worker) of `req`, as a profile counts it: the preferred model
    is dropped (it does not change where the pod *can* run) and allowed models are sorted."""
    return Request(gpus=req.gpus, gpu_milli=req.gpu_milli, gpu_memory_mib=req.gpu_memory_mib,
                   cpus_milli=req.cpus_milli, memory_mib=req.memory_mib,
                   gpu_models=tuple(sorted(req.gpu_models)) if (req.gpus or req.gpu_milli)
                   else ())


def _shape_key(s: Request) -> tuple:
    return (s.gpus, s.gpu_milli, s.gpu_memory_mib, s.cpus_milli, s.memory_mib, s.gpu_models)


def _gpu_class(s: Request) -> tuple[int, int, int]:
    """(per-GPU milli demand, per-GPU memory demand, GPUs needed). A whole-GPU pod needs
    `gpus` GPUs that are entirely free; a CPU-only pod needs none."""
    if s.fractional:
        return (s.gpu_milli, s.gpu_memory_mib, 1)
    if s.gpus:
        return (MILLI, 0, s.gpus)
    return (0, 0, 0)


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """The target workload: pod shapes and their popularity (pod counts, or any positive weights).

    Equality and hashing use `shapes` and `weights` only; the arrays below are derived once,
    with the shapes reordered so that each GPU class is a contiguous run of columns.
    """

    shapes: tuple[Request, ...]
    weights: tuple[float, ...]
    _w: np.ndarray = field(init=False, repr=False, compare=False)  # int64 weight per shape
    _cpu: np.ndarray = field(init=False, repr=False, compare=False)
    _mem: np.ndarray = field(init=False, repr=False, compare=False)
    _models: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    _gpu_shape: np.ndarray = field(init=False, repr=False, compare=False)  # needs a GPU
    _starts: np.ndarray = field(init=False, repr=False, compare=False)  # first column per class
    _d: np.ndarray = field(init=False, repr=False, compare=False)  # per-GPU milli, per class
    _gm: np.ndarray = field(init=False, repr=False, compare=False)  # per-GPU memory, per class
    _k: np.ndarray = field(init=False, repr=False, compare=False)  # GPUs needed, per class
    _total: int = field(init=False, repr=False, compare=False)
    _allowed: dict = field(init=False, repr=False, compare=False)  # cluster models -> mask

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise SpecError(f"profile: {len(self.shapes)} shapes but {len(self.weights)} weights")
        if not self.shapes:
            raise SpecError("profile: needs at least one pod shape")
        for s in self.shapes:
            if s.workers != 1:
                raise SpecError(f"profile: a shape is one pod, got workers={s.workers} in {s}")
        w = [float(x) for x in self.weights]
        bad = [x for x in w if not (math.isfinite(x) and x > 0)]
        if bad:
            raise SpecError(f"profile: weights must be positive and finite, got {bad[0]!r}")
        if all(x.is_integer() for x in w):
            iw = np.array(w, dtype=np.int64)
        else:
            scaled = np.rint(np.array(w) / sum(w) * _WEIGHT_SCALE)
            iw = np.maximum(scaled, 1).astype(np.int64)
        classes = [_gpu_class(s) for s in self.shapes]
        order = sorted(range(len(self.shapes)), key=lambda i: (classes[i], i))
        ordered = [classes[i] for i in order]
        starts = [i for i in range(len(order)) if i == 0 or ordered[i] != ordered[i - 1]]
        uniq = np.array([ordered[i] for i in starts], dtype=np.int64)
        put = object.__setattr__
        put(self, "_w", iw[order])
        put(self, "_cpu", np.array([self.shapes[i].cpus_milli for i in order], dtype=np.int64))
        put(self, "_mem", np.array([self.shapes[i].memory_mib for i in order], dtype=np.int64))
        put(self, "_models", tuple(self.shapes[i].gpu_models for i in order))
        put(self, "_gpu_shape", np.array([classes[i][2] > 0 for i in order]))
        put(self, "_starts", np.array(starts, dtype=np.intp))
        put(self, "_d", uniq[:, 0])
        put(self, "_gm", uniq[:, 1])
        put(self, "_k", uniq[:, 2])
        put(self, "_total", int(iw.sum()))
        put(self, "_allowed", {})

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> WorkloadProfile:
        """The shape mix of `requests`: each worker of each request is one pod. Shapes are
        listed most popular first (ties in a fixed order), weights are pod counts."""
        counts: Counter[Request] = Counter()
        for r in requests:
            counts[pod_shape(r)] += r.workers
        if not counts:
            raise SpecError("profile: from_requests got no requests")
        shapes = sorted(counts, key=lambda s: (-counts[s], _shape_key(s)))
        return cls(tuple(shapes), tuple(float(counts[s]) for s in shapes))

    @property
    def probabilities(self) -> np.ndarray:
        """p_m per shape, in the order of `shapes`."""
        w = np.array(self.weights, dtype=np.float64)
        return w / w.sum()

    @property
    def num_classes(self) -> int:
        return len(self._starts)

    def allowed(self, cluster: Cluster) -> np.ndarray:
        """(models + 1, shapes) bool: which shapes may run on each GPU model of `cluster`; the
        last row is for nodes without GPUs (only CPU-only shapes), so a node's model id -1
        indexes it directly. Columns are in the profile's internal (class) order."""
        key = cluster.models
        mask = self._allowed.get(key)
        if mask is None:
            mask = np.array(
                [[not s or m in s for s in self._models] for m in cluster.models]
                + [list(~self._gpu_shape)], dtype=bool).reshape(len(key) + 1, len(self._models))
            self._allowed[key] = mask  # a memo, not state: the profile's meaning never changes
        return mask


# -- fragmentation -----------------------------------------------------------------------------

def node_fragmentation(state: ClusterState, profile: WorkloadProfile,
                       nodes: np.ndarray | None = None) -> np.ndarray:
    """F_n = sum_m p_m F_n(m) for each node (all by default), in milli-GPUs."""
    if nodes is None:
        nodes = np.arange(len(state.cluster.nodes))
    nodes = np.asarray(nodes, dtype=np.intp)
    sums = _gpu_sums(state, profile, nodes)
    q = _fitting_weight(state, profile, nodes, 0, 0)
    return _weighted_frag(profile, sums[0], sums[1], sums[2], q) / profile._total


def cluster_fragmentation(state: ClusterState, profile: WorkloadProfile) -> float:
    """Expected fragmented GPU share of the whole cluster, in milli-GPUs."""
    return float(node_fragmentation(state, profile).sum())


def _gpu_sums(state: ClusterState, profile: WorkloadProfile, nodes: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node: S (free milli), and per GPU class A (free milli on GPUs that can hold the
    class's per-GPU demand), C (how many such GPUs); and the GPU memory of a fully free GPU."""
    f, m, valid = _node_gpus(state, nodes)
    sat = valid[..., None] & (f[..., None] >= profile._d) & (m[..., None] >= profile._gm)
    a = np.einsum("ngj,ng->nj", sat, f)
    c = sat.sum(axis=1)
    cap = np.where(f == MILLI, m, 0).max(axis=1)
    return f.sum(axis=1), a.astype(np.int64), c, cap


def _node_gpus(state: ClusterState, nodes: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes, widest node) matrices of per-GPU free milli and free GPU memory, 0 where a node
    has fewer GPUs, and which entries are real GPUs. A node's GPUs are contiguous, so one
    padded gather reads them all."""
    cluster = state.cluster
    count = np.diff(np.append(cluster.node_first_gpu, cluster.total_gpus))[nodes]
    cols = np.arange(max(int(count.max(initial=0)), 1))
    valid = cols < count[:, None]
    idx = np.where(valid, cluster.node_first_gpu[nodes][:, None] + cols, 0)
    f = np.where(valid, state.gpu_free_milli[idx], 0)
    m = np.where(valid, state.gpu_free_mem[idx], 0)
    return f, m, valid


def _fitting_weight(state: ClusterState, profile: WorkloadProfile, nodes: np.ndarray,
                    cpu_used: int, mem_used: int) -> np.ndarray:
    """(nodes, classes): total weight of the shapes in each class that the node's model, free
    CPU and free memory (after using `cpu_used`, `mem_used` more) would admit."""
    cpu = state.node_free_cpu[nodes] - cpu_used
    mem = state.node_free_mem[nodes] - mem_used
    ok = profile.allowed(state.cluster)[state.cluster.node_model_id[nodes]]
    ok &= (cpu[:, None] >= profile._cpu) & (mem[:, None] >= profile._mem)
    return np.add.reduceat(ok * profile._w, profile._starts, axis=1)


def _weighted_frag(profile: WorkloadProfile, s: np.ndarray, a: np.ndarray, c: np.ndarray,
                   q: np.ndarray) -> np.ndarray:
    """sum_m w_m F_n(m): a shape that fits the node wastes S - A of it, one that does not
    wastes all S. So the total is W*S minus A for the fitting weight of each class."""
    fits = c >= profile._k
    return profile._total * s - (fits * a * q).sum(axis=1)


# -- choices -----------------------------------------------------------------------------------

def choose_gpu(state: ClusterState, req: Request, cand: np.ndarray,
               profile: WorkloadProfile) -> int:
    """The GPU among `cand` (all able to hold one worker of the fractional `req`) whose node's
    fragmentation grows least when the worker lands on it. Ties: fullest GPU, lowest index."""
    cluster = state.cluster
    cand = np.sort(np.asarray(cand, dtype=np.intp))
    free, fmem = state.gpu_free_milli, state.gpu_free_mem
    gnode = cluster.gpu_node[cand]
    starts = np.ones(len(cand), dtype=bool)
    starts[1:] = gnode[1:] != gnode[:-1]  # cand is sorted, so a node's GPUs are adjacent
    node_kind, nodes = _node_kinds(state, gnode[starts])
    kind = node_kind[np.cumsum(starts) - 1]
    # GPUs with the same free share and memory on nodes of one kind score the same: score the
    # first (lowest-index) of each, which is also the one the tie-break would pick.
    key = (kind * (MILLI + 1) + free[cand]) * (int(fmem.max()) + 1) + fmem[cand]
    _, first = np.unique(key, return_index=True)
    reps = cand[first]
    inv = kind[first]
    s, a, c, _ = _gpu_sums(state, profile, nodes)
    before = _weighted_frag(profile, s, a, c, _fitting_weight(state, profile, nodes, 0, 0))

    u, um = req.gpu_milli, req.gpu_memory_mib
    f, m = free[reps][:, None], fmem[reps][:, None]
    # Only the chosen GPU changes; update its node's per-class sums by what it adds and drops.
    held = (f >= profile._d) & (m >= profile._gm)
    holds = (f - u >= profile._d) & (m - um >= profile._gm)
    a2 = a[inv] - held * f + holds * (f - u)
    c2 = c[inv] - held + holds
    q2 = _fitting_weight(state, profile, nodes, req.cpus_milli, req.memory_mib)[inv]
    after = _weighted_frag(profile, s[inv] - u, a2, c2, q2)
    best = np.lexsort((reps, free[reps], after - before[inv]))[0]
    return int(reps[best])


def choose_node(state: ClusterState, req: Request, nodes: np.ndarray,
                profile: WorkloadProfile) -> int:
    """The node among `nodes` (each able to hold one worker of the whole-GPU or CPU-only `req`)
    whose fragmentation grows least. Ties: best fit (fewest whole GPUs free, or for a CPU-only
    pod the least CPU free), then lowest index."""
    nodes = np.sort(np.asarray(nodes, dtype=np.intp))
    kind, reps = _node_kinds(state, nodes)
    s, a, c, cap = _gpu_sums(state, profile, reps)
    before = _weighted_frag(profile, s, a, c, _fitting_weight(state, profile, reps, 0, 0))
    k = req.gpus
    # The pod takes k fully free GPUs, all alike (free share MILLI, memory `cap`).
    whole = (MILLI >= profile._d) & (cap[:, None] >= profile._gm)
    q2 = _fitting_weight(state, profile, reps, req.cpus_milli, req.memory_mib)
    after = _weighted_frag(profile, s - k * MILLI, a - k * MILLI * whole, c - k * whole, q2)
    fit = state.node_free_whole[nodes] if k else state.node_free_cpu[nodes]
    best = np.lexsort((nodes, fit, (after - before)[kind]))[0]
    return int(nodes[best])


def _node_kinds(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group `nodes` into kinds of equal state (GPU model, free CPU and memory, and the multiset
    of per-GPU free share and memory), which fragment alike. Returns each node's kind and one
    node per kind. A big cluster has many identical nodes (all the empty ones of a model, say),
    so scoring kinds instead of nodes saves most of the work."""
    cluster = state.cluster
    f, m, valid = _node_gpus(state, nodes)
    gpu = f * (int(state.gpu_free_mem.max()) + 1) + m
    gpu = np.sort(np.where(valid, gpu, -1), axis=1)  # GPU order within a node does not matter
    sig = np.column_stack((cluster.node_model_id[nodes], state.node_free_cpu[nodes],
                           state.node_free_mem[nodes], gpu))
    # Sort rows with a lexsort (far cheaper than np.unique(axis=0)); a new kind starts where a
    # row differs from the one before. The sort is stable, so a kind's first row is its
    # lowest-index node.
    order = np.lexsort(sig.T[::-1])
    srt = sig[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    kind = np.empty(len(order), dtype=np.intp)
    kind[order] = np.cumsum(new) - 1
    return kind, nodes[order[new]]


def place_pod(state: ClusterState, req: Request, profile: WorkloadProfile,
              models: Sequence[str] | None = None) -> Allocation | None:
    """FGD placement of a single-worker request, or None if nothing fits. Does not allocate.

    Every allowed GPU model's nodes compete at once, so FGD also picks the node type; `models`
    (an order chosen by a policy) or the request's preferred model restricts that to one model
    at a time, tried in order.
    """
    if req.workers != 1:
        raise ValueError(f"place_pod places one pod; got workers={req.workers}")
    cluster = state.cluster
    node_ok = (state.node_free_cpu >= req.cpus_milli) & (state.node_free_mem >= req.memory_mib)
    if not (req.gpus or req.gpu_milli):
        nodes = np.flatnonzero(node_ok)
        if nodes.size == 0:
            return None
        return Allocation((WorkerSlot(choose_node(state, req, nodes, profile), (), 0),))
    for ids in _model_groups(cluster, req, models):
        ok = node_ok & np.isin(cluster.node_model_id, ids)
        if req.fractional:
            mask = ((state.gpu_free_milli >= req.gpu_milli)
                    & (state.gpu_free_mem >= req.gpu_memory_mib) & ok[cluster.gpu_node])
            cand = np.flatnonzero(mask)
            if cand.size:
                g = choose_gpu(state, req, cand, profile)
                slot = WorkerSlot(int(cluster.gpu_node[g]), (g,), req.gpu_milli,
                                  req.gpu_memory_mib)
                return Allocation((slot,))
        else:
            nodes = np.flatnonzero(ok & (state.node_free_whole >= req.gpus))
            if nodes.size:
                n = choose_node(state, req, nodes, profile)
                lo = int(cluster.node_first_gpu[n])
                local = np.flatnonzero(state.gpu_free_milli[lo:lo + cluster.nodes[n].num_gpus]
                                       == MILLI)
                return Allocation((WorkerSlot(n, tuple((local[:req.gpus] + lo).tolist())),))
    return None


def _model_groups(cluster: Cluster, req: Request, models: Sequence[str] | None
                  ) -> list[list[int]]:
    if models is not None:
        return [[cluster.models.index(m)] for m in models if m in cluster.models]
    ids = [i for i, m in enumerate(cluster.models) if req.allows(m)]
    pref = req.preferred_gpu_model
    if pref in cluster.models and cluster.models.index(pref) in ids:
        p = cluster.models.index(pref)
        rest = [i for i in ids if i != p]
        return [[p], rest] if rest else [[p]]
    return [ids] if ids else []
