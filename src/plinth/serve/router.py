"""A service's router: its replicas' one address, run as a unit of the service (`router`) that
the scheduler places like any unit, with bounded queues, 503 on overflow, request timeouts, and
replicas that join and leave as they start and stop.

    PLINTH_REPLICA_SECRET=... python -m plinth.serve.router --service NAME --slo-ms 100 \\
        [--queue 50] [--concurrency 4] [--timeout-s 10] [--window-s 10] [--report-s 1] \\
        [--host ADDRESS] [--port 0]

It listens on its node's address (PLINTH_NODE_ADDRESS, which the runtime gives every unit; else
127.0.0.1), on a port the OS picks unless --port names one, and prints ``ready http://HOST:PORT``.
POST /v1/NAME/infer is sent to the replica with the fewest requests in flight, never more than
`concurrency` per replica. When every replica is full the request waits in the queue; when the
queue holds `queue` requests already, the answer is 503 at once, and a request that waits longer
than `timeout_s` in all gets 504. A request whose replica turns out to be gone (connection
refused or reset: it died, or is stopping) is sent to another, so replica churn loses nothing
but explicit 503s and 504s. GET /metrics gives the counters in Prometheus text format.

Replicas join by themselves: once a replica serves, it posts its address to
/_plinth/replicas/NAME with the service's secret, and again every second (a heartbeat). One not
heard from for `HEARTBEAT_TIMEOUT_S` is no longer sent requests; one that stops posts /leave
first.

Nothing on the request path goes through the control plane. The router tells its controller
where it listens and what it has seen (`plinth.serve.reports.RouterReport`) every `report_s`,
over the control plane's API with its unit's credential (`plinth.runtime.report`); while the
control plane is down or restarting, requests go on being answered and the reports wait.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import numpy as np
import uvicorn
from fastapi import FastAPI, Header, Request, Response
from pydantic import BaseModel, Field

from plinth.core.runtime import NODE_ADDRESS
from plinth.runtime.report import Reporter
from plinth.serve import httpserver
from plinth.serve.reports import RouterReport
from plinth.serve.spec import SECRET_ENV, RouterSpec

HEARTBEAT_TIMEOUT_S = 15.0  # a safety net: a dead replica is found sooner (refused)


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
class _Counts:
    """What the router has seen since it started (the counters of its reports)."""

    arrivals: int = 0
    ok: int = 0
    within_slo: int = 0
    latency_s: float = 0.0
    codes: dict[int, int] = field(default_factory=dict)


class Join(BaseModel):
    unit: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str = Field(pattern=r"^https?://[^\s/]+$", max_length=200)
    service_ms: float | None = Field(None, gt=0)


class Router:
    """One service's router. All its state lives on its event loop."""

    def __init__(self, service: str, secret: str, spec: RouterSpec, *, slo_s: float,
                 window_s: float = 10.0) -> None:
        self.service, self.secret, self.spec = service, secret, spec
        self.slo_s, self.window_s = slo_s, window_s
        self.replicas: dict[str, _Replica] = {}  # by unit name
        self.queued = 0
        self.counts = _Counts()
        self.recent: deque[tuple[float, float]] = deque()  # (when, latency) of recent 200s
        self.cond: asyncio.Condition | None = None
        self.client: aiohttp.ClientSession | None = None
        self.app = self._make_app()

    def _make_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            self.cond = asyncio.Condition()
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
            if service != self.service:
                return Response(f'{{"detail": "unknown service {service!r}"}}', 404)
            kind = request.headers.get("content-type", "application/json")
            return await self.handle(await request.body(), kind)

        @app.post("/_plinth/replicas/{service}", status_code=204)
        async def join(service: str, body: Join, authorization: str = Header("")) -> Response:
            if not self._authorised(service, authorization):
                return Response('{"detail": "unknown service or wrong secret"}', 403)
            r = self.replicas.get(body.unit)
            if r is None or r.url != body.url:  # new, or a replacement at a new address
                self.replicas[body.unit] = _Replica(body.url, time.monotonic(), body.service_ms)
                await self._wake()
            else:
                r.seen, r.service_ms = time.monotonic(), body.service_ms or r.service_ms
            return Response(status_code=204)

        @app.post("/_plinth/replicas/{service}/leave", status_code=204)
        async def leave(service: str, body: Join, authorization: str = Header("")) -> Response:
            if not self._authorised(service, authorization):
                return Response('{"detail": "unknown service or wrong secret"}', 403)
            r = self.replicas.get(body.unit)
            if r is not None and r.url == body.url:
                r.draining = True  # in flight ones finish; the replica waits for them
            return Response(status_code=204)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.prometheus(), media_type="text/plain; version=0.0.4")

        return app

    def _authorised(self, service: str, authorization: str) -> bool:
        given = authorization.removeprefix("Bearer ").encode()
        return service == self.service and hmac.compare_digest(given, self.secret.encode())

    async def _wake(self) -> None:
        assert self.cond is not None
        async with self.cond:
            self.cond.notify_all()

    def _pick(self) -> _Replica | None:
        best, now = None, time.monotonic()
        for r in self.replicas.values():
            if r.inflight < self.spec.concurrency and r.live(now) and (
                    best is None or r.inflight < best.inflight):
                best = r
        if best is not None:
            best.inflight += 1
        return best

    @property
    def inflight(self) -> int:
        return sum(r.inflight for r in self.replicas.values())

    def ready(self) -> int:
        now = time.monotonic()
        return sum(1 for r in self.replicas.values() if r.live(now))

    def _done(self, code: int, t0: float) -> None:
        c = self.counts
        c.codes[code] = c.codes.get(code, 0) + 1
        if code == 200:
            now = time.perf_counter()
            lat = now - t0
            c.ok += 1
            c.latency_s += lat
            c.within_slo += lat <= self.slo_s
            self.recent.append((now, lat))

    async def _replica(self, deadline: float) -> _Replica | int:
        """A replica with room, waiting in the queue for one; or the status code to answer."""
        picked = self._pick()
        if picked is not None:
            return picked
        if self.queued >= self.spec.queue:
            return 503
        assert self.cond is not None
        self.queued += 1
        try:
            async with self.cond:
                while (picked := self._pick()) is None:
                    # Woken when a request ends or a replica joins; at least once a second,
                    # so that a replica whose heartbeat resumed is found again.
                    wait = min(deadline - time.perf_counter(), 1.0)
                    if wait <= 0:
                        return 504
                    try:
                        await asyncio.wait_for(self.cond.wait(), wait)
                    except TimeoutError:
                        pass
            return picked
        finally:
            self.queued -= 1

    async def handle(self, body: bytes, content_type: str = "application/json") -> Response:
        t0 = time.perf_counter()
        deadline = t0 + self.spec.timeout_s
        self.counts.arrivals += 1
        queued = 0.0  # time waiting for a replica with room
        while True:
            tq = time.perf_counter()
            replica = await self._replica(deadline)
            queued += time.perf_counter() - tq
            if isinstance(replica, int):
                self._done(replica, t0)
                detail = "queue full" if replica == 503 else "timed out in the queue"
                return Response(f'{{"detail": "{detail}"}}', replica)
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
                await self._wake()
            self._done(code, t0)
            # Server-Timing: its wait here for a replica, then the replica's own time, so that a
            # client can tell the hops' cost from the queueing and the model.
            timing = f"queue;dur={queued * 1000:.3f}" + (f", {timing}" if timing else "")
            return Response(content, code, media_type=kind or "application/json",
                            headers={"server-timing": timing})

    def report(self, url: str) -> RouterReport:
        """Its counters since it started, and the p99 of the 200s of the last `window_s`."""
        now, mono = time.perf_counter(), time.monotonic()
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()
        for unit in [u for u, r in self.replicas.items()
                     if mono - r.seen > 10 * HEARTBEAT_TIMEOUT_S and not r.inflight]:
            del self.replicas[unit]  # silent for long: gone
        c = self.counts
        lat = [x for _, x in self.recent]
        times = [r.service_ms for r in self.replicas.values() if r.service_ms]
        return RouterReport(
            url=url, arrivals=c.arrivals, ok=c.ok, within_slo=c.within_slo,
            rejected=c.codes.get(503, 0) + c.codes.get(504, 0), latency_s=c.latency_s,
            p99_s=float(np.percentile(lat, 99)) if lat else 0.0,
            ongoing=self.queued + self.inflight, ready=self.ready(),
            service_ms=sum(times) / len(times) if times else None)

    def prometheus(self) -> str:
        name = self.service
        lines = ["# TYPE plinth_serve_requests_total counter"]
        for code, n in sorted(self.counts.codes.items()):
            lines.append(f'plinth_serve_requests_total{{service="{name}",code="{code}"}} {n}')
        for metric, kind, value in (
                ("replicas", "gauge", self.ready()),
                ("queued", "gauge", self.queued),
                ("inflight", "gauge", self.inflight),
                ("latency_seconds_sum", "counter", f"{self.counts.latency_s:.6f}")):
            lines.append(f"# TYPE plinth_serve_{metric} {kind}")
            lines.append(f'plinth_serve_{metric}{{service="{name}"}} {value}')
        return "\n".join(lines) + "\n"


