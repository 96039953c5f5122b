"""FL round time across hosts: an FLTask on the multi-host bed against the same task on one host.

    sudo .venv/bin/python bench/fl_hosts.py [--clients 20] [--rounds 5] [--json F]

The task: a 1.08M-parameter MLP (64-1000-1000-10, float32, 4.3 MB an update) on the digits data
set, split among --clients clients (FedAvg, every client every round, one local epoch). Two
shapes of it: `flat` (every client joins the server) and `middles` (`server.aggregation.mode:
tree` with 2 middle aggregators, each with one leaf unit, clients joining the middle of their
cid mod 2: the server folds one update per node).

- bed: the multi-host bed of tests/hosts (Linux namespaces: h1 holds the control plane and a
  Ray head with no CPUs, h2 and h3 are Ray worker nodes, h4 is a data owner's machine with no
  Ray). The units are placed on h2 and h3 and listen on their nodes' addresses; the clients run
  in --procs processes on h4 (`plinth fl client --task`, asking the control plane for their
  server's or middle's address) and reach the units over the bed's veth links.
- one host: `plinth up` with the local runtime on 127.0.0.1 (two fake nodes, so that the two
  middles each have one), the clients in as many processes on the same machine.

Every process of both runs on the one machine's cores, so the difference is what crossing hosts
costs (Ray's launch path, the veth links, the namespaces), not extra hardware. A round's time is
the server's (from the first task handed out to the round committed: training, uploads and
aggregation), as it reports it to the controller; the table gives the median of the rounds after
the first, and the whole task from submit to succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hosts"))  # the bed (bed.py, cluster.py)

MODEL = '''"""A 1.08M-parameter MLP for the digits data set (bench/fl_hosts.py)."""

from torch import nn


def make_model(spec):
    return nn.Sequential(nn.Linear(64, 1000), nn.ReLU(), nn.Linear(1000, 1000), nn.ReLU(),
                         nn.Linear(1000, 10))
'''
PLINTH = [sys.executable, "-m", "plinth.cli.main"]


def write_app(folder: Path, shape: str, clients: int, rounds: int) -> Path:
    """The task of `shape` (flat or middles) and its clients' tokens, in `folder`."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL)
    doc = {"kind": "FLTask", "name": f"bench-{shape}", "code": "model.py", "seed": 0,
           "data": {"source": "digits", "partition": "iid", "clients": clients},
           "train": {"epochs": 1, "batch_size": 16, "lr": 0.05},
           "strategy": {"name": "fedavg"},
           "server": {"rounds": rounds, "fraction": 1.0, "min_clients": clients,
                      "min_available": clients, "straggler_timeout": 600},
           "resources": {"cpus": 0.25, "memory": "2Gi"},
           "transport": {"tokens": "tokens.txt"}}
    if shape == "middles":
        doc["server"]["aggregation"] = {"mode": "tree", "max_leaves": 1, "middles": 2}
    path = folder / f"{shape}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def tenants_own(path: Path) -> None:
    """As root, the admin's tenant (`default`) runs its units as its own Unix user, on the local
    runtime and on a Ray node alike: the tokens file its server or middles read is its own."""
    if os.geteuid() == 0:
        from plinth.control.users import ensure_user

        user = ensure_user("default")
        os.chown(path, user.uid, user.gid)


