"""Attacks on the REST API of a real `plinth up` with numbers and bodies that it used to accept
(issue 36: findings 6, 11, 12 and part of 13). Each request here is refused with one line
that names the field, before anything reaches the control loop, and what was accepted before
the attack still runs."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import httpx
from plinth_platform import Platform, run_cli

BIG_OFFSET = 2**62  # lseek() past what ext4 allows: EINVAL, which was answered 500


def api(p: Platform) -> httpx.Client:
    return httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {p.token}"},
                        timeout=30)


def refused(r: httpx.Response, detail: str, status: int = 422) -> None:
    assert (r.status_code, r.json()) == (status, {"detail": detail}), r.text


def started(p: Platform, job_id: int, wait_for) -> float:
    """When the scheduler started the job: it was placed, whatever its command then did."""
    with p.client() as c:
        return wait_for(lambda: c.job(job_id)["start_time"], 60, f"job {job_id} to start")


def ended(p: Platform, job_id: int, wait_for) -> None:
    with p.client() as c:
        wait_for(lambda: c.job(job_id)["end_time"], 60, f"job {job_id} to end")


def test_a_job_of_any_kind_asks_for_some_cpu_and_memory(shared_platform) -> None:
    """Finding 6: `cpus: 0, memory: 0` ran without limits and counted as using nothing."""
    service = {"kind": "Service", "name": "zero", "model": "tiny-cnn", "slo_ms": 50,
               "service_ms": 5}
    with api(shared_platform) as h:
        for resources, detail in (({"cpus": 0, "memory": 0},
                                   "resources.cpus: must be > 0 (got 0) (and 1 more)"),
                                  ({"cpus": 0}, "resources.cpus: must be > 0 (got 0)"),
                                  ({"memory": 0}, "resources.memory: must be > 0 (got 0)"),
                                  ({"memory": "0Gi"}, "resources.memory: must be > 0 (got 0)")):
            refused(h.post("/v1/workloads", json={"command": ["true"], "resources": resources}),
                    detail)
        refused(h.post("/v1/workloads", json={**service, "resources": {"cpus": 0}}),
                "resources.cpus: must be > 0 (got 0)")
        refused(h.post("/v1/workloads", json={"kind": "FLTask", "resources": {"memory": 0}}),
                "resources.memory: must be > 0 (got 0)")
        # Without resources a job gets the documented defaults: 1 CPU and 4 GiB.
        r = h.post("/v1/workloads", json={"name": "defaults", "command": ["true"]})
        assert r.status_code == 201, r.text
        spec = h.get(f"/v1/workloads/{r.json()['id']}").json()["spec"]
        assert (spec["resources"]["cpus"], spec["resources"]["memory"]) == (1.0, 4096)


def test_quotas_are_bounded_and_finite_and_scheduling_goes_on(shared_platform, wait_for) -> None:
    """Finding 11: a quota of 1e308 GPUs was answered 200, and then every pass failed."""
    with api(shared_platform) as h:
        before = h.post("/v1/workloads", json={"name": "before", "command": ["true"],
                                          "resources": {"gpus": 1}}).json()["id"]
        refused(h.put("/v1/tenants/huge", json={"gpus": 1e308}),
                "gpus: must be <= 1048576 (got 1e+308)")
        refused(h.put("/v1/tenants/huge", json={"gpus": 1, "borrowing_limit": 1e308}),
                "borrowing_limit: must be <= 1048576 (got 1e+308)")
        for raw, got in (('{"gpus": Infinity}', "inf"), ('{"gpus": 1e999}', "inf"),
                         ('{"gpus": NaN}', "nan")):  # Python's JSON reads all three
            refused(h.put("/v1/tenants/huge", content=raw,
                          headers={"Content-Type": "application/json"}),
                    f"gpus: must be a finite number (got {got})")
        # Other numbers of a job that the store or the scheduler could not hold.
        refused(h.post("/v1/workloads", json={"command": ["true"], "array": "0,4294967296"}),
                "array: an index is at most 2147483647, got 4294967296 in '0,4294967296'")
        refused(h.post("/v1/workloads", json={"command": ["true"], "max_runtime": 1e300}),
                "max_runtime: must be <= 315360000 s (got 1e+300 s)")
        assert "huge" not in [t["name"] for t in h.get("/v1/tenants").json()]
        after = h.post("/v1/workloads", json={"name": "after", "command": ["true"],
                                         "resources": {"gpus": 1}}).json()["id"]
    assert started(shared_platform, before, wait_for)
    assert started(shared_platform, after, wait_for)


def test_a_quota_stored_before_the_bound_does_not_stop_scheduling(platform, wait_for) -> None:
    """...`even after a restart`: a store that already holds 1e308 (written by a version that
    accepted it) is read with the quota at its bound."""
    platform.stop()
    with closing(sqlite3.connect(platform.home / "plinth.db")) as db, db:
        db.execute("UPDATE tenants SET gpus = 1e308, borrowing_limit = 1e308 "
                   "WHERE name = 'default'")
    platform.start()
    with platform.client() as c:
        job = c.submit({"name": "quota", "command": ["true"], "resources": {"gpus": 1}})
    assert started(platform, job, wait_for)  # the pass failed with OverflowError before


def test_a_log_offset_past_the_end_answers_416(shared_platform, wait_for) -> None:
    """Finding 12: `GET /v1/jobs/{id}/logs?offset=<huge>` (now /v1/workloads/{ref}/logs) answered 500."""
    with shared_platform.client() as c:
        job = c.submit({"name": "hello", "command": ["echo", "hello"]})
    ended(shared_platform, job, wait_for)
    with api(shared_platform) as h:
        size = h.get(f"/v1/workloads/{job}/logs").json()["offset"]  # the whole log, in bytes
        assert size > 0  # the platform's line that the attempt starts, at least
        r = h.get(f"/v1/workloads/{job}/logs", params={"offset": BIG_OFFSET})
        refused(r, f"offset: {BIG_OFFSET} is past the end of job {job}'s log ({size} bytes)",
                416)
        assert r.headers["content-range"] == f"bytes */{size}"
        r = h.get(f"/v1/workloads/{job}/logs", params={"offset": size})  # the end: nothing more
        assert r.json() == {"data": "", "offset": size, "done": True}


def test_bodies_are_strict_so_true_is_not_a_number(shared_platform) -> None:
    """Finding 13: `expires_in: true` made a token that expired in one second."""
    with api(shared_platform) as h:
        tokens = len(h.get("/v1/tokens").json())
        for body, detail in (
                ({"expires_in": True}, "expires_in: input should be a valid number (got True)"),
                ({"expires_in": "60"}, "expires_in: input should be a valid number (got '60')")):
            refused(h.post("/v1/tenants/default/tokens", json=body), detail)
        assert len(h.get("/v1/tokens").json()) == tokens  # none was made
        refused(h.put("/v1/tenants/strict", json={"gpus": True}),
                "gpus: input should be a valid number (got True)")
        refused(h.post("/v1/workloads", json={"command": ["true"], "workers": True}),
                "workers: input should be a valid integer (got True)")
        refused(h.post("/v1/workloads", json={"command": ["true"], "resources": {"gpus": "1"}}),
                "resources.gpus: input should be a valid integer (got '1')")


def test_every_status_a_route_answers_is_documented(shared_platform) -> None:
    """Finding 13: some statuses the API answers were not in its OpenAPI."""
    with api(shared_platform) as h:
        paths = h.get("/openapi.json").json()["paths"]
        documented = {(m.upper(), path): set(map(int, op["responses"]))
                      for path, ops in paths.items() for m, op in ops.items()}
        assert documented[("GET", "/v1/health")] == {200}  # no token, no parameters
        assert 416 in documented[("GET", "/v1/workloads/{ref}/logs")]
        # Statuses the body routes answer before a route runs, each seen here.
        seen = {h.post("/v1/workloads", content=b"\xff{", headers={
                    "Content-Type": "application/json"}).status_code,  # not JSON: 400
                h.post("/v1/workloads", content=iter([b"{}"])).status_code,  # chunked: 411
                h.post("/v1/workloads", content=b"x" * (2 << 20)).status_code}  # over the cap: 413
        assert seen == {400, 411, 413}
        for (method, path), codes in documented.items():
            if method in ("POST", "PUT"):
                assert seen | {401, 422} <= codes, (method, path, codes)


def test_plinth_submit_refuses_a_yaml_alias_bomb(shared_platform, tmp_path) -> None:
    """Finding 13: a 559-byte alias bomb ran `plinth submit` past 60 s and 2.9 GB."""
    rows = ["x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    rows += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 6)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("command: [true]\nenv:\n" + "".join(f"  {r}\n" for r in rows))
    with shared_platform.client() as c:
        jobs = len(c.jobs(all=True))
        r = run_cli(shared_platform, "submit", str(bomb))
        assert (r.returncode, r.stderr) == (
            2, f"error: {bomb}:8: invalid YAML: aliases repeat more than 100000 values\n")
        assert len(c.jobs(all=True)) == jobs

