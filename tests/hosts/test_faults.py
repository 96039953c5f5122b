"""Faults on the bed: a worker host cut off for 30 s, and a host that dies. A job that beats
into the shared folder (attempt, host, time) shows what ran where and when: it is started again
elsewhere only after the head declares its host dead, its old attempt has fenced itself by then
(nothing runs twice at once), and no accepted job is lost. A bed of its own (these tests break
hosts), with a fourth host that is not a Ray node at first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from bed import wait_for
from cluster import PlinthBed, Worker

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.xdist_group("hosts")]
PARTITION_S = 30
LOAD = Path(__file__).parent / "load.py"


@pytest.fixture(scope="module")
def faults_bed():
    pb = PlinthBed(hosts=4, workers=(Worker("h2", rack="r2"), Worker("h3", rack="r3")))
    try:
        yield pb.up()
    finally:
        pb.down()


def _beating(pb, name: str):
    """Submit a job that appends `ATTEMPT HOST TIME` to a shared file twice a second; the
    file's path."""
    beats = pb.shared / f"{name}.beats"
    beats.touch()
    beats.chmod(0o666)
    spec = pb.shared / f"{name}.yaml"
    spec.write_text(f"name: {name}\ncommand: [sh, -c, 'while :; do echo $PLINTH_ATTEMPT "
                    f"$(hostname) $(date +%s.%N) >> {beats}; sleep 0.5; done']\n"
                    "resources: {cpus: 1}\n")
    pb.cli("h3", "submit", str(spec))
    return beats


def _beats(path) -> list[tuple[int, str, float]]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line being written may be cut
            out.append((int(parts[0]), parts[1], float(parts[2])))
    return out


def _job(pb, name: str) -> dict:
    jobs = json.loads(pb.cli("h1", "ls", "--all", "-o", "json").stdout)
    return next(j for j in jobs if j["name"] == name)


def _nodes(pb) -> str:
    return pb.cli("h1", "nodes").stdout


def test_a_partitioned_host_is_replaced_and_its_old_attempt_never_runs_beside_the_new(
        faults_bed):
    pb = faults_bed
    beats = _beating(pb, "hb-partition")
    first = wait_for(lambda: _beats(beats), "the first beat")[0]
    host = first[1]
    pb.bed.partition(host)
    try:
        # The head declares the host dead during the partition: the job runs again elsewhere.
        wait_for(lambda: any(a == 2 for a, _, _ in _beats(beats)), "attempt 2's first beat",
                 timeout=PARTITION_S)
    finally:
        pb.bed.heal(host)
    seen = _beats(beats)
    old = [t for a, _, t in seen if a == 1]
    new = [(h, t) for a, h, t in seen if a == 2]
    assert {h for h, _ in new} != {host}, "attempt 2 ran on the host that was cut off"
    assert max(old) < min(t for _, t in new), "attempt 1 was still beating when 2 began"
    # Healed, the host's old attempt stays dead (Ray ends a raylet declared dead; the worker
    # fenced itself before that); the host comes back as a node of its own.
    wait_for(lambda: f"\n {host} " in _nodes(pb), f"{host} back in plinth nodes")
    n = len(_beats(beats))
    wait_for(lambda: len(_beats(beats)) >= n + 6, "three more seconds of beats")
    assert [a for a, _, _ in _beats(beats)[n:]] == [2] * (len(_beats(beats)) - n)
    job = _job(pb, "hb-partition")
    assert (job["state"], job["attempt"]) == ("running", 2)
    pb.cli("h1", "cancel", str(job["id"]))


def test_a_host_that_dies_has_its_jobs_requeued_and_comes_back_when_it_boots(faults_bed):
    pb = faults_bed
    wait_for(lambda: all(f"\n {h} " in _nodes(pb) for h in ("h2", "h3")), "both workers up")
    beats = _beating(pb, "hb-death")
    host = wait_for(lambda: _beats(beats), "the first beat")[0][1]
    pb.bed.kill_host(host)  # every process on it, Ray's and the job's
    other = wait_for(lambda: [h for a, h, _ in _beats(beats) if a == 2], "attempt 2")[0]
    assert other != host
    assert f"\n {host} " not in _nodes(pb)
    pb.join(Worker(host, rack=f"r{host[1:]}"))  # it boots again, empty, and Ray starts
    wait_for(lambda: f"\n {host} " in _nodes(pb), f"{host} back in plinth nodes")
    job = _job(pb, "hb-death")
    assert (job["state"], job["attempt"]) == ("running", 2)
    pb.cli("h1", "cancel", str(job["id"]))


