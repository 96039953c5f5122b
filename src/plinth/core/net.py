"""Network helpers shared by the shells that open sockets (serving, the CLI, tests)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now, picked by the OS. Another process may take it
    before the caller binds it, so use it at once (or bind port 0 yourself where you can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
