"""The router on loopback: replicas join with the service's secret (a wrong one is refused, so no
process can put itself in front of another tenant's traffic), leave, go silent, and a request
whose replica is gone goes to another one."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from plinth.core.net import free_port
from plinth.serve.router import Router, RouterServer
from plinth.serve.spec import RouterSpec


def backend(tag: str) -> RouterServer:
    """A real HTTP server standing in for a replica: answers /infer with its tag."""
    app = FastAPI()

    @app.post("/infer")
    async def infer() -> dict:
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
