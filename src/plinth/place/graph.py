"""The operator graph that placers work on, and the fx tracer that builds it.

Nodes are kept in a topological order: every edge goes from a lower index to a higher one. That
one invariant is what the placers, the simulator and coarsening rely on for acyclicity, and
`OpGraph.validate` checks it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from plinth.core.errors import PlinthError

# Splitting these has no value: their insides run back to back and share large temporaries.
ATOMIC_TYPES: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.LSTM, nn.GRU, nn.RNN,
                                             nn.LSTMCell, nn.GRUCell)


def is_atomic(module: nn.Module) -> bool:
    """A module that is placed as one operator: built-in leaves, recurrent layers, attention, and
    any module that sets ``plinth_atomic = True`` (a conv-bn-relu block, an attention block)."""
    return isinstance(module, ATOMIC_TYPES) or bool(getattr(module, "plinth_atomic", False))


class PlaceTracer(fx.Tracer):
    """fx tracer that keeps atomic blocks as single `call_module` nodes."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_atomic(m) or super().is_leaf_module(m, module_qualified_name)


def fx_trace(model: nn.Module) -> fx.GraphModule:
    """Trace `model` with `PlaceTracer`; raises whatever fx raises on untraceable code."""
    graph = PlaceTracer().trace(model)
    return fx.GraphModule(model, graph, model.__class__.__name__)


def placeable(node: fx.Node) -> bool:
    """Inputs arrive with the data and the output is collected by the caller: neither is placed."""
    return node.op not in ("placeholder", "output")


