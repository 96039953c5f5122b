"""Transports move encoded messages between the server and clients.

A transport offers the server four things: the clients it can reach (`clients`), a way to wait
until enough have joined (`wait_for`), a way to send one request and get a future reply
(`submit`), and `close`. Payloads are the bytes made by `plinth.fl.serde`, whatever the transport.

A transport that receives replies off a network writes each one into `landing(total)` when the
server sets it for a round (the accumulator's buffer: the aggregator tree's shared memory), so
the reply is never copied on its way to the fold; the others deliver whole bytes and ignore it.
Such a transport also refuses a reply that announces more than `max_reply` bytes before it
allocates anything for it; the server sets it from its model's size (`reply_limit`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from plinth.fl import serde
from plinth.fl.messages import ClientInfo

# The most a reply carries per parameter of the model: a top-k codec sends a uint32 index and
# the value (12 bytes for a float64 model), SecAgg a uint32 ring element, a middle a float64 mean.
REPLY_BYTES_PER_PARAM = 16


def reply_limit(parameters: Any) -> int:
    """The largest reply a client may send to a task on a model of `parameters` (arrays): each
    parameter at its widest encoding, the arrays' alignment, and the largest message header."""
    arrays = list(parameters)
    n = sum(int(getattr(a, "size", 0)) for a in arrays)
    return REPLY_BYTES_PER_PARAM * n + serde.ALIGN * (4 * len(arrays) + 64) + serde.MAX_HEADER


class Transport(Protocol):
    landing: Callable[[int], Any] | None
    max_reply: int | None

    def clients(self) -> list[ClientInfo]: ...

    def wait_for(self, n: int, timeout: float) -> bool: ...

    def submit(self, cid: str, payload: bytes | bytearray) -> Future: ...

    def close(self) -> None: ...
