"""Nodes, clusters, requests and allocations.

Amounts are integers: CPUs in milli-CPUs, memory in MiB, GPU share in milli-GPUs (1000 = one
whole GPU, as in Alibaba's `gpu_milli`). Specs are frozen slotted dataclasses; the mutable hot
state of a running cluster lives in `plinth.sched.state.ClusterState` as numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from plinth.core.errors import SpecError
from plinth.core.gpus import GpuModel, gpu_model

if TYPE_CHECKING:
    import numpy as np

MILLI = 1000


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpus_milli: int
    memory_mib: int
    gpu_model: str | None = None
    num_gpus: int = 0
    rack: str = "rack-0"
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or self.cpus_milli < 0 or self.memory_mib < 0:
            raise SpecError(f"node {self.name}: resources must not be negative")
        if self.num_gpus and not self.gpu_model:
            raise SpecError(f"node {self.name}: gpu_model is required when gpus > 0")

    @property
    def model(self) -> GpuModel | None:
        return gpu_model(self.gpu_model) if self.gpu_model else None


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks for. Amounts are per worker; `workers` is the gang size."""

    gpus: int = 0  # whole GPUs per worker
    gpu_milli: int = 0  # fractional SM share per worker (1..999), only when gpus == 0
    gpu_memory_mib: int = 0  # GPU memory per worker for a fractional share (0 = no limit asked)
    cpus_milli: int = 0
    memory_mib: int = 0
    workers: int = 1
    gpu_models: tuple[str, ...] = ()  # allowed models; empty means any
    preferred_gpu_model: str | None = None
    nodes: tuple[str, ...] = ()  # the nodes it may run on, by name (Slurm's --nodelist); any
    # The whole gang's GPU demand in milli-GPUs, derived: stored because every pass of every
    # policy reads it for each job it looks at.
    gpu_milli_total: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gpu_milli == MILLI and self.gpus == 0:
            object.__setattr__(self, "gpu_milli", 0)
            object.__setattr__(self, "gpus", 1)
        object.__setattr__(self, "gpu_milli_total",
                           self.workers * (self.gpus * MILLI + self.gpu_milli))
        for name in ("gpus", "gpu_milli", "gpu_memory_mib", "cpus_milli", "memory_mib"):
            if getattr(self, name) < 0:
                raise SpecError(f"request.{name}: must not be negative, got {getattr(self, name)}")
        if self.workers < 1:
            raise SpecError(f"request.workers: must be at least 1, got {self.workers}")
        if self.gpus and self.gpu_milli:
            raise SpecError("request: ask for whole gpus or a gpu_milli fraction, not both")
        if self.gpu_milli >= MILLI:
            raise SpecError(f"request.gpu_milli: a fraction must be below 1000, got {self.gpu_milli}")

    @property
    def fractional(self) -> bool:
        return self.gpu_milli > 0

    @property
    def num_gpus(self) -> float:
        """The gang's GPU demand in GPUs (fractions count as fractions)."""
        return self.gpu_milli_total / MILLI

    def allows(self, model: str | None) -> bool:
        return not self.gpu_models or model in self.gpu_models


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Where one worker of a gang runs: a node, the global indices of its GPUs, and its share."""

    node: int
    gpus: tuple[int, ...] = ()
    milli: int = MILLI  # share of each GPU in `gpus`
    gpu_memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    slots: tuple[WorkerSlot, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({s.node for s in self.slots}))

    @property
    def gpu_milli_total(self) -> int:
        return sum(len(s.gpus) * s.milli for s in self.slots)

    def to_dict(self) -> dict:
        """As the store keeps it (JSON)."""
        return {"slots": [{"node": s.node, "gpus": list(s.gpus), "milli": s.milli,
                           "gpu_memory_mib": s.gpu_memory_mib} for s in self.slots]}

    @classmethod
    def from_dict(cls, d: dict) -> Allocation:
        return cls(tuple(WorkerSlot(int(s["node"]), tuple(int(g) for g in s["gpus"]),
                                    int(s["milli"]), int(s["gpu_memory_mib"]))
                         for s in d["slots"]))


@dataclass(frozen=True)
class Cluster:
    """An immutable cluster description. Index arrays are derived once and cached."""

    nodes: tuple[Node, ...]
    name: str = "cluster"
    tenants: tuple[TenantQuota, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.nodes:
            raise SpecError(f"cluster {self.name}: has no nodes")
        if self.total_gpus == 0:
            raise SpecError(f"cluster {self.name}: has no GPUs (every node has gpus: 0)")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SpecError(f"cluster {self.name}: node name {dup!r} appears twice")

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    @cached_property
    def models(self) -> tuple[str, ...]:
        """The GPU models present, in first-seen order."""
        return tuple(dict.fromkeys(n.gpu_model for n in self.nodes if n.num_gpus))

    @cached_property
    def racks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n.rack for n in self.nodes))

    @cached_property
    def node_first_gpu(self) -> np.ndarray:
        import numpy as np  # here, not at the top: reading a spec needs no numpy

        counts = np.array([n.num_gpus for n in self.nodes], dtype=np.int64)
        return np.concatenate(([0], np.cumsum(counts)[:-1]))

    @cached_property
    def gpu_node(self) -> np.ndarray:
        import numpy as np

        return np.repeat(np.arange(len(self.nodes)), [n.num_gpus for n in self.nodes])

    @cached_property
    def node_model_id(self) -> np.ndarray:
        """Index into `models` per node; -1 for a node without GPUs."""
        import numpy as np

        ids = {m: i for i, m in enumerate(self.models)}
        return np.array([ids.get(n.gpu_model, -1) if n.num_gpus else -1 for n in self.nodes])

    @cached_property
    def node_model_list(self) -> list[int]:
        """`node_model_id` as plain ints, for hot loops."""
        return self.node_model_id.tolist()

    @cached_property
    def node_gpu_range(self) -> list[tuple[int, int]]:
        """(first global GPU index, GPU count) per node, as plain ints."""
        return [(int(f), n.num_gpus) for f, n in zip(self.node_first_gpu, self.nodes)]

    @cached_property
    def gpu_slots(self) -> tuple[WorkerSlot, ...]:
        """A worker slot holding just GPU g, whole, per GPU (shared: slots are immutable, and
        gangs of one-GPU workers are placed in every pass)."""
        return tuple(WorkerSlot(int(n), (g,)) for g, n in enumerate(self.gpu_node.tolist()))

    @cached_property
    def node_rack_id(self) -> np.ndarray:
        import numpy as np

        ids = {r: i for i, r in enumerate(self.racks)}
        return np.array([ids[n.rack] for n in self.nodes])

    def gpus_of_model(self, model: str) -> int:
        return sum(n.num_gpus for n in self.nodes if n.gpu_model == model)

    def describe(self) -> str:
        by_model: dict[str, int] = {}
        for n in self.nodes:
            if n.num_gpus:
                by_model[n.gpu_model] = by_model.get(n.gpu_model, 0) + n.num_gpus  # type: ignore[index]
        parts = ", ".join(f"{g}x{m}" for m, g in by_model.items())
        nodes = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}"
        return f"{nodes}, {self.total_gpus} GPUs ({parts})"


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's guaranteed GPUs and how much it may borrow, as in a Kueue ClusterQueue."""

    name: str
    nominal_gpus: float
    borrowing_limit: float | None = None  # None: may borrow all idle quota in the cohort
    cohort: str = "default"
    weight: float = 1.0