@dataclass(slots=True)
class OpGraph:
    """A forward operator graph with per-node costs. Backward ops are implied, one per node,
    on the same device (Baechi places forward ops only).

    Units: times in microseconds, sizes in bytes. `members` lists the original operator names
    (fx node names, or module paths for a hook-traced graph) that a node stands for.
    """

    names: list[str]
    fwd_us: np.ndarray
    bwd_us: np.ndarray
    param_bytes: np.ndarray   # parameters; their gradients cost as much again
    act_bytes: np.ndarray     # activations kept from forward until this op's backward
    temp_bytes: np.ndarray    # scratch while the op runs (the output gradient buffer)
    out_bytes: np.ndarray     # what the node can send to other nodes
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    members: list[tuple[str, ...]]
    scopes: list[str]         # module path of each node, for display and expert splits
    tracer: str = "fx"
    preds: list[list[int]] = field(default_factory=list, repr=False)
    succs: list[list[int]] = field(default_factory=list, repr=False)
    pred_edges: list[list[int]] = field(default_factory=list, repr=False)
    succ_edges: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        n = len(self.names)
        for name in ("fwd_us", "bwd_us"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        for name in ("param_bytes", "act_bytes", "temp_bytes", "out_bytes", "src", "dst",
                     "edge_bytes"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        self.preds, self.succs = [[] for _ in range(n)], [[] for _ in range(n)]
        self.pred_edges, self.succ_edges = [[] for _ in range(n)], [[] for _ in range(n)]
        for e, (u, v) in enumerate(zip(self.src.tolist(), self.dst.tolist())):
            self.succs[u].append(v)
            self.preds[v].append(u)
            self.succ_edges[u].append(e)
            self.pred_edges[v].append(e)

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def perm_bytes(self) -> np.ndarray:
        """Memory a node holds on its device for the whole step: parameters, their gradients,
        and the activations kept for backward."""
        return 2 * self.param_bytes + self.act_bytes

    @property
    def work_us(self) -> np.ndarray:
        """Forward plus backward time: the load a node puts on its device in one step."""
        return self.fwd_us + self.bwd_us

    def total_bytes(self) -> int:
        """Memory to hold the whole step on one device."""
        return int(self.perm_bytes.sum() + (self.temp_bytes.max() if self.n else 0))

    def validate(self) -> None:
        """Raise if the graph breaks an invariant (tests switch this on)."""
        n = self.n
        arrays = (self.fwd_us, self.bwd_us, self.param_bytes, self.act_bytes, self.temp_bytes,
                  self.out_bytes)
        if any(len(a) != n for a in arrays) or len(self.members) != n or len(self.scopes) != n:
            raise PlinthError("graph: per-node arrays differ in length")
        if not (len(self.src) == len(self.dst) == len(self.edge_bytes)):
            raise PlinthError("graph: edge arrays differ in length")
        if len(self.src) and not np.all(self.src < self.dst):
            e = int(np.argmax(self.src >= self.dst))
            raise PlinthError(f"graph: edge {self.names[self.src[e]]} -> {self.names[self.dst[e]]} "
                              "goes backwards in the topological order (a cycle?)")
        if any(np.any(a < 0) for a in arrays) or np.any(self.edge_bytes < 0):
            raise PlinthError("graph: negative cost")
        if len(set(zip(self.src.tolist(), self.dst.tolist()))) != len(self.src):
            raise PlinthError("graph: duplicate edge")


def tensor_bytes(value: object) -> int:
    """Bytes of every tensor inside a (nested) value."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def tensors_in(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def chain_graph(fwd_us, *, out_bytes=0, param_bytes=0, act_bytes=0, temp_bytes=0,
                bwd_ratio: float = 0.0) -> OpGraph:
    """A chain 0 -> 1 -> ... (hand-checked tests and examples)."""
    n = len(fwd_us)
    return from_arrays(fwd_us, list(zip(range(n - 1), range(1, n))), out_bytes=out_bytes,
                       param_bytes=param_bytes, act_bytes=act_bytes, temp_bytes=temp_bytes,
                       bwd_ratio=bwd_ratio)


def from_arrays(fwd_us, edges, *, out_bytes=0, param_bytes=0, act_bytes=0, temp_bytes=0,
                bwd_ratio: float = 0.0, names: list[str] | None = None) -> OpGraph:
    """Build a graph from plain numbers: scalars broadcast over nodes; edge bytes are the
    producer's output bytes. Edges must go from lower to higher index."""
    fwd = np.asarray(fwd_us, dtype=np.float64)
    n = len(fwd)

    def per_node(x):
        return np.broadcast_to(np.asarray(x, dtype=np.int64), (n,)).copy()

    out = per_node(out_bytes)
    src = np.array([u for u, _ in edges], dtype=np.int64)
    dst = np.array([v for _, v in edges], dtype=np.int64)
    names = names or [f"n{i}" for i in range(n)]
    return OpGraph(names, fwd, fwd * bwd_ratio, per_node(param_bytes), per_node(act_bytes),
                   per_node(temp_bytes), out, src, dst, out[src] if len(src) else src,
                   [(nm,) for nm in names], ["" for _ in names])


def layered_dag(n: int, *, width: int, rng: np.random.Generator, fanin: int = 2,
                mean_us: float = 100.0, mean_bytes: float = 1e6) -> OpGraph:
    """A random layered DAG of `n` nodes (benchmarks of placement time at scale). Each node
    draws up to `fanin` inputs from the previous layer; costs are log-normal."""
    layers = [list(range(i, min(i + width, n))) for i in range(0, n, width)]
    edges: set[tuple[int, int]] = set()
    for prev, cur in itertools.pairwise(layers):
        for v in cur:
            k = int(rng.integers(1, fanin + 1))
            for u in rng.choice(prev, size=min(k, len(prev)), replace=False):
                edges.add((int(u), v))
    fwd = rng.lognormal(np.log(mean_us), 0.8, n)
    out = rng.lognormal(np.log(mean_bytes), 0.8, n).astype(np.int64)
    params = rng.lognormal(np.log(mean_bytes), 1.0, n).astype(np.int64)
    return from_arrays(fwd, sorted(edges), out_bytes=out, param_bytes=params, act_bytes=out,
                       temp_bytes=out, bwd_ratio=2.0)