def client_argv(app: Path, clients: int, procs: int) -> list[list[str]]:
    per = -(-clients // procs)
    return [[*PLINTH, "fl", "client", str(app), "--task", yaml.safe_load(app.read_text())["name"],
             "--cids", f"{lo}-{min(clients, lo + per) - 1}", "--tokens",
             str(app.parent / "tokens.txt")] for lo in range(0, clients, per)]


def finish(name: str, get, procs: list[subprocess.Popen], t0: float) -> dict:
    """Wait for the task to end; its per-round times and the whole task's."""
    while (w := get(name))["state"] == "active":
        bad = [p for p in procs if p.poll() not in (None, 0)]
        if bad:
            raise RuntimeError(f"a client process failed: {bad[0].stdout.read()[-1500:]}")
        time.sleep(1.0)
    wall = time.perf_counter() - t0
    if w["state"] != "succeeded":
        raise RuntimeError(f"{name} ended {w['state']}: {w['status']}")
    secs = [r["seconds"] for r in w["status"]["per_round"]]
    return {"round_s": statistics.median(secs[1:] or secs), "first_round_s": secs[0],
            "rounds": len(secs), "task_s": wall,
            "accuracy": w["status"]["per_round"][-1]["accuracy"]}


def on_one_host(app: Path, clients: int, procs: int) -> dict:
    """The task on `plinth up` with the local runtime on 127.0.0.1."""
    home = app.parent / "home-one"
    port = free_port()
    jobs = app.parent / "jobs-one"
    jobs.mkdir(mode=0o755, exist_ok=True)
    server = start_server(home, port, "--fake-gpus", "1xA100,1xV100", "--grace", "2",
                          "--min-runtime", "0", "--jobs-dir", str(jobs))
    url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
    env = {**os.environ, "PLINTH_SERVER": url, "PLINTH_TOKEN": token, "OMP_NUM_THREADS": "1"}
    tenants_own(app.parent / "tokens.txt")
    running: list[subprocess.Popen] = []
    try:
        t0 = time.perf_counter()
        subprocess.run([*PLINTH, "submit", str(app)], env=env, check=True, capture_output=True)
        running = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
                   for argv in client_argv(app, clients, procs)]
        with Client(url, token) as c:
            return finish(yaml.safe_load(app.read_text())["name"], c.workload, running, t0)
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
        stop_server(server)
        kill_jobs(home)


def on_the_bed(pb, app: Path, clients: int, procs: int) -> dict:
    """The task on the bed: units on h2 and h3, clients on h4."""
    env = {**pb.env, "PLINTH_SERVER": pb.server, "PLINTH_TOKEN": pb.token,
           "OMP_NUM_THREADS": "1"}
    running: list[subprocess.Popen] = []
    try:
        t0 = time.perf_counter()
        pb.cli("h4", "submit", str(app))
        running = [pb.bed.run("h4", argv, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
                   for argv in client_argv(app, clients, procs)]
        out = finish(yaml.safe_load(app.read_text())["name"],
                     lambda name: pb.api("h4", f"/v1/workloads/{name}"), running, t0)
        w = pb.api("h4", f"/v1/workloads/{yaml.safe_load(app.read_text())['name']}")
        out["nodes"] = sorted({pb.api("h4", f"/v1/workloads/{u['job_id']}")["allocation"][
            "slots"][0]["node_name"] for u in w["units"]})
        return out
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--procs", type=int, default=2, help="client processes")
    ap.add_argument("--shapes", default="flat,middles")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    from bed import skip_reason
    from cluster import PlinthBed, Worker

    why = skip_reason()
    if why:
        sys.exit(f"fl_hosts: the bed cannot be built here: {why}")
    shapes = args.shapes.split(",")
    results: list[dict] = []
    pb = PlinthBed(hosts=4, workers=(Worker("h2", rack="r2"), Worker("h3", rack="r3")))
    try:
        pb.up()
        folder = pb.shared / "fl-hosts"
        for shape in shapes:
            app = write_app(folder / shape, shape, args.clients, args.rounds)
            pb.bed.sh("h4", [*PLINTH, "fl", "tokens", str(app.parent / "tokens.txt"),
                             "--clients", str(args.clients)])
            tenants_own(app.parent / "tokens.txt")
            results.append({"shape": shape, "where": "bed",
                            **on_the_bed(pb, app, args.clients, args.procs)})
    finally:
        pb.down()
    local = Path(tempfile.mkdtemp(prefix="plinth-fl-hosts-"))
    local.chmod(0o755)
    for shape in shapes:
        app = write_app(local / shape, shape, args.clients, args.rounds)
        subprocess.run([*PLINTH, "fl", "tokens", str(app.parent / "tokens.txt"), "--clients",
                        str(args.clients)], check=True, capture_output=True)
        results.append({"shape": shape, "where": "one host", "nodes": ["127.0.0.1"],
                        **on_one_host(app, args.clients, args.procs)})
    t = Table(title=f"FLTask, 1.08M parameters, {args.clients} clients in {args.procs} "
                    f"processes, {args.rounds} rounds")
    for col in ("shape", "where", "units on", "round s (median)", "first round s", "task s",
                "accuracy"):
        t.add_column(col, justify="left" if col in ("shape", "where", "units on") else "right")
    for r in sorted(results, key=lambda r: (shapes.index(r["shape"]), r["where"])):
        t.add_row(r["shape"], r["where"], ",".join(r["nodes"]), f"{r['round_s']:.2f}",
                  f"{r['first_round_s']:.2f}", f"{r['task_s']:.1f}", f"{r['accuracy']:.4f}")
    Console(width=120).print(t)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
