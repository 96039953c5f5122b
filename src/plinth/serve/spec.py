"""The user-facing serving config (`plinth serve up service.yaml`), checked once at the boundary."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from plinth.core.errors import SpecError

MODELS = ("tiny-cnn", "mlp")


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

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.model not in MODELS:
            raise ValueError(f"model {self.model!r} is not one of {', '.join(MODELS)}")
        if self.slo_ms <= self.service_ms:
            raise ValueError(f"slo_ms {self.slo_ms:g} must be above service_ms {self.service_ms:g}")
        return self


class ServiceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    quota: int = Field(ge=1, description="replicas in all (1 CPU each)")
    policy: str = "aiad"
    tick_s: float = Field(10.0, gt=0)
    router: RouterSpec = RouterSpec()
    jobs: list[JobSpec] = Field(min_length=1)

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


def parse_service(doc: object, where: str = "service") -> ServiceSpec:
    try:
        return ServiceSpec.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "value_error":  # our own checks already name the values
            raise SpecError(f"{where}: field {loc}: {msg}") from None
        raise SpecError(f"{where}: field {loc}: {msg} (got {err.get('input')!r})") from None


def load_service(path: str | Path) -> ServiceSpec:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError:
        raise SpecError(f"{path}: bad YAML") from None
    return parse_service(doc, str(path))
