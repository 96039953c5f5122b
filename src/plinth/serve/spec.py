"""The Service spec (`kind: Service` in `plinth submit`), checked once at the boundary."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plinth.core.jobspec import Resources
from plinth.core.spec import beside, from_folder
from plinth.serve.models import MODELS

SECRET_ENV = "PLINTH_REPLICA_SECRET"  # the service's secret: its replicas join its router with it


class RouterSpec(BaseModel):
    """A service's router (`plinth.serve.router`): a unit of the service, in front of its
    replicas."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    queue: int = Field(50, ge=0, description="requests queued before 503")
    concurrency: int = Field(4, ge=1, description="requests in flight per replica")
    timeout_s: float = Field(10.0, gt=0, description="per request, queue wait included (504)")
    cpus: float = Field(0.5, gt=0, le=64, description="the router unit's CPUs")


class Batching(BaseModel):
    """Dynamic batching in each replica, after GSLICE: batches up to the largest size whose
    measured execution time stays under about half the SLO (`max_batch: 0`), or `max_batch`;
    a batch waits at most `max_wait_ms` to fill."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    max_batch: int = Field(0, ge=0, le=4096)
    max_wait_ms: float = Field(5.0, ge=0, le=10_000)


# The model forms a Tune task tunes (plinth.tune.spec): TVM imports the model via torch.export.
_TUNABLE = re.compile(r"^([A-Za-z_][\w.]*:[A-Za-z_]\w*|.+\.pt2)$")


class Tuned(BaseModel):
    """Serve the model as a `kind: Tune` task tuned it: each replica builds it with TVM from the
    records tuned at the share nearest its own (its CPU count on `cpu`, its GPU share in percent
    on `cuda`) and runs it on the Relax VM instead of torch. See `plinth.serve.tuned`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    db: str = Field(min_length=1, description="the Tune task's database folder")
    target: Literal["cpu", "cuda"] = "cpu"


class ServiceSpec(BaseModel):
    """An inference service: the user's model behind the platform's router, on replicas the
    scheduler places and the autoscaler sizes. Read it with `plinth.core.spec.load_spec`.

    ```yaml
    kind: Service
    name: digits
    model: examples.serve.cnn:make     # MODULE:FACTORY, or a TorchScript / torch.export file
    handler: examples.serve.handler:Digits   # optional: JSON in and out
    input_shape: [1, 28, 28]           # one request, without the batch dimension
    slo_ms: 100                        # p99 latency target
    resources: {cpus: 1, memory: 1Gi}  # per replica; or gpu_fraction with gpu_memory
    min_replicas: 1
    max_replicas: 4
    router: {cpus: 0.5, queue: 50, concurrency: 4, timeout_s: 10}   # its router unit
    tuned: {db: tune-db, target: cpu}  # optional: serve the TVM build a Tune task tuned
    ```
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    run_with: ClassVar[str] = "plinth submit FILE"

    kind: Literal["Service"] = "Service"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
    tenant: str | None = None
    model: str = Field(min_length=1)
    handler: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    input_shape: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(
        default_factory=lambda: [1, 28, 28], min_length=1, max_length=8)
    slo_ms: float = Field(gt=0, le=3_600_000)
    service_ms: float | None = Field(None, gt=0, le=3_600_000,
                                     description="one request's time on a replica; "
                                     "default: measured by `plinth submit`")
    resources: Resources = Field(default_factory=lambda: Resources(cpus=1, memory=1024))
    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(4, ge=1, le=1000)
    priority: int = Field(0, ge=-1000, le=1000)
    preemptible: bool = False  # a replica is not preempted by default (see docs/serving.md)
    batching: Batching = Field(default_factory=Batching)
    router: RouterSpec = Field(default_factory=RouterSpec)
    tuned: Tuned | None = None
    # where MODULE is imported from: default, where you submit; a relative one is taken from
    # the spec's folder, so that a spec naming its project's root runs from any directory
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    def submitted(self, base: Path | None) -> ServiceSpec:
        """MODULE is imported from `workdir` (where you submit, or relative to the spec's
        folder); a model file beside the spec is made absolute, and so is `tuned.db`, found
        from the spec's folder. The model is loaded and timed here, in a child process (one
        line naming the field if it fails), for `service_ms` unless the spec gives it: the
        control plane never imports a user's model."""
        from plinth.serve.check import check_model

        workdir = from_folder(base, self.workdir) if self.workdir else os.path.abspath(".")
        model = beside(base, self.model)
        tuned = self.tuned
        if tuned is not None:
            tuned = tuned.model_copy(update={"db": from_folder(base, tuned.db)})
        measured = check_model(model, self.input_shape, self.slo_ms, workdir=workdir,
                               tuned=None if tuned is None else (tuned.db, tuned.target,
                                                                 self.share()))
        return self.model_copy(update={"workdir": workdir, "model": model, "tuned": tuned,
                                       "service_ms": self.service_ms or round(measured, 3)})

    def threads(self) -> int:
        """The threads a replica runs its model on (OMP_NUM_THREADS, TVM_NUM_THREADS): its
        whole CPUs, at least one, unless `env` sets OMP_NUM_THREADS."""
        return int(self.env.get("OMP_NUM_THREADS") or max(1, math.floor(self.resources.cpus)))

    def share(self) -> float:
        """A replica's share as a Tune task counts shares: its GPU share in percent (the MPS
        thread percentage the runtime gives it) when it has a gpu_fraction, else its threads."""
        if self.resources.gpu_fraction:
            return float(max(1, round(self.resources.gpu_fraction * 100)))
        return float(self.threads())

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if "\0" in v or "\n" in v:
            raise ValueError("must be MODULE:FACTORY or a file path on one line")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        threads = v.get("OMP_NUM_THREADS")
        if threads is not None and not (threads.isdigit() and int(threads) >= 1):
            raise ValueError(f"OMP_NUM_THREADS must be a whole number >= 1, got {threads!r}")
        return v

    @model_validator(mode="after")
    def _check(self) -> ServiceSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} is below min_replicas "
                             f"{self.min_replicas}")
        if self.resources.gpus:
            raise ValueError("resources.gpus: a replica takes a gpu_fraction (with gpu_memory) "
                             "or CPUs, not whole GPUs")
        if self.service_ms is not None and self.service_ms >= self.slo_ms:
            raise ValueError(f"slo_ms {self.slo_ms:g} ms must be above service_ms "
                             f"{self.service_ms:g} ms")
        if self.tuned is not None:
            self._check_tuned(self.tuned)
        return self

    def _check_tuned(self, tuned: Tuned) -> None:
        if not _TUNABLE.match(self.model) or self.model in MODELS:
            raise ValueError(f"tuned: a tuned model is MODULE:FACTORY or a .pt2 file, as a "
                             f"Tune task takes it; model is {self.model!r}")
        gpu = self.resources.gpu_fraction
        if tuned.target == "cuda" and not gpu:
            raise ValueError("tuned.target: cuda runs on a GPU share; give the replica a "
                             "resources.gpu_fraction, or use target: cpu")
        if tuned.target == "cpu" and gpu:
            raise ValueError(f"tuned.target: cpu runs on the replica's CPUs, but "
                             f"resources.gpu_fraction {gpu:g} gives it a GPU share; use "
                             f"target: cuda")
