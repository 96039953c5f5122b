"""What the API's routes share: the control plane, the caller (from the bearer token), and the
checks that every route makes the same way.

`create_app` (plinth.control.api) puts the control plane and the token store on `app.state`;
a route asks for them as parameters: `cp: CP`, `who: Who` (any valid token) or `_: Admin`.

Cheap dependencies are `async def`: they run on the event loop, without a hop through the
thread pool. Routes that read the store are plain `def` and use the pool.
"""

# No `from __future__ import annotations`: FastAPI reads the annotations at runtime.

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ConfigDict

from plinth.control.auth import Auth, Principal
from plinth.control.service import ControlPlane
from plinth.core.errors import SpecError

MAX_ID = 2**63 - 1  # SQL BIGINT
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]

# API bodies are strict (`true` is not a number, "4" is not 4) and their numbers finite.
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

_bearer = HTTPBearer(auto_error=False)


async def control_plane(request: Request) -> ControlPlane:
    return request.app.state.cp


async def tokens(request: Request) -> Auth:
    return request.app.state.auth


CP = Annotated[ControlPlane, Depends(control_plane)]
Tokens = Annotated[Auth, Depends(tokens)]


async def principal(auth: Tokens,
                    cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
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


def tenant_for(cp: ControlPlane, asked: str | None, who: Principal) -> str:
    """The tenant a submission is for: the one it names, else the token's. Only an admin
    token submits for another tenant."""
    tenant = asked or who.tenant
    if tenant != who.tenant and not who.admin:
        raise HTTPException(403, f"a token of tenant {who.tenant!r} cannot submit for "
                                 f"tenant {tenant!r}")
    if tenant not in cp.tenant_names:
        raise SpecError(f"tenant: unknown tenant {tenant!r}")
    return tenant


def scope(who: Principal) -> str | None:
    """The tenant whose things the token may see; None: every tenant's (an admin token)."""
    return None if who.admin else who.tenant
