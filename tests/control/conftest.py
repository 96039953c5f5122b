"""Fixtures: a real PostgreSQL server when the machine has one, a running control plane, and one
in virtual time."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from plinth_platform import Platform, reachable
from virtual import VirtualPlatform

from plinth.core.net import free_port


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / name).exists():
            return str(base / name)
    return None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A throw-away PostgreSQL server on 127.0.0.1, started and stopped here (skipped where the
    machine has no PostgreSQL binaries)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="plinth-pg-"))
    data = root / "data"
    # PostgreSQL refuses to run as root: run it as the `postgres` user where we are root.
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    port = free_port()
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "plinth"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://plinth@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def platform_factory() -> type[Platform]:
    return Platform


@pytest.fixture
def platform(tmp_path) -> Iterator[Platform]:
    p = Platform(tmp_path / "home").start()
    yield p
    p.stop()
    p.kill_jobs()


@pytest.fixture
def vp(tmp_path) -> Iterator[VirtualPlatform]:
    """A control plane in virtual time (virtual.py): 1x4xA100, drf, `plinth up`'s defaults."""
    with VirtualPlatform(tmp_path) as p:
        yield p


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """The test's folder, one its platform's jobs can use: as root they run as their tenants'
    users (see plinth_platform.reachable)."""
    return reachable(tmp_path)


@pytest.fixture(scope="module")
def shared_platform(tmp_path_factory) -> Iterator[Platform]:
    p = Platform(tmp_path_factory.mktemp("plinth") / "home").start()
    yield p
    p.stop()
    p.kill_jobs()


@pytest.fixture
def wait_for():
    return _wait_for


def _wait_for(cond, timeout: float = 30.0, what: str = "condition"):
    """Poll `cond` until it returns something truthy; fail the test after `timeout`."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
