"""Coarsening keeps the graph acyclic and every total the same, and merges what it should."""

import numpy as np
import pytest

from plinth.place.coarsen import coarsen
from plinth.place.graph import OpGraph, chain_graph, from_arrays, layered_dag


def _totals(g: OpGraph):
    return (g.fwd_us.sum(), g.bwd_us.sum(), g.param_bytes.sum(), g.act_bytes.sum())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("target", [None, 30])
def test_random_dags_stay_acyclic_with_the_same_totals(seed, target):
    g = layered_dag(400, width=8, rng=np.random.default_rng(seed), fanin=3)
    c = coarsen(g, max_node_us=g.work_us.sum() / 8, target_nodes=target)
    c.graph.validate()  # every edge goes forward in the new order: no cycle
    assert c.graph.n < g.n
    np.testing.assert_allclose(_totals(c.graph), _totals(g))
    members = sorted(m for ms in c.graph.members for m in ms)
    assert members == sorted(g.names)  # a partition of the original operators
    # An original edge inside a group vanishes; one across groups survives, forwards.
    gs, gd = c.group[g.src], c.group[g.dst]
    assert np.all(gs <= gd)
    assert set(zip(gs[gs != gd].tolist(), gd[gs != gd].tolist())) == \
        set(zip(c.graph.src.tolist(), c.graph.dst.tolist()))


def test_a_chain_collapses_to_one_node():
    c = coarsen(chain_graph([1.0] * 10, out_bytes=5))
    assert c.graph.n == 1 and c.graph.fwd_us[0] == 10.0 and len(c.graph.src) == 0


def test_caps_stop_merging():
    c = coarsen(chain_graph([1.0] * 10, out_bytes=5, bwd_ratio=1.0), max_node_us=4.0)
    assert c.graph.n == 5 and np.all(c.graph.work_us <= 4.0)


def test_parallel_branches_feeding_one_join_are_merged_into_it():
    # 0 -> {1, 2} -> 3: 1 and 2 each have one consumer, so rule 1 co-places them with 3.
    g = from_arrays([1, 1, 1, 1], [(0, 1), (0, 2), (1, 3), (2, 3)], out_bytes=10)
    c = coarsen(g)
    assert c.group[1] == c.group[2] == c.group[3]


def test_a_tensor_crossing_into_a_group_is_counted_once():
    # 0 feeds 1 and 2, which end up in one group: the edge carries 0's output once.
    g = from_arrays([1, 1, 1, 1, 1], [(0, 1), (0, 2), (0, 4), (1, 3), (2, 3)], out_bytes=7)
    c = coarsen(g, max_node_us=3.0)
    k = c.group
    assert k[1] == k[2] == k[3] and k[0] != k[1]
    e = [i for i in range(len(c.graph.src))
         if (c.graph.src[i], c.graph.dst[i]) == (k[0], k[1])]
    assert len(e) == 1 and c.graph.edge_bytes[e[0]] == 7
