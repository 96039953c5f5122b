"""The FGD paper's inflation test (Weng et al., ATC'23): how full can placement get the cluster?

Pods arrive in trace order and never leave. Each is placed at once, and the run stops at the
first pod that cannot be placed; the result is the GPU allocation ratio then (allocated
milli-GPUs over the total). If the list runs out first, it starts again from the top, as the
paper inflates its workload by repeating the trace's pods. `fill` is the paper's other reading:
pods that do not fit are skipped, and the ratio is read when the arrived GPU demand reaches the
cluster's capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import cycle, islice

from plinth.core.resources import MILLI, Cluster, Request
from plinth.sched.placement import DEFAULT_PLACEMENT, PlacementConfig, place_and_allocate
from plinth.sched.state import ClusterState

MAX_ROUNDS = 10  # a list repeated this often without a failure: the cluster is too big for it

Placer = Callable[[ClusterState, Request], bool]


@dataclass(frozen=True, slots=True)
class Inflation:
    alloc_ratio: float
    placed: int
    skipped: int
    failed_pod: Request | None
    state: ClusterState


def _placer(cfg: PlacementConfig) -> Placer:
    return lambda state, req: place_and_allocate(state, req, cfg) is not None


def first_failure(cluster: Cluster, pods: Sequence[Request],
                  cfg: PlacementConfig = DEFAULT_PLACEMENT, *, placer: Placer | None = None,
                  max_rounds: int = MAX_ROUNDS) -> Inflation:
    """Place pods in order until one fails; the allocation ratio at that point."""
    place = placer or _placer(cfg)
    state = ClusterState(cluster)
    placed, failed = 0, None
    for req in islice(cycle(pods), len(pods) * max_rounds):
        if not place(state, req):
            failed = req
            break
        placed += 1
    return Inflation(state.used_milli / state.capacity_milli, placed, 0, failed, state)


def fill(cluster: Cluster, pods: Sequence[Request], cfg: PlacementConfig = DEFAULT_PLACEMENT,
         *, placer: Placer | None = None, max_rounds: int = MAX_ROUNDS) -> Inflation:
    """Place pods in order, skipping those that do not fit, until the arrived GPU demand
    reaches the cluster's capacity; the allocation ratio then."""
    place = placer or _placer(cfg)
    state = ClusterState(cluster)
    arrived = placed = skipped = 0
    for req in islice(cycle(pods), len(pods) * max_rounds):
        if arrived >= state.capacity_milli:
            break
        arrived += req.gpu_milli_total
        if place(state, req):
            placed += 1
        else:
            skipped += 1
    return Inflation(state.used_milli / state.capacity_milli, placed, skipped, None, state)


def describe(r: Request) -> str:
    gpu = f"{r.gpus} GPU" if r.gpus else f"{r.gpu_milli} mGPU" if r.gpu_milli else "no GPU"
    models = f" on {'|'.join(r.gpu_models)}" if r.gpu_models else ""
    return f"{gpu}{models}, {r.cpus_milli / MILLI:g} CPU, {r.memory_mib} MiB"


__all__ = ["MAX_ROUNDS", "Inflation", "describe", "fill", "first_failure"]
