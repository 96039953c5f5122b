"""Job specs: the YAML a user submits, checked once at the boundary by pydantic.

Read them with `plinth.core.spec.load_spec` (the one loader of every kind of spec).

```yaml
kind: Job                   # optional: a spec without a kind is a Job
name: train-cnn
tenant: research            # optional: the token's tenant by default
command: ["python", "train.py", "--steps", "200"]   # or one string, run by /bin/sh -c
env: {SEED: "1"}
workdir: .                  # default: the directory `plinth submit` runs in
resources:                  # per worker
  cpus: 1                   # the default; > 0 (a job that asks for none is refused)
  memory: 4Gi               # the default; > 0
  gpus: 1                   # whole GPUs per worker, or
  gpu_fraction: 0.25        # a share of one GPU (MPS), with
  gpu_memory: 8Gi           # its GPU memory limit
  gpu_model: A100           # or a list of allowed models
workers: 2                  # a gang: all start together or none does
priority: 0
preemptible: true
max_runtime: 30m            # seconds, or 90s / 30m / 2h / 1d
retries: 0                  # requeue a failed run this many times
checkpoint_dir: /data/ckpt  # default: $PLINTH_HOME/checkpoints/JOB (as root: --jobs-dir/TENANT/JOB)
afterok: [12]               # start once job 12 has succeeded; also after, afterany, afternotok
array: 0-99%10              # 100 tasks, PLINTH_ARRAY_INDEX 0..99, at most 10 at a time
placement:                  # optional: a model-parallel plan for the GPUs given (Baechi)
  model: plinth.place.models:gnmt
  algo: m-etf               # m-etf, m-sct or m-topo
  batch: 64
  memory: 16Gi              # per device; default: the GPU's memory
```
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from plinth.core.errors import SpecError
from plinth.core.gpus import gpu_model
from plinth.core.resources import MILLI, Request
from plinth.core.spec import beside, parse_memory, trusted
from plinth.core.workload import Job

# A job without max_runtime is planned as if it ran this long (backfill needs an estimate).
DEFAULT_ESTIMATE_S = 24 * 3600.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Bounds far beyond any machine, so that absurd numbers are rejected by name, not overflowed.
MAX_CPUS, MAX_GPUS, MAX_MIB, MAX_RUNTIME_S = 65536, 1024, 2**40, 10 * 365 * 86400
# What a field with a unit accepts (its OpenAPI schema): MiB or a size such as "4Gi"; seconds
# or a duration such as "30m".
MiB = Annotated[int, Field(ge=0, le=MAX_MIB)]
PositiveMiB = Annotated[int, Field(gt=0, le=MAX_MIB)]
Size = Annotated[str, Field(pattern=r"^\s*\d+(\.\d+)?\s*(Mi|Gi|Ti)?\s*$")]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# What execve accepts as a variable name, and what a shell can export.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _no_nul(value: str, what: str) -> str:
    """execve takes C strings: a NUL byte would cut the value short, so it is refused here."""
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL byte")
    return value


DEPENDENCY_KINDS = ("after", "afterany", "afterok", "afternotok")
MAX_DEPENDENCIES = 1000
MAX_ARRAY_TASKS = 10000
MAX_ARRAY_INDEX = 2**31 - 1  # the store keeps an index in a 32-bit column (PostgreSQL's INTEGER)
JobRef = Annotated[int, Field(ge=1, le=2**63 - 1)]
_ARRAY_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_array(text: str) -> tuple[list[int], int | None]:
    """Slurm's --array: ("0-99%10") -> ([0, ..., 99], 10); ("1,3,8-10") -> ([1, 3, 8, 9, 10],
    None). ValueError saying what is wrong."""
    body, _, limit_text = str(text).strip().partition("%")
    if limit_text and not limit_text.isdigit() or limit_text == "0":
        raise ValueError(f"the limit after '%' must be a whole number >= 1, got {text!r}")
    indices: list[int] = []
    for part in body.split(","):
        m = _ARRAY_PART.match(part.strip())
        if m is None:
            raise ValueError(f"expected indices like 0-99, 1,3,5 or 0-15:4, with %N for at "
                             f"most N at a time; got {text!r}")
        first, last, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if last > MAX_ARRAY_INDEX:
            raise ValueError(f"an index is at most {MAX_ARRAY_INDEX}, got {last} in {text!r}")
        if last < first or step < 1:
            raise ValueError(f"{part.strip()!r}: a range runs from low to high in steps >= 1")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"at most {MAX_ARRAY_TASKS} tasks, got more in {text!r}")
        indices.extend(range(first, last + 1, step))
    if len(set(indices)) != len(indices):
        raise ValueError(f"an index appears twice in {text!r}")
    return indices, int(limit_text) if limit_text else None


# A spec's check: each of an array's (up to 10,000) tasks carries the same text, read back at
# every restart; expanding it once per task was O(tasks²).
_check_array = lru_cache(maxsize=256)(parse_array)


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``90s``, ``30m``, ``2h`` or ``1d``."""
    if isinstance(value, bool):
        raise ValueError(f"expected seconds or a duration like 30m, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"must be > 0 (got {value!r})")
        return float(value)
    m = _DURATION.match(str(value))
    if m is None:
        raise ValueError("expected seconds or a duration like 30m (units s, m, h, d), "
                         f"got {value!r}")
    seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"must be > 0 (got {value!r})")
    return seconds


