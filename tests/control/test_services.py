"""Services as platform workloads, end to end on loopback: a real `plinth up`, the example
service submitted with `plinth submit` next to a training job, load through its router (a unit
of its own), the replica set growing and shrinking through the control plane, a replica killed,
the control plane killed under load while the service goes on answering, its router killed and
replaced at a new address, and nothing lost."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from plinth_platform import Platform
from plinth_platform import run_cli as cli
from virtual_http import served

from plinth.client import ApiError
from plinth.serve.loadgen import ClosedLoop

EXAMPLE = Path(__file__).parents[2] / "examples" / "serve" / "service.yaml"
IMAGE = json.dumps({"inputs": [[[[0.0] * 28] * 28]]})


def unit_procs(jobs_dir: Path, module: str, unit: str | None = None) -> list[psutil.Process]:
    """The processes of the platform's service units running `module` (and `unit`)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        cmd, env = p.info.get("cmdline") or [], p.info.get("environ") or {}
        if module in cmd and (unit is None or unit in cmd) and \
                env.get("PLINTH_CHECKPOINT_DIR", "").startswith(str(jobs_dir)):
            out.append(p)
    return out


@pytest.fixture
def serving(tmp_path):
    p = Platform(tmp_path / "home", "--serve-tick", "1", "--serve-policy", "aiad").start()
    yield p
    p.stop()
    p.kill_jobs()


def status(c, name: str = "digits") -> dict:
    return c.workload(name)


