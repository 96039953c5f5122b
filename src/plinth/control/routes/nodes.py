"""/v1/nodes: each node, its GPUs and what is allocated on them."""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

from fastapi import APIRouter
from pydantic import BaseModel

from plinth.control.routes.deps import CP, Who, scope
from plinth.control.routes.errors import errors

router = APIRouter(tags=["nodes"])


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
    running: list[int]  # a tenant's token sees its own jobs here, and how full a node is


@router.get("/v1/nodes", response_model=list[NodeInfo], responses=errors(401))
async def nodes(cp: CP, who: Who) -> list[dict]:
    return cp.node_usage(scope(who))
