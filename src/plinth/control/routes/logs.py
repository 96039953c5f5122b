"""/v1/workloads/{ref}/logs: a job's log, read from a byte offset (`plinth logs -f` follows it)."""

# No `from __future__ import annotations`: FastAPI reads the route annotations at runtime.

import os
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from plinth.control.routes import jobs
from plinth.control.routes.deps import CP, MAX_ID, Who
from plinth.control.routes.errors import READ, errors
from plinth.control.routes.workloads import Ref, find_workload
from plinth.core.errors import SpecError
from plinth.core.lifecycle import State

router = APIRouter(tags=["logs"])
LOG_CHUNK = 1 << 20


class LogChunk(BaseModel):
    data: str
    offset: int  # where the next read starts
    done: bool  # the job has finished and `data` reaches the end of its log


@router.get("/v1/workloads/{ref}/logs", response_model=LogChunk,
            responses=errors(404, 416, *READ))
def logs(ref: Ref, cp: CP, who: Who,
         offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0) -> dict:
    """Up to 1 MiB of a job's log from byte `offset` (a job that has not started has an empty
    log). An offset past the log's end answers 416, with the log's size. A workload of another
    kind has no log of its own: each of its units' jobs has one."""
    row = jobs.find(cp, ref, who)
    if row is None:
        w = find_workload(cp, ref, who)
        raise SpecError(f"ref: {w['kind']} {w['name']} has no log of its own; each of its "
                        f"units' jobs has one (their ids: `plinth show {w['name']}`)")
    job_id = row["id"]
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
