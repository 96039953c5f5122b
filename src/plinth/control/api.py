"""The REST API (FastAPI; OpenAPI at /docs). Every route but /v1/health needs a bearer token.

A tenant sees only its own jobs: another tenant's job answers 404, exactly as a job that does
not exist, so that ids do not leak what others run.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import asyncio
import os
import re
import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

import plinth
from plinth.control.auth import Auth, Principal, check_tenant_name
from plinth.control.bodylimit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from plinth.control.kinds import check_kind
from plinth.control.errors import Conflict, NotFound
from plinth.control.service import ControlPlane
from plinth.core.jobspec import JobSpec
from plinth.control.store import TOKEN_ID_CHARS, digest
from plinth.control.unit_api import unit_routes
from plinth.core.errors import PlinthError, SpecError, UnplaceableError
from plinth.core.spec import errors_message, spec_from_dict
from plinth.core.lifecycle import TERMINAL, State
from plinth.sched.quota import MAX_QUOTA_GPUS

LOG_CHUNK = 1 << 20
MAX_ID = 2**63 - 1  # SQL BIGINT
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]


class ErrorOut(BaseModel):
    detail: str  # one line that names the field or the job at fault


ERRORS: dict = {code: {"model": ErrorOut, "description": what} for code, what in (
    (400, ("a body that cannot be parsed, or a request the control plane could not carry "
           "out; `detail` says why")),
    (401, "missing or unknown API token"), (403, "not allowed for this token"),
    (404, "no such job, workload, tenant or token (or another tenant's)"),
    (409, "conflicts with the job's state"),
    (411, "a request body that does not declare its length (Content-Length)"),
    (413, "request body over the server's limit; `detail` says the limit"),
    (416, "`offset` is past the end of the log; `detail` and Content-Range say its size"),
    (422, "invalid input; `detail` names the field"))}


def errors(*codes: int) -> dict:
    """The error statuses a route can answer, for its OpenAPI `responses` (every one it can
    answer is listed: the API's fuzz test holds it to them)."""
    return {code: ERRORS[code] for code in sorted(codes)}


READ = (401, 422)  # a route with a token and parameters
BODY = (400, 401, 411, 413, 422)  # a route that takes a body (see bodylimit.py)


class Submitted(BaseModel):
    id: int  # the job's, or an array's (its first task's)
    state: str
    tasks: int | None = None  # an array: how many tasks it has


class JobSummary(BaseModel):
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


class LogChunk(BaseModel):
    data: str
    offset: int  # where the next read starts
    done: bool  # the job has finished and `data` reaches the end of its log


class NodeInfo(BaseModel):
    name: str
    gpu_model: str | None
    gpus: int
    gpus_used: float
    gpu_free_milli: list[int]
    cpus: float
    cpus_used: float
    memory_mib: int
    memory_used_mib: int
    running: list[int]


# API bodies are strict (`true` is not a number, "4" is not 4) and their numbers finite.
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TenantIn(BaseModel):
    model_config = STRICT

    gpus: float | None = Field(None, ge=0, le=MAX_QUOTA_GPUS,
                               description="nominal GPU quota; null: an equal share")
    borrowing_limit: float | None = Field(None, ge=0, le=MAX_QUOTA_GPUS)
    user: str | None = Field(None, min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_][\w.-]*$",
                             description="an existing Unix user its jobs run as (root "
                                         "server); null: its own, made for it")


class TenantOut(BaseModel):
    name: str
    gpus: float | None
    borrowing_limit: float | None
    user: str | None  # the Unix user its jobs run as; null: the server's


class TokenIn(BaseModel):
    model_config = STRICT

    expires_in: float | None = Field(None, gt=0, le=10 * 365 * 86400,
                                     description="seconds until it stops working; null: never")


class TokenOut(BaseModel):
    id: str  # names the token in lists and `revoke`; cannot log in
    tenant: str
    token: str
    expires: float | None


class TokenInfo(BaseModel):
    id: str
    tenant: str
    admin: bool
    created: float
    expires: float | None


class UnitOut(BaseModel):
    unit: str  # "replica-2"
    job_id: int  # its newest job
    state: str
    attempt: int
    reason: str


