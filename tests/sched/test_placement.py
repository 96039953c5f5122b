"""Placement: consolidation, rack locality, fractional best fit, and no over-commit ever."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core import Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.errors import SpecError
from plinth.sched.placement import (
    DEFAULT_PLACEMENT,
    FreedWhole,
    locality_factor,
    never_fits,
    place,
    place_and_allocate,
    placeable,
)
from plinth.sched.state import ClusterState


def cluster(n=8, gpus=8, per_rack=4, model="V100") -> Cluster:
    return Cluster(tuple(Node(f"n{i}", 64_000, 256_000, model, gpus, rack=f"r{i // per_rack}")
                         for i in range(n)))


def test_single_node_gang_goes_to_the_fullest_node_that_fits():
    c = cluster(n=3)
    s = ClusterState(c)
    place_and_allocate(s, Request(gpus=1, workers=6))  # node 0 keeps 2 free
    place_and_allocate(s, Request(gpus=1, workers=3))  # best fit: node 1 (8 free) -> 5 left
    a = place(s, Request(gpus=1, workers=2))
    assert a.nodes == (0,), "best fit picks the node with exactly 2 free GPUs"
    assert locality_factor(c, a) == 1.0


def test_spread_gang_stays_in_one_rack_and_uses_fewest_nodes():
    c = cluster(n=8, per_rack=4)
    s = ClusterState(c)
    # Leave rack r0 with 4 + 4 + 4 + 4 free and rack r1 with 8 free on every node.
    for n in range(4):
        s.allocate(Allocation((WorkerSlot(n, tuple(range(8 * n, 8 * n + 4))),)), Request(gpus=4))
    a = place(s, Request(gpus=1, workers=16))
    assert a is not None
    racks = {c.nodes[n].rack for n in a.nodes}
    assert racks == {"r1"} and len(a.nodes) == 2
    assert locality_factor(c, a) < 1.0


def test_gang_is_all_or_nothing():
    s = ClusterState(cluster(n=2))
    before = s.gpu_free_milli.copy()
    assert place(s, Request(gpus=1, workers=17)) is None
    assert (s.gpu_free_milli == before).all()


def test_fractional_best_fit_packs_onto_the_used_gpu_and_respects_memory():
    c = cluster(n=1, gpus=2)
    s = ClusterState(c)
    a1 = place_and_allocate(s, Request(gpu_milli=500, gpu_memory_mib=20_000))
    a2 = place_and_allocate(s, Request(gpu_milli=300, gpu_memory_mib=10_000))
    assert a1.slots[0].gpus == a2.slots[0].gpus, "best fit shares the partly used GPU"
    # 200 milli left on that GPU but only 2,768 MiB: a 4 GiB request must go elsewhere.
    a3 = place_and_allocate(s, Request(gpu_milli=200, gpu_memory_mib=4_096))
    assert a3.slots[0].gpus != a1.slots[0].gpus
    s.check()


def test_never_fits_names_the_reason():
    c = cluster(n=2)
    assert "cluster has 16" in never_fits(c, Request(gpus=1, workers=17))
    assert "allowed model" in never_fits(c, Request(gpus=1, gpu_models=("A100",)))
    assert never_fits(c, Request(gpus=8, workers=2)) is None


def test_request_validation_names_the_field():
    with pytest.raises(SpecError, match="request.workers"):
        Request(gpus=1, workers=0)
    with pytest.raises(SpecError, match="not both"):
        Request(gpus=1, gpu_milli=500)
    with pytest.raises(SpecError, match="request.gpus"):
        Request(gpus=-1)


requests = st.one_of(
    st.builds(lambda g, w: Request(gpus=g, workers=w), st.sampled_from([1, 2, 4, 8]),
              st.integers(1, 4)),
    st.builds(lambda m, mem: Request(gpu_milli=m, gpu_memory_mib=mem),
              st.integers(50, 950), st.integers(0, 20_000)),
)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(requests, st.booleans()), min_size=1, max_size=60))
def test_no_gpu_is_ever_over_committed(ops):
    """Random placements and releases: SM share and memory stay within capacity, gangs are
    whole, and the index always matches the arrays."""
    s = ClusterState(cluster(n=4, gpus=4, per_rack=2))
    live = []
    for req, release in ops:
        if release and live:
            a, r = live.pop(0)
            s.release(a, r)
        else:
            a = place_and_allocate(s, req)
            if a is not None:
                assert len(a.slots) == req.workers  # all or nothing
                assert all(len(sl.gpus) == (req.gpus or 1) for sl in a.slots)
                live.append((a, req))
        s.check()
    used = sum(a.gpu_milli_total for a, _ in live)
    assert used == s.used_milli
    assert (s.gpu_free_milli >= 0).all() and (s.gpu_free_mem >= 0).all()
    np.testing.assert_array_equal(s.gpu_free_milli <= 1000, True)


def test_spread_picks_the_rack_needing_fewest_nodes_then_least_spare():
    c = cluster(n=12, per_rack=4)
    s = ClusterState(c)
    # Free GPUs per node: rack r0 8,8,8,8 (32 free); rack r1 8,8,4,4 (24); rack r2 2,2,2,2.
    for n, keep in [(6, 4), (7, 4), (8, 2), (9, 2), (10, 2), (11, 2)]:
        s.allocate(Allocation((WorkerSlot(n, tuple(range(8 * n, 8 * n + 8 - keep))),)),
                   Request(gpus=8 - keep))
    a = place(s, Request(gpus=1, workers=20))
    # r0 and r1 both need 3 nodes; r1 leaves 4 GPUs spare, r0 12: r1 wins.
    assert {c.nodes[n].rack for n in a.nodes} == {"r1"} and len(a.nodes) == 3
    a = place(s, Request(gpus=1, workers=28))  # only r0 holds 28: 4 nodes
    assert {c.nodes[n].rack for n in a.nodes} == {"r0"} and len(a.nodes) == 4
    a = place(s, Request(gpus=1, workers=40))  # no rack holds 40: across racks, largest first
    assert len(a.slots) == 40 and len({c.nodes[n].rack for n in a.nodes}) > 1


def _random_state(data, c: Cluster) -> tuple[ClusterState, list]:
    s, live = ClusterState(c), []
    for req in data.draw(st.lists(requests, max_size=25)):
        a = place_and_allocate(s, req)
        if a is not None:
            live.append((a, req))
    return s, live


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_placeable_and_freed_whole_agree_with_placing(data):
    """`placeable` says what `place` finds; `FreedWhole` says what `placeable` says on a copy
    with the counted allocations released, for any whole-GPU gang without CPU or memory."""
    c = cluster(n=6, gpus=4, per_rack=2)
    s, live = _random_state(data, c)
    freed, released = FreedWhole(s), s.copy()
    countable = True
    for a, r in data.draw(st.lists(st.sampled_from(live), unique_by=id)) if live else []:
        countable &= freed.add(a)
        released.release(a, r)
    for req in data.draw(st.lists(requests, min_size=1, max_size=6)):
        assert placeable(s.copy(), req) == (place(s.copy(), req) is not None)
        if countable and FreedWhole.countable(req, DEFAULT_PLACEMENT):
            assert freed.fits(req) == placeable(released.copy(), req)
    s.check()


def test_freed_whole_refuses_gpu_shares():
    s = ClusterState(cluster(n=1, gpus=2))
    share = place_and_allocate(s, Request(gpu_milli=500))
    whole = place_and_allocate(s, Request(gpus=1))
    freed = FreedWhole(s)
    assert freed.add(whole) and not freed.add(share)
    assert freed.fits(Request(gpus=1)) and not freed.fits(Request(gpus=2))


def test_a_request_pinned_to_nodes_runs_only_there():
    """`nodes` (a job's `nodelist`): every worker on a named node, whatever the best fit
    elsewhere would be; no room there is no placement, and the state is untouched."""
    c = cluster(n=3, gpus=4)
    s = ClusterState(c)
    place_and_allocate(s, Request(gpus=1, workers=3))  # best fit would now be node 0
    for req in (Request(cpus_milli=1000, nodes=("n2",)),
                Request(gpu_milli=250, gpu_memory_mib=1024, nodes=("n2",)),
                Request(gpus=2, workers=2, nodes=("n2",)),
                Request(gpus=1, workers=2, nodes=("n1", "n2"))):
        a = place(s, req)
        assert a is not None and set(a.nodes) <= {c.node_index[n] for n in req.nodes}, req
        assert placeable(s, req)
    a = place_and_allocate(s, Request(gpus=1, workers=2, nodes=("n1", "n2")))
    assert a.nodes == (1,), "the first named node with room takes every worker it can"
    before = s.gpu_free_milli.copy()
    full = Request(gpus=4, nodes=("n1",))  # n1 has 2 of its 4 GPUs left
    assert place(s, full) is None and not placeable(s, full)
    assert (s.gpu_free_milli == before).all()
    s.check()


def test_a_request_pinned_to_an_unknown_node_never_fits():
    assert never_fits(cluster(n=2), Request(cpus_milli=1, nodes=("n9",))) == \
        "no node named 'n9' in the cluster"
    assert never_fits(cluster(n=2), Request(gpus=1, nodes=("n1",))) is None
