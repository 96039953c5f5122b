"""/v1/tenants and /v1/tokens: tenants, their GPU quotas and their API tokens (admin only)."""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import time

from fastapi import APIRouter
from pydantic import BaseModel, Field

from plinth.control.auth import check_tenant_name
from plinth.control.errors import NotFound
from plinth.control.routes.deps import CP, STRICT, Admin, Tokens
from plinth.control.routes.errors import BODY, READ, errors
from plinth.control.store import TOKEN_ID_CHARS, digest
from plinth.sched.quota import MAX_QUOTA_GPUS

router = APIRouter(tags=["tenants"])


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


@router.get("/v1/tenants", response_model=list[TenantOut], responses=errors(401, 403))
def list_tenants(cp: CP, _: Admin) -> list[dict]:
    return [{**r, "user": r["unix_user"]} for r in cp.store.tenants()]


@router.put("/v1/tenants/{name}", response_model=TenantOut, responses=errors(403, *BODY))
def put_tenant(name: str, body: TenantIn, cp: CP, _: Admin) -> dict:
    check_tenant_name(name)
    user = cp.set_tenant(name, body.gpus, body.borrowing_limit, body.user)
    return {"name": name, **body.model_dump(), "user": user}


@router.post("/v1/tenants/{name}/tokens", response_model=TokenOut, status_code=201,
             responses=errors(403, 404, *BODY))
def add_token(name: str, cp: CP, auth: Tokens, _: Admin, body: TokenIn | None = None) -> dict:
    if name not in cp.tenant_names:
        raise NotFound(f"tenant {name!r} not found")
    expires = None if body is None or body.expires_in is None else \
        time.time() + body.expires_in
    token = auth.add_token(name, expires=expires)
    return {"id": digest(token)[:TOKEN_ID_CHARS], "tenant": name, "token": token,
            "expires": expires}


@router.get("/v1/tokens", response_model=list[TokenInfo], responses=errors(403, *READ))
def list_tokens(cp: CP, _: Admin, tenant: str | None = None) -> list[dict]:
    return cp.store.token_rows(tenant)


@router.delete("/v1/tokens/{token_id}", status_code=204, responses=errors(403, 404, *READ))
def revoke_token(token_id: str, auth: Tokens, _: Admin) -> None:
    if not auth.revoke(token_id):
        raise NotFound(f"token {token_id!r} not found (give the id `plinth tenant tokens` "
                       "shows)")
