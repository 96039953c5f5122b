"""The user-facing serving config (`plinth serve up service.yaml`), checked once at the boundary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plinth.core.registry import Registry
from plinth.serve.policies import POLICIES

# The models a replica serves (plinth.serve.replica builds them; torch is imported on first use).
MODELS: Registry[Callable[[], Any]] = Registry("model")  # -> a torch.nn.Module
MODELS.add("tiny-cnn", "plinth.serve.replica:tiny_cnn")
MODELS.add("mlp", "plinth.serve.replica:mlp")


class RouterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)  # 0: any free port
    queue: int = Field(50, ge=0, description="requests queued per job before 503")
    concurrency: int = Field(4, ge=1, description="requests in flight per replica")
    timeout_s: float = Field(10.0, gt=0, description="per request, queue wait included (504)")


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = "tiny-cnn"
    slo_ms: float = Field(gt=0)
    service_ms: float = Field(gt=0, description="mean service time of one request on a replica")
    replicas: int = Field(1, ge=1)

    @field_validator("model")
    @classmethod
    def _known(cls, v: str) -> str:
        return MODELS.check(v)

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.slo_ms <= self.service_ms:
            raise ValueError(f"slo_ms {self.slo_ms:g} must be above service_ms {self.service_ms:g}")
        return self


class ServiceSpec(BaseModel):
    """Read it with `plinth.core.spec.load_spec(path, kind="Service")`."""

    model_config = ConfigDict(extra="forbid")
    run_with: ClassVar[str] = "plinth serve up FILE"

    kind: Literal["Service"] = "Service"
    quota: int = Field(ge=1, description="replicas in all (1 CPU each)")
    policy: str = "aiad"
    tick_s: float = Field(10.0, gt=0)
    router: RouterSpec = RouterSpec()
    jobs: list[JobSpec] = Field(min_length=1)

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        return POLICIES.check(v, field="")

    @model_validator(mode="after")
    def _check(self) -> ServiceSpec:
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names must be unique, got {names}")
        if self.quota < len(self.jobs):
            raise ValueError(f"quota {self.quota} is smaller than one replica per job "
                             f"({len(self.jobs)} jobs)")
        if sum(j.replicas for j in self.jobs) > self.quota:
            raise ValueError("the jobs' initial replicas exceed the quota")
        return self
