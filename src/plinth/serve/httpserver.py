"""What a service's two processes, its router and its replicas, share to serve HTTP: a socket
bound before the server starts (so that a port in use is a one-line error), and uvicorn started
on it without its own signal handling (each process takes SIGTERM itself, to stop in its own
order and exit 0; uvicorn would also re-raise the signal and exit non-zero)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); port 0: one the OS picks."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it Nagle holds a response's body for the
    # client's delayed ACK of its headers, 40 ms on every keep-alive request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def start(config: uvicorn.Config, sock: socket.socket) -> tuple[Server, asyncio.Task]:
    """The server serving on `sock`, once it accepts connections, and the task that runs it."""
    server = Server(config)
    served = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if served.done():
            await served
            raise OSError("the HTTP server did not start")
        await asyncio.sleep(0.01)
    return server, served
