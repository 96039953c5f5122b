"""The consent hook: who may be selected, whose update may be used, and the audit of both.

Only clients with live consent for the task's purpose enter the pool (the others are audited
as excluded); an update from a client whose consent was revoked during the round is refused on
arrival; every selection and participation is recorded (`plinth.fl.privacy.consent`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from plinth.core.errors import PlinthError, SpecError
from plinth.fl.app import AppSpec, ConsentSpec
from plinth.fl.messages import Failure

log = logging.getLogger("plinth.fl.safeguards")


class ConsentHook:
    def __init__(self, spec: AppSpec, consent: ConsentSpec, wall: Callable[[], float]) -> None:
        from plinth.fl.privacy.consent import ConsentRegistry

        self.spec, self.wall = consent, wall  # wall-clock seconds since the epoch
        self.task_id = consent.task_id or spec.name
        path = Path(spec.resolve(consent.registry) or "")
        if not path.parent.is_dir():
            raise SpecError(f"consent.registry: folder {path.parent} does not exist")
        self.registry = ConsentRegistry(str(path))  # created empty when new

    def consenting(self, r: int, ids: list[str], min_clients: int) -> list[str]:
        """The ids with live consent for the task's purpose (the others audited as excluded)."""
        c = self.spec
        live = self.registry.eligible(ids, c.purpose, now=self.wall(), min_version=c.min_version,
                                      task_id=self.task_id, round=r).eligible
        if len(live) < min_clients:
            raise PlinthError(f"consent: {len(live)} of {len(ids)} clients have live consent for "
                              f"{c.purpose!r}; server.min_clients is {min_clients}")
        return live

    def selected(self, r: int, chosen: list[str]) -> None:
        self.registry.record_selection(chosen, self.spec.purpose, now=self.wall(),
                                       task_id=self.task_id, round=r)

    def refuses_update(self, cid: str) -> str | None:
        """Why an update from `cid` must not be used (consent no longer live), or None."""
        ver = self.registry.consent_version(cid, self.spec.purpose, now=self.wall())
        if ver is None or ver < self.spec.min_version:
            return f"consent for {self.spec.purpose!r} is not live (revoked); update refused"
        return None

    def participated(self, r: int, chosen: list[str], failures: list[Failure]) -> None:
        failed = {f.cid for f in failures}
        now = self.wall()
        for cid in chosen:
            if cid in failed:
                continue
            try:
                self.registry.record_participation(cid, self.spec.purpose,
                                                   task_id=self.task_id, round=r, now=now)
            except ValueError as e:  # consent revoked during the round
                log.warning("round %d: %s", r, e)

    def close(self) -> None:
        self.registry.close()
