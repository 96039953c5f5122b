"""The API's errors: one line in `detail` that names the field or the job at fault.

Each route lists the statuses it can answer (`errors(...)`) for its OpenAPI `responses`; the
API's fuzz test holds it to them.
"""

# No `from __future__ import annotations`: FastAPI reads the models at runtime.

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from plinth.control.errors import Conflict, NotFound
from plinth.core.errors import PlinthError, SpecError, UnplaceableError
from plinth.core.jobspec import JobSpec
from plinth.core.spec import errors_message


class ErrorOut(BaseModel):
    detail: str  # one line that names the field or the job at fault


ERRORS: dict = {code: {"model": ErrorOut, "description": what} for code, what in (
    (400, ("a body that cannot be parsed, or a request the control plane could not carry "
           "out; `detail` says why")),
    (401, "missing or unknown API token"), (403, "not allowed for this token"),
    (404, "no such workload, job, tenant or token (or another tenant's)"),
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

# The tags of a body that is one of several models (a spec of any kind, see workloads.py):
# pydantic puts the tag in an error's location, where a user wants the field alone.
UNION_TAGS = frozenset({"Job", "other"})


async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """The same one line as `plinth submit` prints for a bad file, without the "body" prefix."""
    errs = [{**e, "loc": _field(tuple(e.get("loc", ())))} for e in exc.errors()] or [
        {"type": "invalid", "loc": (), "msg": "invalid request"}]
    return JSONResponse(status_code=422, content={"detail": errors_message("", errs, JobSpec)})


def _field(loc: tuple) -> tuple:
    if loc[:1] == ("body",):
        loc = loc[1:]
        if loc[:1] and loc[0] in UNION_TAGS:
            loc = loc[1:]
    return loc


async def refused(_: Request, exc: PlinthError) -> JSONResponse:
    code = (404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict)
            else 422 if isinstance(exc, (SpecError, UnplaceableError)) else 400)
    return JSONResponse(status_code=code, content={"detail": str(exc)})


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(PlinthError, refused)  # type: ignore[arg-type]
