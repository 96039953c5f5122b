"""One control plane per store: a lease, taken before anything in the store is read or adopted.

Two control planes on one store would both re-adopt the running jobs and fight over each one
(issue 36, item 9). So `plinth up` holds a lock on its store for as long as it runs, taken right
after it binds its port and before it opens the store, makes a token, starts a runtime or adopts
a job. A second `plinth up` on the same store refuses to start, with one line naming the holder
(exit code 2, as every refused start). It does not wait as a standby: a standby that took over
when the lease lapsed would also need every unit of the old holder fenced, and a supervisor
(systemd's `Restart=`) that starts `plinth up` again gives the same recovery more simply.

- SQLite: an exclusive `flock` on ``DB.lock``, the file next to the database file (keyed on the
  store, so the same ``--db`` under another ``PLINTH_HOME`` is caught too). The holder writes its
  pid, host, port and start time in it, for the line a second one prints. The kernel drops the
  lock when the holder ends, ``kill -9`` included; the jobs it started do not hold it (the
  descriptor is close-on-exec, and processes are only started through exec).
- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) in the store's database,
  on a connection of its own held for the server's life. The connection's ``application_name``
  names the holder; a second control plane finds it in ``pg_locks`` and ``pg_stat_activity``. The
  lock lives as long as that session: a holder that is killed, or whose connection the database
  drops, has lost it.
- An in-memory SQLite store is one process's own and takes no lease.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from plinth.core.errors import PlinthError, SpecError

# The advisory lock's key, as two int4s ("PLNT", 1): apart from any key an application using
# the same database would pick with the one-bigint form.
PG_KEY = (0x504C4E54, 1)
REFUSAL = "a second control plane on one store refuses to start; stop the one running first"


class LeaseHeld(PlinthError):
    """Another control plane holds the store."""


class Lease:
    """This process's hold on its store, until `release` (or the process ends)."""

    def __init__(self, what: str, release: Callable[[], None] = lambda: None) -> None:
        self.what = what  # where the lease is, for the start-up lines
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()


def holder_line(pid: int, host: str, port: int | str, since: float | str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) \
        if isinstance(since, (int, float)) else since
    return f"pid {pid} on host {host}, port {port}, since {when}"


def acquire(url: str, *, port: int, clock: Callable[[], float] = time.time) -> Lease:
    """The lease on the store at `url` (a normalised SQLAlchemy URL, as `Store.url`), for a
    control plane serving on `port`; raises `LeaseHeld` with one line naming the holder."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if not path or path == ":memory:" or url in ("sqlite://", "sqlite:///:memory:"):
            return Lease("none (an in-memory store)")
        return _sqlite(Path(path), port, clock())
    if url.startswith("postgresql"):
        return _postgres(url, port, clock())
    raise SpecError(f"--db: a control plane needs a lease on its store, which Plinth takes on "
                    f"SQLite and PostgreSQL only, not {url.split(':', 1)[0]!r}")


def _sqlite(db: Path, port: int, now: float) -> Lease:
    db = db.expanduser().resolve()
    if not db.parent.is_dir():
        raise SpecError(f"--db: cannot use {str(db)!r}: directory {db.parent} does not exist")
    path = db.with_name(db.name + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = _sqlite_holder(os.pread(fd, 4096, 0))
        finally:
            os.close(fd)
        raise LeaseHeld(f"store {db} is held by another control plane ({holder}, lock "
                        f"{path}): {REFUSAL}") from None
    except BaseException:
        os.close(fd)
        raise
    me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "port": port,
                     "since": now})
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode() + b"\n", 0)
    return Lease(f"lock {path}", lambda: os.close(fd))  # closing it drops the lock


def _sqlite_holder(text: bytes) -> str:
    try:
        h = json.loads(text)
        return holder_line(int(h["pid"]), str(h["host"]), h["port"], float(h["since"]))
    except (ValueError, KeyError, TypeError):  # the holder has locked, not yet written
        return "one that is starting"


def _postgres(url: str, port: int, now: float) -> Lease:
    me = {"pid": os.getpid(), "host": socket.gethostname(), "port": port,
          "since": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))}
    # application_name holds 63 bytes: the host goes last, so that only it is ever cut
    name = f"plinth up pid={me['pid']} port={port} host={me['host']}"[:63]
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT",
                              connect_args={"application_name": name})
    try:
        conn = engine.connect()
    except (sa.exc.SQLAlchemyError, ModuleNotFoundError) as e:
        engine.dispose()
        why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise PlinthError(f"--db: cannot open {engine.url.render_as_string()!r}: {why}") \
            from None
    try:
        got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:a, :b)"),
                           {"a": PG_KEY[0], "b": PG_KEY[1]}).scalar()
        if not got:
            holder = _postgres_holder(conn)
            raise LeaseHeld(f"store {engine.url.render_as_string()} is held by another "
                            f"control plane ({holder}): {REFUSAL}")
    except BaseException:
        conn.close()
        engine.dispose()
        raise

    def release() -> None:
        conn.close()  # the session ends, and its advisory lock with it
        engine.dispose()

    return Lease(f"advisory lock {PG_KEY} in its database", release)


def _postgres_holder(conn: sa.Connection) -> str:
    row = conn.execute(sa.text(
        "SELECT a.pid, a.application_name, a.client_addr, a.backend_start "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :a AND l.objid = :b "
        "AND l.objsubid = 2 AND l.database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())"),
        {"a": PG_KEY[0], "b": PG_KEY[1]}).first()
    if row is None:  # released between the two queries
        return "one that has just stopped; try again"
    fields = dict(f.split("=", 1) for f in str(row.application_name).split()[2:] if "=" in f)
    since = row.backend_start.strftime("%Y-%m-%d %H:%M:%S") if row.backend_start else "?"
    if "pid" not in fields:  # not a plinth up: name what the database knows of it
        return f"PostgreSQL backend {row.pid} ({row.application_name!r}) from " \
               f"{row.client_addr or 'a local socket'}, since {since}"
    return holder_line(int(fields["pid"]), fields.get("host", "?"), fields.get("port", "?"),
                       since) + f" (PostgreSQL backend {row.pid})"
