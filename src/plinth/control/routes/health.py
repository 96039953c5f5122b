"""/v1/health: whether the control plane answers, and how it is set up. No token needed."""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

from fastapi import APIRouter
from pydantic import BaseModel

import plinth
from plinth.control.routes.deps import CP

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    version: str
    policy: str
    nodes: int
    gpus: int
    isolation: str
    min_runtime_s: float  # the scheduler's config, for `plinth export`
    round_s: float


@router.get("/v1/health", response_model=Health)
async def health(cp: CP) -> dict:
    return {"status": "ok", "version": plinth.__version__, "policy": cp.policy_name,
            "nodes": len(cp.cluster.nodes), "gpus": cp.cluster.total_gpus,
            "isolation": getattr(cp.runtime, "isolation", "none"),
            "min_runtime_s": cp.config.min_runtime, "round_s": cp.config.round_s}
