"""The HTTP router in front of the replicas: bounded queues, 503 on overflow, request timeouts.

POST /v1/{job}/infer is sent to the job's replica with the fewest requests in flight, never more
than `concurrency` per replica. When every replica is full the request waits in the job's queue;
when the queue holds `queue` requests already, the answer is 503 at once, and a request that waits
longer than `timeout_s` in all gets 504. GET /metrics gives the counters in Prometheus text format.

All router state lives on its event loop. The control shell changes it only through the coroutines
`add_replica`, `drain_replica` and `take_window`, scheduled onto that loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import numpy as np
from fastapi import FastAPI, Request, Response

from plinth.serve.spec import RouterSpec


@dataclass(slots=True)
class _Replica:
    url: str
    inflight: int = 0
    draining: bool = False


@dataclass(slots=True)
class _JobState:
    replicas: dict[str, _Replica] = field(default_factory=dict)
    queued: int = 0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    window_arrivals: int = 0
    window_latencies: list[float] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    latency_sum: float = 0.0

    def pick(self, concurrency: int) -> _Replica | None:
        best = None
        for r in self.replicas.values():
            if not r.draining and r.inflight < concurrency and (best is None
                                                                 or r.inflight < best.inflight):
                best = r
        if best is not None:
            best.inflight += 1
        return best

    @property
    def inflight(self) -> int:
        return sum(r.inflight for r in self.replicas.values())


@dataclass(frozen=True, slots=True)
class Window:
    """What happened to one job since the last `take_window`."""

    arrivals: int
    p99_s: float
    ongoing: int
    ready: int


class Router:
    def __init__(self, spec: RouterSpec, jobs: list[str]) -> None:
        self.spec = spec
        self.jobs = {j: _JobState() for j in jobs}
        self.client: httpx.AsyncClient | None = None
        self._bad_seen = dict.fromkeys(jobs, 0)  # 503s and 504s already reported
        self.app = self._make_app()

    def _make_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000))
            yield
            await self.client.aclose()

        app = FastAPI(title="plinth router", lifespan=lifespan)

        @app.post("/v1/{job}/infer")
        async def infer(job: str, request: Request) -> Response:
            return await self.handle(job, await request.body())

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.prometheus(), media_type="text/plain; version=0.0.4")

        return app

    def _done(self, js: _JobState, code: int, t0: float) -> None:
        js.codes[code] = js.codes.get(code, 0) + 1
        if code == 200:
            lat = time.perf_counter() - t0
            js.window_latencies.append(lat)
            js.latency_sum += lat

    async def handle(self, job: str, body: bytes) -> Response:
        js = self.jobs.get(job)
        if js is None:
            return Response(f'{{"detail": "unknown job {job!r}"}}', 404)
        t0 = time.perf_counter()
        deadline = t0 + self.spec.timeout_s
        js.window_arrivals += 1
        replica = js.pick(self.spec.concurrency)
        if replica is None:
            if js.queued >= self.spec.queue:
                self._done(js, 503, t0)
                return Response('{"detail": "queue full"}', 503)
            js.queued += 1
            try:
                async with js.cond:
                    while (replica := js.pick(self.spec.concurrency)) is None:
                        await asyncio.wait_for(js.cond.wait(), deadline - time.perf_counter())
            except TimeoutError:
                self._done(js, 504, t0)
                return Response('{"detail": "timed out in the queue"}', 504)
            finally:
                js.queued -= 1
        try:
            assert self.client is not None
            r = await self.client.post(replica.url + "/infer", content=body,
                                       headers={"content-type": "application/json"},
                                       timeout=max(deadline - time.perf_counter(), 0.001))
            code, content = r.status_code, r.content
        except httpx.TimeoutException:
            code, content = 504, b'{"detail": "replica timed out"}'
        except httpx.HTTPError as e:
            code, content = 502, f'{{"detail": "replica error: {type(e).__name__}"}}'.encode()
        finally:
            replica.inflight -= 1
            async with js.cond:
                js.cond.notify_all()
        self._done(js, code, t0)
        return Response(content, code, media_type="application/json")

    # --- control operations, run on the router's loop -------------------------------------

    async def add_replica(self, job: str, rid: str, url: str) -> None:
        js = self.jobs[job]
        js.replicas[rid] = _Replica(url)
        async with js.cond:
            js.cond.notify_all()

    async def drain_replica(self, job: str, rid: str, grace_s: float) -> None:
        """Stop sending to the replica, then wait (up to grace_s) for its requests to finish."""
        js = self.jobs[job]
        r = js.replicas[rid]
        r.draining = True
        end = time.perf_counter() + grace_s
        while r.inflight > 0 and time.perf_counter() < end:
            await asyncio.sleep(0.01)
        del js.replicas[rid]

    async def take_window(self) -> dict[str, Window]:
        out = {}
        for name, js in self.jobs.items():
            lat = js.window_latencies
            # A 503 or 504 in the window counts as a violation of any SLO.
            bad = js.codes.get(503, 0) + js.codes.get(504, 0) - self._bad_seen[name]
            p99 = float(np.percentile(lat, 99)) if lat else 0.0
            if bad > 0:
                p99 = max(p99, self.spec.timeout_s)
            out[name] = Window(js.window_arrivals, p99, js.queued + js.inflight,
                               sum(1 for r in js.replicas.values() if not r.draining))
            js.window_arrivals, js.window_latencies = 0, []
            self._bad_seen[name] = js.codes.get(503, 0) + js.codes.get(504, 0)
        return out

    def prometheus(self) -> str:
        lines = ["# TYPE plinth_serve_requests_total counter"]
        for name, js in self.jobs.items():
            for code, n in sorted(js.codes.items()):
                lines.append(f'plinth_serve_requests_total{{job="{name}",code="{code}"}} {n}')
        lines.append("# TYPE plinth_serve_replicas gauge")
        for name, js in self.jobs.items():
            ready = sum(1 for r in js.replicas.values() if not r.draining)
            lines.append(f'plinth_serve_replicas{{job="{name}"}} {ready}')
        lines.append("# TYPE plinth_serve_queued gauge")
        for name, js in self.jobs.items():
            lines.append(f'plinth_serve_queued{{job="{name}"}} {js.queued}')
        lines.append("# TYPE plinth_serve_inflight gauge")
        for name, js in self.jobs.items():
            lines.append(f'plinth_serve_inflight{{job="{name}"}} {js.inflight}')
        lines.append("# TYPE plinth_serve_latency_seconds_sum counter")
        for name, js in self.jobs.items():
            lines.append(f'plinth_serve_latency_seconds_sum{{job="{name}"}} {js.latency_sum:.6f}')
        return "\n".join(lines) + "\n"
