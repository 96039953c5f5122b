"""A service's router, run as its process (`python -m plinth.serve.router`) on loopback: it
listens on its node's address, replicas join with the service's secret (a wrong one is refused,
so no process can put itself in front of another tenant's traffic), leave, go silent, a request
whose replica is gone goes to another one, and it reports its address and counters to its
controller over HTTP as a unit does."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Header, Request, Response
from replica_process import ReplicaProcess

from plinth.core.errors import PlinthError
from plinth.core.runtime import NODE_ADDRESS
from plinth.runtime.report import TOKEN_ENV, URL_ENV
from plinth.serve.reports import RouterReport
from plinth.serve.spec import SECRET_ENV

NODE = "127.0.0.2"  # on Linux all of 127/8 is loopback: a node address that is not 127.0.0.1


@dataclass
class Served:
    """A real HTTP server on a thread of this process."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: FastAPI) -> Served:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return Served(f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread)


def backend(tag: str, busy_s: float = 0.0) -> Served:
    """A real HTTP server standing in for a replica: answers /infer with its tag, after
    `busy_s`, saying so in Server-Timing as a replica does."""
    app = FastAPI()

    @app.post("/infer")
    async def infer(response: Response) -> dict:
        await asyncio.sleep(busy_s)
        response.headers["server-timing"] = f"replica;dur={busy_s * 1000:.3f}"
        return {"replica": tag}

    return serve(app)


@dataclass
class Plane:
    """A real HTTP server standing in for the control plane's /v1/units/report."""

    reports: list[RouterReport] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/units/report", status_code=204)
        async def report(request: Request, authorization: str = Header("")) -> None:
            self.reports.append(RouterReport.model_validate(await request.json()))
            self.tokens.add(authorization)

        return app


@dataclass
class RouterUnder:
    proc: ReplicaProcess
    plane: Plane

    @property
    def url(self) -> str:
        return self.proc.url

    def join(self, unit: str, url: str, secret: str, leave: bool = False,
             service: str = "svc") -> int:
        path = f"{self.url}/_plinth/replicas/{service}" + ("/leave" if leave else "")
        return httpx.post(path, json={"unit": unit, "url": url},
                          headers={"Authorization": f"Bearer {secret}"}).status_code

    def infer(self, service: str = "svc") -> httpx.Response:
        return httpx.post(f"{self.url}/v1/{service}/infer", json={}, timeout=10)

    def report_after(self, check) -> RouterReport:
        """The first report that passes `check`, waiting for the next ones (every 50 ms)."""
        deadline = time.monotonic() + 30  # a bound on a hang, not a timing assert
        while True:
            seen = list(self.plane.reports)
            got = next((r for r in reversed(seen) if check(r)), None)
            if got is not None:
                return got
            assert time.monotonic() < deadline, seen[-1:]
            time.sleep(0.05)


def start_router(*args: str) -> Iterator[RouterUnder]:
    plane = Plane()
    api = serve(plane.app())
    env = {**os.environ, SECRET_ENV: "s3cret", NODE_ADDRESS: NODE,
           URL_ENV: f"{api.url}/v1/units/report", TOKEN_ENV: "unit-token"}
    proc = ReplicaProcess.start(["--service", "svc", "--slo-ms", "1000", "--report-s", "0.05",
                                 *args], env=env, module="plinth.serve.router", timeout_s=60)
    try:
        yield RouterUnder(proc, plane)
    finally:
        proc.close()
        api.stop()


@pytest.fixture
def router() -> Iterator[RouterUnder]:
    yield from start_router("--timeout-s", "1")


def test_it_listens_on_its_nodes_address_and_reports_it(router) -> None:
    assert router.url.startswith(f"http://{NODE}:")
    first = router.report_after(lambda r: True)
    assert first.url == router.url and first.arrivals == 0 and first.ready == 0
    assert router.plane.tokens == {"Bearer unit-token"}  # its unit's credential


def test_only_the_services_secret_joins_a_replica(router) -> None:
    good, evil = backend("good"), backend("evil")
    try:
        assert router.join("replica-0", evil.url, "guess") == 403
        assert httpx.post(f"{router.url}/_plinth/replicas/svc",  # no secret at all
                          json={"unit": "replica-0", "url": evil.url}).status_code == 403
        assert router.infer().status_code == 504  # none has joined
        assert router.join("replica-0", good.url, "s3cret") == 204
        assert {router.infer().json()["replica"] for _ in range(5)} == {"good"}
        # It routes its own service only: another name is unknown, to join or to ask.
        assert router.join("replica-0", evil.url, "s3cret", service="other") == 403
        assert router.infer("other").status_code == 404
    finally:
        good.stop()
        evil.stop()


def test_a_gone_replica_is_skipped_and_a_leaving_one_gets_nothing_new(router) -> None:
    a, b = backend("a"), backend("b")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    try:
        assert router.join("replica-0", dead, "s3cret") == 204
        assert router.join("replica-1", a.url, "s3cret") == 204
        got = [router.infer() for _ in range(6)]
        assert {r.status_code for r in got} == {200}
        assert {r.json()["replica"] for r in got} == {"a"}
        assert router.join("replica-2", b.url, "s3cret") == 204
        assert router.join("replica-1", a.url, "s3cret", leave=True) == 204
        assert {router.infer().json()["replica"] for _ in range(6)} == {"b"}
        # Its counters reach the controller: 12 answered, one replica live (b), none queued.
        r = router.report_after(lambda r: r.ok == 12)
        assert (r.arrivals, r.within_slo, r.rejected, r.ready, r.ongoing) == (12, 12, 0, 1, 0)
        assert 0 < r.p99_s < 1 and 0 < r.latency_s
    finally:
        closed.close()
        a.stop()
        b.stop()


def test_server_timing_splits_the_wait_for_a_replica_from_the_replicas_time() -> None:
    """With one request at a time per replica, the second of two sent together waits in the
    router for the first to end; each answer says how long it queued and what the replica
    took."""
    slow = backend("slow", busy_s=0.3)
    routers = start_router("--timeout-s", "5", "--concurrency", "1")
    r = next(routers)
    try:
        assert r.join("replica-0", slow.url, "s3cret") == 204
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda _: r.infer(), range(2)))
        timings = []
        for answer in got:
            assert answer.status_code == 200
            parts = dict(p.split(";dur=") for p in answer.headers["server-timing"].split(", "))
            timings.append({k: float(v) for k, v in parts.items()})
        assert all(t["replica"] == 300.0 for t in timings)
        first, second = sorted(timings, key=lambda t: t["queue"])
        assert second["queue"] >= 200 > first["queue"]  # it waited for the first one's 300 ms
    finally:
        routers.close()
        slow.stop()


def test_a_router_without_the_services_secret_refuses_to_start() -> None:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    with pytest.raises(PlinthError, match=SECRET_ENV):
        ReplicaProcess.start(["--service", "svc", "--slo-ms", "100"], env=env,
                             module="plinth.serve.router", timeout_s=60)
