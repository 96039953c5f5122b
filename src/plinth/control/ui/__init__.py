"""The web dashboard at /ui and Prometheus metrics at /metrics, on the API's port and tokens.

Server-side Jinja2 templates; htmx (vendored in `static/`, no build step) polls each page's live
part every two seconds. A browser signs in once with an API token (`/ui/login`), which is kept
in an HttpOnly, SameSite=Strict cookie; a request may instead send the usual bearer header.
A tenant's token sees its own workloads only: another tenant's job is a 404 on every page and
fragment, as in the REST API. /metrics needs an admin token (its labels name every tenant).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.ui.routes import router


def mount(app: FastAPI, cp: ControlPlane, auth: Auth) -> None:
    app.include_router(router(cp, auth))
    # htmx and the style sheet: public files, the same for every user
    app.mount("/ui/static", StaticFiles(directory=Path(__file__).parent / "static"),
              name="ui-static")
