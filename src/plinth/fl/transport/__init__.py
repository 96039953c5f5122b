"""Transports move encoded messages between the server and clients.

A transport offers the server four things: the clients it can reach (`clients`), a way to wait
until enough have joined (`wait_for`), a way to send one request and get a future reply
(`submit`), and `close`. Payloads are the bytes made by `plinth.fl.serde`, whatever the transport.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from plinth.fl.messages import ClientInfo


class Transport(Protocol):
    def clients(self) -> list[ClientInfo]: ...

    def wait_for(self, n: int, timeout: float) -> bool: ...

    def submit(self, cid: str, payload: bytes | bytearray) -> Future: ...

    def close(self) -> None: ...
