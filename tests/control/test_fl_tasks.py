"""FL tasks as platform workloads, on loopback: an FL app submitted with `plinth submit` runs its
server as a job of the task; remote client processes join over gRPC with their tokens; the
control plane is killed (-9) and the server process is killed mid-task; the task resumes from
its last round checkpoint and finishes with every round recorded."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import yaml
from plinth_platform import Platform, reachable, tenants_own, with_shims
from plinth_platform import run_cli as cli
from virtual_http import served

APPS = Path(__file__).parents[1] / "fl" / "apps"
ROUNDS = 40


def app(tmp_path: Path, clients: int = 2, **extra) -> Path:
    """The tiny digits app as an FLTask for `clients` clients, with their tokens, in a folder
    the task's units (its tenant's user, as root) can read."""
    reachable(tmp_path)
    doc = yaml.safe_load((APPS / "tiny.yaml").read_text())
    doc |= {"kind": "FLTask", "name": "digits-fl", "code": str(APPS / "tiny.py"),
            "resources": {"cpus": 0.5, "memory": "2Gi"}}
    doc["data"]["clients"] = clients
    doc["server"] |= {"rounds": ROUNDS, "min_clients": 2, "min_available": 2}
    doc["transport"] = {"tokens": "tokens.txt"}
    doc |= extra
    p = tmp_path / "app.yaml"
    p.write_text(yaml.safe_dump(doc))
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "tokens",
                    str(tmp_path / "tokens.txt"), "--clients", str(clients)], check=True,
                   capture_output=True)
    tenants_own(tmp_path / "tokens.txt")  # the task's server reads it as the tenant's user
    return p


def start_client(spec: Path, p: Platform, cid: int, api_token: str | None = None
                 ) -> subprocess.Popen:
    """`plinth fl client --task digits-fl` for partition `cid`, with its token from the app's
    tokens.txt: it asks the control plane `p` (with `api_token`, else the admin's) where its
    server (or middle aggregator) is, and again whenever it loses it."""
    tokens = (spec.parent / "tokens.txt").read_text().split("\n")
    return subprocess.Popen(
        [sys.executable, "-m", "plinth.cli.main", "fl", "client", str(spec), "--task",
         "digits-fl", "--cid", str(cid), "--token", tokens[cid].split()[1]],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PLINTH_SERVER": p.url,
             "PLINTH_TOKEN": api_token or p.token})


@contextlib.contextmanager
def task_platform(tmp_path: Path, spec: Path, *extra: str, clients: int = 2,
                  fake_gpus: str | None = "4xA100") -> Iterator[tuple[Platform, list]]:
    """A real `plinth up` with the task submitted and its first `clients` clients joining over
    gRPC (a test may append more to the list it is given); the clients and the control
    plane's jobs are ended afterwards whatever happens."""
    p = Platform(tmp_path / "home", *extra, fake_gpus=fake_gpus).start()
    procs: list[subprocess.Popen] = []
    try:
        out = cli(p, "submit", str(spec))
        assert out.returncode == 0 and "Submitted FLTask digits-fl" in out.stdout, out.stderr
        procs += [start_client(spec, p, i) for i in range(clients)]
        yield p, procs
        for proc in procs:
            proc.wait(120)
    except BaseException:  # say what each client said (pytest shows it with the failure)
        for i, proc in enumerate(procs):
            if proc.poll() is None:
                proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            err = err.decode(errors="replace") if isinstance(err, bytes) else err  # text mode
            print(f"client process {i}: exit {proc.wait()}; stderr: {err[-2000:]}")
        raise
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        p.stop()
        p.kill_jobs()


def server_procs(p: Platform) -> list[psutil.Process]:
    """The task's server and the shim that runs it."""
    return with_shims([
        x for x in psutil.process_iter(["cmdline", "environ"])
        if "server" in (x.info.get("cmdline") or []) and "fl" in (x.info.get("cmdline") or [])
        and (x.info.get("environ") or {}).get("PLINTH_CHECKPOINT_DIR", "").startswith(
            str(p.jobs_dir))])


def committed_round(folder: Path) -> int:
    """The last round the task's server under `folder` has committed (0 before its round
    log exists)."""
    for db in folder.glob("**/server/meta.sqlite"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
                return c.execute("SELECT COALESCE(MAX(round), 0) FROM rounds").fetchone()[0]
        except sqlite3.Error:
            return 0
    return 0


def test_an_fl_task_survives_its_control_plane_and_server_being_killed(tmp_path, wait_for):
    spec = app(tmp_path)
    with task_platform(tmp_path, spec) as (p, clients):
        c = p.client()
        # Read from the server's own round log, not the status (refreshed each second): the
        # tiny app's rounds are fast enough that, on a loaded machine, the task once ended
        # between the status showing round 2 and the clients being paused.
        wait_for(lambda: committed_round(p.jobs_dir) >= 2, 180, "two rounds")
        # The clients are paused until the server has been killed, so the kills land mid-task
        # however fast the rounds run (on CI the task once finished during the restart).
        paused = [psutil.Process(proc.pid) for proc in clients]
        for proc in paused:
            proc.suspend()
        # kill -9 of the control plane: the server job goes on, and is re-adopted.
        p.stop(signal.SIGKILL)
        p.start()
        c = p.client()
        (unit,) = c.workload("digits-fl")["units"]
        assert "re-adopted" in [e["kind"] for e in c.job(unit["job_id"])["events"]]
        # kill -9 of the server: it is lost and started again, resuming from its last round.
        at = c.workload("digits-fl")["status"]["round"]
        victims = server_procs(p)
        assert victims
        for proc in victims:
            proc.kill()
        for proc in paused:
            proc.resume()
        wait_for(lambda: c.job(unit["job_id"])["attempt"] > unit["attempt"], 60,
                 "the server to start again")
        wait_for(lambda: c.workload("digits-fl")["state"] != "active", 300, "the task to end")
        done = c.workload("digits-fl")
        assert done["state"] == "succeeded", done
        rounds = [r["round"] for r in done["status"]["per_round"]]
        assert rounds == list(range(1, ROUNDS + 1)), rounds  # each round once, none redone
        assert done["status"]["per_round"][-1]["accuracy"] > 0.5 and at < ROUNDS
        show = cli(p, "show", "digits-fl")
        assert f"round {ROUNDS} of {ROUNDS}" in show.stdout and "accuracy per round" in show.stdout


def test_one_client_process_holds_several_clients_each_proven_by_its_own_token(tmp_path,
                                                                             wait_for):
    """`plinth fl client --cids 0-3 --tokens FILE`: four data partitions in one process (the
    data and the model load once), each joining the task's server over its own connection
    with its own token; every round has all four."""
    spec = app(tmp_path, clients=4)
    doc = yaml.safe_load(spec.read_text())
    doc["server"] |= {"rounds": 3, "min_clients": 4, "min_available": 4}
    spec.write_text(yaml.safe_dump(doc))
    with task_platform(tmp_path, spec, clients=0) as (p, procs):
        c = p.client()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "plinth.cli.main", "fl", "client", str(spec), "--task",
             "digits-fl", "--cids", "0-3", "--tokens", str(tmp_path / "tokens.txt")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PLINTH_SERVER": p.url,
                 "PLINTH_TOKEN": p.token}))
        wait_for(lambda: c.workload("digits-fl")["state"] != "active", 300, "the task to end")
        done = c.workload("digits-fl")
        assert done["state"] == "succeeded", done
        assert [(r["round"], r["participants"]) for r in done["status"]["per_round"]] == \
            [(1, 4), (2, 4), (3, 4)]
        out, err = procs[0].communicate(timeout=120)
        assert procs[0].returncode == 0, err
        assert "clients 0-3: 12 tasks done" in out, out


