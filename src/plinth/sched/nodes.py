"""Nodes that have left the cluster, held out of the plan until they come back.

A node that leaves keeps its index (allocations, the store and the GPU numbering refer to nodes
by index), but nothing may be placed on it. So whatever is free on it is taken in the plan by a
hold: an allocation that belongs to no job. Its jobs end as the runtime reports them lost, and
what they release is taken too, at the owner's next step. When the node is back, its holds are
released and it is free again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plinth.core.resources import Allocation, Cluster, Request, WorkerSlot
from plinth.sched.state import ClusterState

if TYPE_CHECKING:
    from plinth.sched.owner import Owner


class DownNodes:
    __slots__ = ("holds", "nodes")

    def __init__(self) -> None:
        self.nodes: frozenset[int] = frozenset()
        self.holds: list[tuple[Allocation, Request]] = []  # taken in the plan, in order

    def set(self, nodes: frozenset[int], state: ClusterState) -> bool:
        """`nodes` are the ones down now; returns whether that changed."""
        if nodes == self.nodes:
            return False
        for alloc, req in reversed(self.holds):
            state.release(alloc, req)
        self.holds, self.nodes = [], nodes
        self.take_free(state)
        return True

    def take_free(self, state: ClusterState) -> None:
        """Hold what is free on the down nodes now (after their jobs released it)."""
        fm, fmem = state.gpu_free_milli, state.gpu_free_mem
        for n in sorted(self.nodes):
            first, count = state.cluster.node_gpu_range[n]
            # A GPU with no share free is left out: a hold of none would move it in the
            # whole-GPU index.
            gpus = tuple(WorkerSlot(n, (g,), int(fm[g]), int(fmem[g]))
                         for g in range(first, first + count) if fm[g])
            cpu, mem = int(state.node_free_cpu[n]), int(state.node_free_mem[n])
            if gpus:
                self._take(state, Allocation(gpus), Request())
            if cpu or mem:
                self._take(state, Allocation((WorkerSlot(n),)),
                           Request(cpus_milli=cpu, memory_mib=mem))

    def _take(self, state: ClusterState, alloc: Allocation, req: Request) -> None:
        state.allocate(alloc, req)
        self.holds.append((alloc, req))


def grown(owner: Owner, cluster: Cluster) -> tuple[ClusterState, ClusterState]:
    """The owner's plan and what its launched attempts hold, rebuilt on `cluster`: its own
    with nodes appended (every index kept), from the jobs as they stand (as
    plinth.sched.invariants checks them)."""
    n = len(owner.cluster.nodes)
    if cluster.nodes[:n] != owner.cluster.nodes:
        raise ValueError("add_nodes: the new cluster must keep the old nodes, in order")
    plan, held = ClusterState(cluster), ClusterState(cluster)
    for js in owner.running.values():
        plan.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
    for jid, (alloc, _, _) in owner.next_start.items():
        plan.allocate(alloc, owner.jobs[jid].job.request)
    for jid in owner.runs:
        js = owner.jobs[jid]
        held.allocate(js.allocation, js.job.request)  # type: ignore[arg-type]
    for alloc, req in owner.down.holds:
        plan.allocate(alloc, req)
    return plan, held
