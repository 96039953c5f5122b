"""The placers on small hand-checked graphs: precedence, memory caps and known optima."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core.errors import SpecError, UnplaceableError
from plinth.place.algorithms import PLACERS, Devices, placer
from plinth.place.algorithms.common import Ledger
from plinth.place.algorithms.m_sct import favourite_children, sct_lp
from plinth.place.comm import PCIE, CommModel
from plinth.place.graph import chain_graph, from_arrays, layered_dag
from plinth.place.simulate import critical_path_us, simulate

FREE = CommModel(0.0, 0.0, "free")
SLOW = CommModel(1e-3, 50.0, "slow")   # 1 KB/ms: moving any real tensor costs a lot
ALGOS = list(PLACERS)


@pytest.mark.parametrize("algo", ["m-etf", "m-sct"])
@pytest.mark.parametrize("n,k", [(8, 4), (9, 4), (6, 3), (5, 1)])
def test_independent_equal_ops_spread_evenly(algo, n, k):
    g = from_arrays([10.0] * n, [], out_bytes=100, bwd_ratio=2.0)
    p = placer(algo)(g, Devices.uniform(k, 10**9), FREE)
    step = simulate(g, p.device, FREE, k, order=p.order)
    assert step.makespan_us == pytest.approx(math.ceil(n / k) * 30.0)  # the optimum
    assert np.bincount(p.device, minlength=k).max() == math.ceil(n / k)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_chain_with_costly_transfers_stays_on_one_device(algo):
    g = chain_graph([5.0, 1.0, 7.0, 2.0, 3.0], out_bytes=10**6, bwd_ratio=1.0)
    p = placer(algo)(g, Devices.uniform(4, 10**9), SLOW)
    assert len(set(p.device.tolist())) == 1
    step = simulate(g, p.device, SLOW, 4, order=p.order)
    assert step.makespan_us == pytest.approx(2 * 18.0) == pytest.approx(critical_path_us(g))


def _dag(seed, n=120):
    return layered_dag(n, width=6, rng=np.random.default_rng(seed), mean_bytes=2e5)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("seed", range(5))
def test_memory_caps_and_precedence_always_hold(algo, seed):
    g = _dag(seed)
    devices = Devices.uniform(4, int(g.total_bytes() * 0.4))  # one device cannot hold it
    p = placer(algo)(g, devices, PCIE)
    assert p.device.min() >= 0 and p.device.max() < 4
    step = simulate(g, p.device, PCIE, 4, order=p.order)
    assert np.all(step.peak_bytes <= devices.memory)
    # The placer's own schedule: an op never starts before its inputs are computed.
    if algo != "m-topo":
        finish = p.order + g.work_us
        assert np.all(p.order[g.dst] >= finish[g.src] - 1e-6)


def test_m_topo_fills_in_order_under_its_cap():
    g = _dag(0)
    devices = Devices.uniform(4, g.total_bytes())
    p = placer("m-topo")(g, devices, PCIE)
    assert np.all(np.diff(p.device) >= 0)  # contiguous runs in topological order
    ledger, device_of = Ledger(g, devices), np.full(g.n, -1)
    for u in range(g.n):
        ledger.commit(u, int(p.device[u]), device_of)
        device_of[u] = p.device[u]
    cap = g.total_bytes() / 4 + (g.perm_bytes + g.temp_bytes).max()
    assert np.all(ledger.used() <= cap)
    assert len(set(p.device.tolist())) > 1  # the cap, not the memory, spread it


@pytest.mark.parametrize("seed", range(3))
def test_sct_lp_solution_is_feasible(seed):
    g = _dag(seed, n=60)
    x, s, bound = sct_lp(g, PCIE)
    p, c = g.work_us, PCIE.cost_us(g.edge_bytes)
    tol = 1e-6 * p.max()
    assert np.all(x >= -1e-9) and np.all(x <= 1 + 1e-9) and np.all(s >= -tol)
    assert np.all(s[g.dst] >= s[g.src] + p[g.src] + c * x - tol)
    for lists in (g.succ_edges, g.pred_edges):
        for edges in lists:
            if len(edges) >= 2:
                assert x[edges].sum() >= len(edges) - 1 - 1e-6
    assert bound >= (s + p).max() - tol
    # Every path's work is a lower bound on the relaxation's makespan.
    longest = np.zeros(g.n)
    for v in range(g.n):
        longest[v] = p[v] + max((longest[u] for u in g.preds[v]), default=0.0)
    assert bound >= longest.max() - tol
    fav = favourite_children(g, x)
    kids = fav[fav >= 0]
    assert len(set(kids.tolist())) == len(kids)  # at most one favourite parent each


def test_sct_keeps_a_favourite_child_on_its_parents_device():
    # A fork: 0 -> 1 (heavy tensor) and 0 -> 2 (light). 1 should follow 0 with no transfer.
    g = from_arrays([10, 10, 10], [(0, 1), (0, 2)], out_bytes=[10**6, 10, 10], bwd_ratio=1.0)
    g.edge_bytes[:] = [10**6, 10]
    p = placer("m-sct")(g, Devices.uniform(2, 10**9), SLOW)
    assert p.device[1] == p.device[0]


def test_a_node_too_big_for_any_device_is_named():
    g = chain_graph([1.0] * 4, param_bytes=[10, 10, 5000, 10])
    for algo in ALGOS:
        with pytest.raises(UnplaceableError, match=r"'n2' needs 9.77 KiB.*--memory"):
            placer(algo)(g, Devices.uniform(4, 1000), PCIE)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_graph_too_big_in_total_is_refused(algo):
    g = from_arrays([1.0] * 8, [], param_bytes=400)   # 8 x 800 bytes on 4 x 1000
    with pytest.raises(UnplaceableError, match="does not fit"):
        placer(algo)(g, Devices.uniform(4, 1000), PCIE)


def test_zero_devices_or_memory_and_unknown_algo_are_refused():
    with pytest.raises(SpecError, match="--devices"):
        Devices.uniform(0, 100)
    with pytest.raises(SpecError, match="--memory"):
        Devices.uniform(2, 0)
    with pytest.raises(SpecError, match="--algo.*m-etf"):
        placer("random")


@st.composite
def small_dags(draw):
    n = draw(st.integers(1, 18))
    pairs = [(u, v) for v in range(n) for u in range(v)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=30)) if pairs else []
    sizes = st.integers(0, 5000)
    return from_arrays(draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)), sorted(edges),
                       out_bytes=draw(st.lists(sizes, min_size=n, max_size=n)),
                       param_bytes=draw(st.lists(sizes, min_size=n, max_size=n)),
                       act_bytes=draw(st.lists(sizes, min_size=n, max_size=n)),
                       temp_bytes=draw(st.lists(sizes, min_size=n, max_size=n)), bwd_ratio=2.0)


@settings(max_examples=80, deadline=None)
@given(g=small_dags(), k=st.integers(1, 4), frac=st.floats(0.05, 1.2),
       algo=st.sampled_from(ALGOS))
def test_any_plan_respects_memory_and_precedence(g, k, frac, algo):
    devices = Devices.uniform(k, max(1, int(g.total_bytes() * frac)))
    try:
        p = placer(algo)(g, devices, PCIE)
    except UnplaceableError as e:
        assert "\n" not in str(e) and "needs" in str(e)
        return
    step = simulate(g, p.device, PCIE, k, order=p.order)
    assert np.all(step.peak_bytes <= devices.memory)
    assert step.makespan_us >= critical_path_us(g) - 1e-6
    if algo != "m-topo":
        assert np.all(p.order[g.dst] >= p.order[g.src] + g.work_us[g.src] - 1e-6)


def test_simulate_waits_for_a_producer_on_another_device_over_a_zero_byte_edge():
    """Found by the property test above: n1 -> n4 carries no bytes, n4 runs on another device,
    and the simulated step ended before the critical path (5 us against 6)."""
    g = from_arrays([0.0, 1.0, 0.0, 0.0, 1.0], [(0, 1), (1, 3), (1, 4)], out_bytes=[0] * 5,
                    param_bytes=[0] * 5, act_bytes=[0] * 5, temp_bytes=[0] * 5, bwd_ratio=2.0)
    step = simulate(g, [0, 0, 1, 1, 1], PCIE, 2)
    assert step.makespan_us >= critical_path_us(g) - 1e-6


def test_m_etf_waits_for_a_producer_even_when_its_edge_carries_no_bytes():
    """A zero-byte edge (found by the property test above) is still a dependency: the consumer,
    forced onto the other device by memory, starts only after its producer finishes."""
    g = from_arrays([10.0, 1.0], [(0, 1)], out_bytes=[0, 0], param_bytes=[400, 400],
                    act_bytes=[0, 0], temp_bytes=[0, 0], bwd_ratio=2.0)
    devices = Devices.uniform(2, 1000)
    for algo in ("m-etf", "m-sct"):
        p = placer(algo)(g, devices, PCIE)
        assert p.device[0] != p.device[1]
        assert p.order[1] >= p.order[0] + g.work_us[0]