def test_a_service_scales_survives_replica_and_control_plane_kills(serving, tmp_path, wait_for):
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec |= {"slo_ms": 25, "max_replicas": 2,  # tight enough that 12 clients break it here
             "workdir": str(EXAMPLE.parents[2])}  # the copy is not beside the examples
    svc_file = tmp_path / "service.yaml"
    svc_file.write_text(yaml.safe_dump(spec))
    out = cli(serving, "submit", str(svc_file))
    assert out.returncode == 0, out.stderr
    assert "Submitted Service digits" in out.stdout
    train = cli(serving, "submit", str(EXAMPLE.parents[1] / "jobs" / "train.yaml"))
    assert train.returncode == 0, train.stderr
    c = serving.client()
    wait_for(lambda: status(c)["status"].get("ready") == 1, 120, "the first replica")
    url = status(c)["status"]["url"]  # where its router listens, as it reported
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1/digits/infer")

    # Under load the replica set grows to max_replicas, through the scheduler.
    with ClosedLoop(url, IMAGE, clients=12) as load:
        wait_for(lambda: status(c)["status"]["desired"] == 2, 120, "a scale-up")
        wait_for(lambda: status(c)["status"].get("ready") == 2, 120, "the second replica")
        assert any(j["name"] == "digits.replica-1" and j["state"] == "running"
                   for j in c.jobs())
        # Kill a replica: it is replaced by a new job of the same unit; requests it held are
        # sent to the other replica.
        (victim,) = unit_procs(serving.jobs_dir, "plinth.serve.replica", "replica-1")[-1:]
        old_job = next(u["job_id"] for u in status(c)["units"] if u["unit"] == "replica-1")
        victim.send_signal(signal.SIGKILL)
        wait_for(lambda: next(u for u in status(c)["units"] if u["unit"] == "replica-1")
                 ["job_id"] != old_job, 60, "a replacement replica")
        wait_for(lambda: status(c)["status"].get("ready") == 2, 120, "the replacement to serve")
    lost = {k: n for k, n in load.codes.items() if k not in (200, 503)}
    assert load.codes.get(200, 0) > 100 and not lost, load.codes

    # Calm: the set shrinks back to min_replicas, and the unit's job is cancelled.
    wait_for(lambda: status(c)["status"]["desired"] == 1, 120, "a scale-down")
    wait_for(lambda: next(u for u in status(c)["units"] if u["unit"] == "replica-1")["state"]
             == "cancelled", 60, "the extra replica to stop")

    # kill -9 of the control plane under load: the router and its replica go on answering
    # while it is down (nothing on the request path goes through it), and it adopts them again
    # with the service's address.
    running = {u["unit"]: u["job_id"] for u in status(c)["units"] if u["state"] == "running"}
    assert set(running) == {"router", "replica-0"}
    with ClosedLoop(url, IMAGE, clients=4) as load:
        wait_for(lambda: load.codes.get(200, 0) > 10, 60, "answers before the kill")
        serving.stop(signal.SIGKILL)
        during = load.codes.get(200, 0)
        wait_for(lambda: load.codes.get(200, 0) > during + 50, 60,
                 "answers while the control plane is down")
        serving.start()
        c = serving.client()
        after = status(c)
        wait_for(lambda: load.codes.get(200, 0) > during + 100, 60, "answers after it")
    assert set(load.codes) == {200}, load.codes  # not one failed
    assert after["state"] == "active" and after["status"]["url"] == url
    assert {u["unit"]: u["job_id"] for u in after["units"] if u["state"] == "running"} == running
    assert "re-adopted" in [e["kind"] for e in c.job(running["router"])["events"]]
    assert "re-adopted" in [e["kind"] for e in c.job(running["replica-0"])["events"]]

    ls = cli(serving, "ls")
    assert "SERVICE" in ls.stdout and "digits" in ls.stdout.split("SERVICE", 1)[1]
    show = cli(serving, "show", "digits")
    assert "why: aiad" in show.stdout and "replica-0" in show.stdout

    # kill -9 of its router: a new router is placed and reports a new address; the replica
    # that joined the old one is started again to join the new one, and the service answers
    # at its new address.
    (router,) = unit_procs(serving.jobs_dir, "plinth.serve.router")
    router.send_signal(signal.SIGKILL)
    def replaced() -> dict | None:
        w = status(c)
        now = {u["unit"]: u["job_id"] for u in w["units"] if u["state"] == "running"}
        new = set(now) == {"router", "replica-0"} and all(now[u] != running[u] for u in now)
        return w if new and w["status"].get("url") not in (None, url) else None

    url = wait_for(replaced, 120, "a new router and replica")["status"]["url"]
    wait_for(lambda: httpx.post(url, content=IMAGE, timeout=30).status_code == 200, 120,
             "the new replica to join the new router")

    # Cancelling the service stops its router and replicas; its address answers no more.
    assert c.cancel_workload("digits")["state"] == "cancelled"
    wait_for(lambda: all(u["state"] == "cancelled" for u in status(c)["units"]), 60,
             "the units to stop")
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, content=IMAGE, timeout=30)


def test_bad_service_specs_are_one_line_errors(vp, tmp_path) -> None:
    """On a control plane in virtual time (virtual.py), the CLI over real HTTP."""
    base = yaml.safe_load(EXAMPLE.read_text()) | {"workdir": str(EXAMPLE.parents[2])}
    cases = {
        "model: no such file": {"model": "missing.pt"},
        "max_replicas": {"max_replicas": 0},
        "slo_ms": {"slo_ms": 0.001},
        "resources.gpus": {"resources": {"gpus": 1}},
    }
    with served(vp) as api:
        for what, change in cases.items():
            f = tmp_path / "bad.yaml"
            f.write_text(yaml.safe_dump(base | change))
            out = cli(api, "submit", str(f))
            assert out.returncode != 0 and what in out.stderr, (what, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    # A max_replicas that could never fit is refused by the control plane, and nothing stays.
    c = vp.client()
    with pytest.raises(ApiError, match=r"^max_replicas: 1000 replicas of 0.5 CPUs and a router of 0.5 need 500.5 "):
        c.submit_workload(base | {"name": "huge", "max_replicas": 1000})
    with pytest.raises(ApiError, match=r"can never run here"):
        c.submit_workload(base | {"name": "huge", "max_replicas": 1,
                                  "resources": {"cpus": 1, "memory": "64Ti"}})
    assert [w for w in c.workloads(all=True) if w["name"] == "huge"] == []
