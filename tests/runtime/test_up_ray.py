"""`plinth up --runtime ray` end to end, on the real 2-node Ray cluster on 127.0.0.1: the example
gang trains over gloo under Ray actors, and a job survives kill -9 of the control plane."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from conftest import EXAMPLES, PY, wait_for

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture
def up(ray_cluster, tmp_path):
    """`plinth up --runtime ray` on tmp_path/home: (url, token, servers started, start)."""
    home, port = tmp_path / "home", free_port()
    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(start_server(home, port, "--runtime", "ray", "--ray-address",
                                  ray_cluster.address, "--grace", "2", "--min-runtime", "0"))

    start()
    yield f"http://127.0.0.1:{port}", (home / "token").read_text().strip(), procs, start
    for p in procs:
        stop_server(p)
    kill_jobs(home)


def test_the_example_gang_runs_on_ray(up):
    url, token, _, _ = up
    r = subprocess.run([PY, "-m", "plinth.cli.main", "submit", str(EXAMPLES / "gang.yaml"),
                        "--wait", "--server", url, "--token", token],
                       check=False, capture_output=True, text=True, timeout=300)
    with Client(url, token) as c:
        (job,) = [j for j in c.jobs(all=True) if j["name"] == "gang-ddp"]
        log = c.logs(job["id"])
    assert r.returncode == 0, r.stdout + r.stderr + log[-3000:]
    assert "=== plinth: attempt 1" in log and "on ray-" in log, log[-3000:]


def test_a_running_job_is_adopted_after_kill_9_and_cancelled(up):
    url, token, procs, start = up
    with Client(url, token) as c:
        job = c.submit({"kind": "Job", "name": "sleeper",
                        "command": ["sh", "-c", "echo up; exec sleep 600"],
                        "resources": {"cpus": 0.1, "memory": 64, "gpus": 1}})
        # Its output has come back from its actor: the launch has returned and is recorded.
        wait_for(lambda: "up\n" in c.logs(job), "the job to run", timeout=120)
        time.sleep(1)  # the store's group commit
    stop_server(procs[-1], signal.SIGKILL)
    start()  # adopts the job through its named actor
    with Client(url, token) as c:
        assert c.job(job)["state"] == "running"
        c.cancel(job)
        assert c.wait(job, timeout=120) == "cancelled"


def test_a_service_replica_runs_on_a_ray_node_and_answers(ray_cluster, tmp_path):
    """A Service on `plinth up --runtime ray`: its replica is a unit job the Ray runtime starts
    on a Ray node; it joins the control plane's router, which answers through it."""
    import json

    import httpx
    import yaml

    home, port, serve_port = tmp_path / "home", free_port(), free_port()
    proc = start_server(home, port, "--runtime", "ray", "--ray-address", ray_cluster.address,
                        "--grace", "2", "--min-runtime", "0", "--serve-port", str(serve_port))
    try:
        url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
        spec = yaml.safe_load((EXAMPLES.parent / "serve" / "service.yaml").read_text())
        spec |= {"workdir": str(EXAMPLES.parents[1]), "min_replicas": 1, "max_replicas": 1,
                 "resources": {"cpus": 0.5, "memory": "1Gi"}}
        with Client(url, token) as c:
            w = c.submit_workload(spec)
            wait_for(lambda: c.workload("digits")["status"].get("ready") == 1,
                     "the replica to join the router", timeout=240)
            body = json.dumps({"inputs": [[[[0.0] * 28] * 28]]})
            r = httpx.post(w["status"]["url"], content=body, timeout=60)
            assert r.status_code == 200, r.text
            assert len(r.json()["outputs"][0]) == 10  # the digits model's ten scores
            (unit,) = c.workload("digits")["units"]
            slot = c.job(unit["job_id"])["allocation"]["slots"][0]
            assert slot["node_name"] in ("ray-head", "ray-worker"), slot
            # Stopped through the runtime, so its actor leaves the shared Ray cluster too.
            c.cancel_workload("digits")
            assert c.wait(unit["job_id"], timeout=120) == "cancelled"
    finally:
        stop_server(proc)
        kill_jobs(home)


def test_a_priority_job_preempts_a_gang_that_spans_both_ray_nodes(up):
    """Every GPU of the 2-node cluster is held by one preemptible gang (workers on both
    nodes); a higher-priority job preempts it: its workers are stopped on both nodes, the
    urgent job runs, and the gang is requeued."""
    url, token, _, _ = up
    with Client(url, token) as c:
        gang = c.submit({"kind": "Job", "name": "wide", "workers": 3, "priority": 0,
                         "command": ["sh", "-c", "echo up; exec sleep 600"],
                         "resources": {"cpus": 0.1, "memory": 64, "gpus": 2}})
        try:
            wait_for(lambda: c.logs(gang).count("up\n") == 3, "the gang's 3 workers",
                     timeout=180)
        except AssertionError as e:
            j = c.job(gang)
            raise AssertionError(f"{e}: {j['state']}, {j.get('reason')}, {j['events']}") from None
        nodes = {s["node_name"] for s in c.job(gang)["allocation"]["slots"]}
        assert nodes == {"ray-head", "ray-worker"}, nodes
        urgent = c.submit({"kind": "Job", "name": "urgent", "priority": 10,
                           "command": ["echo", "urgent-ran"],
                           "resources": {"cpus": 0.1, "memory": 64, "gpus": 2}})
        assert c.wait(urgent, timeout=180) == "succeeded"
        assert "urgent-ran" in c.logs(urgent)
        kinds = [e["kind"] for e in c.job(gang)["events"]]
        assert kinds[:4] == ["submitted", "started", "stop-preempt", "preempted"], kinds
        assert c.job(gang)["preemptions"] == 1
        c.cancel(gang)
        assert c.wait(gang, timeout=120) == "cancelled"
