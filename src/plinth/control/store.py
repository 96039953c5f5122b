"""The durable store: jobs, their events, tenants and API tokens, through SQLAlchemy Core.

SQLite is the default (one file, WAL mode); PostgreSQL works through the same code with a
``postgresql://`` URL. Every state change of a job is one transaction that updates the job row
(guarded by its old state) and appends the event that explains it, so the store never holds a
state without its reason, and a crash between the two cannot happen.

SQLite runs with ``synchronous=NORMAL`` in WAL mode: a committed transaction survives the
control plane being killed (the WAL is in the OS page cache); only a power loss can take back
the last few commits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from plinth.core.errors import PlinthError, SpecError
from plinth.core.kinds import WorkloadState
from plinth.core.lifecycle import TERMINAL, State, check_transition

metadata = sa.MetaData()

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("submit_time", sa.Float, nullable=False),
    sa.Column("start_time", sa.Float),
    sa.Column("end_time", sa.Float),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("exit_code", sa.Integer),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("stop_reason", sa.String(16)),
    sa.Column("allocation", sa.JSON),
    sa.Column("handle", sa.JSON),
    sa.Column("preemptions", sa.Integer, nullable=False, default=0),
    sa.Column("checkpoint_step", sa.Integer),  # the last checkpoint the job reported
    sa.Column("checkpoint_time", sa.Float),
    sa.Column("array_id", sa.Integer, index=True),  # a job array's id: its first task's
    sa.Column("array_index", sa.Integer),  # the task's index in its array
    sa.Column("workload_id", sa.Integer, index=True),  # a unit of this workload (not a Job),
    sa.Column("unit", sa.String(64)),  # by this name within it ("replica-2")
)

# Workloads of the kinds with several units (a Service, an FLTask, a Tune): the spec as
# submitted, and the status its controller keeps (desired size, why, addresses). Their units
# are ordinary jobs that point back here. A Job is its own one unit and has no row here.
workloads = sa.Table(
    "workloads", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("name", sa.String(64), nullable=False, index=True),
    sa.Column("tenant", sa.String(64), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),  # active, succeeded, failed, cancelled
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("status", sa.JSON, nullable=False),
    sa.Column("secret", sa.String(64), nullable=False),  # its units' shared secret (CSPRNG)
    sa.Column("submit_time", sa.Float, nullable=False),
    sa.Column("end_time", sa.Float),
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False, index=True),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("message", sa.Text, nullable=False, default=""),
)

tenants = sa.Table(
    "tenants", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("gpus", sa.Float),  # nominal GPU quota; NULL: an equal share
    sa.Column("borrowing_limit", sa.Float),  # NULL: may borrow all idle quota
    sa.Column("unix_user", sa.String(32)),  # its jobs run as this user (root server); NULL: ours
)

tokens = sa.Table(
    "tokens", metadata,
    sa.Column("digest", sa.String(64), primary_key=True),  # sha256 of the token, never the token
    sa.Column("tenant", sa.String(64), sa.ForeignKey("tenants.name"), nullable=False),
    sa.Column("admin", sa.Boolean, nullable=False, default=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("expires", sa.Float),  # NULL: never
)
# A token is known by the start of its digest: enough to name it (`plinth tenant revoke ID`),
# nothing to log in with.
TOKEN_ID_CHARS = 12


_INSERT_JOB = jobs.insert()
_INSERT_EVENT = events.insert()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def normalise_url(url: str) -> str:
    """A path or SQLAlchemy URL; ``postgresql://`` uses the psycopg 3 driver."""
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


@dataclass(frozen=True, slots=True)
class Event:
    job_id: int
    kind: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    """One job's move for `Store.transitions`, as `Store.transition` takes it."""

    job_id: int
    old: State
    new: State
    at: float
    kind: str
    message: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)


