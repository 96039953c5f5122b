"""Sizing the aggregator tree: a pure function of load and measured throughput (no CPU count),
the EWMA the server feeds it, and leaves that are not pinned by the tree."""

import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.aggregate.sizing import TreeShape, ewma, leaf_throughput, size_tree


@given(n=st.integers(0, 100_000), size=st.integers(1, 10**9),
       tput=st.one_of(st.none(), st.floats(1e3, 1e11)), deadline=st.floats(1e-3, 1e3),
       cap=st.integers(1, 256), per_middle=st.one_of(st.none(), st.integers(1, 64)),
       per_leaf=st.one_of(st.none(), st.integers(1, 64)))
def test_the_shape_stays_in_bounds_and_covers_every_update(n, size, tput, deadline, cap,
                                                           per_middle, per_leaf):
    sh = size_tree(expected_updates=n, update_bytes=size, throughput_bps_per_leaf=tput,
                   round_deadline_s=deadline, max_leaves=cap, leaves_per_middle=per_middle,
                   max_updates_per_leaf=per_leaf)
    assert 1 <= sh.leaves <= max(1, min(cap, n))
    if per_leaf is not None and sh.leaves < cap:
        assert sh.updates_per_leaf <= per_leaf  # the cap holds wherever the budget allows
    assert sh.leaves * sh.updates_per_leaf >= n  # every expected update has a leaf
    assert sh.middles == math.ceil(sh.leaves / (per_middle or sh.leaves))
    if tput is not None and sh.leaves < min(cap, n):
        # fewer leaves than allowed: they fold the round's bytes within the deadline
        assert n * size <= sh.leaves * tput * deadline * (1 + 1e-9)


def test_more_load_or_slower_leaves_never_mean_fewer_leaves():
    base = {"update_bytes": 4_000_000, "round_deadline_s": 0.5, "max_leaves": 16}
    by_load = [size_tree(expected_updates=n, throughput_bps_per_leaf=2e9, **base).leaves
               for n in (10, 100, 1000)]
    by_speed = [size_tree(expected_updates=1000, throughput_bps_per_leaf=t, **base).leaves
                for t in (8e9, 2e9, 5e8)]
    assert by_load == sorted(by_load) and by_load[0] < by_load[-1]
    assert by_speed == sorted(by_speed) and by_speed[0] < by_speed[-1]
    # 1000 x 4 MB at 2 GB/s within 0.5 s: 4 leaves
    sh = size_tree(expected_updates=1000, throughput_bps_per_leaf=2e9, **base)
    assert (sh.leaves, sh.middles, sh.updates_per_leaf, sh.cpus) == (4, 1, 250, 1.0)
    assert isinstance(sh, TreeShape) and "-> 4 leaves" in sh.reason


def test_the_prior_and_a_fixed_tree():
    kw = {"update_bytes": 1, "throughput_bps_per_leaf": None, "round_deadline_s": 1.0}
    assert size_tree(expected_updates=20, max_leaves=8, prior_updates_per_leaf=4, **kw).leaves == 5
    fixed = size_tree(expected_updates=1, max_leaves=3, fixed_leaves=7, **kw)
    assert fixed.leaves == 3 and "fixed" in fixed.reason
    with pytest.raises(PlinthError, match="max_leaves"):
        size_tree(expected_updates=1, max_leaves=0, **kw)


def test_a_per_leaf_update_cap_resizes_a_fast_tree_with_the_load():
    """Tiny updates fold so fast that throughput alone asks for one leaf whatever the load;
    `max_updates_per_leaf` makes the tree follow the round's participants, within max_leaves."""
    kw = {"update_bytes": 10_000, "throughput_bps_per_leaf": 1e8, "round_deadline_s": 1.0,
          "max_leaves": 5}
    assert [size_tree(expected_updates=n, **kw).leaves for n in (3, 10, 100)] == [1, 1, 1]
    capped = [size_tree(expected_updates=n, max_updates_per_leaf=3, **kw) for n in (3, 10, 100)]
    assert [sh.leaves for sh in capped] == [1, 4, 5]
    assert "at most 3 updates a leaf -> 4 leaves" in capped[1].reason
    assert capped[1].updates_per_leaf == 3  # 10 updates over 4 leaves: 3 a leaf at most
    # a fixed tree stays fixed, and a slow leaf still asks for more leaves than the cap would
    assert size_tree(expected_updates=10, max_updates_per_leaf=1, fixed_leaves=2, **kw
                     ).leaves == 2
    slow = {**kw, "throughput_bps_per_leaf": 2e4}
    assert size_tree(expected_updates=10, max_updates_per_leaf=9, **slow).leaves == 5


def test_the_sizing_reads_no_cpu_count(monkeypatch):
    def boom(*a):
        raise AssertionError("size_tree read the machine's CPUs")

    monkeypatch.setattr(os, "cpu_count", boom)
    monkeypatch.setattr(os, "sched_getaffinity", boom)
    assert size_tree(expected_updates=64, update_bytes=10**6, throughput_bps_per_leaf=1e9,
                     round_deadline_s=0.01, max_leaves=32).leaves == 7


def test_the_ewma_skips_empty_rounds_and_moves_towards_samples():
    assert ewma(None, None) is None and ewma(None, 4.0) == 4.0
    assert ewma(4.0, 0.0) == 4.0 and ewma(4.0, float("nan")) == 4.0
    assert ewma(4.0, 8.0, alpha=0.25) == pytest.approx(5.0)
    assert leaf_throughput([100, 0, 300], [1.0, 0.0, 1.0]) == 200.0
    assert leaf_throughput([0], [0.0]) is None
    with pytest.raises(PlinthError, match="alpha"):
        ewma(1.0, 1.0, alpha=0.0)


def test_leaves_keep_the_cpus_the_runtime_gave_and_report_their_throughput():
    """The tree does not pin its leaves: each may run where its parent may (the runtime's
    placement), and each reports bytes folded and busy seconds for the sizing."""
    x0 = [np.zeros((300, 100), np.float32)]
    tree = Hierarchy(x0, leaves=2)
    try:
        mine = os.sched_getaffinity(0)
        assert [os.sched_getaffinity(p) for p in tree.pids] == [mine, mine]
        for k in range(4):
            tree.submit_arrays([np.ones((300, 100), np.float32)], 1.0, f"u{k}")
        res = tree.finish(timeout=60)
    finally:
        tree.close()
    assert res.count == 4 and sum(res.folded_bytes) == 4 * tree.update_bytes
    assert len(res.busy_s) == 2 and all(s >= 0 for s in res.busy_s)
    assert leaf_throughput(res.folded_bytes, res.busy_s) > 0
