"""`POST /v1/units/report`: a unit's report of its state (`plinth.runtime.report`).

Authenticated by the unit's own token (`plinth.control.unitauth`), scoped to one attempt of its
job; an API token is not one. The body is checked with the model its kind's controller names
for that unit, and a bad one is a one-line 422 naming the field. An attempt that has been
replaced gets 409: a unit that comes back after its node was lost cannot overwrite the state
its replacement reports.
"""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from plinth.control.routes.deps import CP
from plinth.control.routes.errors import BODY, errors
from plinth.control.unitauth import BadCredential
from plinth.control.workloads import Fenced

router = APIRouter(tags=["units"])
_bearer = HTTPBearer(auto_error=False)


@router.post("/v1/units/report", status_code=204, responses=errors(401, 409, *BODY))
def report(cp: CP, cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
           body: Annotated[dict[str, Any], Body()]) -> None:
    try:
        cp.workloads.report(cred.credentials if cred else "", body)
    except BadCredential as e:
        raise HTTPException(401, f"{e}: a unit reports with its PLINTH_UNIT_TOKEN",
                            headers={"WWW-Authenticate": "Bearer"}) from None
    except Fenced as e:
        raise HTTPException(409, f"fenced: {e}") from None
