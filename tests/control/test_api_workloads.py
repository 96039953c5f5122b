"""One API for every kind of workload (`/v1/workloads`), in process: a Job and a Service
submitted through the same route, listed together, shown and cancelled by their references,
and bad input answered with one line that names the field.

The control loop is not started: what is accepted is stored and queued, and never runs, so
the Service's router is a unit job that stays pending (so its replicas, which wait for the
router's address, are not submitted).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from plinth.control.api import create_app
from plinth.control.auth import Auth
from plinth.control.service import ControlPlane
from plinth.control.store import Store
from plinth.runtime.local import LocalRuntime

JOB = {"name": "train", "command": ["true"]}
SERVICE = {"kind": "Service", "name": "digits", "model": "examples.serve.cnn:make",
           "slo_ms": 100, "service_ms": 5, "resources": {"cpus": 0.5, "memory": "1Gi"},
           "min_replicas": 1, "max_replicas": 2}


class Api:
    def __init__(self, http: TestClient, cp: ControlPlane, auth: Auth, admin: str) -> None:
        self.http, self.cp, self.auth, self.admin = http, cp, auth, admin

    def call(self, method: str, path: str, token: str | None = None, **kw):
        return self.http.request(method, path, headers={
            "Authorization": f"Bearer {token or self.admin}"}, **kw)

    def refused(self, method: str, path: str, detail: str, status: int = 422, **kw) -> None:
        r = self.call(method, path, **kw)
        assert (r.status_code, r.json()) == (status, {"detail": detail}), r.text
        assert "\n" not in detail


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = Store(str(tmp_path / "plinth.db"))
    auth = Auth(store)
    token = auth.bootstrap(tmp_path)
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="2xA100"),
                      home=tmp_path)
    try:
        with TestClient(create_app(cp, auth)) as http:
            yield Api(http, cp, auth, token)
    finally:
        cp.close()


def test_a_job_and_a_service_through_one_api(api: Api) -> None:
    r = api.call("POST", "/v1/workloads", json=JOB)
    assert r.status_code == 201, r.text
    job = r.json()
    assert {k: job[k] for k in ("kind", "name", "state", "tasks")} == \
        {"kind": "Job", "name": "train", "state": "pending", "tasks": None}
    r = api.call("POST", "/v1/workloads", json={**JOB, "name": "sweep", "array": "0-3"})
    array = r.json()
    assert (r.status_code, array["kind"], array["tasks"]) == (201, "Job", 4)
    r = api.call("POST", "/v1/workloads", json=SERVICE)
    assert r.status_code == 201, r.text
    svc = r.json()
    assert (svc["kind"], svc["name"], svc["state"]) == ("Service", "digits", "active")
    assert [u["unit"] for u in svc["units"]] == ["router"]
    router = svc["units"][0]["job_id"]

    # Listed together: the service first, then every job, its router's among them.
    r = api.call("GET", "/v1/workloads")
    listed = r.json()
    assert [(w["kind"], w["name"]) for w in listed][:2] == [("Service", "digits"),
                                                           ("Job", "digits.router")]
    assert int(r.headers["X-Total-Count"]) == len(listed) == 1 + 1 + 4 + 1
    unit = next(w for w in listed if w["id"] == router and w["kind"] == "Job")
    assert (unit["workload_id"], unit["unit"]) == (svc["id"], "router")
    assert {w["name"]: w["state"] for w in listed if w["kind"] == "Job"}["train"] == "pending"
    only = api.call("GET", "/v1/workloads", params={"kind": "Service"}).json()
    assert [w["name"] for w in only] == ["digits"]
    # A page holds the service and then jobs; the next one goes on with the jobs.
    first = api.call("GET", "/v1/workloads", params={"limit": 2}).json()
    second = api.call("GET", "/v1/workloads", params={"limit": 2, "offset": 2}).json()
    assert [w["id"] for w in first + second] == [w["id"] for w in listed[:4]]

    # Shown by reference: a job by id, a task of an array as Slurm writes it, a service by
    # name.
    shown = api.call("GET", f"/v1/workloads/{job['id']}").json()
    assert (shown["kind"], shown["spec"]["command"], shown["events"][0]["kind"]) == \
        ("Job", ["true"], "submitted")
    task = api.call("GET", f"/v1/workloads/{array['id']}_2").json()
    assert (task["array_id"], task["array_index"]) == (array["id"], 2)
    shown = api.call("GET", "/v1/workloads/digits").json()
    assert (shown["kind"], shown["spec"]["slo_ms"], shown["history"][0]["job_id"]) == \
        ("Service", 100, router)
    api.refused("GET", "/v1/workloads/digits/logs", "ref: Service digits has no log of its "
                "own; each of its units' jobs has one (their ids: `plinth show digits`)")
    assert api.call("GET", f"/v1/workloads/{router}/logs").json()["data"] == ""

    # Cancelled by reference: a job, every task of an array, a service and its router.
    r = api.call("DELETE", f"/v1/workloads/{job['id']}")
    assert (r.status_code, r.json()["kind"], r.json()["state"]) == (200, "Job", "cancelled")
    api.refused("DELETE", f"/v1/workloads/{job['id']}",
                f"job {job['id']} has already finished (cancelled)", 409)
    r = api.call("DELETE", f"/v1/workloads/{array['id']}", params={"array": True})
    assert r.json()["state"] == "cancelled"
    r = api.call("DELETE", "/v1/workloads/digits")
    assert (r.status_code, r.json()["kind"], r.json()["state"]) == (200, "Service", "cancelled")
    assert api.call("GET", "/v1/workloads").json() == []  # none is active
    ended = api.call("GET", "/v1/workloads", params={"all": True}).json()
    assert {w["state"] for w in ended} == {"cancelled"} and len(ended) == len(listed)
    states = api.call("GET", "/v1/workloads", params={"state": "active"}).json()
    assert states == []


def test_a_tenant_sees_its_own_workloads_of_every_kind(api: Api) -> None:
    for name in ("alpha", "beta"):
        api.call("PUT", f"/v1/tenants/{name}", json={})
    alpha = api.call("POST", "/v1/tenants/alpha/tokens").json()["token"]
    beta = api.call("POST", "/v1/tenants/beta/tokens").json()["token"]
    job = api.call("POST", "/v1/workloads", alpha, json=JOB).json()
    assert api.call("POST", "/v1/workloads", alpha, json=SERVICE).status_code == 201
    listed = api.call("GET", "/v1/workloads", alpha).json()
    assert {w["kind"] for w in listed} == {"Job", "Service"}
    assert api.call("GET", "/v1/workloads", beta).json() == []
    for ref, what in ((str(job["id"]), f"job {job['id']}"), ("digits", "workload 'digits'")):
        for method, path in (("GET", ref), ("DELETE", ref), ("GET", f"{ref}/logs")):
            r = api.call(method, f"/v1/workloads/{path}", beta)
            assert (r.status_code, r.json()) == (404, {"detail": f"{what} not found"})
    r = api.call("POST", "/v1/workloads", beta, json={**SERVICE, "tenant": "alpha"})
    assert r.status_code == 403
    assert api.call("DELETE", "/v1/workloads/digits", alpha).json()["state"] == "cancelled"


JOB_FIELDS = ("kind, name, tenant, command, env, workdir, resources, workers, priority, "
              "preemptible, max_runtime, retries, checkpoint_dir, placement, nodelist, after, "
              "afterany, afterok, afternotok, array, array_index, array_id")


@pytest.mark.parametrize(("body", "detail"), [
    ({"command": []}, "command: must not be empty"),
    ({**JOB, "workers": "2"}, "workers: input should be a valid integer (got '2')"),
    ({**JOB, "colour": "red"}, f"colour: unknown field; allowed fields: {JOB_FIELDS}"),
    ({**SERVICE, "slo_ms": None}, "slo_ms: input should be a valid number (got None)"),
    ({**SERVICE, "max_replicas": 1001}, "max_replicas: must be <= 1000 (got 1001)"),
    ({**SERVICE, "name": "123"},
     "name: '123' reads as a job id; a workload's name needs a letter"),
    ({"kind": 5}, "kind: input should be a valid string (got 5)"),
    ({"kind": "Nope"},
     "kind: unknown kind 'Nope'; choose one of: Job, Service, FLTask, Tune, Cluster"),
    ({"kind": "Cluster", "nodes": [{"name": "a"}]},
     ("kind: the control plane does not run Cluster specs yet; use `plinth sim --cluster "
      "FILE` meanwhile")),
    ([JOB], f"input should be a valid dictionary or object to extract fields from (got {[JOB]})"),
])
def test_a_bad_spec_of_any_kind_is_one_line_naming_the_field(api: Api, body, detail) -> None:
    api.refused("POST", "/v1/workloads", detail, json=body)
    assert api.call("GET", "/v1/workloads", params={"all": True}).json() == []  # none kept


def test_a_service_that_could_never_fit_is_refused_and_not_kept(api: Api) -> None:
    r = api.call("POST", "/v1/workloads", json={**SERVICE, "max_replicas": 1000})
    cpus = sum(n.cpus_milli for n in api.cp.cluster.nodes) / 1000
    assert (r.status_code, r.json()["detail"]) == (
        422, (f"max_replicas: 1000 replicas of 0.5 CPUs and a router of 0.5 need 500.5 CPUs; "
              f"the cluster has {cpus:g}"))
    assert api.call("GET", "/v1/workloads", params={"all": True}).json() == []


def test_bad_references_and_filters_are_one_line(api: Api) -> None:
    api.refused("GET", "/v1/workloads/12", "job 12 not found", 404)
    api.refused("GET", "/v1/workloads/12_3", "job 12_3 not found", 404)
    api.refused("GET", f"/v1/workloads/{2**64}", f"job {2**64} not found", 404)
    api.refused("DELETE", "/v1/workloads/nothing", "workload 'nothing' not found", 404)
    api.refused("GET", "/v1/workloads", "query.kind[0]: input should be 'Job', 'Service', "
                "'FLTask' or 'Tune' (got 'Nope')", params={"kind": "Nope"})
    api.refused("GET", "/v1/workloads", "state: unknown state 'sleeping'; choose from pending, "
                "running, stopping, succeeded, failed, cancelled, timeout, rejected, active",
                params={"state": "sleeping"})
