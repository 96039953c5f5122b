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
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from plinth.core.errors import PlinthError
from plinth.control.kinds import job_to_run
from plinth.core.jobspec import JobSpec
from plinth.core.lifecycle import State
from plinth.core.spec import load_spec, spec_from_dict

DEFAULT_SERVER = "http://127.0.0.1:8642"


def plinth_home() -> Path:
    return Path(os.environ.get("PLINTH_HOME") or Path.home() / ".plinth").expanduser()


def default_token() -> str | None:
    if os.environ.get("PLINTH_TOKEN"):
        return os.environ["PLINTH_TOKEN"]
    path = plinth_home() / "token"
    return path.read_text().strip() if path.exists() else None


def workload_path(ref: str | int) -> str:
    """The API's path of a workload: a job by id (12, or 12_5 for a task of an array), or a
    workload of another kind by name."""
    if not str(ref).strip():
        raise PlinthError("JOB: give a job id (12, or 12_5 for a task of an array) or a "
                          "workload's name")
    return f"/v1/workloads/{quote(str(ref), safe='')}"


def check_token(token: str | None) -> str | None:
    """The token without surrounding whitespace (a pasted one often ends in a newline). A token
    that cannot go in an HTTP header is refused without echoing it: it is a secret."""
    token = token.strip() if token else None
    if token and not all(33 <= ord(ch) < 127 for ch in token):
        raise PlinthError("--token / PLINTH_TOKEN: the API token contains a space or a "
                          "non-printable character; tokens are printable ASCII (plt_...)")
    return token


