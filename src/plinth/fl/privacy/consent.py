"""Purpose-scoped consent registry, eligibility filter for client selection, and audit log (SQLite).

A client opts in for one *purpose* (e.g. "keyboard-next-word") under a consent text *version*,
at a timestamp. Revocation ends it for all later rounds. Selection asks :meth:`eligible`, which
never returns a client without live consent for the task's purpose (and at least the required
version). Every grant, revocation, selection decision and participation is appended to an audit
log that can be queried. Time is passed in (``now``, seconds since the epoch), never read here.

Who may grant: only the client itself, through the FL server's ``Consent`` call
(:class:`ConsentService`, `plinth fl consent grant`), where its id is the one its token proves.
The audit log can be exported (:func:`export_audit`, `plinth fl consent audit --export`).
"""

from __future__ import annotations

import csv
import json
import logging
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger("plinth.fl.privacy.consent")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS consent (
    client_id TEXT NOT NULL, purpose TEXT NOT NULL, version INTEGER NOT NULL,
    granted_at REAL NOT NULL, revoked_at REAL,
    PRIMARY KEY (client_id, purpose, granted_at)
);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, client_id TEXT NOT NULL,
    purpose TEXT NOT NULL, event TEXT NOT NULL, task_id TEXT, round INTEGER, detail TEXT
);
CREATE INDEX IF NOT EXISTS audit_client ON audit (client_id, ts);
"""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    seq: int
    ts: float
    client_id: str
    purpose: str
    event: str  # granted | revoked | selected | excluded | participated
    task_id: str | None
    round: int | None
    detail: str | None


@dataclass(frozen=True, slots=True)
class Eligibility:
    eligible: list[str]
    excluded: dict[str, str]  # client -> reason


class ConsentRegistry:
    """SQLite-backed registry; ``path=":memory:"`` for tests, a file path in production."""

    def __init__(self, path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _audit(
        self,
        ts: float,
        client: str,
        purpose: str,
        event: str,
        task: str | None = None,
        rnd: int | None = None,
        detail: str | None = None,
    ) -> None:
        self._db.execute(
            "INSERT INTO audit (ts, client_id, purpose, event, task_id, round, detail) VALUES (?,?,?,?,?,?,?)",
            (ts, client, purpose, event, task, rnd, detail),
        )

    @staticmethod
    def _check(client_id: str, purpose: str) -> None:
        if not client_id or not purpose:
            raise ValueError(
                f"client_id and purpose must be non-empty, got {client_id!r}, {purpose!r}"
            )

    def grant(self, client_id: str, purpose: str, *, version: int, now: float) -> None:
        self._check(client_id, purpose)
        if version < 1:
            raise ValueError(f"consent version must be >= 1, got {version}")
        with self._db:
            # A new grant supersedes an older live one for the same purpose.
            self._db.execute(
                "UPDATE consent SET revoked_at=? WHERE client_id=? AND purpose=? AND revoked_at IS NULL",
                (now, client_id, purpose),
            )
            self._db.execute(
                "INSERT INTO consent VALUES (?,?,?,?,NULL)", (client_id, purpose, version, now)
            )
            self._audit(now, client_id, purpose, "granted", detail=f"version {version}")

    def revoke(self, client_id: str, purpose: str, *, now: float) -> bool:
        """End the client's consent for ``purpose``; False when there was none to revoke."""
        with self._db:
            cur = self._db.execute(
                "UPDATE consent SET revoked_at=? WHERE client_id=? AND purpose=? AND revoked_at IS NULL",
                (now, client_id, purpose),
            )
            if cur.rowcount:
                self._audit(now, client_id, purpose, "revoked")
        return bool(cur.rowcount)

    def consent_version(self, client_id: str, purpose: str, *, now: float) -> int | None:
        """The version of the consent live at ``now``, or None."""
        row = self._db.execute(
            "SELECT version FROM consent WHERE client_id=? AND purpose=? AND granted_at<=? "
            "AND (revoked_at IS NULL OR revoked_at>?) ORDER BY granted_at DESC LIMIT 1",
            (client_id, purpose, now, now),
        ).fetchone()
        return None if row is None else int(row[0])

    def eligible(
        self,
        candidates: Iterable[str],
        purpose: str,
        *,
        now: float,
        min_version: int = 1,
        task_id: str | None = None,
        round: int | None = None,
    ) -> Eligibility:
        """Filter ``candidates`` to those with live consent for ``purpose``; say why others are out."""
        ok, out = [], {}
        with self._db:
            for c in candidates:
                ver = self.consent_version(c, purpose, now=now)
                if ver is None:
                    out[c] = f"no live consent for purpose {purpose!r}"
                elif ver < min_version:
                    out[c] = f"consent version {ver} < required {min_version}"
                else:
                    ok.append(c)
                    continue
                self._audit(now, c, purpose, "excluded", task_id, round, out[c])
                log.info("client %s excluded from %s round %s: %s", c, task_id, round, out[c])
        return Eligibility(ok, out)

    def select(
        self,
        candidates: Iterable[str],
        purpose: str,
        *,
        k: int,
        rng,
        now: float,
        min_version: int = 1,
        task_id: str | None = None,
        round: int | None = None,
    ) -> list[str]:
        """Sample up to ``k`` clients uniformly from the eligible ones (``rng``: numpy Generator).

        Every pick and every exclusion is audited; a client without live consent is never returned.
        """
        pool = self.eligible(
            candidates, purpose, now=now, min_version=min_version, task_id=task_id, round=round
        )
        picked = sorted(pool.eligible)
        if len(picked) > k:
            idx = rng.choice(len(picked), size=k, replace=False)
            picked = [picked[i] for i in sorted(idx)]
        self.record_selection(picked, purpose, now=now, task_id=task_id, round=round)
        return picked

    def record_selection(self, picked: Iterable[str], purpose: str, *, now: float,
                         task_id: str | None = None, round: int | None = None) -> None:
        """Audit the clients a round selected (drawn by the caller from `eligible`)."""
        with self._db:
            for c in picked:
                self._audit(now, c, purpose, "selected", task_id, round)

    def consents(self, client_id: str) -> list[dict[str, object]]:
        """Every consent record of one client, oldest first (live ones have revoked_at None)."""
        rows = self._db.execute(
            "SELECT purpose, version, granted_at, revoked_at FROM consent WHERE client_id=? "
            "ORDER BY granted_at", (client_id,))
        return [dict(zip(("purpose", "version", "granted_at", "revoked_at"), r, strict=True))
                for r in rows]

    def record_participation(
        self,
        client_id: str,
        purpose: str,
        *,
        task_id: str,
        round: int,
        now: float,
        detail: str | None = None,
    ) -> None:
        """Log a participation; refuses (ValueError) when the client has no live consent."""
        if self.consent_version(client_id, purpose, now=now) is None:
            raise ValueError(
                f"client {client_id} has no live consent for {purpose!r}; participation refused"
            )
        with self._db:
            self._audit(now, client_id, purpose, "participated", task_id, round, detail)

    def audit_log(
        self,
        *,
        client_id: str | None = None,
        purpose: str | None = None,
        task_id: str | None = None,
        event: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[AuditEntry]:
        where, args = [], []
        for col, val in (
            ("client_id", client_id),
            ("purpose", purpose),
            ("task_id", task_id),
            ("event", event),
        ):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        if since is not None:
            where.append("ts>=?")
            args.append(since)
        if until is not None:
            where.append("ts<?")
            args.append(until)
        sql = "SELECT seq, ts, client_id, purpose, event, task_id, round, detail FROM audit"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [AuditEntry(*row) for row in self._db.execute(sql + " ORDER BY seq", args)]


def export_audit(entries: Iterable[AuditEntry], path: str | Path) -> int:
    """Write audit entries to `path` as CSV (``.csv``) or JSON lines (anything else); the
    number written."""
    p = Path(path)
    rows = [asdict(e) for e in entries]
    with p.open("w", newline="") as f:
        if p.suffix == ".csv":
            w = csv.DictWriter(f, fieldnames=[x.name for x in fields(AuditEntry)])
            w.writeheader()
            w.writerows(rows)
        else:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return len(rows)


class ConsentService:
    """The server's consent API: grant, revoke and list for an *authenticated* client id (the
    transport passes the id its token proves), scoped to the task's purpose. Each request opens
    its own connection, so the API's threads never share one with the round loop."""

    def __init__(self, path: str, purpose: str, *, wall: Callable[[], float]) -> None:
        self.path, self.purpose, self.wall = path, purpose, wall

    def handle(self, client_id: str, request: dict[str, Any]) -> dict[str, Any]:
        action = request.get("action")
        purpose = request.get("purpose") or self.purpose
        if purpose != self.purpose:
            raise ValueError(f"purpose: this task asks consent for {self.purpose!r}, "
                             f"not {purpose!r}")
        reg = ConsentRegistry(self.path)
        try:
            if action == "grant":
                version = request.get("version", 1)
                if isinstance(version, bool) or not isinstance(version, int):
                    raise ValueError(f"version: must be a whole number, got {version!r}")
                reg.grant(client_id, purpose, version=version, now=self.wall())
                return {"client_id": client_id, "granted": purpose, "version": version}
            if action == "revoke":
                return {"client_id": client_id, "revoked": purpose,
                        "had_consent": reg.revoke(client_id, purpose, now=self.wall())}
            if action == "list":
                return {"client_id": client_id, "consents": reg.consents(client_id),
                        "audit": [asdict(e) for e in reg.audit_log(client_id=client_id)]}
            raise ValueError(f"action: must be grant, revoke or list, got {action!r}")
        finally:
            reg.close()
