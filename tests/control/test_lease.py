"""One control plane per store (issue 36, item 9): a second `plinth up` on the store of a running
one, through the same home, through the same `--db` from another home, or on one PostgreSQL
database, refuses to start with one line naming the holder (exit code 2). The first goes on
untouched, its running job not re-adopted, stopped or restarted; once the first has stopped, even
by kill -9 with its jobs still running, a new one starts and adopts them."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from plinth_platform import Platform

from plinth.client import Client
from plinth.control.lease import LeaseHeld, acquire
from plinth.core.errors import PlinthError
from plinth.core.net import free_port


def _answers(port: int) -> bool:
    with Client(f"http://127.0.0.1:{port}", token="-") as c:
        try:
            c.health()
            return True
        except PlinthError:
            return False


def second_up(home: Path, wait_for, *extra: str) -> tuple[int, list[str]]:
    """`plinth up` on `home`: its exit code and the lines it printed, once it has exited. One
    that starts instead (its API answers) is stopped, and the test fails."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "plinth.cli.main", "up", "--home", str(home),
                             "--port", str(port), "--fake-gpus", "4xA100", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _answers(port), 60,
                 "the second control plane to exit or answer")
        assert proc.poll() is not None, "a second control plane started on the same store"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    out = proc.stdout.read() if proc.stdout else ""
    return proc.returncode, [line for line in out.splitlines() if line.strip()]


def _running(p: Platform, wait_for, db: Path | None = None) -> tuple[int, dict]:
    """A long job of `p`'s, launched (its handle in the store at `db`, default its home's):
    its id and what the API shows of it."""
    db = db or p.home / "plinth.db"
    with p.client() as c:
        j = c.submit({"name": "long", "command": "exec sleep 600"})

        def launched() -> bool:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as s:
                row = s.execute("SELECT handle FROM jobs WHERE id = ?", (j,)).fetchone()
            return row is not None and json.loads(row[0] or "null") is not None

        wait_for(lambda: c.job(j)["state"] == "running" and launched(), 60, "a running job")
        return j, c.job(j)


def _untouched(p: Platform, j: int, before: dict) -> None:
    assert p.proc is not None and p.proc.poll() is None, "the first control plane stopped"
    with p.client() as c:
        after = c.job(j)
    assert (after["state"], after["attempt"], after["events"]) == \
        ("running", before["attempt"], before["events"]), (before, after)


def test_a_second_control_plane_on_one_home_refuses_and_a_new_one_starts_after_kill(
        tmp_path, wait_for) -> None:
    home = tmp_path / "home"
    p = Platform(home).start()
    try:
        j, before = _running(p, wait_for)
        token = (home / "token").read_bytes()
        code, lines = second_up(home, wait_for)
        assert code == 2 and len(lines) == 1, lines
        assert "held by another control plane" in lines[0] and \
            f"pid {p.proc.pid} " in lines[0] and f"port {p.port}," in lines[0], lines
        _untouched(p, j, before)
        assert (home / "token").read_bytes() == token
        # kill -9: the lock goes with the process, though its job (its child once) runs on
        p.stop(signal.SIGKILL)
        p.start()
        with p.client() as c:
            wait_for(lambda: "re-adopted" in [e["kind"] for e in c.job(j)["events"]], 30,
                     "the job to be re-adopted")
            assert c.job(j)["state"] == "running"
    finally:
        p.stop()
        p.kill_jobs()


def test_the_same_db_from_another_home_is_refused(tmp_path, wait_for) -> None:
    db = tmp_path / "shared.db"
    p = Platform(tmp_path / "one", "--db", str(db)).start()
    try:
        j, before = _running(p, wait_for, db)
        code, lines = second_up(tmp_path / "two", wait_for, "--db", str(db))
        assert code == 2 and len(lines) == 1, lines
        assert f"store {db} is held" in lines[0] and f"pid {p.proc.pid} " in lines[0], lines
        _untouched(p, j, before)
        assert not (tmp_path / "two" / "token").exists()  # nothing of it was written
        p.stop()  # SIGTERM: the lease is released, the job left running
        other = Platform(tmp_path / "two", "--db", str(db)).start()
        try:
            with other.client(p.token) as c:  # the store's admin token, made by the first
                assert c.job(j)["state"] == "running"
        finally:
            other.stop()
    finally:
        p.stop()
        p.kill_jobs()


def test_a_second_control_plane_on_one_postgres_database_refuses(tmp_path, wait_for,
                                                                 postgres_url) -> None:
    p = Platform(tmp_path / "one", "--db", postgres_url).start()
    try:
        code, lines = second_up(tmp_path / "two", wait_for, "--db", postgres_url)
        assert code == 2 and len(lines) == 1, lines
        assert "held by another control plane" in lines[0] and \
            f"pid {p.proc.pid} " in lines[0] and f"port {p.port}," in lines[0], lines
        assert p.proc.poll() is None and _answers(p.port)
        with pytest.raises(LeaseHeld, match=f"pid {p.proc.pid} "):  # in-process, the same
            acquire("postgresql+psycopg://" + postgres_url.split("://", 1)[1], port=1)
        p.stop()
        lease = acquire("postgresql+psycopg://" + postgres_url.split("://", 1)[1], port=1)
        lease.release()
    finally:
        p.stop()
        p.kill_jobs()