class WorkloadOut(BaseModel):
    id: int
    kind: str  # Service, ...
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


class Health(BaseModel):
    status: str
    version: str
    policy: str
    nodes: int
    gpus: int
    isolation: str
    min_runtime_s: float  # the scheduler's config, for `plinth export`
    round_s: float


_SIM_TIME = re.compile(r"\bt=(\d+(?:\.\d+)?)s\b")


def wall_times(reason: str) -> str:
    """The scheduler writes times as `t=<seconds>s` (virtual time in the simulator); on the
    platform they are wall-clock seconds, shown as local clock times."""
    return _SIM_TIME.sub(lambda m: time.strftime("%H:%M:%S", time.localtime(float(m.group(1)))),
                         reason)


def parse_states(values: list[str]) -> list[State]:
    """`--state pending,running` (or the option repeated) as states; an unknown one is an error
    that lists the known ones."""
    names = [v.strip().lower() for item in values for v in item.split(",") if v.strip()]
    known = {s.value: s for s in State}
    bad = next((n for n in names if n not in known), None)
    if bad is not None:
        raise SpecError(f"state: unknown state {bad!r}; choose from {', '.join(known)}")
    return [known[n] for n in names]


def create_app(cp: ControlPlane, auth: Auth, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="Plinth", version=plinth.__version__,
                  description="Submit, watch and cancel jobs on a Plinth cluster.")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False)

    # Cheap routes and dependencies are `async def`: they run on the event loop, without a hop
    # through the thread pool. Routes that read the store are plain `def` and use the pool.
    async def principal(cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                  ) -> Principal:
        who = auth.principal(cred.credentials if cred else None)
        if who is None:
            raise HTTPException(401, "missing or unknown API token",
                                headers={"WWW-Authenticate": "Bearer"})
        return who

    async def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.admin:
            raise HTTPException(403, "this needs an admin token")
        return who

    Who = Annotated[Principal, Depends(principal)]
    Admin = Annotated[Principal, Depends(admin)]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # The same one line as `plinth submit` prints for a bad file, without the "body" prefix.
        errs = [{**e, "loc": tuple(p for p in e.get("loc", ()) if p != "body")}
                for e in exc.errors()] or [{"type": "invalid", "loc": (), "msg": "invalid request"}]
        return JSONResponse(status_code=422, content={"detail": errors_message("", errs, JobSpec)})

    @app.exception_handler(PlinthError)
    async def _plinth(_: Request, exc: PlinthError) -> JSONResponse:
        code = (404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict)
                else 422 if isinstance(exc, (SpecError, UnplaceableError)) else 400)
        return JSONResponse(status_code=code, content={"detail": str(exc)})

    def visible(job_id: int, who: Principal) -> dict:
        row = cp.store.job(job_id)
        if row is None or not who.may_see(row["tenant"]):
            raise NotFound(f"job {job_id} not found")
        return row

    def summary(row: dict) -> dict:
        spec = row["spec"]
        res = spec.get("resources", {})
        per_worker = res.get("gpus") or res.get("gpu_fraction") or 0
        reason = row["reason"]
        if row["state"] == State.PENDING.value:
            reason = wall_times(cp.reason(row["id"]) or reason)
        return {**{k: row[k] for k in JobSummary.model_fields if k in row},
                "gpus": per_worker * spec.get("workers", 1), "workers": spec.get("workers", 1),
                "reason": reason}

    @app.get("/v1/health", response_model=Health)
    async def health() -> dict:
        return {"status": "ok", "version": plinth.__version__, "policy": cp.policy_name,
                "nodes": len(cp.cluster.nodes), "gpus": cp.cluster.total_gpus,
                "isolation": getattr(cp.runtime, "isolation", "none"),
                "min_runtime_s": cp.config.min_runtime, "round_s": cp.config.round_s}

    def tenant_for(asked: str | None, who: Principal) -> str:
        tenant = asked or who.tenant
        if tenant != who.tenant and not who.admin:
            raise HTTPException(403, f"a token of tenant {who.tenant!r} cannot submit for "
                                     f"tenant {tenant!r}")
        if tenant not in cp.tenant_names:
            raise SpecError(f"tenant: unknown tenant {tenant!r}")
        return tenant

    @app.post("/v1/jobs", response_model=Submitted, status_code=201,
              responses=errors(403, *BODY))
    async def submit(spec: JobSpec, who: Who) -> dict:
        tenant = tenant_for(spec.tenant, who)
        for kind, dep in spec.dependencies():
            found = cp.store.job(dep)
            if found is None or not who.may_see(found["tenant"]):
                raise SpecError(f"{kind}: job {dep} not found")
        spec, row, now = cp.admit(spec, tenant)
        if spec.array:
            ids = await asyncio.to_thread(cp.submit_tasks, spec, row, now)
            return {"id": ids[0], "state": State.PENDING.value, "tasks": len(ids)}
        job_id = await asyncio.wrap_future(cp.writer.insert(row, now))  # group commit
        return {"id": cp.accepted(job_id, spec, now), "state": State.PENDING.value}

    @app.get("/v1/jobs", response_model=list[JobSummary],
             responses=errors(*READ))
    def list_jobs(who: Who, response: Response, all: bool = False, tenant: str | None = None,
                  state: Annotated[list[str] | None, Query()] = None, name: str | None = None,
                  array: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                  limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
                  offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> list[dict]:
        """Jobs newest first, `limit` from `offset`; the X-Total-Count header says how many
        match in all. `state` (repeated or comma-separated) implies `all`."""
        if tenant is not None and not who.may_see(tenant):
            response.headers["X-Total-Count"] = "0"
            return []
        scope = tenant if tenant is not None else (None if who.admin else who.tenant)
        states = parse_states(state) if state else (
            None if all else [s for s in State if s not in TERMINAL])
        filters = {"tenant": scope, "states": states, "name": name, "array": array}
        response.headers["X-Total-Count"] = str(cp.store.count_jobs(**filters))
        return [summary(r) for r in cp.store.jobs(**filters, limit=limit, offset=offset)]

    @app.get("/v1/jobs/{job_id}", response_model=JobDetail,
             responses=errors(404, *READ))
    def show(job_id: JobId, who: Who) -> dict:
        row = visible(job_id, who)
        alloc = row["allocation"]
        if alloc:  # name the nodes: the stored allocation holds their indices
            names = [n.name for n in cp.cluster.nodes]
            alloc = {"slots": [{**s, "node_name": names[s["node"]] if s["node"] < len(names)
                                else None} for s in alloc["slots"]]}
        return {**summary(row), "spec": row["spec"], "allocation": alloc,
                "events": [{"time": e["time"], "kind": e["kind"], "message": e["message"]}
                           for e in cp.store.events(job_id)]}

    @app.post("/v1/jobs/{job_id}/cancel", response_model=Submitted,
              responses=errors(404, 409, *BODY))
    def cancel(job_id: JobId, who: Who, array: bool = False) -> dict:
        """Cancel a job; with `array`, every unfinished task of the array it heads, as
        `scancel ARRAY` does."""
        row = visible(job_id, who)
        if array and row["array_id"] == job_id:  # every task in one turn, one transaction
            cp.cancel_array(job_id)
            return {"id": job_id, "state": (cp.store.job(job_id) or row)["state"]}
        return {"id": job_id, "state": cp.cancel(job_id)}

    @app.get("/v1/jobs/{job_id}/logs", response_model=LogChunk,
             responses=errors(404, 416, *READ))
    def logs(job_id: JobId, who: Who, offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> dict:
        """Up to 1 MiB of the job's log from byte `offset` (a job that has not started has an
        empty log). An offset past the log's end answers 416, with the log's size."""
        row = visible(job_id, who)
        data, size = b"", 0
        try:
            with open(cp.log_path(job_id), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if offset <= size:  # seeking far past the end fails (EINVAL on ext4)
                    f.seek(offset)
                    data = f.read(LOG_CHUNK)
        except FileNotFoundError:  # not started yet: an empty log
            pass
        if offset > size:
            raise HTTPException(416, f"offset: {offset} is past the end of job {job_id}'s log "
                                     f"({size} bytes)",
                                headers={"Content-Range": f"bytes */{size}"})
        done = State(row["state"]).terminal and len(data) < LOG_CHUNK
        return {"data": data.decode("utf-8", "replace"), "offset": offset + len(data),
                "done": done}

    # --- workloads of several units (Service, ...) -------------------------------------------

    def workload_out(row: dict, detail: bool = False) -> dict:
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

    def visible_workload(ref: str, who: Principal) -> dict:
        return cp.workloads.find(ref, None if who.admin else who.tenant)

    @app.post("/v1/workloads", response_model=WorkloadOut, status_code=201,
              responses=errors(403, *BODY))
    def submit_workload(body: dict[str, Any], who: Who) -> dict:
        """Submit a spec of a kind with several units (`kind: Service`); a Job goes to
        /v1/jobs."""
        spec = spec_from_dict(body, source="")
        if spec.kind == "Job":
            raise SpecError("kind: a Job is submitted to /v1/jobs")
        check_kind(spec)
        w = cp.workloads.submit(spec, tenant_for(spec.tenant, who))
        return workload_out(cp.store.workloads(name=w.name, tenant=w.tenant)[0])

    @app.get("/v1/workloads", response_model=list[WorkloadOut],
             responses=errors(*READ))
    def list_workloads(who: Who, all: bool = False) -> list[dict]:
        rows = cp.workloads.rows(None if who.admin else who.tenant, None if all else True)
        return [workload_out(r) for r in rows]

    @app.get("/v1/workloads/{ref}", response_model=WorkloadDetail,
             responses=errors(404, *READ))
    def show_workload(ref: Annotated[str, Path(max_length=64)], who: Who) -> dict:
        return workload_out(visible_workload(ref, who), detail=True)

    @app.post("/v1/workloads/{ref}/cancel", response_model=WorkloadOut,
              responses=errors(404, 409, *BODY))
    def cancel_workload(ref: Annotated[str, Path(max_length=64)], who: Who) -> dict:
        row = visible_workload(ref, who)
        cp.workloads.cancel(row["id"])
        return workload_out(cp.workloads.find(str(row["id"]), row["tenant"]))

    @app.get("/v1/nodes", response_model=list[NodeInfo],
             responses=errors(401))
    async def nodes(who: Who) -> list[dict]:
        return cp.node_usage(None if who.admin else who.tenant)

    @app.get("/v1/tenants", response_model=list[TenantOut],
             responses=errors(401, 403))
    def list_tenants(_: Admin) -> list[dict]:
        return [{**r, "user": r["unix_user"]} for r in cp.store.tenants()]

    @app.put("/v1/tenants/{name}", response_model=TenantOut,
             responses=errors(403, *BODY))
    def put_tenant(name: str, body: TenantIn, _: Admin) -> dict:
        check_tenant_name(name)
        user = cp.set_tenant(name, body.gpus, body.borrowing_limit, body.user)
        return {"name": name, **body.model_dump(), "user": user}

    @app.post("/v1/tenants/{name}/tokens", response_model=TokenOut, status_code=201,
              responses=errors(403, 404, *BODY))
    def add_token(name: str, _: Admin, body: TokenIn | None = None) -> dict:
        if name not in cp.tenant_names:
            raise NotFound(f"tenant {name!r} not found")
        expires = None if body is None or body.expires_in is None else \
            time.time() + body.expires_in
        token = auth.add_token(name, expires=expires)
        return {"id": digest(token)[:TOKEN_ID_CHARS], "tenant": name, "token": token,
                "expires": expires}

    @app.get("/v1/tokens", response_model=list[TokenInfo],
             responses=errors(403, *READ))
    def list_tokens(_: Admin, tenant: str | None = None) -> list[dict]:
        return cp.store.token_rows(tenant)

    @app.delete("/v1/tokens/{token_id}", status_code=204,
                responses=errors(403, 404, *READ))
    def revoke_token(token_id: str, _: Admin) -> None:
        if not auth.revoke(token_id):
            raise NotFound(f"token {token_id!r} not found (give the id `plinth tenant tokens` "
                           "shows)")

    app.include_router(unit_routes(cp, errors(401, 409, *BODY)))

    from plinth.control.ui import mount  # the dashboard (/ui) and /metrics; imports this module

    mount(app, cp, auth)
    return app
