"""What the replay models: the router's per-replica queues, arrivals, cold start, compression."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from plinth.cli.serve import app
from plinth.core.errors import SpecError
from plinth.serve.policies import make_policy
from plinth.serve.sim import COLD_START_S, SimConfig, _arrivals, _Fifo, _Router, simulate
from plinth.serve.traces import SERVICE_FITS, CountTrace, ServiceTime, load_service_time

SVC = ServiceTime("lognorm", shape=0.36, loc=0.073, scale=0.087)


def burst(n: int, eps: float = 1e-3) -> np.ndarray:
    return np.arange(n) * eps


def test_round_robin_router_sends_in_turn_and_caps_four_in_flight() -> None:
    r = _Router(2, cc=4, least=False)
    arr, svc = burst(10), np.ones(10)
    lat = r.run(arr, svc, np.ones(10, bool), cap=50)
    # Requests alternate between the two replicas; each serves its own four in order.
    assert [len(f) for f in r.fin] == [4, 4]
    np.testing.assert_allclose((lat + arr)[:8], [1, 1, 2, 2, 3, 3, 4, 4], atol=0.01)
    # The 9th and 10th find both replicas holding 4: they wait in the router queue, each goes
    # to the replica that frees a slot first, and queues behind that replica's last request.
    np.testing.assert_allclose((lat + arr)[8:], [5, 5], atol=0.01)
    assert r.ongoing(0.5) == 10 and r.ongoing(4.5) == 2
    # Never more than 4 in flight on a replica at any instant.
    for f in r.fin:
        assert len(f) <= 4


def test_router_queue_is_bounded_and_overflow_is_dropped() -> None:
    r = _Router(1, cc=4, least=True)
    lat = r.run(burst(60), np.ones(60), np.ones(60, bool), cap=50)
    assert np.isinf(lat).sum() == 60 - 4 - 50
    assert np.all(np.isfinite(lat[:54]))


def test_least_loaded_router_picks_the_replica_with_fewest_in_flight() -> None:
    r = _Router(3, cc=4, least=True)
    lat = r.run(burst(3), np.full(3, 10.0), np.ones(3, bool), cap=50)
    assert [len(f) for f in r.fin] == [1, 1, 1]  # one each, not four on the first replica
    assert np.isfinite(lat).all()
    # A long request keeps replica 0 busy; once replica 1 is idle again it gets the next one,
    # and a tie in flight goes to the first replica.
    r = _Router(2, cc=4, least=True)
    r.run(np.array([0.0, 0.1, 0.7, 0.8]), np.array([10.0, 0.5, 0.5, 0.5]), np.ones(4, bool),
          cap=50)
    assert list(r.fin[0]) == [10.0, 10.5] and list(r.fin[1]) == [0.6, 1.2]


def test_per_replica_queues_block_behind_a_slow_request_where_fifo_does_not() -> None:
    arr = burst(3)
    svc = np.array([10.0, 1.0, 1.0])
    rr = _Router(2, cc=4, least=False).run(arr, svc, np.ones(3, bool), cap=50)
    fifo = _Fifo(2).run(arr, svc, np.ones(3, bool), cap=50)
    # Round-robin puts the third request behind the 10 s one; the central FIFO gives it to the
    # replica that is free after 1 s.
    assert rr[2] > 10.0 and fifo[2] < 3.0


def test_router_scale_down_removes_starting_replicas_first_and_keeps_held_requests() -> None:
    r = _Router(2, cc=4, least=True)
    r.run(burst(4), np.ones(4), np.ones(4, bool), cap=50)
    r.scale(4, now=0.5, cold=10.0)
    assert r.size() == 4 and r.ready(0.5) == 2 and r.ready(10.5) == 4
    r.scale(2, now=1.0, cold=10.0)
    assert r.size() == 2 and r.ready(1.0) == 2  # the two starting ones went
    r.scale(1, now=1.0, cold=10.0)
    assert r.size() == 1 and r.ongoing(1.5) == 2  # the removed one still finishes its request


def test_poisson_arrivals_keep_each_minutes_count_in_expectation() -> None:
    rng = np.random.default_rng(0)
    sizes = [_arrivals("poisson", rng, 600, 3).size for _ in range(400)]
    assert abs(np.mean(sizes) - 600) < 3 * np.sqrt(600 / 400)
    assert np.std(sizes) > 10  # the count itself varies, unlike the uniform spread
    a = _arrivals("poisson", rng, 600, 3)
    assert a.min() >= 180.0 and a.max() < 240.0 and np.all(np.diff(a) >= 0)
    assert _arrivals("uniform", rng, 600, 3).size == 600


def test_poisson_replay_total_is_close_to_the_trace() -> None:
    counts = np.full((20, 2), 300, np.int64)
    tr = CountTrace("flat", ("a", "b"), counts)
    r = simulate(tr, make_policy("fairshare"), SimConfig(service=SVC, quota=6,
                                                         arrivals="poisson"))
    assert r.requests != counts.sum() and abs(r.requests - counts.sum()) < 4 * np.sqrt(12000)


def test_compressed_replay_is_the_trace_with_a_longer_cold_start() -> None:
    rng = np.random.default_rng(1)
    tr = CountTrace("t", ("a", "b"), rng.poisson(400, (15, 2)).astype(np.int64))
    fast = simulate(tr, make_policy("aiad"), SimConfig(service=SVC, quota=6, cold_start_s=3.0,
                                                       compress=10))
    slow = simulate(tr, make_policy("aiad"), SimConfig(service=SVC, quota=6, cold_start_s=30.0))
    assert fast.slo_violation_rate == slow.slo_violation_rate
    assert fast.p99_latency_s == pytest.approx(slow.p99_latency_s / 10)


def test_defaults_and_validation() -> None:
    cfg = SimConfig(service=SVC)
    assert cfg.cold_start_s == COLD_START_S and cfg.queueing == "router"
    assert cfg.arrivals == "uniform" and cfg.label()["cold_start_s"] == COLD_START_S
    with pytest.raises(SpecError, match="--queueing: 'lifo'"):
        SimConfig(service=SVC, queueing="lifo")
    with pytest.raises(SpecError, match="--arrivals"):
        SimConfig(service=SVC, arrivals="bursty")
    with pytest.raises(SpecError, match="--compress"):
        SimConfig(service=SVC, compress=0.5)
    fit = load_service_time("faro-10job")
    assert fit is SERVICE_FITS["faro-10job"] and 0.150 < fit.mean < 0.158


def test_queueing_models_give_different_replays() -> None:
    rng = np.random.default_rng(2)
    tr = CountTrace("t", ("a",), rng.poisson(1000, (10, 1)).astype(np.int64))
    out = {q: simulate(tr, make_policy("fairshare"), SimConfig(service=SVC, quota=3,
                                                               queueing=q))
           for q in ("router", "round-robin", "fifo")}
    assert len({r.p99_latency_s for r in out.values()}) >= 2
    assert out["fifo"].requests == out["router"].requests == int(tr.counts.sum())


def test_cli_takes_faro_cold_start_queueing_and_arrivals(tmp_path) -> None:
    import json
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"ts": m, "counts": {"a": {"c": 200}, "b": {"c": 100}}}) + "\n"
                         for m in range(6)))
    res = CliRunner().invoke(app, [
        "sim", "--trace", str(p), "--service-time", "faro-10job", "--cpus", "4",
        "--policy", "aiad", "--cold-start", "35", "--queueing", "round-robin",
        "--arrivals", "poisson", "--compress", "10", "--json", str(tmp_path / "r.json"),
        "--out", ""])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "r.json").read_text())[0]
    assert row["cold_start_s"] == 35 and row["queueing"] == "round-robin"
    assert row["arrivals"] == "poisson" and row["compress"] == 10
    assert "cold start 35 s" in res.output
