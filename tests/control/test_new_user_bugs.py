"""Regressions for the bugs a new user met (issue 18), each reproduced as it was reported."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plinth_platform import run_cli as cli
from virtual_http import served

from plinth.client import ApiError, Client
from plinth.core.errors import PlinthError, SpecError
from plinth.runtime.sim_behaviour import SimBehaviour


def test_1_a_job_without_gpus_runs(shared_platform, tmp_path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text('name: c\ncommand: ["echo","hi"]\n')  # the spec's default shape: no GPU
    with shared_platform.client() as c:
        j = c.submit(spec)
        assert c.wait(j, timeout=60) == "succeeded", c.job(j)["reason"]
        assert "hi" in c.logs(j) and c.job(j)["gpus"] == 0


@pytest.mark.parametrize(("spec", "field"), [
    ({"env": {"A=B": "x"}}, "env: 'A=B' is not a variable name"),
    ({"env": {"A": "x\0y"}}, "env: the value of A contains a NUL byte"),
    ({"command": ["echo", "a\0b"]}, "command: argument 1 contains a NUL byte"),
    ({"workdir": "/tmp\0/x"}, "workdir: the path contains a NUL byte"),
])
def test_2_inputs_that_wedged_a_job_are_refused_at_submit(vp, spec, field) -> None:
    body = {"name": "wedge", "command": ["true"], **spec}
    r = vp.http.post("/v1/workloads", json=body)
    assert r.status_code == 422 and r.json()["detail"].startswith(field)
    with vp.client() as c:  # never stored, so never seen by the control loop
        assert "wedge" not in [j["name"] for j in c.jobs(all=True)]


def test_2_the_loop_survives_a_launch_that_raises(tmp_path) -> None:
    """A spec that slipped past the checks (here built without them) fails to launch: the job
    becomes launch-failed, its GPUs are free again and the next job runs."""
    from plinth.control.service import ControlPlane
    from plinth.core.jobspec import JobSpec, Resources
    from plinth.control.store import Store
    from plinth.runtime.local import LocalRuntime

    store = Store(str(tmp_path / "plinth.db"))
    store.put_tenant("default", None, None)
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"),
                      home=tmp_path)
    cp.start()
    try:
        bad = JobSpec.model_construct(**{**JobSpec(command=["true"]).__dict__,
                                         "env": {"A=B": "x"}, "name": "bad",
                                         "resources": Resources(gpus=1)})
        good = JobSpec(name="good", command=["true"], resources=Resources(gpus=1))
        ids = [cp.submit(s, "default") for s in (bad, good)]
        deadline = time.monotonic() + 30
        while any(not (store.job(i) or {}).get("end_time") for i in ids):
            assert time.monotonic() < deadline, [store.job(i)["state"] for i in ids]
            time.sleep(0.05)
        first, second = (store.job(i) for i in ids)
        assert first["state"] == "failed" and "illegal environment variable" in first["reason"]
        assert "launch-failed" in [e["kind"] for e in store.events(ids[0])]
        assert second["state"] == "succeeded"
        assert cp.node_usage()[0]["gpus_used"] == 0
    finally:
        cp.close()


def test_2_a_stored_spec_that_no_longer_passes_fails_alone(tmp_path) -> None:
    from plinth.control.service import ControlPlane
    from plinth.control.store import Store
    from plinth.runtime.local import LocalRuntime

    store = Store(str(tmp_path / "plinth.db"))
    store.put_tenant("default", None, None)
    spec = {"kind": "Job", "name": "old", "command": ["true"], "env": {"A=B": "x"}}
    bad = store.insert_job({"name": "old", "tenant": "default", "spec": spec}, time.time())
    ok = store.insert_job({"name": "ok", "tenant": "default",
                           "spec": {**spec, "env": {}}}, time.time())
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"),
                      home=tmp_path)
    try:
        cp.recover()
        assert store.job(bad)["state"] == "failed" and "env" in store.job(bad)["reason"]
        assert cp.recovery.pending == 1
        assert store.job(ok)["state"] == "running"  # recovered, and started by the first step
    finally:
        cp.close()


def test_2_a_job_cancelled_before_its_launch_was_recorded_stays_cancelled(tmp_path) -> None:
    """The wedged job of the report: stopping (cancelled) with nothing launched. A restart
    finishes it as cancelled instead of requeueing it as lost and running it again."""
    from plinth.control.service import ControlPlane
    from plinth.control.store import Store
    from plinth.runtime.local import LocalRuntime
    from plinth.core.lifecycle import State

    store = Store(str(tmp_path / "plinth.db"))
    store.put_tenant("default", None, None)
    now = time.time()
    j = store.insert_job({"name": "wedged", "tenant": "default",
                          "spec": {"kind": "Job", "name": "wedged", "command": ["true"]}}, now)
    alloc = {"slots": [{"node": 0, "gpus": [], "milli": 0, "gpu_memory_mib": 0}]}
    store.transition(j, State.PENDING, State.RUNNING, now, "started", attempt=1,
                     start_time=now, allocation=alloc)
    store.transition(j, State.RUNNING, State.STOPPING, now, "stop-cancel", stop_reason="cancel")
    cp = ControlPlane(store, LocalRuntime(tmp_path / "runtime", fake_gpus="1xA100"),
                      home=tmp_path)
    try:
        cp.recover()
        row = store.job(j)
        assert row["state"] == "cancelled" and row["attempt"] == 1
        assert cp.recovery.cancelled == 1 and j not in cp.owner.jobs
    finally:
        cp.close()


def test_3_a_token_with_whitespace_is_trimmed_and_never_printed(vp) -> None:
    with served(vp) as api:
        with Client(api.url, api.token + " \n") as c:
            assert c.health()["status"] == "ok" and c.jobs() is not None
        secret = "plt_secret-value"
        with pytest.raises(PlinthError) as e:
            Client(api.url, secret[:6] + " " + secret[6:])
        assert secret[6:] not in str(e.value) and "PLINTH_TOKEN" in str(e.value)
        r = cli(api, "ls", token=api.token + " ")
        assert r.returncode == 0, r.stderr


def test_4_ls_pages_and_says_when_it_stops(vp) -> None:
    with vp.client() as c:
        ids = [c.submit({"name": "page", "command": ["true"]}) for _ in range(5)]
        vp.run_until(lambda: all(c.job(j)["state"] == "succeeded" for j in ids), limit_s=30)
        page, total = c.jobs_page(name="page", all=True, limit=2, offset=2)
        assert total == 5 and [j["id"] for j in page] == sorted(ids, reverse=True)[2:4]
    with served(vp) as api:
        r = cli(api, "ls", "-a", "--name", "page", "--limit", "2")
        assert r.returncode == 0, r.stderr
        assert "showing 1-2 of 5" in r.stdout and "--page 2" in r.stdout
        r = cli(api, "ls", "-a", "--name", "page", "--limit", "2", "--page", "3")
        assert str(min(ids)) in r.stdout and "showing 5-5 of 5" in r.stdout
        r = cli(api, "ls", "-a", "--name", "page", "--limit", "2", "--page", "4")
        assert r.returncode == 0 and "page 4 is past the last: 5 jobs, 2 a page" in r.stdout
        r = cli(api, "ls", "--state", "succeeded", "--name", "page", "-o", "json")
        assert sorted(j["id"] for j in json.loads(r.stdout)) == sorted(ids)
        r = cli(api, "ls", "--state", "sleeping")
        assert r.returncode == 2 and "state: unknown state 'sleeping'" in r.stderr


def up(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", "up", "--home",
                           str(tmp_path / "home"), "--fake-gpus", "1xA100", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_5_and_9_bad_up_options_are_one_line(tmp_path) -> None:
    r = up(tmp_path, "--port", "99999")
    assert r.returncode == 2 and r.stderr.strip().endswith("--port: must be in 0..65535, got "
                                                           "99999")
    assert "Traceback" not in r.stderr
    missing = tmp_path / "nonexistent"
    r = up(tmp_path, "--port", "0", "--db", f"sqlite:///{missing}/x.db")
    assert r.returncode == 2 and f"directory {missing} does not exist" in r.stderr
    assert not missing.exists()
    r = up(tmp_path, "--port", "0", "--tls-cert", str(tmp_path / "no.pem"))
    assert r.returncode == 2 and "give both or neither" in r.stderr


def test_6_request_bodies_are_capped(vp) -> None:
    body = {"name": "big", "command": ["true"], "env": {"BIG": "x" * (2 << 20)}}
    with served(vp) as api:  # over real HTTP: uvicorn hands the body over in pieces
        r = httpx.post(f"{api.url}/v1/workloads", json=body,
                       headers={"Authorization": f"Bearer {api.token}"})
        assert r.status_code == 413 and "the limit is 1048576 bytes" in r.json()["detail"]
        with api.client() as c:
            assert "big" not in [j["name"] for j in c.jobs(all=True)]
            with pytest.raises(ApiError, match="limit is 1048576 bytes") as e:
                c.submit(body)
            assert e.value.status == 413


def test_8_a_job_that_ended_while_down_keeps_its_end_time(platform, wait_for) -> None:
    with platform.client() as c:
        j = c.submit({"name": "short", "command": "sleep 1"})
        wait_for(lambda: platform.launched(j), what="launched")
    platform.stop(signal.SIGKILL)
    exit_file = wait_for(lambda: next((platform.home / "runtime" / "exit").glob(f"j{j}-*.exit"),
                                      None), what="the exit file")
    restarted = time.time()  # after the job ended; the control plane is back seconds later
    platform.start()
    with platform.client() as c:
        assert c.wait(j, timeout=30) == "succeeded"
        d = c.job(j)
    assert abs(d["end_time"] - exit_file.stat().st_mtime) < 0.01 and d["end_time"] < restarted
    assert "recovered 1 ended while down" in (platform.home / "server.log").read_text()


def test_9_smaller_ones(vp) -> None:
    with served(vp) as api:
        r = cli(api, "cancel", "999999")
    assert r.returncode == 2 and "not found" in r.stdout + r.stderr  # as `show` exits
    vp.behave("stubborn", SimBehaviour(exit_at=30.0, ignore_term=True))
    vp.behave("hog", SimBehaviour(exit_at=30.0))
    with vp.client() as c:
        # stopping says why, not "Admitted"
        j = c.submit({"name": "stubborn", "command": "trap '' TERM; sleep 30"})
        vp.step()
        assert c.job(j)["state"] == "running"
        assert c.cancel(j) == "stopping"
        assert c.job(j)["reason"] == "stopping: cancelled by the user"
        vp.run_until(lambda: c.job(j)["state"] == "cancelled", limit_s=30)
        # no empty checkpoint folder for a job that never saved
        assert not (vp.home / "checkpoints" / str(j)).exists()
        # another tenant sees how full a node is, not which jobs run there
        hog = c.submit({"name": "hog", "command": "sleep 30", "resources": {"gpus": 1}})
        vp.step()
        assert c.job(hog)["state"] == "running"
        assert hog in c.nodes()[0]["running"]
        c.set_tenant("other")
        with vp.client(c.add_token("other")) as other:
            n = other.nodes()[0]
            assert n["running"] == [] and n["gpus_used"] == 1
        c.cancel(hog)
    from plinth.core.spec import spec_from_dict
    for field, value, text in (("priority", 2**40, "must be <= 2147483647 (got 1099511627776)"),
                               ("max_runtime", float("nan"), "must be a finite number"),
                               ("max_runtime", "100000d", "must be <= 315360000 s")):
        with pytest.raises(SpecError) as e:
            spec_from_dict({"command": ["true"], field: value}, source="j.yaml")
        assert f"j.yaml: {field}: {text}" in str(e.value) and "e+" not in str(e.value)
