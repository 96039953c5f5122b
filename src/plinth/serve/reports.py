"""What a Service's units report to its controller (`plinth.serve.workload`), over the API with
their unit's credential (`plinth.runtime.report`).

A replica reports once its model is loaded: for a tuned model, which records it runs, so that
`plinth show` says so without the control plane reading the tenant's tuning database.

The router reports every second where it listens (the address it bound on its node) and its
counters since it started. Counters, not windows: a report is the unit's whole current state,
so one lost while the control plane restarts costs nothing (the next one carries it), and the
autoscaler takes the difference between the reports it sees at its ticks.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tuned: str | None = Field(default=None, max_length=1000)  # TunedInfo.line()


class RouterReport(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    url: str = Field(pattern=r"^https?://[^\s/]+$", max_length=200)  # where it listens
    arrivals: int = Field(ge=0)  # requests received since it started
    ok: int = Field(ge=0)  # of those, answered 200
    within_slo: int = Field(ge=0)  # of those, within the service's SLO
    rejected: int = Field(ge=0)  # answered 503 (queue full) or 504 (timed out)
    latency_s: float = Field(ge=0)  # the sum of the 200s' latencies
    p99_s: float = Field(ge=0)  # the 200s' p99 over the last window (the autoscaler's tick)
    ongoing: int = Field(ge=0)  # queued and in flight now
    ready: int = Field(ge=0)  # replicas joined and heard from
    service_ms: float | None = Field(default=None, gt=0)  # the replicas' mean measured time
