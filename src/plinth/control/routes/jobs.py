"""The Job kind in the API: a job's summary, detail and answers, and how a job is submitted,
found by its reference and cancelled. Its routes are the workloads' (`workloads.py`): a Job is
the simplest kind of workload, one gang run once, or an array of them.

A job is named by its id (`12`), or a task of an array as Slurm writes it (`12_5`: task 5 of
array 12). The jobs of other kinds' units are jobs too, named by id.
"""

# No `from __future__ import annotations`: FastAPI reads the models at runtime.

import asyncio
import re
import time
from typing import Any, Literal

from pydantic import BaseModel

from plinth.control.auth import Principal
from plinth.control.errors import NotFound
from plinth.control.routes.deps import MAX_ID, tenant_for
from plinth.control.service import ControlPlane
from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.lifecycle import State

JOB_REF = re.compile(r"^([0-9]+)(?:_([0-9]+))?$")  # 12, or 12_5


class JobOut(BaseModel):
    """A Job as submitting or cancelling it answers: its id and its state."""

    kind: Literal["Job"] = "Job"
    id: int  # the job's, or an array's (its first task's)
    name: str
    tenant: str
    state: str
    tasks: int | None = None  # an array, on submit: how many tasks it has


class JobSummary(BaseModel):
    kind: Literal["Job"] = "Job"
    id: int
    name: str
    tenant: str
    state: str
    priority: int
    submit_time: float
    start_time: float | None
    end_time: float | None
    attempt: int
    exit_code: int | None
    preemptions: int
    checkpoint_step: int | None = None  # the last checkpoint the job reported, and when
    checkpoint_time: float | None = None
    array_id: int | None = None  # a task of this array,
    array_index: int | None = None  # with this index
    workload_id: int | None = None  # a unit of this workload (of another kind),
    unit: str | None = None  # by this name within it
    gpus: float
    workers: int
    reason: str


class JobEvent(BaseModel):
    time: float
    kind: str
    message: str


class JobDetail(JobSummary):
    spec: dict[str, Any]
    allocation: dict[str, Any] | None
    events: list[JobEvent]


_SIM_TIME = re.compile(r"\bt=(\d+(?:\.\d+)?)s\b")


def wall_times(reason: str) -> str:
    """The scheduler writes times as `t=<seconds>s` (virtual time in the simulator); on the
    platform they are wall-clock seconds, shown as local clock times."""
    return _SIM_TIME.sub(lambda m: time.strftime("%H:%M:%S", time.localtime(float(m.group(1)))),
                         reason)


def parse_states(values: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """`--state pending,running` (or the option repeated) as state names; an unknown one is an
    error that lists the known ones (the job states, and `extra`)."""
    names = [v.strip().lower() for item in values for v in item.split(",") if v.strip()]
    known = [s.value for s in State]
    known += [e for e in extra if e not in known]
    bad = next((n for n in names if n not in known), None)
    if bad is not None:
        raise SpecError(f"state: unknown state {bad!r}; choose from {', '.join(known)}")
    return names


def summary(cp: ControlPlane, row: dict) -> dict:
    spec = row["spec"]
    res = spec.get("resources", {})
    per_worker = res.get("gpus") or res.get("gpu_fraction") or 0
    reason = row["reason"]
    if row["state"] == State.PENDING.value:
        reason = wall_times(cp.reason(row["id"]) or reason)
    return {**{k: row[k] for k in JobSummary.model_fields if k in row}, "kind": "Job",
            "gpus": per_worker * spec.get("workers", 1), "workers": spec.get("workers", 1),
            "reason": reason}


def detail(cp: ControlPlane, row: dict) -> dict:
    alloc = row["allocation"]
    if alloc:  # name the nodes: the stored allocation holds their indices
        names = [n.name for n in cp.cluster.nodes]
        alloc = {"slots": [{**s, "node_name": names[s["node"]] if s["node"] < len(names)
                            else None} for s in alloc["slots"]]}
    return {**summary(cp, row), "spec": row["spec"], "allocation": alloc,
            "events": [{"time": e["time"], "kind": e["kind"], "message": e["message"]}
                       for e in cp.store.events(row["id"])]}


def visible(cp: ControlPlane, job_id: int, who: Principal) -> dict:
    """A job's row; another tenant's job is not found, exactly as one that does not exist."""
    row = cp.store.job(job_id) if 1 <= job_id <= MAX_ID else None
    if row is None or not who.may_see(row["tenant"]):
        raise NotFound(f"job {job_id} not found")
    return row


def find(cp: ControlPlane, ref: str, who: Principal) -> dict | None:
    """The row of the job `ref` names (`12`, or `12_5`); None if `ref` does not name a job
    (it names a workload of another kind)."""
    m = JOB_REF.match(ref)
    if m is None:
        return None
    head, index = m.groups()
    if index is None:
        return visible(cp, int(head), who)
    array = int(head)
    tasks = cp.store.jobs(array=array, index=int(index), limit=1) \
        if array <= MAX_ID and int(index) <= MAX_ID else []
    if not tasks or not who.may_see(tasks[0]["tenant"]):
        raise NotFound(f"job {ref} not found")
    return tasks[0]


async def submit(cp: ControlPlane, spec: JobSpec, who: Principal) -> dict:
    tenant = tenant_for(cp, spec.tenant, who)
    for kind, dep in spec.dependencies():
        found = cp.store.job(dep)
        if found is None or not who.may_see(found["tenant"]):
            raise SpecError(f"{kind}: job {dep} not found")
    spec, row, now = cp.admit(spec, tenant)
    out = {"kind": "Job", "name": spec.name, "tenant": tenant, "state": State.PENDING.value}
    if spec.array:
        ids = await asyncio.to_thread(cp.submit_tasks, spec, row, now)
        return {**out, "id": ids[0], "tasks": len(ids)}
    job_id = await asyncio.wrap_future(cp.writer.insert(row, now))  # group commit
    return {**out, "id": cp.accepted(job_id, spec, now)}


def cancel(cp: ControlPlane, row: dict, array: bool) -> dict:
    """Cancel a job; with `array`, every unfinished task of the array it heads, as
    `scancel ARRAY` does."""
    job_id = row["id"]
    out = {"kind": "Job", "id": job_id, "name": row["name"], "tenant": row["tenant"]}
    if array and row["array_id"] == job_id:  # every task in one turn, one transaction
        cp.cancel_array(job_id)
        return {**out, "state": (cp.store.job(job_id) or row)["state"]}
    return {**out, "state": cp.cancel(job_id)}