def test_a_host_that_joins_while_the_plane_runs_takes_the_next_job(faults_bed):
    pb = faults_bed
    assert "\n h4 " not in _nodes(pb)
    pb.join(Worker("h4", gpus=1, model="V100", rack="r4"))
    wait_for(lambda: "\n h4 " in _nodes(pb), "h4 in plinth nodes")
    spec = pb.shared / "on-h4.yaml"
    spec.write_text("name: on-h4\ncommand: [hostname]\nnodelist: [h4]\n"
                    "resources: {cpus: 1, gpus: 1, gpu_model: [V100]}\n")
    done = pb.cli("h3", "submit", "--wait", str(spec), check=False)
    job = _job(pb, "on-h4")
    log = pb.cli("h1", "logs", str(job["id"])).stdout
    assert done.returncode == 0 and job["state"] == "succeeded", log
    assert log.rstrip().endswith("h4"), log


def test_a_host_that_dies_under_a_service_and_an_fl_task_has_their_units_replaced(
        faults_bed):
    """After the join above there are three worker hosts. A Service (its router and 2
    replicas) and a tree FL task (its server, 2 middles on different hosts, their leaves) run;
    the host of a middle that is not the server's dies mid-task. The middle is replaced on a
    host that lives, the task goes on to its last round, and the service is back to 2 ready
    replicas, answering."""
    from test_fl import _app, start_clients
    from test_service import SERVICE

    pb = faults_bed
    wait_for(lambda: all(f"\n {h} " in _nodes(pb) for h in ("h2", "h3", "h4")),
             "three worker hosts")
    (pb.shared / "svc.yaml").write_text(SERVICE.replace("name: digits", "name: svc"))
    pb.cli("h1", "submit", str(pb.shared / "svc.yaml"))
    name, rounds = "fl-death", 300  # a round of the tiny app takes some 0.1 s
    app = _app(pb, name)
    doc = yaml.safe_load(app.read_text())
    doc["server"]["rounds"] = rounds
    app.write_text(yaml.safe_dump(doc))
    pb.cli("h1", "submit", str(app))
    clients = start_clients(pb, "h1", app, name)
    try:
        units = wait_for(lambda: {u["unit"]: u["job_id"] for u in pb.api(
            "h1", f"/v1/workloads/{name}")["units"] if u["state"] == "running"}.keys() >= {
            "server", "middle-0", "middle-1"} and pb.api("h1", f"/v1/workloads/{name}")["units"],
            "the server and both middles running")
        placed = {u["unit"]: _node_of(pb, u["job_id"]) for u in units}
        victim = next(placed[m] for m in ("middle-0", "middle-1")
                      if placed[m] != placed["server"])
        wait_for(lambda: pb.api("h1", f"/v1/workloads/{name}")["status"].get("round", 0) >= 1,
                 "the FL task's first round")
        pb.bed.kill_host(victim)
        gone = pb.api("h1", f"/v1/workloads/{name}")["status"]["round"]
        w = wait_for(lambda: (w := pb.api("h1", f"/v1/workloads/{name}"))["state"] != "active"
                     and w, "the FL task to end", timeout=600)
        out = clients.communicate(timeout=120)[0]
    finally:
        if clients.poll() is None:
            clients.kill()
    assert w["state"] == "succeeded", (w, out[-2000:])
    assert w["status"]["round"] == rounds > gone
    live = {u["unit"]: _node_of(pb, u["job_id"]) for u in w["units"]}
    assert victim not in {live["middle-0"], live["middle-1"]}, live  # replaced elsewhere
    assert live["middle-0"] != live["middle-1"], live
    # The service: its units on the dead host replaced; 2 replicas ready again, answering.
    svc = wait_for(lambda: (s := pb.api("h1", "/v1/workloads/svc"))["status"].get("ready") == 2
                   and s, "the service's 2 replicas ready again")
    running = [u for u in svc["units"] if u["state"] == "running"]
    assert {u["unit"] for u in running} == {"router", "replica-0", "replica-1"}, svc["units"]
    assert victim not in {_node_of(pb, u["job_id"]) for u in running}
    got = pb.bed.sh("h1", [sys.executable, str(LOAD), svc["status"]["url"],
                           str(pb.shared / "svc-load.json"), "--seconds", "3"], env=pb.env)
    assert got.returncode == 0
    codes = json.loads((pb.shared / "svc-load.json").read_text())["codes"]
    assert set(codes) == {"200"} and codes["200"] > 0, codes
    pb.cli("h1", "cancel", "svc")
    pb.join(Worker(victim, rack=f"r{victim[1:]}"))


def _node_of(pb, job_id: int) -> str:
    return pb.api("h1", f"/v1/workloads/{job_id}")["allocation"]["slots"][0]["node_name"]