class ApiError(PlinthError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class Client:
    def __init__(self, server: str | None = None, token: str | None = None,
                 timeout: float = 30.0, ca_cert: str | None = None) -> None:
        """`ca_cert` (or $PLINTH_CA_CERT): a PEM file of the CA that signed an https server's
        certificate, when it is not one the system trusts."""
        self.server = (server or os.environ.get("PLINTH_SERVER") or DEFAULT_SERVER).rstrip("/")
        if "://" not in self.server:
            self.server = "http://" + self.server
        token = check_token(token or default_token())
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ca_cert = ca_cert or os.environ.get("PLINTH_CA_CERT")
        verify: Any = True
        if ca_cert:
            try:
                verify = ssl.create_default_context(cafile=ca_cert)
            except (OSError, ssl.SSLError) as e:
                raise PlinthError(f"PLINTH_CA_CERT: cannot load {ca_cert}: "
                                  f"{getattr(e, 'strerror', None) or e}") from None
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout,
                                  verify=verify)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        return self._send(method, path, **kw).json()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
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
        return r

    # --- workloads: every kind, a Job the simplest ---------------------------------------------

    def submit_workload(self, spec: Any, *, base: Path | None = None) -> dict:
        """Submit a spec of any kind (a JobSpec, a ServiceSpec, ..., a dict, or a YAML path);
        returns the answer: a Job's `id` (an array's: its first task's, and `tasks`), or
        another kind's workload as `workload` shows it. As with sbatch, a job runs in the
        directory it is submitted from unless it names one, and a command argument that names
        a file next to the spec (`train.py` beside `train.yaml`) is made absolute, so that a
        spec runs from any directory; `base` is the spec's folder when `spec` is not a path. A
        Service's model is checked here first: it is loaded and timed once (one line naming
        the field if it fails)."""
        if isinstance(spec, (str, Path)):
            base = Path(spec).parent
            spec = load_spec(Path(spec))
        elif isinstance(spec, dict):
            spec = spec_from_dict(spec, source="spec")
        return self._call("POST", "/v1/workloads",
                          json=spec.submitted(base).model_dump(mode="json", exclude_none=True))

    def submit(self, spec: JobSpec | dict | str | Path, *, base: Path | None = None) -> int:
        """`submit_workload` for a Job; returns its id. A spec of another kind is a one-line
        error that says to submit it with `submit_workload`."""
        if isinstance(spec, (str, Path)):
            base = Path(spec).parent
            spec = job_to_run(load_spec(Path(spec)), str(spec))
        elif isinstance(spec, dict):
            spec = job_to_run(spec_from_dict(spec, source="job spec"), "job spec")
        else:
            spec = job_to_run(spec, "job spec")
        return int(self.submit_workload(spec, base=base)["id"])

    def workloads(self, *, all: bool = False, kinds: list[str] | None = None,
                  tenant: str | None = None) -> list[dict]:
        """Workloads of these kinds (every kind if None): those of several units first, then
        jobs, each newest first; active ones, or all with `all=True`."""
        return self.workloads_page(all=all, kinds=kinds, tenant=tenant)[0]

    def workloads_page(self, *, all: bool = False, kinds: list[str] | None = None,
                       tenant: str | None = None, states: list[str] | None = None,
                       name: str | None = None, array: int | None = None, limit: int = 1000,
                       offset: int = 0) -> tuple[list[dict], int]:
        """(`limit` workloads from `offset`; how many match in all). Filters: `kinds`,
        `tenant`, `states` (any of them; implies `all`), `name`, `array` (its tasks)."""
        params: dict[str, Any] = {"all": all, "limit": limit, "offset": offset}
        for key, value in (("kind", kinds), ("tenant", tenant), ("state", states),
                           ("name", name), ("array", array)):
            if value:
                params[key] = value
        r = self._send("GET", "/v1/workloads", params=params)
        return r.json(), int(r.headers.get("X-Total-Count", 0))

    def workload(self, ref: str | int) -> dict:
        """A workload by its reference: a job's id (12, or 12_5 for a task of an array), or
        another kind's name."""
        return self._call("GET", workload_path(ref))

    def cancel_workload(self, ref: str | int, *, array: bool = False) -> dict:
        """Cancel a workload; with `array`, every task of the array the job `ref` heads (if
        it heads one). Returns the answer, with its state afterwards."""
        return self._call("DELETE", workload_path(ref),
                          params={"array": True} if array else None)

    # --- jobs: the Job kind, by id ------------------------------------------------------------

    def jobs(self, *, all: bool = False, tenant: str | None = None, limit: int = 1000,
             **filters: Any) -> list[dict]:
        """Jobs, newest first: active ones, or all with `all=True`; see `jobs_page`."""
        return self.jobs_page(all=all, tenant=tenant, limit=limit, **filters)[0]

    def jobs_page(self, **filters: Any) -> tuple[list[dict], int]:
        """`workloads_page` of jobs alone (the jobs of other kinds' units among them)."""
        return self.workloads_page(kinds=["Job"], **filters)

    def job(self, job_id: int | str) -> dict:
        return self.workload(job_id)

    def cancel(self, job_id: int | str, *, array: bool = False) -> str:
        """Cancel a job; with `array`, every task of the array `job_id` heads (if it heads
        one). Returns the job's state afterwards."""
        return self.cancel_workload(job_id, array=array)["state"]

    def wait_all(self, job_id: int, timeout: float = 600.0, poll_s: float = 0.2) -> str:
        """`wait` for a job, or for every task of the array it heads; returns its state, or
        the worst of its tasks' (failed before cancelled before timeout before succeeded)."""
        state = self.wait(job_id, timeout, poll_s)
        if self.job(job_id).get("array_id") != job_id:
            return state
        deadline = time.monotonic() + timeout
        while self.jobs_page(array=job_id, limit=1)[1]:  # active tasks left
            if time.monotonic() > deadline:
                raise PlinthError(f"array {job_id} still running after {timeout:g} s")
            time.sleep(poll_s)
        ends = {j["state"] for j in self.jobs(array=job_id, all=True, limit=10000)}
        return next(s for s in ("failed", "cancelled", "timeout", "succeeded") if s in ends)

    def logs(self, job_id: int | str, offset: int = 0) -> str:
        return self._call("GET", workload_path(job_id) + "/logs",
                          params={"offset": offset})["data"]

    def follow(self, job_id: int | str, poll_s: float = 0.25) -> Iterator[str]:
        """Yield log text as it is written, until the job has finished (`logs -f`)."""
        offset = 0
        while True:
            chunk = self._call("GET", workload_path(job_id) + "/logs", params={"offset": offset})
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
                   borrowing_limit: float | None = None, user: str | None = None) -> dict:
        """Create a tenant or change its quota; `user`: an existing Unix user its jobs run as
        (on a root control plane; without it, a tenant gets a user of its own)."""
        return self._call("PUT", f"/v1/tenants/{name}",
                          json={"gpus": gpus, "borrowing_limit": borrowing_limit, "user": user})

    def add_token(self, tenant: str, expires_in: float | None = None) -> str:
        """A new API token for `tenant`, valid for `expires_in` seconds (None: until revoked)."""
        return self.new_token(tenant, expires_in)["token"]

    def new_token(self, tenant: str, expires_in: float | None = None) -> dict:
        """`add_token` with its id and expiry: {"id", "tenant", "token", "expires"}."""
        return self._call("POST", f"/v1/tenants/{tenant}/tokens",
                          json={"expires_in": expires_in})

    def tokens(self, tenant: str | None = None) -> list[dict]:
        """Tokens by id (never by secret): id, tenant, admin, created, expires."""
        return self._call("GET", "/v1/tokens", params={"tenant": tenant} if tenant else {})

    def revoke_token(self, token_id: str) -> None:
        self._send("DELETE", f"/v1/tokens/{token_id}")
