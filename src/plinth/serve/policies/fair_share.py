"""Static fair share: every job gets quota / n replicas, forever."""

from __future__ import annotations

from dataclasses import dataclass

from plinth.serve.policies.base import fair_share, no_drop
from plinth.serve.types import Decision, Snapshot


@dataclass(frozen=True, slots=True)
class FairShare:
    """Static fair share of the quota (quota / n replicas per job)."""

    name: str = "fairshare"

    def initial_state(self, n_jobs: int) -> bool:
        return False  # whether the share has been set

    def decide(self, snap: Snapshot, state: bool) -> tuple[Decision | None, bool]:
        if state:
            return None, state
        share = fair_share(snap.n, snap.quota)
        return Decision(share, no_drop(snap.n), f"fair share of {snap.quota}"), True
