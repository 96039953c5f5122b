"""ClusterState: `fits` agrees with what an allocation would do, and the bucket index stays
true to the arrays whatever the allocations' slots."""

from __future__ import annotations

import random
from collections import Counter

from plinth.core.resources import MILLI, Allocation, Cluster, Node, Request, WorkerSlot
from plinth.sched.state import ClusterState


def _cluster() -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 8_000, 64_000, "V100", 4) for i in range(3)))


def _would_allocate(state: ClusterState, alloc: Allocation, req: Request) -> bool:
    """The reference: allocating on a copy over-commits nothing."""
    trial = state.copy()
    try:
        trial.allocate(alloc, req)
    except AssertionError:
        return False
    return bool((trial.node_free_cpu >= 0).all() and (trial.node_free_mem >= 0).all())


def _random_case(rng: random.Random, cluster: Cluster) -> tuple[Allocation, Request]:
    """Half the time a gang of whole GPUs asking nothing else, one GPU a slot as Philly's
    (the fast path: its slots sometimes ask one GPU twice); else whole GPUs or GPU shares,
    with or without CPUs, memory and GPU memory."""
    plain = rng.random() < 0.5
    whole = plain or rng.random() < 0.5
    slots = []
    for _ in range(rng.randint(2 if plain else 1, 5)):
        node = rng.randrange(len(cluster.nodes))
        first = node * 4
        k = 1 if plain else rng.randint(1, 2) if whole else 1
        gpus = tuple(rng.sample(range(first, first + 4), k))
        milli = MILLI if whole else rng.choice((250, 500, 750))
        gmem = 0 if plain else rng.choice((0, 0, 4_000, 12_000))
        slots.append(WorkerSlot(node, gpus, milli, gmem))
    if plain:
        return Allocation(tuple(slots)), Request(gpus=1, workers=len(slots))
    req = Request(cpus_milli=rng.choice((0, 0, 1_000, 3_000)),
                  memory_mib=rng.choice((0, 0, 16_000, 40_000)))
    return Allocation(tuple(slots)), req


def test_fits_answers_as_an_allocation_would():
    cluster, rng = _cluster(), random.Random(7)
    outcomes: Counter[tuple[bool, bool]] = Counter()
    for _ in range(3_000):
        state = ClusterState(cluster)
        for _ in range(rng.randint(0, 4)):  # some of the cluster taken already
            alloc, req = _random_case(rng, cluster)
            if _would_allocate(state, alloc, req):
                state.allocate(alloc, req)
        alloc, req = _random_case(rng, cluster)
        fits = state.fits(alloc, req)
        assert fits == _would_allocate(state, alloc, req), (alloc, req)
        fast = not req.cpus_milli and not req.memory_mib and len(alloc.slots) > 1 and all(
            s.milli == MILLI and not s.gpu_memory_mib for s in alloc.slots)
        outcomes[fast, fits] += 1
    # Both paths answered both ways, a GPU asked for twice among them.
    assert all(outcomes[fast, fits] >= 50 for fast in (True, False) for fits in (True, False))


def test_a_gang_asking_one_gpu_twice_does_not_fit():
    state = ClusterState(_cluster())
    twice = Allocation((WorkerSlot(0, (1,), MILLI, 0), WorkerSlot(0, (1,), MILLI, 0)))
    assert not state.fits(twice, Request(gpus=1, workers=2))
    apart = Allocation((WorkerSlot(0, (1,), MILLI, 0), WorkerSlot(0, (2,), MILLI, 0)))
    assert state.fits(apart, Request(gpus=1, workers=2))


def test_the_bucket_index_follows_gangs_over_several_nodes():
    """A gang's slots on one node move that node's whole-GPU count once, by their sum."""
    cluster, rng = _cluster(), random.Random(3)
    state = ClusterState(cluster)
    held: list[Allocation] = []
    req = Request(gpus=1)
    for _ in range(2_000):
        if held and (rng.random() < 0.5 or state.free_milli == 0):
            state.release(held.pop(rng.randrange(len(held))), req)
        else:
            free = [g for g in range(cluster.total_gpus) if state.gpu_free_milli[g] == MILLI]
            picked = sorted(rng.sample(free, min(len(free), rng.randint(1, 6))))
            alloc = Allocation(tuple(WorkerSlot(g // 4, (g,), MILLI, 0) for g in picked))
            state.allocate(alloc, req)
            held.append(alloc)
        state.check()
        for k, nodes in enumerate(state.buckets[0]):
            assert all(state.node_free_whole[n] == k for n in nodes)
        assert sum(len(b) for b in state.buckets[0]) == len(cluster.nodes)
