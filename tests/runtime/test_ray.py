"""The Ray runtime beyond the contract suite, on the real 2-node Ray cluster on 127.0.0.1
(ray_cluster.py): the nodes it reports, placement exactly as the scheduler asked, a gloo gang
across both nodes, lost actors, recovery after kill -9 of the control plane, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PY, sh, wait_for
from ray_cluster import HEAD, WORKER

from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.runtime import EventKind, Handle, LaunchSpec, RuntimeEvent, WorkerLaunch

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
HERE = Path(__file__).parent
SRC = str(HERE.parents[1] / "src")


@pytest.fixture
def rt(ray_cluster):
    from plinth.runtime.ray import RayRuntime

    rt = RayRuntime(ray_cluster.address)
    yield rt
    for job_id, attempt in rt.running():
        rt.stop(job_id, attempt, 0)
    wait_for(lambda: not rt.running(), "leftover workers to be killed")
    rt.close()


def end_of(rt, job_id: int, attempt: int = 1) -> RuntimeEvent:
    got: list[RuntimeEvent] = []

    def ended() -> bool:
        got.extend(rt.poll())
        return any(e.kind in (EventKind.EXITED, EventKind.LOST) for e in got)

    wait_for(ended, f"the end of job {job_id}", timeout=120)
    return next(e for e in got if e.kind in (EventKind.EXITED, EventKind.LOST))


def launch(rt, tmp: Path, job_id: int, command, workers) -> Handle:
    return rt.launch(LaunchSpec(job_id, 1, tuple(command), tuple(workers),
                                str(tmp / f"job{job_id}.log"),
                                env={"PATH": os.path.dirname(PY) + ":/usr/bin:/bin"}))


def test_nodes_come_from_the_ray_cluster(rt):
    nodes = {n.name: n for n in rt.nodes()}
    assert sorted(nodes) == [HEAD.name, WORKER.name]
    for spec in (HEAD, WORKER):
        n = nodes[spec.name]
        assert (n.num_gpus, n.gpu_model, n.rack, n.cpus_milli) == \
               (spec.gpus, "A100", spec.rack, spec.cpus * 1000)
    assert "ray-head (127.0.0.1, r0): 4 CPUs" in rt.describe()


def test_each_worker_runs_where_the_scheduler_put_it_with_its_gpus(rt, tmp_path):
    import ray

    # Rank 0 on the worker node's GPU 1, rank 1 on the head's GPUs 2 and 3: not what Ray
    # would choose by itself (it packs, and numbers from 0).
    ws = [WorkerLaunch(0, WORKER.name, gpus=(1,)), WorkerLaunch(1, HEAD.name, gpus=(2, 3))]
    h = launch(rt, tmp_path, 7301, sh("echo rank=$RANK gpus=$CUDA_VISIBLE_DEVICES"), ws)
    ids = {n["Labels"]["plinth-node"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    table = ray.util.placement_group_table(ray.util.get_placement_group("plinth-j7301-a1"))
    assert table["bundles_to_node_id"] == {0: ids[WORKER.name], 1: ids[HEAD.name]}
    assert table["bundles"] == {0: {"GPU": 1.0}, 1: {"GPU": 2.0}}  # no CPU asked, none held
    assert [p.exit_file for p in h.procs] == ["ray:plinth-j7301-a1-r0", "ray:plinth-j7301-a1-r1"]
    assert end_of(rt, 7301).exit_code == 0
    log = (tmp_path / "job7301.log").read_text()  # copied from each worker's node
    assert "rank=0 gpus=1\n" in log and "rank=1 gpus=2,3\n" in log
    # The attempt's placement group and actors are gone with it.
    wait_for(lambda: ray.util.placement_group_table().get(table["placement_group_id"], {})
             .get("state") == "REMOVED", "the placement group to be removed")
    with pytest.raises(ValueError):
        ray.get_actor("plinth-j7301-a1-r0", namespace="plinth")


def test_a_worker_that_asks_for_no_cpu_runs_on_a_node_whose_cpus_are_all_taken(rt, tmp_path):
    """As the scheduler counts it: a unit that reserves no CPU (a Tune tracker) fits there."""
    launch(rt, tmp_path, 7310, sh("sleep 600"),
           [WorkerLaunch(0, WORKER.name, cpus_milli=WORKER.cpus * 1000)])
    launch(rt, tmp_path, 7311, sh("echo ran"), [WorkerLaunch(0, WORKER.name, memory_mib=64)])
    ev = end_of(rt, 7311)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 0), ev
    assert "ran\n" in (tmp_path / "job7311.log").read_text()


@pytest.mark.slow
def test_gloo_gang_across_two_nodes_agrees_on_an_all_reduce(rt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ws = [WorkerLaunch(r, (HEAD, WORKER)[r // 2].name) for r in range(4)]
    launch(rt, tmp_path, 7302, (PY, str(HERE / "gloo_worker.py"), str(out)), ws)
    ev = end_of(rt, 7302)
    log = (tmp_path / "job7302.log").read_text()
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 0), log[-2000:]
    reports = [json.loads((out / f"{r}.json").read_text()) for r in range(4)]
    assert [r["sum"] for r in reports] == [10.0] * 4  # 1 + 2 + 3 + 4 on every rank
    assert [r["env"]["LOCAL_RANK"] for r in reports] == ["0", "1", "0", "1"]
    assert {r["env"]["MASTER_PORT"] for r in reports} == {reports[0]["env"]["MASTER_PORT"]}


def test_a_killed_actor_loses_the_attempt_and_stops_the_gang(rt, tmp_path):
    import ray

    ws = [WorkerLaunch(0, HEAD.name), WorkerLaunch(1, WORKER.name)]
    launch(rt, tmp_path, 7303, sh("sleep 600"), ws)
    ray.kill(ray.get_actor("plinth-j7303-a1-r1", namespace="plinth"))
    ev = end_of(rt, 7303)
    assert ev.kind is EventKind.LOST and ev.message.startswith("rank 1: its actor"), ev
    assert rt.running() == []  # rank 0 was stopped with it


def test_adopt_after_kill_9_of_the_control_plane(rt, ray_cluster, tmp_path):
    """A control plane (its own process, as `plinth up`) launches a gang and is killed -9;
    this one adopts it by the stored handle and stops it. A handle whose actors are gone is
    lost."""
    script = (
        "import json, sys\n"
        "from plinth.runtime import LaunchSpec, WorkerLaunch\n"
        "from plinth.runtime.ray import RayRuntime\n"
        f"rt = RayRuntime({ray_cluster.address!r})\n"
        "ws = (WorkerLaunch(0, 'ray-head'), WorkerLaunch(1, 'ray-worker'))\n"
        f"h = rt.launch(LaunchSpec(7304, 1, ('/bin/sh', '-c', 'sleep 600'), ws, "
        f"{str(tmp_path / 'job7304.log')!r}))\n"
        "print(json.dumps(h.to_dict()), flush=True)\n"
        "sys.stdin.read()\n")
    cp = subprocess.Popen([PY, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONPATH": SRC})
    try:
        line = cp.stdout.readline()  # type: ignore[union-attr]
        assert line, "the first control plane did not launch"
    finally:
        cp.send_signal(signal.SIGKILL)
        cp.wait()
    handle = Handle.from_dict(json.loads(line))
    assert rt.adopt(handle) is True
    assert rt.running() == [(7304, 1)]
    rt.stop(7304, 1, grace_s=30)
    ev = end_of(rt, 7304)
    assert (ev.kind, ev.exit_code) == (EventKind.EXITED, 143)
    # Its actors are gone now: adopting the same attempt again finds none.
    assert rt.adopt(handle) is False
    (again,) = rt.poll()
    assert again.kind is EventKind.LOST and "is gone" in again.message


def test_a_worker_asking_for_gpus_the_node_lacks_is_one_line(rt, tmp_path):
    with pytest.raises(PlinthError, match=r"^job 7305 attempt 1: workers\[0\].gpus: no GPU 2 "
                                          r"on ray-worker \(2 GPUs\)$"):
        launch(rt, tmp_path, 7305, sh("true"), [WorkerLaunch(0, WORKER.name, gpus=(2,))])
    with pytest.raises(PlinthError, match=r"'ray-gone' is not a live Ray node"):
        launch(rt, tmp_path, 7305, sh("true"), [WorkerLaunch(0, "ray-gone")])
    with pytest.raises(PlinthError, match=r"did not start on Ray: .*'no-such-command' is not "
                                          r"an executable"):
        launch(rt, tmp_path, 7305, ("no-such-command",), [WorkerLaunch(0, HEAD.name)])
    assert rt.running() == []


@pytest.mark.parametrize("args, message", [
    (["--ray-address", "127.0.0.1:{port}"],
     "--ray-address 127.0.0.1:{port}: cannot reach the Ray head: Connection refused"),
    ([], "--runtime ray: give the Ray head with --ray-address HOST:PORT (or auto)"),
    (["--ray-address", "nowhere"], "--ray-address: expected HOST:PORT or auto, got 'nowhere'"),
])
def test_plinth_up_on_a_bad_ray_address_is_one_line(tmp_path, args, message):
    port = free_port()
    args = [a.format(port=port) for a in args]
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "plinth.cli.main", "up", "--home", str(tmp_path / "home"),
                        "--port", str(free_port()), "--runtime", "ray", *args],
                       check=False, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message.format(port=port) in lines[0], p.stderr
    assert time.monotonic() - t0 < 60  # not Ray's minute of retries


def test_plinth_up_with_another_ray_version_than_the_clusters_is_one_line(ray_cluster, tmp_path):
    """A driver whose Ray is another version than the cluster's: Ray's own check (against the
    version the cluster recorded at start) refuses it, and `plinth up` says so in one line,
    naming both versions."""
    import platform

    import ray

    script = ("import os, sys\n"
              "os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'\n"
              "import ray\n"
              "ray.__version__ = '2.0.0'  # what this driver claims to be\n"
              "from plinth.cli.main import main\n"
              "sys.argv[0] = 'plinth'\n"
              "main()\n")
    p = subprocess.run([PY, "-c", script, "up", "--home", str(tmp_path / "home"), "--port",
                        str(free_port()), "--runtime", "ray", "--ray-address",
                        ray_cluster.address], check=False, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    py = platform.python_version()
    assert len(lines) == 1 and lines[0].endswith(
        f"--ray-address {ray_cluster.address}: version mismatch: the Ray cluster runs Ray "
        f"{ray.__version__} on Python {py}, this control plane Ray 2.0.0 on Python {py}; run "
        f"it with the cluster's versions"), p.stderr


def test_node_logs_read_a_new_file_of_a_reused_name_from_its_start(tmp_path, monkeypatch):
    """Job ids start again at 1 under another control plane (a new store), so a worker's name
    comes back on a node whose NodeLogs outlived the first: its new output must not be read
    from the old one's offset."""
    from plinth.runtime import ray_logs

    monkeypatch.setattr(ray_logs.tempfile, "gettempdir", lambda: str(tmp_path))
    logs, name = ray_logs.NodeLogs(), "plinth-j1-a1-r0"
    folder = ray_logs.worker_dir(name)
    folder.mkdir(parents=True)
    (folder / "id").write_text("first")
    (folder / "output.log").write_bytes(b"the first job's output\n")
    assert logs.take([name]) == {name: b"the first job's output\n"}
    (folder / "id").write_text("second")  # the new worker of that name
    (folder / "output.log").write_bytes(b"up\n")
    assert logs.take([name]) == {name: b"up\n"}
    assert logs.take([name]) == {}