class Store:
    def __init__(self, url: str) -> None:
        self.url = normalise_url(url)
        self.sqlite = self.url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.sqlite:
            path = self.url.removeprefix("sqlite:///")
            # A typo in --db must not create directories all over the file system.
            if path and path != ":memory:" and not Path(path).parent.is_dir():
                raise SpecError(f"--db: cannot use {url!r}: directory {Path(path).parent} "
                                "does not exist")
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        try:
            self.engine = sa.create_engine(self.url, **kwargs)
        except (sa.exc.ArgumentError, ModuleNotFoundError) as e:
            raise SpecError(f"--db: cannot use {url!r}: {e}") from None
        if self.sqlite:
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        # SQLite has one writer at a time; taking turns here avoids busy retries under load.
        self._write = threading.Lock() if self.sqlite else contextlib.nullcontext()
        try:
            metadata.create_all(self.engine)
            self._add_missing_columns()
        except sa.exc.OperationalError as e:
            raise PlinthError(f"--db: cannot open {url!r}: {str(e.orig).strip()}") from None

    def _add_missing_columns(self) -> None:
        """A store made by an older version gains the columns added since (all nullable)."""
        inspector = sa.inspect(self.engine)
        for table in metadata.sorted_tables:
            have = {c["name"] for c in inspector.get_columns(table.name)}
            for col in table.columns:
                if col.name not in have:
                    kind = col.type.compile(dialect=self.engine.dialect)
                    with self._write, self.engine.begin() as c:
                        c.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {col.name} "
                                          f"{kind}"))

    def close(self) -> None:
        self.engine.dispose()

    # --- jobs ---------------------------------------------------------------------------------

    def insert_job(self, row: Mapping[str, Any], now: float, message: str = "") -> int:
        return self.insert_jobs([(row, now, message)])[0]

    def insert_jobs(self, batch: Sequence[tuple[Mapping[str, Any], float, str]], *,
                    array: bool = False) -> list[int]:
        """Insert submitted jobs, each with its `submitted` event, in one transaction; with
        `array`, they are the tasks of one job array, whose id is the first task's."""
        ids = []
        with self._write, self.engine.begin() as c:
            if self.sqlite:  # the hot path: the driver directly, no statement machinery
                ids = _sqlite_insert_jobs(c.connection.driver_connection, batch)
            else:
                # Parameters go separately from the statement, so it is compiled once.
                for row, now, message in batch:
                    job_id = int(c.execute(_INSERT_JOB, {**row, "state": State.PENDING.value,
                                                         "submit_time": now}
                                           ).inserted_primary_key[0])
                    c.execute(_INSERT_EVENT, {"job_id": job_id, "time": now,
                                              "kind": "submitted", "message": message})
                    ids.append(job_id)
            if array and ids:
                c.execute(jobs.update().where(jobs.c.id == sa.bindparam("task"))
                          .values(array_id=ids[0]), [{"task": i} for i in ids])
        return ids

    def transition(self, job_id: int, old: State, new: State, now: float, kind: str,
                   message: str = "", **fields: Any) -> None:
        """Move a job from `old` to `new`, with `fields` changed and the event recorded, in one
        transaction. Raises if the transition is illegal or the job is no longer in `old`."""
        check_transition(job_id, old, new)
        with self._write, self.engine.begin() as c:
            done = c.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.state == old.value)
                             .values(state=new.value, **fields)).rowcount
            if done != 1:
                raise PlinthError(f"job {job_id}: store does not hold it as {old.value}")
            c.execute(_INSERT_EVENT, {"job_id": job_id, "time": now, "kind": kind,
                                      "message": message})

    def transitions(self, batch: Sequence[Transition]) -> None:
        """Many `transition`s in one transaction (a cancelled array: thousands of jobs), each
        set of like changes as one executemany; all of them, or none if a job has moved."""
        if not batch:
            return
        runs: list[tuple[tuple, list[dict]]] = []  # like moves in a row, in the batch's order
        for t in batch:
            check_transition(t.job_id, t.old, t.new)
            key = (t.old, t.new, tuple(sorted(t.fields)))
            if not runs or runs[-1][0] != key:
                runs.append((key, []))
            runs[-1][1].append({"_id": t.job_id, **{f"_{k}": v for k, v in t.fields.items()}})
        with self._write, self.engine.begin() as c:
            for (old, new, keys), rows in runs:
                done = c.execute(jobs.update().where(jobs.c.id == sa.bindparam("_id"),
                                                     jobs.c.state == old.value)
                                 .values(state=new.value,
                                         **{k: sa.bindparam(f"_{k}") for k in keys}),
                                 rows).rowcount
                if done != len(rows) and c.dialect.supports_sane_multi_rowcount:
                    raise PlinthError(f"jobs {rows[0]['_id']}..{rows[-1]['_id']}: the store "
                                      f"does not hold all {len(rows)} as {old.value}")
            c.execute(_INSERT_EVENT, [{"job_id": t.job_id, "time": t.at, "kind": t.kind,
                                       "message": t.message} for t in batch])

    def array_summary(self, array_id: int) -> tuple[set[State], bool]:
        """The states an array's tasks are in, and whether any has started: one aggregate
        over the array_id index instead of reading every task back."""
        q = (sa.select(jobs.c.state, sa.func.max(jobs.c.attempt))
             .where(jobs.c.array_id == array_id).group_by(jobs.c.state))
        with self.engine.connect() as c:
            rows = c.execute(q).all()
        return {State(s) for s, _ in rows}, any(a for _, a in rows)

    def update_job(self, job_id: int, **fields: Any) -> None:
        with self._write, self.engine.begin() as c:
            c.execute(jobs.update().where(jobs.c.id == job_id).values(**fields))

    def add_events(self, batch: Iterable[Event], now: float) -> None:
        rows = [{"job_id": e.job_id, "time": now, "kind": e.kind, "message": e.message}
                for e in batch]
        if rows:
            with self._write, self.engine.begin() as c:
                c.execute(_INSERT_EVENT, rows)

    def job(self, job_id: int) -> dict | None:
        with self.engine.connect() as c:
            row = c.execute(jobs.select().where(jobs.c.id == job_id)).mappings().first()
        return dict(row) if row else None

    def jobs(self, *, tenant: str | None = None, states: Iterable[State] | None = None,
             name: str | None = None, array: int | None = None, index: int | None = None,
             limit: int = 1000, offset: int = 0) -> list[dict]:
        """Jobs matching every filter given, newest first; `offset` skips that many (paging).
        `index`: the task of `array` with this index."""
        q = self._filter(jobs.select(), tenant, states, name, array)
        if index is not None:
            q = q.where(jobs.c.array_index == index)
        q = q.order_by(jobs.c.id.desc()).limit(limit).offset(offset)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def count_jobs(self, *, tenant: str | None = None, states: Iterable[State] | None = None,
                   name: str | None = None, array: int | None = None) -> int:
        q = self._filter(sa.select(sa.func.count()).select_from(jobs), tenant, states, name,
                         array)
        with self.engine.connect() as c:
            return int(c.execute(q).scalar_one())

    @staticmethod
    def _filter(q: Any, tenant: str | None, states: Iterable[State] | None,
                name: str | None, array: int | None) -> Any:
        if tenant is not None:
            q = q.where(jobs.c.tenant == tenant)
        if states is not None:
            q = q.where(jobs.c.state.in_([s.value for s in states]))
        if name is not None:
            q = q.where(jobs.c.name == name)
        if array is not None:
            q = q.where(jobs.c.array_id == array)
        return q

    def active_jobs(self) -> list[dict]:
        """Every job not yet in a terminal state, oldest first: what a restart recovers."""
        live = [s for s in State if s not in TERMINAL]
        return sorted(self.jobs(states=live, limit=10**9), key=lambda r: r["id"])

    def events(self, job_id: int) -> list[dict]:
        q = events.select().where(events.c.job_id == job_id).order_by(events.c.id)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # --- workloads ----------------------------------------------------------------------------

    def insert_workload(self, row: Mapping[str, Any], now: float) -> int:
        with self._write, self.engine.begin() as c:
            return int(c.execute(workloads.insert().values(**row, state=WorkloadState.ACTIVE.value,
                                                           submit_time=now)
                                 ).inserted_primary_key[0])

    def update_workload(self, workload_id: int, **fields: Any) -> None:
        with self._write, self.engine.begin() as c:
            c.execute(workloads.update().where(workloads.c.id == workload_id).values(**fields))

    def delete_workload(self, workload_id: int) -> None:
        """Forget a workload refused at submit (it has no units yet)."""
        with self._write, self.engine.begin() as c:
            c.execute(workloads.delete().where(workloads.c.id == workload_id))

    def workloads(self, *, tenant: str | None = None, active: bool | None = None,
                  name: str | None = None) -> list[dict]:
        """Workloads matching the filters, newest first."""
        q = workloads.select().order_by(workloads.c.id.desc())
        if tenant is not None:
            q = q.where(workloads.c.tenant == tenant)
        if active is not None:
            q = q.where((workloads.c.state == WorkloadState.ACTIVE.value) if active else
                        (workloads.c.state != WorkloadState.ACTIVE.value))
        if name is not None:
            q = q.where(workloads.c.name == name)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def units(self, workload_id: int) -> list[dict]:
        """The jobs of a workload's units, oldest first."""
        q = jobs.select().where(jobs.c.workload_id == workload_id).order_by(jobs.c.id)
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    # --- tenants and tokens ---------------------------------------------------------------

    def put_tenant(self, name: str, gpus: float | None, borrowing_limit: float | None,
                   unix_user: str | None = None) -> None:
        values = {"gpus": gpus, "borrowing_limit": borrowing_limit, "unix_user": unix_user}
        with self._write, self.engine.begin() as c:  # an update, so the tenant's tokens stay
            if not c.execute(tenants.update().where(tenants.c.name == name)
                             .values(**values)).rowcount:
                c.execute(tenants.insert().values(name=name, **values))

    def tenants(self) -> list[dict]:
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(tenants.select().order_by(tenants.c.name))
                    .mappings()]

    def add_token(self, token: str, tenant: str, admin: bool = False,
                  expires: float | None = None) -> str:
        """Store a token's digest; returns the token's id."""
        with self._write, self.engine.begin() as c:
            c.execute(tokens.insert().values(digest=digest(token), tenant=tenant, admin=admin,
                                             created=time.time(), expires=expires))
        return digest(token)[:TOKEN_ID_CHARS]

    def tokens(self) -> dict[str, tuple[str, bool, float | None]]:
        """digest -> (tenant, admin, expires)."""
        with self.engine.connect() as c:
            return {r.digest: (r.tenant, r.admin, r.expires)
                    for r in c.execute(tokens.select())}

    def token_rows(self, tenant: str | None = None) -> list[dict]:
        """Every token by id (never by secret or digest), oldest first."""
        q = tokens.select().order_by(tokens.c.created)
        if tenant is not None:
            q = q.where(tokens.c.tenant == tenant)
        with self.engine.connect() as c:
            return [{"id": r.digest[:TOKEN_ID_CHARS], "tenant": r.tenant, "admin": r.admin,
                     "created": r.created, "expires": r.expires} for r in c.execute(q)]

    def revoke_token(self, token_id: str) -> str | None:
        """Delete the token with this id; returns its digest, None if there is none."""
        if len(token_id) != TOKEN_ID_CHARS or not all(ch in "0123456789abcdef" for ch in token_id):
            return None
        with self._write, self.engine.begin() as c:
            found = c.execute(sa.select(tokens.c.digest)
                              .where(tokens.c.digest.startswith(token_id))).scalars().all()
            if len(found) != 1:
                return None
            c.execute(tokens.delete().where(tokens.c.digest == found[0]))
            return found[0]


