"""A closed-loop load generator for a service: `clients` concurrent senders, each posting the
next request as soon as the last is answered, on a thread of its own. It counts answers by
status code; a connection error (the router is down) is counted under the error's name.

    with ClosedLoop(status["url"], body, clients=8) as load:   # the service's address
        ...
    load.codes  # {200: 5120, 503: 3}
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Self

import httpx
import numpy as np


class ClosedLoop:
    def __init__(self, url: str, body: bytes | str, *, clients: int = 8,
                 content_type: str = "application/json", timeout_s: float = 60.0) -> None:
        self.url, self.body, self.clients = url, body, clients
        self.headers = {"content-type": content_type}
        self.timeout_s = timeout_s
        self.codes: dict[int | str, int] = {}
        self.latencies_s: list[float] = []  # of the answers with 200
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()),
                                        name="plinth-load", daemon=True)

    async def _one(self, c: httpx.AsyncClient) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await c.post(self.url, content=self.body, headers=self.headers)
                key: int | str = r.status_code
                if key == 200:
                    self.latencies_s.append(time.perf_counter() - t0)
            except httpx.TransportError as e:
                key = type(e).__name__
                await asyncio.sleep(0.05)
            self.codes[key] = self.codes.get(key, 0) + 1

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as c:
            await asyncio.gather(*(self._one(c) for _ in range(self.clients)))

    def p99_ms(self) -> float:
        return float(np.percentile(self.latencies_s, 99) * 1000) if self.latencies_s else 0.0

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
