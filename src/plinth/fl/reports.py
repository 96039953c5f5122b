"""What an FL task's units report to their controller (`plinth.fl.workload`), and how.

A server or middle aggregator reports first the addresses it bound on its node, once it listens:
where its clients (or, for the server, the middles) connect, and where its node's leaf units
join its tree. The controller starts the units that connect to it only then. The server then
reports after each round it commits: the round records of the last `RECENT_ROUNDS` rounds (so a
report lost while the control plane restarts is made good by the next) and the size of its
aggregator tree for the next round. A middle aggregator reports its own tree's size. Each
report is the unit's whole state: the addresses go with every one. The bodies are checked with these models at the API, as every spec is: a unit that sends
anything else gets a one-line error naming the field, and its controller never sees it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from plinth.core.net import host_port
from plinth.runtime.report import Reporter

RECENT_ROUNDS = 50  # rounds a report carries, and a task's status keeps (its checkpoint has all)
MAX_LEAVES = 4096
MAX_ADDRESS = 300  # characters of a HOST:PORT

_BODY = ConfigDict(extra="forbid", allow_inf_nan=False)


class RoundRow(BaseModel):
    """One committed round, as `plinth show TASK` prints it."""

    model_config = _BODY
    round: int = Field(ge=1)
    accuracy: float | None = None
    loss: float | None = None
    participants: int = Field(ge=0)
    failures: int = Field(ge=0)
    seconds: float | None = Field(default=None, ge=0)
    updates: int | None = Field(default=None, ge=0)
    leaves: int | None = Field(default=None, ge=0, le=MAX_LEAVES)
    epsilon: float | None = Field(default=None, ge=0)  # the privacy budget spent so far


class TreeReport(BaseModel):
    """A middle aggregator's: where it listens, and the size of its tree of leaves for the
    next round."""

    model_config = _BODY
    address: str | None = Field(default=None, max_length=MAX_ADDRESS)  # HOST:PORT, clients
    leaf_address: str | None = Field(default=None, max_length=MAX_ADDRESS)  # its leaves join
    leaves: int | None = Field(default=None, ge=0, le=MAX_LEAVES)

    @field_validator("address", "leaf_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None:
            host_port(v)
        return v


class ServerReport(TreeReport):
    """The server's: its tree's size, and its latest rounds, oldest first."""

    rounds: list[RoundRow] = Field(default_factory=list, max_length=RECENT_ROUNDS)


def round_row(record: dict[str, Any]) -> RoundRow:
    """A server's round record (`plinth.fl.server.RoundRecord`, as stored) as reported."""
    metrics = record.get("metrics") or {}
    # central DP's epsilon, else local DP's (per client, against the server)
    eps = next((metrics[k] for k in ("epsilon", "dp_epsilon", "local_epsilon") if k in metrics),
               None)
    return RoundRow(round=record["round"], accuracy=record.get("accuracy"),
                    loss=record.get("loss"), participants=len(record.get("clients") or []),
                    failures=len(record.get("failures") or []), seconds=record.get("seconds"),
                    updates=record.get("updates"), leaves=metrics.get("leaves"), epsilon=eps)


class RoundReports:
    """The reporting side: a server's (or a middle's) addresses, rounds and tree size, sent as
    one report each time any of them changes. Without a reporter (a unit run by hand, `plinth
    fl sim`) it sends nothing."""

    def __init__(self, reporter: Reporter | None, server: bool) -> None:
        self.reporter, self.server = reporter, server
        self.rows: deque[RoundRow] = deque(maxlen=RECENT_ROUNDS)
        self.leaves: int | None = None
        self.address: str | None = None
        self.leaf_address: str | None = None

    def listening(self, address: str, leaf_address: str | None = None) -> None:
        """Where the unit listens on its node: HOST:PORT for its clients, and for its leaves."""
        self.address, self.leaf_address = address, leaf_address
        self._send()

    def restored(self, records: list[dict[str, Any]]) -> None:
        """The rounds a resumed server had committed before."""
        self.rows.extend(round_row(r) for r in records[-RECENT_ROUNDS:])

    def round(self, record: dict[str, Any]) -> None:
        self.rows.append(round_row(record))
        self._send()

    def tree(self, leaves: int) -> None:
        if leaves != self.leaves:
            self.leaves = leaves
            self._send()

    def _send(self) -> None:
        if self.reporter is None:
            return
        where = {"address": self.address, "leaf_address": self.leaf_address,
                 "leaves": self.leaves}
        body = ServerReport(**where, rounds=list(self.rows)) if self.server \
            else TreeReport(**where)
        self.reporter.send(body.model_dump(mode="json", exclude_none=True))

    def close(self, timeout: float = 10.0) -> None:
        if self.reporter is not None:
            self.reporter.close(timeout)
            self.reporter = None