def test_an_fl_task_without_client_tokens_is_refused(tmp_path, vp) -> None:
    """On a control plane in virtual time (virtual.py), the CLI over real HTTP."""
    spec = app(tmp_path)
    doc = yaml.safe_load(spec.read_text())
    doc.pop("transport")
    spec.write_text(yaml.safe_dump(doc))
    with served(vp) as api:
        out = cli(api, "submit", str(spec))
        assert out.returncode != 0
        assert "transport.tokens: an FLTask's server is reachable on the network" in out.stderr
        doc["transport"] = {"tokens": "missing.txt"}
        spec.write_text(yaml.safe_dump(doc))
        out = cli(api, "submit", str(spec))
        assert "transport.tokens: no such file" in out.stderr
    assert all(w["name"] != "digits-fl" for w in vp.client().workloads(all=True))


def test_a_tree_tasks_leaf_aggregators_are_units_on_the_servers_node(tmp_path, wait_for):
    """`server.aggregation.mode: tree`: the leaves are unit jobs the scheduler places, pinned
    to the server's node (two fake nodes here, so a leaf placed anywhere else would show), and
    the server folds every round through them."""
    run_tree_task(tmp_path, wait_for, fake_gpus="1xA100,1xV100")


def run_tree_task(tmp_path: Path, wait_for, *extra: str, fake_gpus: str | None) -> str:
    """A tree-mode task on `plinth up *extra`: checks that its leaves ran on the server's node
    and that every round went through them; returns that node's name."""
    rounds = 3
    spec = app(tmp_path)
    doc = yaml.safe_load(spec.read_text())
    doc["server"] |= {"rounds": rounds, "aggregation": {"mode": "tree", "max_leaves": 2}}
    spec.write_text(yaml.safe_dump(doc))
    with task_platform(tmp_path, spec, *extra, fake_gpus=fake_gpus) as (p, _):
        c = p.client()

        def node_of(job_id: int) -> str:
            return c.job(job_id)["allocation"]["slots"][0]["node_name"]

        leaves_seen: dict[str, str] = {}

        def leaves_placed() -> bool:
            w = c.workload("digits-fl")
            for u in w["units"]:
                if u["unit"].startswith("leaf-") and c.job(u["job_id"])["allocation"]:
                    leaves_seen[u["unit"]] = node_of(u["job_id"])
            return bool(leaves_seen)

        wait_for(leaves_placed, 120, "a leaf unit to be placed")
        server = next(u for u in c.workload("digits-fl")["units"] if u["unit"] == "server")
        assert set(leaves_seen.values()) == {node_of(server["job_id"])}, leaves_seen
        wait_for(lambda: c.workload("digits-fl")["state"] != "active", 300, "the task to end")
        done = c.workload("digits-fl")
        assert done["state"] == "succeeded", done
        per_round = done["status"]["per_round"]
        assert [r["round"] for r in per_round] == list(range(1, rounds + 1))
        assert all(r["leaves"] and r["leaves"] >= 1 for r in per_round), per_round
        assert all(u["state"] not in ("running", "pending") for u in done["units"]), done["units"]
        return node_of(server["job_id"])