# Specs are strict: a number is a number (YAML's `true` or "4" is not taken for 1 or 4), and
# finite; every number has bounds, so that no accepted value overflows a scheduling pass.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class Resources(BaseModel):
    """Per worker."""

    model_config = STRICT

    # Both default to these; a tenant's job that asks for 0 is refused (see _floor).
    cpus: float = Field(1.0, ge=0, le=MAX_CPUS, json_schema_extra={"exclusiveMinimum": 0})
    memory: int = Field(4096, ge=0, le=MAX_MIB, json_schema_extra={"unit": "MiB"})
    gpus: int = Field(0, ge=0, le=MAX_GPUS)
    gpu_fraction: float | None = Field(None, gt=0, le=1)
    gpu_memory: int | None = Field(None, ge=0, le=MAX_MIB, json_schema_extra={"unit": "MiB"})
    gpu_model: list[str] = Field(default_factory=list)

    @field_validator("memory", mode="before", json_schema_input_type=PositiveMiB | Size)
    @classmethod
    def _memory(cls, v: Any) -> int | None:
        return parse_memory(v)

    @field_validator("gpu_memory", mode="before", json_schema_input_type=MiB | Size | None)
    @classmethod
    def _gpu_memory(cls, v: Any) -> int | None:
        return None if v is None else parse_memory(v)

    @field_validator("cpus", "memory")
    @classmethod
    def _floor(cls, v: float, info: ValidationInfo) -> float:
        # A job that asked for no CPU or memory would run without a limit, and the scheduler
        # would count it as using nothing. Only a spec the platform made (a Tune task's tracker
        # and clients reserve no CPU on purpose: plinth.tune.controller) or read back from its
        # store (accepted before this floor) is validated with TRUSTED and may ask for 0.
        if v == 0 and not trusted(info.context):
            raise ValueError("must be > 0 (got 0)")
        return v

    @field_validator("gpu_model", mode="before", json_schema_input_type=str | list[str] | None)
    @classmethod
    def _models(cls, v: Any) -> list[str]:
        if v is not None and not isinstance(v, (str, list)):
            raise ValueError(f"expected a GPU model or a list of them, got {v!r}")
        names = [v] if isinstance(v, str) else (v or [])
        try:
            return [gpu_model(str(n)).name for n in names]
        except SpecError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _gpu_shape(self) -> Resources:
        if self.gpu_fraction is not None and self.gpus:
            raise ValueError("ask for whole gpus or a gpu_fraction, not both")
        if self.gpu_memory is not None and self.gpu_fraction is None:
            raise ValueError("gpu_memory limits a gpu_fraction; whole GPUs come with all "
                             "their memory")
        return self


class Placement(BaseModel):
    """Ask the platform for a model-parallel placement (Baechi) of the job's model over the GPUs
    it is given; the job reads the plan from $PLINTH_PLACEMENT_PLAN."""

    model_config = STRICT

    model: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # MODULE:FACTORY
    algo: str = Field("m-etf", pattern=r"^m-(etf|sct|topo)$")
    batch: int = Field(64, ge=1, le=1 << 20)
    memory: int | None = Field(None, ge=1, le=MAX_MIB)  # MiB per device; default: the GPU's

    @field_validator("memory", mode="before", json_schema_input_type=PositiveMiB | Size | None)
    @classmethod
    def _memory(cls, v: Any) -> int | None:
        return None if v is None else parse_memory(v)


