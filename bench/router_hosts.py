"""Requests through a service's router across hosts against the same service on one host, and the
requests that fail while the control plane is killed (kill -9) and started again.

    sudo .venv/bin/python bench/router_hosts.py [--clients 4] [--seconds 20] [--json PATH]

Two set-ups of the same service (the built-in `tiny-cnn`, 2 replicas of 0.5 CPU, a router of
1 CPU):

- bed: the multi-host bed of `tests/hosts` (3 hosts of network and mount namespaces on one
  machine; a Ray head and `plinth up --runtime ray` on h1, Ray worker nodes on h2 and h3). The
  router and replicas are placed on the worker hosts; the load is sent from h3 to the router's
  reported address, so a request may cross the bridge twice (h3 to the router's host, and on to
  a replica's).
- one host: `plinth up` with the local runtime on 127.0.0.1, the load from the same machine.

The load is `tests/hosts/load.py` in both (closed loop, `--clients` senders, httpx): requests/s
answered and p50/p99 at the client over `--seconds`. Then a second run of `--seconds` in which
the control plane is killed with SIGKILL a quarter of the way in and started again half way:
every answer that is not a 200 (or a connection that fails) is a failed request.

Every host of the bed is a namespace of this one machine, so both set-ups share its CPUs: the
comparison is of the path (veth and bridge hops, Ray's actors against the local runtime's
shims), not of more machines' capacity. The local runtime as root holds each unit to its CPUs
(cgroup `cpu.max`); Ray's CPUs are logical, so on the bed the router and replicas may use more.
Needs root (namespaces, cgroups).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hosts"))
from bed import skip_reason, wait_for
from cluster import PlinthBed

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port

LOAD = ROOT / "tests" / "hosts" / "load.py"
SERVICE = {"kind": "Service", "name": "digits", "model": "tiny-cnn", "input_shape": [784],
           "slo_ms": 500, "resources": {"cpus": 0.5, "memory": "1Gi"}, "min_replicas": 2,
           "max_replicas": 2, "router": {"cpus": 1}}
READY_S = 300.0


def read(out: Path) -> dict:
    try:
        return json.loads(out.read_text())
    except (FileNotFoundError, ValueError):
        return {"ok": 0, "codes": {}, "done": False}


def measure(start_load, out: Path, seconds: float, kill=None, restart=None) -> dict:
    """One run of the load for `seconds`; with `kill` and `restart`, the control plane is
    killed at a quarter of it and started again at half of it."""
    proc = start_load(out, seconds)
    t0 = time.monotonic()
    plane_down_s = None
    if kill is not None:
        time.sleep(seconds / 4)
        kill()
        down_at = time.monotonic()
        time.sleep(max(seconds / 2 - (time.monotonic() - t0), 0))
        restart()
        plane_down_s = time.monotonic() - down_at
    proc.wait(timeout=seconds + 120)
    got = wait_for(lambda: (r := read(out))["done"] and r, "the load's last figures", 30)
    failed = sum(n for code, n in got["codes"].items() if code != "200")
    return {"rps": got["rps"], "p50_ms": got["p50_ms"], "p99_ms": got["p99_ms"],
            "ok": got["ok"], "failed": failed, "codes": got["codes"],
            "plane_down_s": plane_down_s}


def on_bed(args) -> dict:
    pb = PlinthBed().up()
    try:
        spec = pb.shared / "digits.json"  # JSON is YAML
        spec.write_text(json.dumps(SERVICE))
        pb.cli("h3", "submit", str(spec))
        w = wait_for(lambda: (w := pb.api("h3", "/v1/workloads/digits"))["status"].get("ready")
                 == 2 and w, "the service on the bed", READY_S)
        url = w["status"]["url"]
        nodes = {u["unit"]: pb.api("h3", f"/v1/workloads/{u['job_id']}")["allocation"]
                 ["slots"][0]["node_name"] for u in w["units"] if u["state"] == "running"}

        def load(out: Path, seconds: float) -> subprocess.Popen:
            return pb.bed.run("h3", [sys.executable, str(LOAD), url, str(out), "--clients",
                                     str(args.clients), "--seconds", str(seconds)], env=pb.env)

        def kill() -> None:
            assert pb.plane is not None
            pb.plane.kill()
            pb.plane.wait()

        steady = measure(load, pb.shared / "steady.json", args.seconds)
        killed = measure(load, pb.shared / "killed.json", args.seconds, kill, pb.start_plane)
        return {"where": "bed (3 hosts, Ray)", "router": url, "nodes": nodes,
                "steady": steady, "kill9": killed}
    finally:
        pb.down()


def on_one_host(args) -> dict:
    home = Path(tempfile.mkdtemp(prefix="plinth-router-bench-"))
    jobs = Path(tempfile.mkdtemp(prefix="plinth-router-bench-jobs-"))
    jobs.chmod(0o755)  # tenants' users pass through it
    port = free_port()
    up = ("--fake-gpus", "1xA100", "--jobs-dir", str(jobs), "--grace", "2", "--min-runtime", "0")
    procs = [start_server(home, port, *up)]
    try:
        token = (home / "token").read_text().strip()
        with Client(f"http://127.0.0.1:{port}", token) as c:
            c.submit_workload(SERVICE)
            w = wait_for(lambda: (w := c.workload("digits"))["status"].get("ready") == 2 and w,
                     "the service on one host", READY_S)
        url = w["status"]["url"]

        def load(out: Path, seconds: float) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, str(LOAD), url, str(out), "--clients",
                                     str(args.clients), "--seconds", str(seconds)])

        def restart() -> None:
            procs.append(start_server(home, port, *up))

        steady = measure(load, home / "steady.json", args.seconds)
        killed = measure(load, home / "killed.json", args.seconds,
                         lambda: stop_server(procs[-1], signal.SIGKILL), restart)
        return {"where": "one host (local runtime)", "router": url, "steady": steady,
                "kill9": killed}
    finally:
        stop_server(procs[-1])
        kill_jobs(home, jobs)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(jobs, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", type=Path, default=ROOT / "results" / "router_hosts.json")
    args = ap.parse_args()
    why = skip_reason()
    if why:
        raise SystemExit(why)
    rows = [on_bed(args), on_one_host(args)]
    t = Table(title=f"a service through its router: {args.clients} clients, {args.seconds:g} s "
                    "a run")
    for col in ("set-up", "req/s", "p50 ms", "p99 ms", "kill -9 run: req/s", "p99 ms",
                "failed", "plane down s"):
        t.add_column(col, justify="left" if col == "set-up" else "right")
    for r in rows:
        s, k = r["steady"], r["kill9"]
        t.add_row(r["where"], f"{s['rps']:.1f}", f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}",
                  f"{k['rps']:.1f}", f"{k['p99_ms']:.1f}", f"{k['failed']}",
                  f"{k['plane_down_s']:.1f}")
    Console().print(t)
    for r in rows:
        print(f"{r['where']}: router at {r['router']}" +
              (f", units on {r['nodes']}" if "nodes" in r else ""))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"clients": args.clients, "seconds": args.seconds,
                                     "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