_JOB_COLUMNS = ("name", "tenant", "priority", "spec", "reason", "state", "submit_time", "attempt",
                "preemptions", "array_index", "workload_id", "unit")
_SQLITE_JOB = (f"INSERT INTO jobs ({', '.join(_JOB_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(_JOB_COLUMNS))})")
_SQLITE_EVENT = "INSERT INTO events (job_id, time, kind, message) VALUES (?, ?, ?, ?)"


def _sqlite_insert_jobs(conn: Any, batch: Sequence[tuple[Mapping[str, Any], float, str]]
                        ) -> list[int]:
    """`Store.insert_jobs` on SQLite through the sqlite3 driver: a third of the cost of the
    same inserts through SQLAlchemy Core, which matters at hundreds of submissions a second.
    JSON is stored as SQLAlchemy's JSON type stores it (json.dumps text), so reads agree."""
    cur = conn.cursor()
    ids, evs = [], []
    for row, now, message in batch:
        cur.execute(_SQLITE_JOB, (row["name"], row["tenant"], row.get("priority", 0),
                                  json.dumps(row["spec"]), row.get("reason", ""),
                                  State.PENDING.value, now, 0, 0, row.get("array_index"),
                                  row.get("workload_id"), row.get("unit")))
        ids.append(int(cur.lastrowid))
        evs.append((cur.lastrowid, now, "submitted", message))
    cur.executemany(_SQLITE_EVENT, evs)
    cur.close()
    return ids


class GroupCommit:
    """Submissions that arrive together are committed together (group commit): one transaction
    per batch instead of one per job, so the commit cost is shared under load, while a lone
    submission is committed at once. `insert` returns a future for the job id, resolved after
    the commit, so an API handler can await it without blocking the event loop."""

    MAX_BATCH = 256

    def __init__(self, store: Store) -> None:
        self.store = store
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="plinth-group-commit",
                                        daemon=True)
        self._thread.start()

    def insert(self, row: Mapping[str, Any], now: float, message: str = "") -> Future:
        fut: Future = Future()
        self._q.put((row, now, message, fut))
        return fut

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.MAX_BATCH:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)  # finish this batch, then stop
                    break
                batch.append(nxt)
            try:
                ids = self.store.insert_jobs([(r, t, m) for r, t, m, _ in batch])
            except Exception as e:  # noqa: BLE001 -- every waiter hears about it
                for *_, fut in batch:
                    fut.set_exception(e)
                continue
            for (*_, fut), job_id in zip(batch, ids):
                fut.set_result(job_id)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()

