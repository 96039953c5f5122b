"""The dashboard's routes: one full page and one live fragment (polled by htmx) per view."""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import json
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from plinth.control.auth import Auth, Principal
from plinth.control.errors import Conflict, NotFound
from plinth.control.routes.deps import JobId
from plinth.control.routes.jobs import wall_times
from plinth.control.service import ControlPlane
from plinth.control.ui import results, views
from plinth.core.errors import PlinthError, SpecError
from plinth.core.lifecycle import TERMINAL, State

COOKIE = "plinth_token"
POLL = "every 2s"  # the live parts; the issue allows no faster than once a second
STOP_POLLING = 286  # htmx stops polling an element on this status (a finished job)
MAX_RESULT_BYTES = 64 << 20

HERE = Path(__file__).parent


def _ago(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _clock(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters.update(ago=_ago, clock=_clock, wall=wall_times)


def router(cp: ControlPlane, auth: Auth) -> APIRouter:
    r = APIRouter(include_in_schema=False)

    def principal(request: Request) -> Principal | None:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        return auth.principal(token or request.cookies.get(COOKIE))

    async def viewer(request: Request) -> Principal:
        who = principal(request)
        if who is None:
            if request.headers.get("hx-request"):  # a fragment: the page shows the error
                raise HTTPException(401, "sign in again: missing or unknown API token")
            raise HTTPException(303, "sign in", headers={"Location": "/ui/login"})
        return who

    Who = Annotated[Principal, Depends(viewer)]

    def page(request: Request, name: str, who: Principal | None, status: int = 200,
             **ctx) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"who": who, **ctx}, status_code=status)

    def visible(job_id: int, who: Principal) -> dict:
        row = cp.store.job(job_id)
        if row is None or not who.may_see(row["tenant"]):
            raise HTTPException(404, f"job {job_id} not found")
        return row

    # --- signing in -----------------------------------------------------------------------------

    @r.get("/ui")
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/cluster", 303)

    @r.get("/ui/login", response_class=HTMLResponse)
    async def login_form(request: Request) -> HTMLResponse:
        return page(request, "login.html", None, error="")

    @r.post("/ui/login")
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        if auth.principal(token) is None:
            return page(request, "login.html", None, 401, error="unknown API token")
        resp = RedirectResponse("/ui/cluster", 303)
        resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return resp

    @r.post("/ui/logout")
    async def logout() -> Response:
        resp = RedirectResponse("/ui/login", 303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    # --- pages ----------------------------------------------------------------------------------

    @r.get("/ui/cluster", response_class=HTMLResponse)
    def cluster_page(request: Request, who: Who) -> HTMLResponse:
        return page(request, "cluster.html", who, view=views.cluster(cp, who), poll=POLL)

    @r.get("/ui/cluster/live", response_class=HTMLResponse)
    def cluster_live(request: Request, who: Who) -> HTMLResponse:
        return page(request, "_cluster.html", who, view=views.cluster(cp, who))

    @r.get("/ui/queue", response_class=HTMLResponse)
    def queue_page(request: Request, who: Who,
                   page_no: Annotated[int, Query(alias="page", ge=1, le=10**9)] = 1
                   ) -> HTMLResponse:
        view = views.queue(cp, who, page_no, cp.clock())
        return page(request, "queue.html", who, view=view, poll=POLL, policy=cp.policy_name)

    @r.get("/ui/queue/live", response_class=HTMLResponse)
    def queue_live(request: Request, who: Who,
                   page_no: Annotated[int, Query(alias="page", ge=1, le=10**9)] = 1
                   ) -> HTMLResponse:
        view = views.queue(cp, who, page_no, cp.clock())
        return page(request, "_queue.html", who, view=view, policy=cp.policy_name)

    def job_context(job_id: int, who: Principal) -> dict:
        row = visible(job_id, who)
        reason = row["reason"]
        if row["state"] == State.PENDING.value:
            reason = wall_times(cp.reason(job_id) or reason)
        return {"job": row, "reason": reason, "events": cp.store.events(job_id),
                "slots": views.allocation(cp, row["allocation"]),
                "finished": State(row["state"]) in TERMINAL}

    @r.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
    def job_page(request: Request, job_id: JobId, who: Who) -> HTMLResponse:
        ctx = job_context(job_id, who)
        return page(request, "job.html", who, poll=POLL, log=views.log_tail(cp, job_id),
                    spec=json.dumps(ctx["job"]["spec"], indent=2), **ctx)

    @r.get("/ui/jobs/{job_id}/live", response_class=HTMLResponse)
    def job_live(request: Request, job_id: JobId, who: Who) -> HTMLResponse:
        ctx = job_context(job_id, who)
        return page(request, "_job.html", who, STOP_POLLING if ctx["finished"] else 200, **ctx)

    @r.get("/ui/jobs/{job_id}/log", response_class=HTMLResponse)
    def job_log(request: Request, job_id: JobId, who: Who) -> HTMLResponse:
        row = visible(job_id, who)
        status = STOP_POLLING if State(row["state"]) in TERMINAL else 200
        return page(request, "_log.html", who, status, log=views.log_tail(cp, job_id))

    @r.post("/ui/jobs/{job_id}/cancel", response_class=HTMLResponse)
    def job_cancel(request: Request, job_id: JobId, who: Who) -> HTMLResponse:
        if not request.headers.get("hx-request"):  # a cross-site form cannot set this header
            raise HTTPException(403, "cancel from the dashboard's button (HX-Request missing)")
        visible(job_id, who)  # the owner's tenant or the admin: others get 404
        try:
            state, error = cp.cancel(job_id), ""
        except (Conflict, NotFound) as e:
            state, error = None, str(e)
        return page(request, "_cancelled.html", who, state=state, error=error)

    @r.get("/ui/simulations", response_class=HTMLResponse)
    async def sim_page(request: Request, who: Who) -> HTMLResponse:
        return page(request, "simulations.html", who)

    async def opened(request: Request, who: Principal, view, template: str) -> HTMLResponse:
        """A results file posted by the page, drawn, or a one-line error."""
        body = await request.body()
        try:
            if len(body) > MAX_RESULT_BYTES:
                raise SpecError(f"results file: {len(body)} bytes is over the "
                                f"{MAX_RESULT_BYTES} byte limit")
            try:
                data = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise SpecError(f"results file: not JSON ({e})") from None
            # drawing takes a moment (matplotlib): off the event loop that serves the API
            return page(request, template, who, view=await run_in_threadpool(view, data))
        except PlinthError as e:
            return page(request, "_error.html", who, 422, error=str(e))

    @r.post("/ui/simulations", response_class=HTMLResponse)
    async def sim_open(request: Request, who: Who) -> HTMLResponse:
        return await opened(request, who, results.sim_view, "_simulation.html")

    @r.get("/ui/fl", response_class=HTMLResponse)
    def fl_page(request: Request, who: Who) -> HTMLResponse:
        return page(request, "fl.html", who, tasks=views.fl_tasks(cp, who), poll=POLL)

    @r.get("/ui/fl/live", response_class=HTMLResponse)
    def fl_live(request: Request, who: Who) -> HTMLResponse:
        return page(request, "_fl_tasks.html", who, tasks=views.fl_tasks(cp, who))

    @r.post("/ui/fl", response_class=HTMLResponse)
    async def fl_open(request: Request, who: Who) -> HTMLResponse:
        return await opened(request, who, results.fl_view, "_fl.html")

    @r.get("/ui/services", response_class=HTMLResponse)
    def services_page(request: Request, who: Who) -> HTMLResponse:
        return page(request, "services.html", who, services=views.services(cp, who), poll=POLL)

    @r.get("/ui/services/live", response_class=HTMLResponse)
    def services_live(request: Request, who: Who) -> HTMLResponse:
        return page(request, "_services.html", who, services=views.services(cp, who))

    # --- Prometheus -----------------------------------------------------------------------------

    @r.get("/metrics")
    def metrics(request: Request) -> Response:
        who = principal(request)
        if who is None:
            raise HTTPException(401, "missing or unknown API token",
                                headers={"WWW-Authenticate": "Bearer"})
        if not who.admin:
            raise HTTPException(403, "/metrics needs an admin token (its labels name every "
                                     "tenant)")
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(cp.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return r

