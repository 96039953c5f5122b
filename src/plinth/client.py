"""`plinth.Client`: the REST API from Python.

```python
import plinth
c = plinth.Client()                       # $PLINTH_SERVER, $PLINTH_TOKEN, or ~/.plinth/token
job = c.submit("examples/jobs/train.yaml")
c.wait(job)                               # -> "succeeded"
print(c.logs(job))
```
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from plinth.sched.lifecycle import State
from plinth.control.spec import JobSpec, job_to_run
from plinth.core.errors import PlinthError
from plinth.core.spec import load_spec, spec_from_dict

DEFAULT_SERVER = "http://127.0.0.1:8642"


def plinth_home() -> Path:
    return Path(os.environ.get("PLINTH_HOME") or Path.home() / ".plinth").expanduser()


def default_token() -> str | None:
    if os.environ.get("PLINTH_TOKEN"):
        return os.environ["PLINTH_TOKEN"]
    path = plinth_home() / "token"
    return path.read_text().strip() if path.exists() else None


class ApiError(PlinthError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class Client:
    def __init__(self, server: str | None = None, token: str | None = None,
                 timeout: float = 30.0) -> None:
        self.server = (server or os.environ.get("PLINTH_SERVER") or DEFAULT_SERVER).rstrip("/")
        if "://" not in self.server:
            self.server = "http://" + self.server
        token = token or default_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise PlinthError(f"cannot reach the control plane at {self.server}: {e}; "
                              "is `plinth up` running?") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ApiError(r.status_code, f"{detail} (HTTP {r.status_code})")
        return r.json()

    # --- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: JobSpec | dict | str | Path) -> int:
        """Submit a spec (a JobSpec, a dict, or a YAML path); returns the job id. As with
        sbatch, the job runs in the directory it is submitted from unless it names one."""
        if isinstance(spec, (str, Path)):
            spec = job_to_run(load_spec(Path(spec)), str(spec))
        elif isinstance(spec, dict):
            spec = job_to_run(spec_from_dict(spec, source="job spec"), "job spec")
        spec = spec.model_copy(update={"workdir": os.path.abspath(spec.workdir or ".")})
        body = spec.model_dump(mode="json", exclude_none=True)
        return int(self._call("POST", "/v1/jobs", json=body)["id"])

    def jobs(self, *, all: bool = False, tenant: str | None = None,
             limit: int = 1000) -> list[dict]:
        """Jobs, newest first: active ones, or all with `all=True`."""
        params: dict[str, Any] = {"all": all, "limit": limit}
        if tenant:
            params["tenant"] = tenant
        return self._call("GET", "/v1/jobs", params=params)

    def job(self, job_id: int) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: int) -> str:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")["state"]

    def logs(self, job_id: int, offset: int = 0) -> str:
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params={"offset": offset})["data"]

    def follow(self, job_id: int, poll_s: float = 0.25) -> Iterator[str]:
        """Yield log text as it is written, until the job has finished (`logs -f`)."""
        offset = 0
        while True:
            chunk = self._call("GET", f"/v1/jobs/{job_id}/logs", params={"offset": offset})
            if chunk["data"]:
                yield chunk["data"]
            offset = chunk["offset"]
            if chunk["done"]:
                return
            if not chunk["data"]:
                time.sleep(poll_s)

    def wait(self, job_id: int, timeout: float = 600.0, poll_s: float = 0.1) -> str:
        """Block until the job reaches a terminal state; return it."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job(job_id)["state"]
            if State(state).terminal:
                return state
            if time.monotonic() > deadline:
                raise PlinthError(f"job {job_id} still {state} after {timeout:g} s")
            time.sleep(poll_s)

    # --- cluster ------------------------------------------------------------------------------

    def nodes(self) -> list[dict]:
        return self._call("GET", "/v1/nodes")

    def health(self) -> dict:
        return self._call("GET", "/v1/health")

    def tenants(self) -> list[dict]:
        return self._call("GET", "/v1/tenants")

    def set_tenant(self, name: str, gpus: float | None = None,
                   borrowing_limit: float | None = None) -> dict:
        return self._call("PUT", f"/v1/tenants/{name}",
                          json={"gpus": gpus, "borrowing_limit": borrowing_limit})

    def add_token(self, tenant: str) -> str:
        return self._call("POST", f"/v1/tenants/{tenant}/tokens")["token"]
