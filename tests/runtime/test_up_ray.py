"""`plinth up --runtime ray` end to end, on the real 2-node Ray cluster on 127.0.0.1: the example
gang trains over gloo under Ray actors, a job survives kill -9 of the control plane, a service
replica and an FL task's aggregators run on Ray nodes, and a node that dies leaves the
scheduler's view until it is back."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, PY, wait_for
from ray_cluster import HEAD, WORKER

sys.path.insert(0, str(Path(__file__).parents[1] / "control"))  # the FL task tests' helpers
from test_fl_middle_task import run_middle_task
from test_fl_tasks import run_tree_task
from plinth_platform import reachable

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture
def up(ray_cluster, tmp_path):
    """`plinth up --runtime ray` on tmp_path/home: (url, token, servers started, start)."""
    home, port = reachable(tmp_path) / "home", free_port()
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
    """A Service on `plinth up --runtime ray`: its router and its replica are unit jobs the Ray
    runtime starts on Ray nodes; the replica joins the router, which answers through it."""
    import json

    import httpx
    import yaml

    home, port = tmp_path / "home", free_port()
    proc = start_server(home, port, "--runtime", "ray", "--ray-address", ray_cluster.address,
                        "--grace", "2", "--min-runtime", "0")
    try:
        url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
        spec = yaml.safe_load((EXAMPLES.parent / "serve" / "service.yaml").read_text())
        spec |= {"workdir": str(EXAMPLES.parents[1]), "min_replicas": 1, "max_replicas": 1,
                 "resources": {"cpus": 0.5, "memory": "1Gi"}}
        with Client(url, token) as c:
            c.submit_workload(spec)
            wait_for(lambda: c.workload("digits")["status"].get("ready") == 1,
                     "the replica to join the router", timeout=240)
            body = json.dumps({"inputs": [[[[0.0] * 28] * 28]]})
            w = c.workload("digits")  # with the address its router reported
            r = httpx.post(w["status"]["url"], content=body, timeout=60)
            assert r.status_code == 200, r.text
            assert len(r.json()["outputs"][0]) == 10  # the digits model's ten scores
            units = w["units"]
            assert sorted(u["unit"] for u in units) == ["replica-0", "router"]
            for unit in units:
                slot = c.job(unit["job_id"])["allocation"]["slots"][0]
                assert slot["node_name"] in ("ray-head", "ray-worker"), slot
            # Stopped through the runtime, so their actors leave the shared Ray cluster too.
            c.cancel_workload("digits")
            assert all(c.wait(u["job_id"], timeout=120) == "cancelled" for u in units)
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


def test_a_node_that_leaves_loses_its_job_and_leaves_the_cluster_view_until_it_is_back(
        up, ray_cluster, tmp_path):
    """The worker node dies (its raylet and every process on it killed) under a running job:
    the job is lost and requeued, `plinth nodes` no longer lists the node, and a job that can
    run only there waits with a reason instead of being launched on it. When the node rejoins
    (same name, a new Ray node id), both run on it."""
    url, token, _, _ = up
    pinned = {"command": ["sh", "-c", "echo up; exec sleep 600"], "nodelist": [WORKER.name],
              "resources": {"cpus": 0.1, "memory": 64, "gpus": 1}}
    with Client(url, token) as c:
        first = c.submit({"kind": "Job", "name": "on-worker", **pinned})
        wait_for(lambda: "up\n" in c.logs(first), "the job to run on the worker", timeout=120)
        try:
            ray_cluster.kill_node(WORKER.name)  # its raylet, actors and the job's processes
            wait_for(lambda: "lost" in [e["kind"] for e in c.job(first)["events"]],
                     "the job to be lost", timeout=120)
            assert c.job(first)["state"] == "pending", c.job(first)["events"]
            wait_for(lambda: [n["name"] for n in c.nodes()] == [HEAD.name],
                     "the node to leave the cluster view", timeout=60)
            nodes = subprocess.run([PY, "-m", "plinth.cli.main", "nodes", "--server", url,
                                    "--token", token], check=True, capture_output=True,
                                   text=True, timeout=60).stdout
            assert HEAD.name in nodes and WORKER.name not in nodes, nodes
            second = c.submit({"kind": "Job", "name": "also-on-worker", **pinned})
            wait_for(lambda: c.job(second)["reason"] != "queued: waiting for the next "
                     "scheduling pass", "a reason for the waiting job", timeout=30)
            time.sleep(3)  # passes run; none may launch it on the departed node
            for j in (first, second):
                job = c.job(j)
                assert (job["state"], job["attempt"]) == ("pending", 1 if j == first else 0), job
            reason = c.job(second)["reason"]
            assert reason.endswith(f"; {WORKER.name} (in its nodelist) left the cluster"), reason
        finally:
            if WORKER.name not in ray_cluster.workers:
                ray_cluster.add_node(WORKER)  # the next tests share the cluster
        wait_for(lambda: WORKER.name in [n["name"] for n in c.nodes()],
                 "the node to be back in the cluster view", timeout=60)
        for j in (first, second):
            ups = 2 if j == first else 1  # the first ran once before, on the node that died
            wait_for(lambda j=j, ups=ups: c.job(j)["state"] == "running"
                     and c.logs(j).count("up\n") == ups,
                     f"job {j} to run on the node that is back", timeout=120)
            (slot,) = c.job(j)["allocation"]["slots"]
            assert slot["node_name"] == WORKER.name
            c.cancel(j)
            assert c.wait(j, timeout=120) == "cancelled"
    said = (tmp_path / "home" / "server.log").read_text(errors="replace")
    assert f"node {WORKER.name} left the cluster" in said
    assert f"node {WORKER.name} is back in the cluster" in said


def test_a_tree_fl_tasks_leaf_aggregators_run_on_the_servers_ray_node(ray_cluster, tmp_path):
    """An FLTask in tree mode on `plinth up --runtime ray`: its server and leaf aggregators are
    units that the scheduler places on a Ray node and the Ray runtime runs under actors there;
    the task ends with every round folded through its leaves (the checks of the local
    runtime's test in tests/control/test_fl_tasks.py)."""
    node = run_tree_task(tmp_path, lambda cond, timeout, what: wait_for(cond, what, timeout),
                         "--runtime", "ray", "--ray-address", ray_cluster.address,
                         fake_gpus=None)
    assert node in (HEAD.name, WORKER.name)


def test_an_fl_tasks_middle_aggregators_run_one_on_each_ray_node(ray_cluster, tmp_path):
    """LIFL's per-node level on the 2-node Ray cluster: the task's two middle aggregators are
    placed one on each Ray node, each with its leaf on its node (the checks of the local
    runtime's test in tests/control/test_fl_middle_task.py)."""
    placed = run_middle_task(tmp_path, lambda cond, timeout, what: wait_for(cond, what, timeout),
                             "--runtime", "ray", "--ray-address", ray_cluster.address,
                             fake_gpus=None)
    assert {placed["middle-0"], placed["middle-1"]} == {HEAD.name, WORKER.name}, placed
