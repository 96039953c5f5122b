"""What a Service's replica reports to its controller (`plinth.serve.workload`) once its model is
loaded, over the API with its unit's credential (`plinth.runtime.report`): for a tuned model,
which records it runs, so that `plinth show` says so without the control plane reading the
tenant's tuning database."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tuned: str | None = Field(default=None, max_length=1000)  # TunedInfo.line()
