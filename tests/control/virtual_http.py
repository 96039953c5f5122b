"""A control plane in virtual time (virtual.py) served over real HTTP on 127.0.0.1, for what
talks to the API as a process of its own would: the `plinth` CLI in a subprocess, `plinth
export`, a fuzzer reading /openapi.json.

    with VirtualPlatform(tmp_path) as vp, served(vp) as api:
        r = run_cli(api, "ls", "-a")       # plinth_platform.run_cli: api.url and api.token

uvicorn serves the platform's app on a thread of its own, from a socket bound before it
starts, so a request sent at once waits in the socket's backlog rather than failing. The app is
looked up at each request, so a `vp.restart()` is served too. Time still moves only when the
test moves it: a command that waits for a job to end (`submit --wait`, `logs -f`) would wait
for ever, so those run against a real `plinth up`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn
from virtual import VirtualPlatform

from plinth.client import Client


class Served:
    """The platform's address and admin token, as a real platform's (`url`, `token`,
    `client()`)."""

    def __init__(self, vp: VirtualPlatform, port: int) -> None:
        self.vp, self.port = vp, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return self.vp.token

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.token)


@contextlib.contextmanager
def served(vp: VirtualPlatform) -> Iterator[Served]:
    async def app(scope, receive, send) -> None:  # the platform's app now, after a restart too
        await vp.app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="virtual-http", daemon=True)
    thread.start()
    try:
        yield Served(vp, sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
