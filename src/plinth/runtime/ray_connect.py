"""Joining a Ray cluster, with one-line errors for what a user can get wrong: an address that
is not HOST:PORT, a head that does not answer, and a driver whose Ray or Python version differs
from the cluster's.

Ray is imported only when `connect_ray` is called: a loopback address must set Ray's switch
before Ray is first imported.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket

from plinth.core.errors import PlinthError

NAMESPACE = "plinth"
_CONNECTED_BY_US = [False]  # whether this process's Ray connection was made by connect_ray
# Ray's own check (ray._private.utils.check_version_info) raises a RuntimeError of a page:
# "Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n
# This process on node ... was started with:\n    Ray: ...\n    Python: ...".
_VERSIONS = re.compile(r"Ray: (\S+)\s+Python: (\S+)")


def connect_ray(address: str, namespace: str):
    """Ray, connected to the cluster at `address` (HOST:PORT or auto); one-line errors."""
    host = address.rsplit(":", 1)[0] if address != "auto" else ""
    if host and _is_loopback(host):
        # Ray turns a loopback address into this machine's outside address before it connects,
        # where a cluster bound to 127.0.0.1 does not listen; this (documented) switch keeps it.
        # It is read when Ray is first imported.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
        import ray.util.scheduling_strategies
    except ImportError:
        raise PlinthError("--runtime ray: Ray is not installed; pip install 'ray[default]'") \
            from None
    if ray.is_initialized():
        return ray
    if host and _is_loopback(host) and ray._private.ray_constants.ENABLE_RAY_CLUSTER:
        raise PlinthError(f"--ray-address {address}: Ray was imported before the loopback "
                          "switch was set; set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 first")
    if address != "auto":
        _probe(address)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False,
                 logging_level=logging.WARNING, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        why = version_mismatch(e) or f"cannot join the Ray cluster: {one_line(e)}"
        raise PlinthError(f"--ray-address {address}: {why}") from None
    _CONNECTED_BY_US[0] = True
    return ray


def disconnect_ray(ray) -> None:
    """Leave the Ray cluster if `connect_ray` joined it (not a connection this process had)."""
    if _CONNECTED_BY_US[0]:
        ray.shutdown()
        _CONNECTED_BY_US[0] = False


def version_mismatch(e: BaseException) -> str | None:
    """Ray's version-mismatch error in one line naming both sides' versions; None for any
    other error."""
    text = str(e)
    found = _VERSIONS.findall(text)
    if not text.startswith("Version mismatch") or len(found) != 2:
        return None
    (ray_c, py_c), (ray_d, py_d) = found
    return (f"version mismatch: the Ray cluster runs Ray {ray_c} on Python {py_c}, this "
            f"control plane Ray {ray_d} on Python {py_d}; run it with the cluster's versions")


def one_line(e: BaseException) -> str:
    """An error from Ray, which may be a page, as its last line."""
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:300]


def _probe(address: str) -> None:
    """Fail at once, in one line, when nothing listens at `address` (Ray itself retries for
    a minute, then prints a page)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise PlinthError(f"--ray-address: expected HOST:PORT or auto, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise PlinthError(f"--ray-address {address}: cannot reach the Ray head: "
                          f"{e.strerror or e}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
