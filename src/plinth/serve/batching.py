"""Dynamic batching for one replica, after GSLICE (Dhakal et al.).

At startup the replica times its model at batch sizes 1, 2, 4, ... up to a cap (`profile`), and
serves at the largest batch whose time stays within half the SLO (`choose_batch_size`): the other
half is left for the request's wait in the queue and the HTTP round trip. Requests queue, and a
batch goes to the model when it is full or when its oldest request has waited `max_wait_s`
(`plan_dispatch`), a wait bounded so that waiting and then running still fits the SLO
(`bounded_wait_ms`).

The decisions are pure functions of measured numbers and `now`; `Batcher` is the asyncio shell
that queues requests and runs the model in one worker thread, so that the event loop stays free to
take requests while a batch runs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ADAPTIVE_CAP = 64  # the largest batch profiled when the batch size is adaptive
SLO_SHARE = 0.5  # of the SLO, the most a batch's execution may take

Forward = Callable[[torch.Tensor], torch.Tensor]


# --- the pure core ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchChoice:
    size: int
    reason: str


def profile_sizes(cap: int) -> list[int]:
    """1, 2, 4, ... below `cap`, then `cap` itself."""
    if cap < 1:
        raise ValueError(f"the batch cap must be >= 1, got {cap}")
    sizes = [1]
    while sizes[-1] * 2 < cap:
        sizes.append(sizes[-1] * 2)
    return sizes + [cap] if sizes[-1] != cap else sizes


def choose_batch_size(times_ms: Mapping[int, float], *, slo_ms: float,
                      share: float = SLO_SHARE) -> BatchChoice:
    """The largest profiled batch size whose measured time is within `share` of the SLO; 1 when
    none is (a batch of one is always allowed: the replica must still answer)."""
    if not times_ms:
        raise ValueError("no batch size was profiled")
    if any(not np.isfinite(t) or t < 0 for t in times_ms.values()):
        raise ValueError(f"measured times must be finite and >= 0, got {dict(times_ms)}")
    budget = share * slo_ms
    fits = [b for b, t in times_ms.items() if t <= budget]
    if not fits:
        t1 = times_ms.get(1, min(times_ms.values()))
        return BatchChoice(1, f"batch 1 takes {t1:.2f} ms, over {share:g} x SLO = "
                              f"{budget:.2f} ms: serving one at a time")
    size = max(fits)
    over = sorted(b for b in times_ms if b > size)
    why = (f"batch {over[0]} takes {times_ms[over[0]]:.2f} ms" if over
           else f"{size} is the largest size profiled")
    return BatchChoice(size, f"batch {size} takes {times_ms[size]:.2f} ms, within {share:g} x "
                             f"SLO = {budget:.2f} ms; {why}")


def bounded_wait_ms(max_wait_ms: float, *, slo_ms: float, batch_ms: float) -> float:
    """`max_wait_ms`, cut so that the oldest request's wait plus the batch's run fits the SLO."""
    return max(0.0, min(max_wait_ms, slo_ms - batch_ms))


@dataclass(frozen=True, slots=True)
class Dispatch:
    take: int  # requests to run now, from the head of the queue (0: none)
    wake_at: float | None  # when to plan again if nothing arrives (None: on the next arrival)


def plan_dispatch(now: float, rows: Sequence[int], oldest_at: float, *, batch_size: int,
                  max_wait_s: float) -> Dispatch:
    """What to run now, given the queued requests' row counts (oldest first) and the arrival time
    of the oldest. A batch holds whole requests, at most `batch_size` rows (a larger request runs
    alone). It goes when full, when the next request would not fit, or when the oldest request has
    waited `max_wait_s`."""
    if not rows:
        return Dispatch(0, None)
    take, total = 0, 0
    for r in rows:
        if take and total + r > batch_size:
            break
        take, total = take + 1, total + r
    full = total >= batch_size or take < len(rows)
    due = oldest_at + max_wait_s
    if full or now >= due:
        return Dispatch(take, None)
    return Dispatch(0, due)


# --- measuring ----------------------------------------------------------------------------------


def time_forward(forward: Forward, x: torch.Tensor, *, repeats: int = 5,
                 budget_s: float = 1.0) -> float:
    """The median time of `forward(x)` in ms, after one warm-up run; fewer repeats (at least one)
    when the runs would take longer than `budget_s`."""
    forward(x)
    times: list[float] = []
    end = time.perf_counter() + budget_s
    while len(times) < repeats and (not times or time.perf_counter() < end):
        t0 = time.perf_counter()
        forward(x)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def profile(forward: Forward, input_shape: tuple[int, ...], sizes: Sequence[int], *,
            stop_above_ms: float = float("inf")) -> tuple[dict[int, float], str]:
    """Measured ms per batch size, in increasing order of size. It stops after the first size
    that takes over `stop_above_ms` (a larger batch only takes longer) or that the model refuses
    (a model exported with batch 1, say); the second value says why it stopped ("" if it did
    not). Batch 1 must run: its error is raised."""
    times: dict[int, float] = {}
    for b in sizes:
        x = torch.zeros((b, *input_shape))
        if b == 1:
            times[b] = time_forward(forward, x)
        else:
            try:
                y = forward(x)
                if y.shape[:1] != (b,):
                    return times, f"batch {b} gave outputs of shape {tuple(y.shape)}"
                times[b] = time_forward(forward, x)
            except Exception as e:  # noqa: BLE001 -- the model's own limit: serve below it
                return times, f"batch {b} failed: {type(e).__name__}: {str(e)[:200]}"
        if times[b] > stop_above_ms:
            return times, ""
    return times, ""


# --- the asyncio shell --------------------------------------------------------------------------


@dataclass(slots=True)
class _Item:
    x: torch.Tensor
    at: float
    future: asyncio.Future[torch.Tensor]

    @property
    def rows(self) -> int:
        return int(self.x.shape[0])


@dataclass(slots=True)
class BatchStats:
    requests: int = 0
    batches: int = 0
    rows: int = 0
    failed: int = 0
    largest: int = 0  # rows in the largest batch run
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class Batcher:
    """Queues batches of rows from concurrent requests and runs them through `forward` in one
    worker thread, `batch_size` rows at a time. `submit` answers with the request's own rows."""

    def __init__(self, forward: Forward, *, batch_size: int, max_wait_s: float,
                 executor: ThreadPoolExecutor) -> None:
        if batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"batch_size must be >= 1 and max_wait_s >= 0, got {batch_size}, "
                             f"{max_wait_s}")
        self.forward = forward
        self.batch_size = batch_size
        self.max_wait_s = max_wait_s
        self.executor = executor
        self.stats = BatchStats()
        self._queue: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self._draining = False  # run each batch at once: no more requests are coming
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def drain(self) -> None:
        """From now on run what is queued without waiting for a batch to fill (the replica is
        leaving; requests may still arrive until its listener closes)."""
        self._draining = True
        self._wake.set()

    async def close(self) -> None:
        """Drain, run the last requests, and stop; `submit` refuses from now on."""
        self._closed = True
        self.drain()
        if self._task is not None:
            await self._task

    async def submit(self, x: torch.Tensor) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("the replica is shutting down")
        item = _Item(x, time.perf_counter(), asyncio.get_running_loop().create_future())
        self._queue.append(item)
        self._wake.set()
        return await item.future

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            q = self._queue
            wait = 0.0 if self._draining else self.max_wait_s
            d = plan_dispatch(time.perf_counter(), [i.rows for i in q],
                              q[0].at if q else 0.0, batch_size=self.batch_size, max_wait_s=wait)
            if d.take:
                await self._execute([q.popleft() for _ in range(d.take)])
                continue
            if self._closed and not q:
                return
            timeout = None if d.wake_at is None else max(0.0, d.wake_at - time.perf_counter())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _execute(self, items: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        x = items[0].x if len(items) == 1 else torch.cat([i.x for i in items])
        try:
            y = await loop.run_in_executor(self.executor, self.forward, x)
            if y.shape[:1] != (x.shape[0],):
                raise ValueError(f"a batch of {x.shape[0]} gave outputs of shape "
                                 f"{tuple(y.shape)}")
        except Exception as e:  # noqa: BLE001 -- a failed batch is answered, not raised
            if len(items) > 1:  # find the request at fault: the others must still be answered
                for item in items:
                    await self._execute([item])
                return
            self.stats.failed += 1
            if not items[0].future.done():
                items[0].future.set_exception(e)
            return
        now = time.perf_counter()
        st = self.stats
        st.batches += 1
        st.rows += x.shape[0]
        st.largest = max(st.largest, int(x.shape[0]))
        for item, out in zip(items, y.split([i.rows for i in items]), strict=True):
            st.requests += 1
            st.latencies_ms.append((now - item.at) * 1000)
            if not item.future.done():  # a client that went away cancelled its future
                item.future.set_result(out)

    def snapshot(self) -> dict[str, Any]:
        """The numbers GET /stats shows."""
        st = self.stats
        lat = np.fromiter(st.latencies_ms, float)
        p50, p99 = (np.percentile(lat, [50, 99]).tolist() if lat.size else (0.0, 0.0))
        return {"batch_size": self.batch_size, "requests": st.requests, "batches": st.batches,
                "rows": st.rows, "largest_batch": st.largest, "failed": st.failed,
                "queued": len(self._queue), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
