"""The REST API (FastAPI; OpenAPI at /docs), assembled from one router per resource
(`plinth.control.routes`). Every route but /v1/health needs a bearer token.

A tenant sees only its own workloads: another tenant's answers 404, exactly as one that does
not exist, so that ids do not leak what others run.
"""

from __future__ import annotations

from fastapi import FastAPI

import plinth
from plinth.control import ui
from plinth.control.auth import Auth
from plinth.control.bodylimit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from plinth.control.routes import errors, health, logs, nodes, tenants, units, workloads
from plinth.control.service import ControlPlane

ROUTERS = (health.router, workloads.router, logs.router, nodes.router, tenants.router,
           units.router)


def create_app(cp: ControlPlane, auth: Auth, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="Plinth", version=plinth.__version__,
                  description="Submit, watch and cancel workloads (jobs, services, federated "
                              "tasks, tuning) on a Plinth cluster.")
    app.state.cp, app.state.auth = cp, auth  # what routes/deps.py hands to each route
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    ui.mount(app, cp, auth)  # the dashboard (/ui) and /metrics
    return app