# --- the process --------------------------------------------------------------------------------


async def serve(router: Router, sock: socket.socket, url: str, report_s: float,
                reporter: Reporter | None) -> None:
    # Keep-alive longer than a client's pool keeps idle connections, so that the router does
    # not close one just as a client sends on it (the client would see a reset).
    server, served = await httpserver.start(uvicorn.Config(
        router.app, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=75,
        timeout_graceful_shutdown=router.spec.timeout_s), sock)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    print(f"ready {url}", flush=True)
    while not served.done():
        if reporter is not None:
            reporter.send(router.report(url).model_dump())
        await asyncio.wait([served], timeout=report_s)
    await served


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m plinth.serve.router",
                                 description="one plinth service's router")
    ap.add_argument("--service", required=True, help="the service's name (/v1/NAME/infer)")
    ap.add_argument("--slo-ms", type=float, required=True)
    d = RouterSpec()
    ap.add_argument("--queue", type=int, default=d.queue)
    ap.add_argument("--concurrency", type=int, default=d.concurrency)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s)
    ap.add_argument("--window-s", type=float, default=10.0, help="the p99's window")
    ap.add_argument("--report-s", type=float, default=1.0)
    ap.add_argument("--host", default=None, help=f"default: ${NODE_ADDRESS}, else 127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    args = ap.parse_args(argv)
    for name in ("slo_ms", "timeout_s", "window_s", "report_s"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name):g}")
    if not os.environ.get(SECRET_ENV):
        ap.error(f"{SECRET_ENV} must be set: replicas join with it")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = RouterSpec(queue=args.queue, concurrency=args.concurrency,
                          timeout_s=args.timeout_s)
    except ValueError as e:
        print(f"router: {e}", file=sys.stderr, flush=True)
        return 2
    host = args.host or os.environ.get(NODE_ADDRESS) or "127.0.0.1"
    try:
        sock = httpserver.listen(host, args.port)
    except OSError as e:
        print(f"router: cannot listen on {host}:{args.port}: {e.strerror or e}",
              file=sys.stderr, flush=True)
        return 2
    port = sock.getsockname()[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    router = Router(args.service, os.environ[SECRET_ENV], spec, slo_s=args.slo_ms / 1000,
                    window_s=args.window_s)
    reporter = Reporter.from_env()  # on the platform: tell the controller where it listens
    try:
        asyncio.run(serve(router, sock, url, args.report_s, reporter))
    finally:
        if reporter is not None:
            reporter.close(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