class JobSpec(BaseModel):
    model_config = STRICT
    run_with: ClassVar[str] = "plinth submit FILE"

    kind: Literal["Job"] = "Job"
    name: str = "job"
    tenant: str | None = None
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    resources: Resources = Field(default_factory=Resources)
    workers: int = Field(1, ge=1, le=1024)
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    preemptible: bool = True
    max_runtime: float | None = Field(None, gt=0, le=MAX_RUNTIME_S,
                                      json_schema_extra={"unit": "s"})
    retries: int = Field(0, ge=0, le=100)
    checkpoint_dir: str | None = None
    placement: Placement | None = None
    # Run only on these nodes, by name (Slurm's --nodelist). The platform sets it for a unit
    # that must share a node with another unit of its workload.
    nodelist: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=64)
    # Dependencies, as Slurm's --dependency: start after these jobs have started (after), ended
    # (afterany), succeeded (afterok) or ended without success (afternotok).
    after: list[JobRef] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    afterany: list[JobRef] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    afterok: list[JobRef] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    afternotok: list[JobRef] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    # A job array, as Slurm's --array: "0-99", "1,3,5", "0-15:4", with "%10" to run at most
    # 10 tasks at a time. Each task is a job of its own, with PLINTH_ARRAY_INDEX.
    array: str | None = None
    array_index: int | None = Field(None, ge=0, le=MAX_ARRAY_INDEX,
                                    description="set by the platform for array tasks")
    array_id: JobRef | None = Field(None, description="set by the platform: the array's id")

    def submitted(self, base: Path | None) -> JobSpec:
        """As sbatch does, the job runs where it is submitted from unless it names a
        directory; a command argument naming a file beside the spec is made absolute."""
        return self.model_copy(update={"workdir": os.path.abspath(self.workdir or "."),
                                       "command": [beside(base, a) for a in self.command]})

    def dependencies(self) -> list[tuple[str, int]]:
        """(kind, job id) of every dependency, in the order of DEPENDENCY_KINDS."""
        return [(kind, j) for kind in DEPENDENCY_KINDS for j in getattr(self, kind)]

    def array_limit(self) -> int | None:
        """The `%N` of an array spec (checked at the boundary), read without expanding the
        indices: it is read for every task of an array, and expanding `0-9999` each time was
        O(tasks²)."""
        if not self.array:
            return None
        limit = str(self.array).strip().partition("%")[2]
        return int(limit) if limit else None

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            _check_array(v)
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-63 letters, digits, '-', '_' or '.', starting with a "
                             f"letter or digit (got {v!r})")
        return v

    @field_validator("command", mode="before", json_schema_input_type=Annotated[
        list[str | int | float | bool], Field(min_length=1)] | Annotated[str, Field(min_length=1)])
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("must not be empty")
            return ["/bin/sh", "-c", v]
        if isinstance(v, list):  # YAML reads `[python, x.py, --steps, 10]` with an int in it
            return [str(x).lower() if isinstance(x, bool) else
                    str(x) if isinstance(x, (int, float)) else x for x in v]
        return v

    @field_validator("command")
    @classmethod
    def _command_c_strings(cls, v: list[str]) -> list[str]:
        for i, arg in enumerate(v):
            _no_nul(arg, f"argument {i}")
        return v

    @field_validator("workdir", "checkpoint_dir")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else _no_nul(v, "the path")

    @field_validator("env", mode="before",
                     json_schema_input_type=dict[str, str | int | float | bool])
    @classmethod
    def _env(cls, v: Any) -> Any:
        # YAML turns `SEED: 1` into an int; an environment holds strings.
        if isinstance(v, dict):
            return {str(k): (str(x).lower() if isinstance(x, bool) else str(x))
                    for k, x in v.items()}
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, x in v.items():
            if not _ENV_NAME.match(k):
                raise ValueError(f"{k!r} is not a variable name (letters, digits and '_', "
                                 "not starting with a digit)")
            _no_nul(x, f"the value of {k}")
        return v

    @field_validator("max_runtime", mode="before", json_schema_input_type=Annotated[
        float, Field(gt=0, le=MAX_RUNTIME_S)] | str | None)
    @classmethod
    def _runtime(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    def request(self) -> Request:
        """The scheduler's view of this spec."""
        r = self.resources
        milli = round(r.gpu_fraction * MILLI) if r.gpu_fraction is not None else 0
        whole = r.gpus + (1 if milli >= MILLI else 0)
        return Request(gpus=whole, gpu_milli=milli if milli < MILLI else 0,
                       gpu_memory_mib=r.gpu_memory or 0, cpus_milli=round(r.cpus * MILLI),
                       memory_mib=r.memory, workers=self.workers, gpu_models=tuple(r.gpu_model),
                       nodes=tuple(self.nodelist))

    def job(self, job_id: int, tenant: str, submit_time: float) -> Job:
        """The scheduler's view of this spec as a platform job."""
        return Job(job_id, submit_time, self.max_runtime or DEFAULT_ESTIMATE_S, self.request(),
                   name=self.name, tenant=tenant, priority=self.priority,
                   preemptible=self.preemptible, time_limit=self.max_runtime,
                   retries=self.retries, dependencies=tuple(self.dependencies()),
                   array_id=self.array_id,
                   array_limit=self.array_limit() if self.array_id is not None else None)
