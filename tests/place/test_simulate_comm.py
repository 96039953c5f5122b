"""The step-time simulator and the communication model."""

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.place.algorithms import Devices, placer
from plinth.place.comm import PCIE, CommModel, fit, measure_copies
from plinth.place.graph import chain_graph, from_arrays, layered_dag
from plinth.place.simulate import critical_path_us, simulate, single_device


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("algo", ["m-topo", "m-etf", "m-sct"])
def test_makespan_is_at_least_the_critical_path_and_the_busiest_device(seed, algo):
    g = layered_dag(150, width=5, rng=np.random.default_rng(seed))
    p = placer(algo)(g, Devices.uniform(3, g.total_bytes()), PCIE)
    step = simulate(g, p.device, PCIE, 3, order=p.order)
    assert step.makespan_us >= critical_path_us(g) - 1e-6
    assert step.makespan_us >= step.busy_us.max() - 1e-6
    assert step.busy_us.sum() == pytest.approx(g.work_us.sum())


def test_single_device_is_the_sum_of_work_and_memory_the_whole_model():
    g = layered_dag(50, width=4, rng=np.random.default_rng(1))
    one = single_device(g, PCIE)
    assert one.makespan_us == pytest.approx(g.work_us.sum())
    assert one.transfers == 0
    # Peak on one device: everything kept for backward, plus the largest scratch buffer at most.
    assert g.perm_bytes.sum() <= one.peak_bytes[0] <= g.total_bytes()


def test_transfers_use_one_channel_per_device_and_are_not_repeated():
    # 0 on device 0 feeds 1 and 2 on device 1: one copy, not two.
    comm = CommModel(1.0, 0.0)   # 1 µs per byte
    g = from_arrays([1.0, 1.0, 1.0], [(0, 1), (0, 2)], out_bytes=10, bwd_ratio=1.0)
    step = simulate(g, [0, 1, 1], comm, 2)
    fwd_copies = 1
    assert step.transfers == fwd_copies + 2    # and two gradients back
    # forward: 1 + 10 (copy) + 1 + 1; backward of 2 and 1 (1 each), 2 gradient copies in series
    # on the channel (10 each), then backward of 0.
    assert step.makespan_us == pytest.approx(13 + 1 + 10 + 1 + 10 + 1)


def test_a_chain_split_in_two_pays_both_ways():
    comm = CommModel(0.5, 2.0)
    g = chain_graph([4.0, 4.0], out_bytes=8, bwd_ratio=1.0)
    step = simulate(g, [0, 1], comm, 2)
    assert step.makespan_us == pytest.approx(4 + 6 + 4 + 4 + 6 + 4)


def test_fit_recovers_known_slope_and_intercept():
    rng = np.random.default_rng(0)
    sizes = np.repeat([1e3, 1e4, 1e5, 1e6, 1e7], 5)
    a, b = 1 / 12e3, 15.0
    times = a * sizes + b + rng.normal(0, 0.5, sizes.size)
    m = fit(sizes, times)
    assert m.a_us_per_byte == pytest.approx(a, rel=1e-2)
    assert m.b_us == pytest.approx(b, abs=0.5)
    assert m.cost_us(0) == 0.0 and m.cost_us(1e6) == pytest.approx(a * 1e6 + b, rel=1e-2)


def test_fit_refuses_bad_measurements():
    with pytest.raises(SpecError, match="two distinct sizes"):
        fit([100, 100], [1.0, 2.0])
    with pytest.raises(SpecError, match="finite"):
        fit([1, 2, 3], [1.0, np.nan, 3.0])


def test_measured_cpu_copies_fit_a_positive_line():
    sizes, times = measure_copies("cpu", "cpu", sizes=(1 << 12, 1 << 18, 1 << 22), repeats=3)
    assert np.all(times > 0)
    m = fit(sizes, times)
    assert m.a_us_per_byte > 0 and m.b_us >= 0
    assert PCIE.bandwidth_gbps == pytest.approx(12.0)
