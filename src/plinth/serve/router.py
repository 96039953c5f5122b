"""The HTTP router in front of every service's replicas: bounded queues, 503 on overflow, request
timeouts, and replicas that join and leave as they start and stop.

POST /v1/{service}/infer is sent to the service's replica with the fewest requests in flight,
never more than `concurrency` per replica. When every replica is full the request waits in the
service's queue; when the queue holds `queue` requests already, the answer is 503 at once, and a
request that waits longer than `timeout_s` in all gets 504. A request whose replica turns out
to be gone (connection refused or reset: it died, or is stopping) is sent to another, so replica
churn loses nothing but explicit 503s and 504s. GET /metrics gives the counters in Prometheus
text format.

Replicas join by themselves: once a replica serves, it posts its address to
/_plinth/replicas/{service} with the service's secret, and again every second (a heartbeat). One
not heard from for `HEARTBEAT_TIMEOUT_S` is no longer sent requests; one that stops posts
/leave first. So after a restart of the control plane the router learns its replicas again
within a second, without asking anyone.

All router state lives on its event loop. The control plane changes it only through the
coroutines `add_service`, `remove_service`, `remove_unit` and `take_window`, run on that loop
by `RouterServer.call`.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import numpy as np
import uvicorn
from fastapi import FastAPI, Header, Request, Response
from pydantic import BaseModel, Field

from plinth.core.errors import PlinthError
from plinth.serve.spec import RouterSpec

T = TypeVar("T")
HEARTBEAT_TIMEOUT_S = 15.0  # a safety net: a dead replica is found sooner (refused, or its job ended)


@dataclass(slots=True)
class _Replica:
    url: str
    seen: float  # monotonic time of the last heartbeat
    service_ms: float | None = None  # the replica's measured single-request time
    inflight: int = 0
    draining: bool = False

    def live(self, now: float) -> bool:
        return not self.draining and now - self.seen < HEARTBEAT_TIMEOUT_S


@dataclass(slots=True)
class _Service:
    secret: str
    replicas: dict[str, _Replica] = field(default_factory=dict)  # by unit name
    queued: int = 0
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    window_arrivals: int = 0
    window_latencies: list[float] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)
    bad_seen: int = 0  # 503s and 504s already reported
    latency_sum: float = 0.0

    def pick(self, concurrency: int) -> tuple[str, _Replica] | None:
        best, now = None, time.monotonic()
        for unit, r in self.replicas.items():
            if r.inflight < concurrency and r.live(now) and (best is None
                                                              or r.inflight < best[1].inflight):
                best = unit, r
        if best is not None:
            best[1].inflight += 1
        return best

    @property
    def inflight(self) -> int:
        return sum(r.inflight for r in self.replicas.values())

    def ready(self) -> int:
        now = time.monotonic()
        return sum(1 for r in self.replicas.values() if r.live(now))


@dataclass(frozen=True, slots=True)
class Window:
    """What happened to one service since the last `take_window`."""

    arrivals: int
    p99_s: float
    ongoing: int
    ready: int
    ok: int = 0  # answered 200 in the window
    within_slo: int = 0  # of those, within the SLO given to take_window
    service_ms: float | None = None  # the mean of its replicas' measured times
    mean_s: float = 0.0  # mean latency of the requests answered in the window


class Join(BaseModel):
    unit: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str = Field(pattern=r"^https?://[^\s/]+$", max_length=200)
    service_ms: float | None = Field(None, gt=0)


class Router:
    def __init__(self, spec: RouterSpec) -> None:
        self.spec = spec
        self.services: dict[str, _Service] = {}
        self.client: aiohttp.ClientSession | None = None
        self.app = self._make_app()

    def _make_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            # aiohttp, not httpx, to the replicas: one router process forwards over three times
            # as many requests a second with it (bench: 149 against 44 on a loaded 2-core box).
            self.client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                auto_decompress=False)
            yield
            await self.client.close()

        app = FastAPI(title="plinth router", lifespan=lifespan)

        @app.post("/v1/{service}/infer")
        async def infer(service: str, request: Request) -> Response:
            kind = request.headers.get("content-type", "application/json")
            return await self.handle(service, await request.body(), kind)

        @app.post("/_plinth/replicas/{service}", status_code=204)
        async def join(service: str, body: Join,
                       authorization: str = Header("")) -> Response:
            s = self._authorised(service, authorization)
            if s is None:
                return Response('{"detail": "unknown service or wrong secret"}', 403)
            r = s.replicas.get(body.unit)
            if r is None or r.url != body.url:  # new, or a replacement at a new address
                s.replicas[body.unit] = _Replica(body.url, time.monotonic(), body.service_ms)
                async with s.cond:
                    s.cond.notify_all()
            else:
                r.seen, r.service_ms = time.monotonic(), body.service_ms or r.service_ms
            return Response(status_code=204)

        @app.post("/_plinth/replicas/{service}/leave", status_code=204)
        async def leave(service: str, body: Join, authorization: str = Header("")) -> Response:
            s = self._authorised(service, authorization)
            if s is None:
                return Response('{"detail": "unknown service or wrong secret"}', 403)
            r = s.replicas.get(body.unit)
            if r is not None and r.url == body.url:
                r.draining = True  # in flight ones finish; the replica waits for them
            return Response(status_code=204)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.prometheus(), media_type="text/plain; version=0.0.4")

        return app

    def _authorised(self, service: str, authorization: str) -> _Service | None:
        s = self.services.get(service)
        given = authorization.removeprefix("Bearer ").encode()
        if s is None or not hmac.compare_digest(given, s.secret.encode()):
            return None
        return s

    def _done(self, s: _Service, code: int, t0: float) -> None:
        s.codes[code] = s.codes.get(code, 0) + 1
        if code == 200:
            lat = time.perf_counter() - t0
            s.window_latencies.append(lat)
            s.latency_sum += lat

    async def _replica(self, s: _Service, deadline: float) -> tuple[str, _Replica] | int:
        """A replica with room, waiting in the queue for one; or the status code to answer."""
        picked = s.pick(self.spec.concurrency)
        if picked is not None:
            return picked
        if s.queued >= self.spec.queue:
            return 503
        s.queued += 1
        try:
            async with s.cond:
                while (picked := s.pick(self.spec.concurrency)) is None:
                    # Woken when a request ends or a replica joins; at least once a second,
                    # so that a replica whose heartbeat resumed is found again.
                    wait = min(deadline - time.perf_counter(), 1.0)
                    if wait <= 0:
                        return 504
                    try:
                        await asyncio.wait_for(s.cond.wait(), wait)
                    except TimeoutError:
                        pass
            return picked
        finally:
            s.queued -= 1

    async def handle(self, service: str, body: bytes,
                     content_type: str = "application/json") -> Response:
        s = self.services.get(service)
        if s is None:
            return Response(f'{{"detail": "unknown service {service!r}"}}', 404)
        t0 = time.perf_counter()
        deadline = t0 + self.spec.timeout_s
        s.window_arrivals += 1
        queued = 0.0  # time waiting for a replica with room
        while True:
            tq = time.perf_counter()
            got = await self._replica(s, deadline)
            queued += time.perf_counter() - tq
            if isinstance(got, int):
                self._done(s, got, t0)
                detail = "queue full" if got == 503 else "timed out in the queue"
                return Response(f'{{"detail": "{detail}"}}', got)
            _, replica = got
            timing = None
            try:
                assert self.client is not None
                left = max(deadline - time.perf_counter(), 0.001)
                async with self.client.post(replica.url + "/infer", data=body,
                                            headers={"content-type": content_type},
                                            timeout=aiohttp.ClientTimeout(total=left)) as r:
                    content = await r.read()
                    code, kind = r.status, r.headers.get("content-type")
                    timing = r.headers.get("server-timing")
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                if isinstance(e, aiohttp.ServerTimeoutError):
                    code, content, kind = 504, b'{"detail": "replica timed out"}', None
                else:
                    # Refused or reset before it answered: it died or is stopping. Inference
                    # is idempotent, so another replica takes the request.
                    replica.draining = True
                    continue
            except TimeoutError:
                code, content, kind = 504, b'{"detail": "replica timed out"}', None
            except aiohttp.ClientError as e:
                code, kind = 502, None
                content = f'{{"detail": "replica error: {type(e).__name__}"}}'.encode()
            finally:
                replica.inflight -= 1
                async with s.cond:
                    s.cond.notify_all()
            self._done(s, code, t0)
            # Server-Timing: its wait here for a replica, then the replica's own time, so that a
            # client can tell the hops' cost from the queueing and the model.
            timing = f"queue;dur={queued * 1000:.3f}" + (f", {timing}" if timing else "")
            return Response(content, code, media_type=kind or "application/json",
                            headers={"server-timing": timing})

    # --- control operations, run on the router's loop -------------------------------------

    async def add_service(self, name: str, secret: str) -> None:
        if name not in self.services:
            self.services[name] = _Service(secret)

    async def remove_service(self, name: str) -> None:
        self.services.pop(name, None)

    async def remove_unit(self, name: str, unit: str) -> None:
        """The unit's job has ended: forget its replica at once (its heartbeat has stopped)."""
        s = self.services.get(name)
        if s is not None:
            s.replicas.pop(unit, None)

    async def take_window(self, slo_s: dict[str, float] | None = None) -> dict[str, Window]:
        out = {}
        now = time.monotonic()
        for name, s in self.services.items():
            for unit in [u for u, r in s.replicas.items()
                         if now - r.seen > 10 * HEARTBEAT_TIMEOUT_S and not r.inflight]:
                del s.replicas[unit]  # silent for long: gone
            lat = s.window_latencies
            # A 503 or 504 in the window counts as a violation of any SLO.
            bad_total = s.codes.get(503, 0) + s.codes.get(504, 0)
            bad, s.bad_seen = bad_total - s.bad_seen, bad_total
            p99 = float(np.percentile(lat, 99)) if lat else 0.0
            if bad > 0:
                p99 = max(p99, self.spec.timeout_s)
            slo = (slo_s or {}).get(name, float("inf"))
            times = [r.service_ms for r in s.replicas.values() if r.service_ms]
            out[name] = Window(s.window_arrivals, p99, s.queued + s.inflight, s.ready(),
                               len(lat), sum(1 for x in lat if x <= slo),
                               sum(times) / len(times) if times else None,
                               float(np.mean(lat)) if lat else 0.0)
            s.window_arrivals, s.window_latencies = 0, []
        return out

    def prometheus(self) -> str:
        lines = ["# TYPE plinth_serve_requests_total counter"]
        for name, s in self.services.items():
            for code, n in sorted(s.codes.items()):
                lines.append(f'plinth_serve_requests_total{{service="{name}",code="{code}"}} {n}')
        for metric, kind, value in (
                ("replicas", "gauge", lambda s: s.ready()),
                ("queued", "gauge", lambda s: s.queued),
                ("inflight", "gauge", lambda s: s.inflight),
                ("latency_seconds_sum", "counter", lambda s: f"{s.latency_sum:.6f}")):
            lines.append(f"# TYPE plinth_serve_{metric} {kind}")
            lines += [f'plinth_serve_{metric}{{service="{name}"}} {value(s)}'
                      for name, s in self.services.items()]
        return "\n".join(lines) + "\n"


class RouterServer:
    """The router served by uvicorn on its own thread and event loop, on a fixed address (so
    that a service's address stays the same across control plane restarts)."""

    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router, self.host, self.port = router, host, port
        # Keep-alive longer than a client's pool keeps idle connections, so that the router
        # does not close one just as a client sends on it (the client would see a reset).
        self._server = uvicorn.Server(uvicorn.Config(router.app, host=host, port=port,
                                                     log_level="warning", lifespan="on",
                                                     timeout_keep_alive=75))
        self._thread = threading.Thread(target=self._server.run, name="plinth-router",
                                        daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        end = time.monotonic() + 30.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                raise PlinthError(f"--serve-port: the router could not listen on "
                                  f"{self.host}:{self.port}")
            time.sleep(0.01)
        # uvicorn runs the server with asyncio.run in our thread; its sockets know that loop.
        self._loop = self._server.servers[0].get_loop()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        assert self._loop is not None, "the router is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
