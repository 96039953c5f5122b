"""Transports move encoded messages between the server and clients.

A transport offers the server four things: the clients it can reach (`clients`), a way to wait
until enough have joined (`wait_for`), a way to send one request and get a future reply
(`submit`), and `close`. Payloads are the bytes made by `plinth.fl.serde`, whatever the transport.

A transport that receives replies off a network writes each one into `landing(total)` when the
server sets it for a round (the accumulator's buffer: the aggregator tree's shared memory), so
the reply is never copied on its way to the fold; the others deliver whole bytes and ignore it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from plinth.fl.messages import ClientInfo


class Transport(Protocol):
    landing: Callable[[int], Any] | None

    def clients(self) -> list[ClientInfo]: ...

    def wait_for(self, n: int, timeout: float) -> bool: ...

    def submit(self, cid: str, payload: bytes | bytearray) -> Future: ...

    def close(self) -> None: ...
