"""Dynamic batching: the pure choices (batch size, wait bound, dispatch) with property tests, the
asyncio batcher on a real torch model, and a real replica process forming batches under
concurrent load with the same answers as the model run one request at a time."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import io
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from replica_process import ReplicaProcess

from plinth.serve.batching import (
    Batcher,
    bounded_wait_ms,
    choose_batch_size,
    plan_dispatch,
    profile,
    profile_sizes,
)
from plinth.serve.model import forward_fn, load_model
from plinth.serve.replica import NPY

ROOT = str(Path(__file__).resolve().parents[2])
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)

# --- the pure core ------------------------------------------------------------------------------


def test_profile_sizes_double_up_to_the_cap() -> None:
    assert profile_sizes(1) == [1]
    assert profile_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert profile_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    with pytest.raises(ValueError):
        profile_sizes(0)


def test_choose_takes_the_largest_batch_within_half_the_slo() -> None:
    times = {1: 2.0, 2: 3.0, 4: 5.0, 8: 9.0, 16: 17.0}
    c = choose_batch_size(times, slo_ms=20)
    assert c.size == 8 and "within 0.5 x SLO = 10.00 ms" in c.reason and "batch 16" in c.reason
    assert choose_batch_size(times, slo_ms=1000).size == 16
    slow = choose_batch_size(times, slo_ms=3)
    assert slow.size == 1 and "one at a time" in slow.reason
    with pytest.raises(ValueError, match="finite"):
        choose_batch_size({1: float("nan")}, slo_ms=10)


def _times() -> st.SearchStrategy[dict[int, float]]:
    # Measured times grow with the batch, as real ones do (the choice must not assume it).
    return st.lists(st.floats(0.0, 50.0), min_size=1, max_size=8).map(
        lambda inc: {2 ** k: float(np.cumsum(inc)[k]) for k in range(len(inc))})


@given(_times(), st.floats(0.01, 500.0))
def test_choice_fits_the_budget_and_is_the_largest_that_does(times, slo) -> None:
    c = choose_batch_size(times, slo_ms=slo)
    assert c.size in times
    fits = [b for b, t in times.items() if t <= slo / 2]
    assert c.size == (max(fits) if fits else 1)
    assert c.reason


@given(_times(), st.floats(0.01, 500.0), st.floats(0.01, 500.0))
def test_a_looser_slo_never_shrinks_the_batch(times, a, b) -> None:
    lo, hi = sorted((a, b))
    assert choose_batch_size(times, slo_ms=lo).size <= choose_batch_size(times, slo_ms=hi).size


def test_the_wait_is_bounded_by_what_the_slo_leaves() -> None:
    assert bounded_wait_ms(5, slo_ms=100, batch_ms=40) == 5
    assert bounded_wait_ms(80, slo_ms=100, batch_ms=40) == 60
    assert bounded_wait_ms(5, slo_ms=10, batch_ms=20) == 0


def test_dispatch_when_full_or_when_the_oldest_is_due() -> None:
    assert plan_dispatch(0.0, [], 0.0, batch_size=4, max_wait_s=1).take == 0
    d = plan_dispatch(10.0, [1, 1], 9.5, batch_size=4, max_wait_s=1.0)
    assert d.take == 0 and d.wake_at == 10.5
    assert plan_dispatch(10.5, [1, 1], 9.5, batch_size=4, max_wait_s=1.0).take == 2
    assert plan_dispatch(10.0, [1, 1, 1, 1, 1], 10.0, batch_size=4, max_wait_s=1.0).take == 4
    assert plan_dispatch(10.0, [3, 2], 10.0, batch_size=4, max_wait_s=1.0).take == 1  # 2 won't fit
    assert plan_dispatch(10.0, [9], 10.0, batch_size=4, max_wait_s=1.0).take == 1  # runs alone


@given(st.lists(st.integers(1, 10), max_size=20), st.integers(1, 16), st.floats(0, 2),
       st.floats(0, 2))
def test_a_dispatch_never_overfills_and_never_waits_past_the_bound(rows, size, age, wait) -> None:
    d = plan_dispatch(age, rows, 0.0, batch_size=size, max_wait_s=wait)
    assert 0 <= d.take <= len(rows)
    if d.take > 1:
        assert sum(rows[: d.take]) <= size
    if rows and d.take == 0:
        assert d.wake_at == wait and age < wait  # it waits only while the oldest is not due
    if rows and age >= wait:
        assert d.take >= 1


def test_profile_stops_at_a_batch_the_model_refuses() -> None:
    net = torch.nn.Linear(3, 2)

    def batch_one_only(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise RuntimeError("exported with a static batch")
        with torch.inference_mode():
            return net(x)

    times, stop = profile(batch_one_only, (3,), profile_sizes(16))
    assert sorted(times) == [1, 2] and "batch 4 failed: RuntimeError" in stop
    assert choose_batch_size(times, slo_ms=1e9).size == 2


# --- the asyncio batcher on a real model --------------------------------------------------------


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_batcher_forms_full_batches_and_answers_each_request_with_its_rows() -> None:
    forward = forward_fn(_net())
    rows = [1, 2, 1, 2, 2, 1, 1, 2]  # batches of 4 rows: [1, 2, 1], [2, 2], [1, 1, 2]
    xs = [torch.randn(r, 6, generator=torch.Generator().manual_seed(i))
          for i, r in enumerate(rows)]

    async def go() -> tuple[list[torch.Tensor], dict]:
        with cf.ThreadPoolExecutor(1) as ex:
            # A wait of a minute: the batches here can only go out because they are full.
            b = Batcher(forward, batch_size=4, max_wait_s=60.0, executor=ex)
            b.start()
            outs = await asyncio.gather(*(b.submit(x) for x in xs))
            await b.close()
            return outs, b.snapshot()

    outs, stats = asyncio.run(go())
    assert stats["requests"] == 8 and stats["rows"] == 12 and stats["batches"] == 3
    assert stats["largest_batch"] == 4 and stats["queued"] == 0
    for x, y in zip(xs, outs, strict=True):
        torch.testing.assert_close(y, forward(x), rtol=1e-5, atol=1e-6)


def test_close_runs_a_partial_batch_without_waiting_for_it_to_fill() -> None:
    forward = forward_fn(_net())

    async def go() -> torch.Tensor:
        with cf.ThreadPoolExecutor(1) as ex:
            b = Batcher(forward, batch_size=4, max_wait_s=3600.0, executor=ex)
            b.start()
            pending = asyncio.ensure_future(b.submit(torch.ones(1, 6)))
            await asyncio.sleep(0)  # let it queue
            await b.close()
            with pytest.raises(RuntimeError, match="shutting down"):
                await b.submit(torch.ones(1, 6))
            return await pending

    torch.testing.assert_close(asyncio.run(go()), forward(torch.ones(1, 6)))


def test_a_bad_request_fails_alone_and_the_rest_of_its_batch_is_answered() -> None:
    net = _net()

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.isnan(x).any():
            raise ValueError("nan in the input")
        with torch.inference_mode():
            return net(x)

    async def go() -> list[object]:
        with cf.ThreadPoolExecutor(1) as ex:
            b = Batcher(forward, batch_size=4, max_wait_s=60.0, executor=ex)
            b.start()
            xs = [torch.ones(1, 6), torch.full((1, 6), float("nan")), torch.zeros(1, 6),
                  torch.ones(1, 6)]
            res = await asyncio.gather(*(b.submit(x) for x in xs), return_exceptions=True)
            await b.close()
            assert b.stats.failed == 1 and b.stats.requests == 3
            return res

    res = asyncio.run(go())
    assert isinstance(res[1], ValueError)
    assert all(isinstance(r, torch.Tensor) for i, r in enumerate(res) if i != 1)


# --- a replica process under concurrent load ----------------------------------------------------


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_replica_batches_concurrent_requests_and_matches_unbatched_results() -> None:
    rng = np.random.default_rng(0)
    xs = [rng.random((1, 1, 28, 28), dtype=np.float32) for _ in range(8)]
    # Batches of 4 and a wait far past the test: the 8 requests can only go out as 2 full batches.
    args = ["--model", "examples.serve.cnn:make", "--input-shape", "1,28,28", "--slo-ms", "1e9",
            "--max-batch", "4", "--max-wait-ms", "1e8", "--workdir", ROOT]
    with ReplicaProcess.start(args, env=ENV, cwd=ROOT) as rp, httpx.Client(timeout=120) as c:
        with cf.ThreadPoolExecutor(8) as ex:
            rs = list(ex.map(lambda x: c.post(rp.url + "/infer", content=_npy(x),
                                              headers={"content-type": NPY}), xs))
        stats = c.get(rp.url + "/stats").json()
        assert rp.stop() == 0
    assert [r.status_code for r in rs] == [200] * 8
    assert stats["batch_size"] == 4 and stats["requests"] == 8 and stats["batches"] == 2
    assert stats["largest_batch"] == 4 and stats["p99_ms"] >= stats["p50_ms"] > 0
    forward = forward_fn(load_model("examples.serve.cnn:make", workdir=ROOT))
    for x, r in zip(xs, rs, strict=True):
        got = np.load(io.BytesIO(r.content))
        np.testing.assert_allclose(got, forward(torch.from_numpy(x)).numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_adaptive_replica_profiles_and_reports_its_choice() -> None:
    args = ["--model", "mlp", "--input-shape", "784", "--slo-ms", "1000"]
    with ReplicaProcess.start(args, env=ENV) as rp:
        stats = httpx.get(rp.url + "/stats").json()
        health = httpx.get(rp.url + "/healthz")
        body = {"inputs": np.zeros((3, 784)).tolist()}
        out = httpx.post(rp.url + "/infer", json=body).json()
    assert health.status_code == 200
    sizes = [int(b) for b in stats["profile_ms"]]
    assert sizes[0] == 1 and stats["batch_size"] in sizes and stats["reason"]
    assert len(out["outputs"]) == 3 and len(out["classes"]) == 3
