"""Network helpers shared by the shells that open sockets (serving, the CLI, tests)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping

from plinth.core.errors import PlinthError
from plinth.core.runtime import NODE_ADDRESS


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now, picked by the OS. Another process may take it
    before the caller binds it, so use it at once (or bind port 0 yourself where you can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise PlinthError(f"cannot listen on {host}: {e.strerror}{bind_hint(host)}") \
                from None
        return int(s.getsockname()[1])


def bind_hint(address: str) -> str:
    """What to say of an address a unit could not bind, when it is its node's address."""
    host = address.rsplit(":", 1)[0].strip("[]") if address.count(":") == 1 or \
        address.startswith("[") else address
    if host and host == os.environ.get(NODE_ADDRESS):
        return (f" ({NODE_ADDRESS}, the address the runtime gave this unit, is not one of "
                f"this node's: {socket.gethostname()})")
    return ""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports free on `host` now: all held at once while the OS picks them, so
    none is handed out twice (as `free_port` called `n` times may)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                 for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]


def node_address(env: Mapping[str, str] = os.environ) -> str:
    """The address of the node this process runs on, as the other nodes reach it: what the
    runtime gives each unit in PLINTH_NODE_ADDRESS, else loopback (a process run by hand)."""
    return env.get(NODE_ADDRESS) or "127.0.0.1"


def advertised(host: str, port: int, env: Mapping[str, str] = os.environ) -> str:
    """The HOST:PORT others dial for a socket bound to `host` and `port`: a wildcard host
    (every interface) is advertised as this node's address."""
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = node_address(env)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_port(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) -> (host, port); ValueError naming what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT with a port 1-65535, got {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)
