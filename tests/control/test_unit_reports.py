"""Units report over the API (`POST /v1/units/report`) with a credential scoped to their job's
attempt: attacked here with every credential but the right one, a bad body, and the token of an
attempt that has been replaced, on a real control plane whose unit is a real process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from typing import Literal

import psutil
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from plinth.control import unitauth
from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.kinds import CONTROLLERS
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.core.jobspec import JobSpec
from plinth.core.kinds import BaseController, Observed, Unit
from plinth.core.spec import KINDS
from plinth.runtime import report
from plinth.runtime.local import LocalRuntime


class EchoSpec(BaseModel):
    kind: Literal["EchoTest"] = "EchoTest"
    name: str = "echo"
    tenant: str | None = None


class EchoReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int = Field(ge=0)


class Echo(BaseController):
    """One long-running unit `u`, replaced when it dies, whose reports set `status.value`."""

    kind = "EchoTest"

    def units(self, w, observed: Mapping[str, Observed], now: float) -> list[Unit]:
        return [Unit("u", JobSpec(name="u", command=["sleep", "600"]))]

    def report_model(self, w, unit: str):
        return EchoReport

    def report(self, w, unit: str, body: EchoReport, ctx) -> bool:
        w.status["value"] = body.value
        return True


@pytest.fixture
def plane(tmp_path, wait_for) -> Iterator[tuple[ControlPlane, TestClient, str]]:
    for reg, target in ((KINDS, EchoSpec), (CONTROLLERS, Echo)):
        reg.add("EchoTest", target)
    store = Store(str(tmp_path / "plinth.db"))
    auth = Auth(store)
    admin = auth.bootstrap(tmp_path)
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"),
                      home=tmp_path)
    cp.api_url = "http://testserver"
    cp.start()
    try:
        yield cp, TestClient(create_app(cp, auth)), admin
    finally:
        for wid in list(cp.workloads.active):  # its unit's process goes with it
            cp.workloads.cancel(wid)
        wait_for(lambda: all(j.status.terminal for j in cp.owner.jobs.values()), 30,
                 "the units to end")
        cp.close()
        for reg in (KINDS, CONTROLLERS):  # this worker's registries as they were
            for table in (reg._targets, reg._names):
                table.pop("echotest", None)


def _unit_env(cp: ControlPlane, wid: int, wait_for, not_job: int | None = None
              ) -> tuple[int, int, dict[str, str]]:
    """The running unit's job (other than `not_job`), its process, and the environment that
    process was given."""
    def running() -> int | None:
        job = cp.workloads.unit_jobs.get(wid, {}).get("u")
        js = cp.owner.jobs.get(job) if job is not None else None
        return job if js is not None and js.status.value == "running" and job != not_job \
            else None

    job = wait_for(running, 60, "the unit to run")

    def mine(token: str) -> bool:  # not a process another test left behind
        try:
            return unitauth.verify(cp.home, token)[0] == job
        except unitauth.BadCredential:
            return False

    def proc() -> tuple[int, dict[str, str]] | None:
        for p in psutil.process_iter(["name"]):
            try:
                e = p.environ()
            except (psutil.Error, OSError):
                continue
            if e.get("PLINTH_JOB_ID") == str(job) and p.info["name"] == "sleep" and \
                    mine(e.get(report.TOKEN_ENV, "")):
                return p.pid, e
        return None

    return job, *wait_for(proc, 30, "the unit's process")


def test_a_unit_reports_with_its_own_token_and_nothing_else_gets_in(plane, wait_for):
    cp, http, admin = plane
    wid = cp.workloads.submit(EchoSpec(), "default").id
    job, pid, env = _unit_env(cp, wid, wait_for)
    url, token = env[report.URL_ENV], env[report.TOKEN_ENV]
    assert url == "http://testserver/v1/units/report" and token.startswith(f"plu_{job}_")
    assert admin not in env.values()  # the admin token never reaches a unit

    def post(body, credential):
        return http.post("/v1/units/report", json=body,
                         headers={"Authorization": f"Bearer {credential}"})

    assert post({"value": 7}, token).status_code == 204
    assert cp.workloads.active[wid].status["value"] == 7
    assert cp.store.workloads()[0]["status"]["value"] == 7  # stored, as the controller's status

    # Every other credential is refused, and changes nothing.
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    other_attempt = token.replace(f"plu_{job}_1_", f"plu_{job}_2_")
    for credential in (admin, forged, other_attempt, "", f"plu_{job}_1_" + "x" * 43):
        r = post({"value": 8}, credential)
        assert r.status_code == 401, (credential, r.text)
    # The unit's token is for reports only: it is no API token.
    assert http.get("/v1/workloads", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    # A body its controller does not take: one line naming the field.
    r = post({"value": -1}, token)
    assert r.status_code == 422 and "value" in r.json()["detail"] and "\n" not in r.text
    assert post({"value": 1, "extra": 2}, token).status_code == 422
    assert cp.workloads.active[wid].status["value"] == 7

    # Its process dies; the unit is replaced by a new job. The old attempt's token is fenced.
    os.kill(pid, signal.SIGKILL)
    _, _, new_env = _unit_env(cp, wid, wait_for, not_job=job)
    r = post({"value": 9}, token)
    assert r.status_code == 409 and "fenced" in r.json()["detail"]
    assert post({"value": 10}, new_env[report.TOKEN_ENV]).status_code == 204
    assert cp.workloads.active[wid].status["value"] == 10
