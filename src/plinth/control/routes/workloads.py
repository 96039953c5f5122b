"""/v1/workloads: submit, list, show and cancel a workload of any kind.

A Job is the simplest kind (`jobs.py`): one gang run once, or an array of them, named by its
id (`12`, or `12_5` for a task of an array). A Service, an FLTask or a Tune has several units,
each an ordinary job (`plinth.control.workloads`), and is named by its name.

A tenant sees only its own workloads: another tenant's answers 404, exactly as one that does
not exist, so that ids and names do not leak what others run.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from plinth.control.auth import Principal
from plinth.control.errors import NotFound
from plinth.control.kinds import CONTROLLERS, check_kind
from plinth.control.routes import jobs
from plinth.control.routes.deps import CP, MAX_ID, Who, scope, tenant_for
from plinth.control.routes.errors import BODY, READ, errors
from plinth.control.service import ControlPlane
from plinth.core.errors import SpecError
from plinth.core.jobspec import JobSpec
from plinth.core.lifecycle import TERMINAL, State
from plinth.core.spec import spec_from_dict

router = APIRouter(tags=["workloads"])

UNIT_KINDS = CONTROLLERS.names()  # the kinds with several units: Service, FLTask, Tune
KINDS = ("Job", *UNIT_KINDS)
# A workload of several units is active while it runs, and ends as a job does (succeeded,
# failed, cancelled).
WORKLOAD_STATES = ("active",)

Ref = Annotated[str, Path(max_length=64, description="a job's id (12), a task of an array "
                                                     "(12_5), or a workload's name")]


class OtherKindSpec(BaseModel):
    """A spec of a kind with several units, checked by that kind's own model (see
    plinth.core.spec): `kind: Service`, `FLTask` or `Tune`."""

    model_config = ConfigDict(extra="allow", strict=True)

    kind: Annotated[str, Field(json_schema_extra={"not": {"const": "Job"}})]


def _spec_kind(body: Any) -> str:
    kind = body.get("kind", "Job") if isinstance(body, dict) else getattr(body, "kind", "Job")
    return "Job" if kind == "Job" else "other"


# A Job's spec is checked as the body is read (it is the hot path); another kind's by its
# kind's model. The tags must be errors.UNION_TAGS.
SpecIn = Annotated[Annotated[JobSpec, Tag("Job")] | Annotated[OtherKindSpec, Tag("other")],
                   Discriminator(_spec_kind)]


class UnitOut(BaseModel):
    unit: str  # "replica-2"
    job_id: int  # its newest job
    state: str
    attempt: int
    reason: str


class WorkloadOut(BaseModel):
    kind: Literal[UNIT_KINDS]  # type: ignore[valid-type]
    id: int
    name: str
    tenant: str
    state: str  # active, succeeded, failed, cancelled
    submit_time: float
    end_time: float | None
    status: dict[str, Any]  # its controller's: desired size and why, addresses, load
    units: list[UnitOut]


class WorkloadDetail(WorkloadOut):
    spec: dict[str, Any]
    history: list[UnitOut]  # every job its units have had, oldest first


def _either(job: type, other: type) -> Any:
    return Annotated[job | other, Field(discriminator="kind")]


Answer = _either(jobs.JobOut, WorkloadOut)  # to a submit or a cancel
Listed = _either(jobs.JobSummary, WorkloadOut)
Detail = _either(jobs.JobDetail, WorkloadDetail)


def workload_out(cp: ControlPlane, row: dict, detail: bool = False) -> dict:
    units = [{"unit": j["unit"], "job_id": j["id"], "state": j["state"],
              "attempt": j["attempt"], "reason": j["reason"]}
             for j in cp.store.units(row["id"])]
    latest = {u["unit"]: u for u in units}  # a unit's newest job
    out = {k: row[k] for k in ("id", "kind", "name", "tenant", "state", "submit_time",
                               "end_time")}
    live = cp.workloads.active.get(row["id"])
    out["status"] = dict(live.status) if live is not None else row["status"]
    out["units"] = sorted(latest.values(), key=lambda u: u["unit"])
    if detail:
        out["spec"], out["history"] = row["spec"], units
    return out


def find_workload(cp: ControlPlane, name: str, who: Principal) -> dict:
    """A workload of several units by name (the newest of that name)."""
    rows = cp.store.workloads(tenant=scope(who), name=name)
    if not rows:
        raise NotFound(f"workload {name!r} not found")
    return rows[0]


@router.post("/v1/workloads", response_model=Answer, status_code=201,
             responses=errors(403, *BODY))
async def submit(spec: SpecIn, cp: CP, who: Who) -> dict:
    """Submit a spec of any kind: a Job (which may leave `kind` out), a Service, an FLTask or
    a Tune. A Job answers with its id (an array's: its first task's, and how many tasks it
    has); another kind with the workload as the list shows it."""
    if isinstance(spec, JobSpec):
        return await jobs.submit(cp, spec, who)
    return await asyncio.to_thread(_submit_units, cp, spec, who)


def _submit_units(cp: ControlPlane, body: OtherKindSpec, who: Principal) -> dict:
    spec = spec_from_dict({**(body.model_extra or {}), "kind": body.kind}, source="")
    check_kind(spec)
    if jobs.JOB_REF.match(spec.name):
        raise SpecError(f"name: {spec.name!r} reads as a job id; a workload's name needs a "
                        "letter")
    w = cp.workloads.submit(spec, tenant_for(cp, spec.tenant, who))
    return workload_out(cp, cp.store.workloads(name=w.name, tenant=w.tenant)[0])


@router.get("/v1/workloads", response_model=list[Listed], responses=errors(*READ))
def list_workloads(
        cp: CP, who: Who, response: Response,
        kind: Annotated[list[Literal[KINDS]] | None, Query()] = None,  # type: ignore[valid-type]
        all: bool = False, tenant: str | None = None,
        state: Annotated[list[str] | None, Query()] = None, name: str | None = None,
        array: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
        offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> list[dict]:
    """Workloads of the kinds asked for (every kind if none), `limit` from `offset`: those of
    several units first, then jobs (the units' jobs among them), each newest first. The
    X-Total-Count header says how many match in all. Active ones only unless `all`; `state`
    (repeated or comma-separated: a job's state, or `active`) implies `all`; `array`: the
    tasks of that job array."""
    if tenant is not None and not who.may_see(tenant):
        response.headers["X-Total-Count"] = "0"
        return []
    kinds = set(kind or KINDS)
    states = jobs.parse_states(state, WORKLOAD_STATES) if state else None
    owner = tenant if tenant is not None else scope(who)
    others: list[dict] = []
    if array is None and kinds & set(UNIT_KINDS):
        others = [r for r in cp.store.workloads(tenant=owner, name=name,
                                                active=None if all or states else True)
                  if r["kind"] in kinds and (states is None or r["state"] in states)]
    page = [workload_out(cp, r) for r in others[offset:offset + limit]]
    total = len(others)
    if "Job" in kinds:
        if states:
            wanted: list[State] | None = [s for s in State if s.value in states]
        else:
            wanted = None if all else [s for s in State if s not in TERMINAL]
        filters = {"tenant": owner, "name": name, "array": array, "states": wanted}
        total += cp.store.count_jobs(**filters)
        room = limit - len(page)
        if room > 0:
            rows = cp.store.jobs(**filters, limit=room, offset=max(0, offset - len(others)))
            page += [jobs.summary(cp, r) for r in rows]
    response.headers["X-Total-Count"] = str(total)
    return page


@router.get("/v1/workloads/{ref}", response_model=Detail, responses=errors(404, *READ))
def show(ref: Ref, cp: CP, who: Who) -> dict:
    """A workload of any kind: a job with its spec, allocation and events; another kind with
    its controller's status and every job its units have had."""
    row = jobs.find(cp, ref, who)
    if row is not None:
        return jobs.detail(cp, row)
    return workload_out(cp, find_workload(cp, ref, who), detail=True)


@router.delete("/v1/workloads/{ref}", response_model=Answer,
               responses=errors(404, 409, *READ))
def cancel(ref: Ref, cp: CP, who: Who, array: bool = False) -> dict:
    """Cancel a workload. A job: at once if it is pending, else SIGTERM and then SIGKILL; with
    `array`, every unfinished task of the array it heads, as `scancel ARRAY` does. Another
    kind: every unit of it."""
    row = jobs.find(cp, ref, who)
    if row is not None:
        return jobs.cancel(cp, row, array)
    w = find_workload(cp, ref, who)
    cp.workloads.cancel(w["id"])
    return workload_out(cp, cp.workloads.find(str(w["id"]), w["tenant"]))
