"""What a Tune task's units report to their controller (`plinth.tune.controller`), and how.

The tracker and each server bind the address of the node they run on (PLINTH_NODE_ADDRESS, as
the runtime gives it) and report the address they bound (`Bound`), with the job attempt that
bound it (an address is current only while that attempt runs): the controller keeps it in the
task's status, starts the servers once the tracker's is known, and a share's clients once one
of its servers has reported. A client reports what it tuned once its shard is done (`Tuned`),
so that the task's results reach the controller without it reading the tenant's database.
Reports go over the control plane's API with the unit's own credential
(`plinth.runtime.report`), never through files, so a unit may run on any host; the bodies are
checked with these models at the API, and anything else gets a one-line error naming the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from plinth.core.net import host_port
from plinth.runtime.report import Reporter

_BODY = ConfigDict(extra="forbid", allow_inf_nan=False)
REPORT_WAIT_S = 60.0  # a client's last report: long enough for a control plane that restarts


class Bound(BaseModel):
    """The tracker's or a server's: the address it listens on, on its own node."""

    model_config = _BODY
    address: str = Field(max_length=300)
    job: int = Field(ge=0)  # the job, and its attempt, that bound it (0: run by hand)
    attempt: int = Field(ge=0)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        host_port(v)
        return v

    @classmethod
    def here(cls, address: str, env: Mapping[str, str] = os.environ) -> Bound:
        """`address`, bound by this job attempt (PLINTH_JOB_ID, PLINTH_ATTEMPT)."""
        return cls(address=address, job=int(env.get("PLINTH_JOB_ID") or 0),
                   attempt=int(env.get("PLINTH_ATTEMPT") or 0))


class Tuned(BaseModel):
    """A client's, when its shard is done: what it tuned, and how long it took."""

    model_config = _BODY
    tasks: int = Field(ge=0, le=1_000_000)  # the model's tasks in its shard
    trials: int = Field(ge=0, le=100_000)  # its share of the task's trial budget
    records: int = Field(ge=0)  # measured records in its database
    seconds: float = Field(ge=0)  # from its start, imports and task extraction included
    tune_seconds: float | None = Field(default=None, ge=0)  # tuning alone


def send(body: BaseModel, *, wait_s: float | None = None) -> Reporter | None:
    """Report `body` to the unit's controller, and print it (a unit run by hand has no
    controller: its log says where it listens). The reporter's thread sends it again until it
    gets through, while the unit lives on (a tracker, a server); a unit about to exit passes
    `wait_s`, how long to wait for that. Returns the reporter (None off the platform)."""
    text = body.model_dump(mode="json", exclude_none=True)
    print(json.dumps(text), flush=True)
    reporter = Reporter.from_env()
    if reporter is not None:
        reporter.send(text)
        if wait_s is not None:
            reporter.close(wait_s)
    return reporter
