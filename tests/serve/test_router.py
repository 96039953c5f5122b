"""The router on loopback: replicas join with the service's secret (a wrong one is refused, so no
process can put itself in front of another tenant's traffic), leave, go silent, and a request
whose replica is gone goes to another one."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi import FastAPI, Response

from plinth.core.net import free_port
from plinth.serve.router import Router, RouterServer
from plinth.serve.spec import RouterSpec


def backend(tag: str, busy_s: float = 0.0) -> RouterServer:
    """A real HTTP server standing in for a replica: answers /infer with its tag, after
    `busy_s`, saying so in Server-Timing as a replica does."""
    app = FastAPI()

    @app.post("/infer")
    async def infer(response: Response) -> dict:
        await asyncio.sleep(busy_s)
        response.headers["server-timing"] = f"replica;dur={busy_s * 1000:.3f}"
        return {"replica": tag}

    class _Holder(Router):  # RouterServer serves any Router's `app`; give it this one
        def _make_app(self) -> FastAPI:
            return app

    server = RouterServer(_Holder(RouterSpec()), "127.0.0.1", free_port())
    server.start()
    return server


@pytest.fixture
def router():
    r = RouterServer(Router(RouterSpec(timeout_s=1)), "127.0.0.1", free_port())
    r.start()
    r.call(r.router.add_service("svc", "s3cret"))
    yield r
    r.stop()


def join(r: RouterServer, unit: str, url: str, secret: str, leave: bool = False) -> int:
    path = f"{r.url}/_plinth/replicas/svc" + ("/leave" if leave else "")
    return httpx.post(path, json={"unit": unit, "url": url},
                      headers={"Authorization": f"Bearer {secret}"}).status_code


def test_only_the_services_secret_joins_a_replica(router) -> None:
    good, evil = backend("good"), backend("evil")
    try:
        assert join(router, "replica-0", evil.url, "guess") == 403
        assert httpx.post(f"{router.url}/_plinth/replicas/svc",  # no secret at all
                          json={"unit": "replica-0", "url": evil.url}).status_code == 403
        assert httpx.post(f"{router.url}/v1/svc/infer", json={}).status_code == 504  # none
        assert join(router, "replica-0", good.url, "s3cret") == 204
        answers = {httpx.post(f"{router.url}/v1/svc/infer", json={}).json()["replica"]
                   for _ in range(5)}
        assert answers == {"good"}
        # A secret of one service does not join another's.
        router.call(router.router.add_service("other", "0ther"))
        assert httpx.post(f"{router.url}/_plinth/replicas/other",
                          json={"unit": "replica-0", "url": evil.url},
                          headers={"Authorization": "Bearer s3cret"}).status_code == 403
    finally:
        good.stop()
        evil.stop()


def test_a_gone_replica_is_skipped_and_a_leaving_one_gets_nothing_new(router) -> None:
    a, b = backend("a"), backend("b")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused
    try:
        assert join(router, "replica-0", dead, "s3cret") == 204
        assert join(router, "replica-1", a.url, "s3cret") == 204
        got = [httpx.post(f"{router.url}/v1/svc/infer", json={}) for _ in range(6)]
        assert {r.status_code for r in got} == {200}
        assert {r.json()["replica"] for r in got} == {"a"}
        assert join(router, "replica-2", b.url, "s3cret") == 204
        assert join(router, "replica-1", a.url, "s3cret", leave=True) == 204
        got = {httpx.post(f"{router.url}/v1/svc/infer", json={}).json()["replica"]
               for _ in range(6)}
        assert got == {"b"}
        window = router.call(router.router.take_window({"svc": 1.0}))["svc"]
        assert window.arrivals == 12 and window.ok == 12 and window.ready == 1
    finally:
        a.stop()
        b.stop()


def test_server_timing_splits_the_wait_for_a_replica_from_the_replicas_time() -> None:
    """With one request at a time per replica, the second of two sent together waits in the
    router for the first to end; each answer says how long it queued and what the replica
    took."""
    r = RouterServer(Router(RouterSpec(timeout_s=5, concurrency=1)), "127.0.0.1", free_port())
    r.start()
    slow = backend("slow", busy_s=0.3)
    try:
        r.call(r.router.add_service("svc", "s3cret"))
        assert join(r, "replica-0", slow.url, "s3cret") == 204
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda _: httpx.post(f"{r.url}/v1/svc/infer", json={},
                                                     timeout=10), range(2)))
        timings = []
        for answer in got:
            assert answer.status_code == 200
            parts = dict(p.split(";dur=") for p in answer.headers["server-timing"].split(", "))
            timings.append({k: float(v) for k, v in parts.items()})
        assert all(t["replica"] == 300.0 for t in timings)
        first, second = sorted(timings, key=lambda t: t["queue"])
        assert second["queue"] >= 200 > first["queue"]  # it waited for the first one's 300 ms
    finally:
        slow.stop()
        r.stop()
