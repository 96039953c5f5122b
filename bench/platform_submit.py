"""Control plane speed: job submissions per second through the REST API, the time from a
submission to the scheduler's launch decision on an idle cluster, a job array from submission
to its last task's end, `plinth ls` with 10,000 jobs stored, and what a per-tenant Unix user
adds to a launch (as root).

    python bench/platform_submit.py [--jobs 3000] [--threads 4] [--latency-jobs 200]
        [--array-tasks 1000] [--stored 10000] [--json F]

A real `plinth up` process (SQLite store, fake GPUs) on 127.0.0.1. For throughput, a job holding
every GPU runs first, so the submitted jobs queue (scheduling passes still run on the growing
queue) instead of starting thousands of processes. Latency is measured from the store's own
timestamps: the `submitted` event (written when the API accepts the job) to the `started` event
(written when the scheduler decides to launch it), one job at a time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from plinth.cli.quickstart import kill_jobs, start_server, stop_server  # noqa: E402
from plinth.core.net import free_port  # noqa: E402
from plinth.client import Client  # noqa: E402

SPEC = {"name": "bench", "command": ["true"],
        "resources": {"cpus": 0.01, "memory": "16Mi", "gpus": 1}}


def throughput(url: str, token: str, jobs: int, threads: int, server_pid: int
               ) -> tuple[float, float, float]:
    with Client(url, token) as c:
        hog = c.submit({**SPEC, "name": "hog", "command": ["sleep", "3600"],
                        "resources": {**SPEC["resources"], "gpus": 8}, "priority": 100,
                        "preemptible": False})
        while c.job(hog)["state"] != "running":
            time.sleep(0.05)
    per = jobs // threads
    lat: list[float] = []
    lock = threading.Lock()

    # The load generator is deliberately lean (http.client on keep-alive connections, as wrk
    # would be): it shares the machine's two cores with the server, and the server is measured.
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(SPEC).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def worker() -> None:
        mine = []
        conn = http.client.HTTPConnection(host, int(port))
        for _ in range(per):
            t = time.perf_counter()
            conn.request("POST", "/v1/workloads", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 201:
                raise RuntimeError(f"submission failed: HTTP {r.status}")
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    server = psutil.Process(server_pid)
    cpu0 = sum(server.cpu_times()[:2])
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    cpu = sum(server.cpu_times()[:2]) - cpu0
    with Client(url, token) as c:
        pending = [j for j in c.jobs(limit=10000) if j["state"] == "pending"]
        assert len(pending) == per * threads, "lost submissions"
    return per * threads / wall, float(np.percentile(lat, 99)) * 1000, cpu / (per * threads)


def decision_latency(url: str, token: str, n: int) -> np.ndarray:
    out = []
    with Client(url, token) as c:
        for _ in range(n):
            j = c.submit(SPEC)
            while True:
                d = c.job(j)
                if d["state"] in ("succeeded", "failed"):
                    break
                time.sleep(0.005)
            ev = {e["kind"]: e["time"] for e in d["events"]}
            out.append(ev["started"] - ev["submitted"])
    return np.array(out) * 1000


def array_to_finish(url: str, token: str, tasks: int) -> float:
    """Seconds from submitting a `tasks`-task array of `true` (no GPU) to its last task's end."""
    with Client(url, token) as c:
        t0 = time.time()
        head = c.submit({**SPEC, "name": "array", "array": f"0-{tasks - 1}",
                         "resources": {"cpus": 0.01, "memory": "16Mi"}})
        assert c.wait_all(head, timeout=3600, poll_s=0.5) == "succeeded"
        return max(j["end_time"] for j in c.jobs(array=head, all=True, limit=10000)) - t0


def ls_latency(url: str, token: str, stored: int, runs: int = 5) -> tuple[int, float, float]:
    """(jobs stored, ms for one `GET /v1/workloads?kind=Job&all` page of 1000, s for a whole
    `plinth ls -a`) once at least `stored` jobs are stored (more are queued as one array behind
    the hog)."""
    import os
    import subprocess

    with Client(url, token) as c:
        have = c.jobs_page(all=True, limit=1)[1]
        if have < stored:
            c.submit({**SPEC, "name": "filler", "array": f"0-{stored - have - 1}"})
        total = c.jobs_page(all=True, limit=1)[1]
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            c.jobs_page(all=True, limit=1000)
            times.append(time.perf_counter() - t)
    env = {**os.environ, "PLINTH_SERVER": url, "PLINTH_TOKEN": token, "COLUMNS": "80"}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "plinth.cli.main", "ls", "-a"], env=env, check=True,
                   capture_output=True)
    return total, statistics.median(times) * 1000, time.perf_counter() - t


def user_cost(url: str, token: str, n: int) -> tuple[float, float] | None:
    """Mean seconds from submission to the end of a `true` job run as the server's user and as
    a tenant's own Unix user; None where the server is not root."""
    import os

    if os.geteuid() != 0:
        return None
    with Client(url, token) as admin:
        admin.set_tenant("bench-user")
        tenant_token = admin.add_token("bench-user")
    out = []
    for tok in (token, tenant_token):
        with Client(url, tok) as c:
            spans = []
            for _ in range(n):
                j = c.submit({**SPEC, "resources": {"cpus": 0.01, "memory": "16Mi"}})
                c.wait(j, timeout=60, poll_s=0.005)
                d = c.job(j)
                spans.append(d["end_time"] - d["submit_time"])
        out.append(statistics.fmean(spans))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--latency-jobs", type=int, default=200)
    ap.add_argument("--array-tasks", type=int, default=1000)
    ap.add_argument("--stored", type=int, default=10000)
    ap.add_argument("--json")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="plinth-bench-")) / "home"
    results = {}
    port = free_port()
    proc = start_server(home, port, "--fake-gpus", "8xA100", "--min-runtime", "0", "--grace", "1")
    url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
    try:
        lat = decision_latency(url, token, args.latency_jobs)
        users = user_cost(url, token, 50)
        array_s = array_to_finish(url, token, args.array_tasks)
        rate, p99_submit, cpu_per = throughput(url, token, args.jobs, args.threads, proc.pid)
        stored, ls_page_ms, ls_cli_s = ls_latency(url, token, args.stored)
    finally:
        stop_server(proc)
        kill_jobs(home)
    results = {"submissions_per_s": rate, "submit_call_p99_ms": p99_submit,
               "server_cpu_ms_per_submission": cpu_per * 1000,
               "submissions_per_server_cpu_s": 1 / cpu_per,
               "load_average_1m": psutil.getloadavg()[0],
               "decision_p50_ms": float(np.percentile(lat, 50)),
               "decision_p99_ms": float(np.percentile(lat, 99)),
               "decision_max_ms": float(lat.max()), "decision_mean_ms": statistics.fmean(lat),
               "jobs": args.jobs, "threads": args.threads, "latency_jobs": args.latency_jobs,
               "array_tasks": args.array_tasks, "array_submit_to_finish_s": array_s,
               "jobs_stored": stored, "ls_page_ms": ls_page_ms, "ls_cli_s": ls_cli_s,
               "launch_as_server_user_s": users[0] if users else None,
               "launch_as_tenant_user_s": users[1] if users else None}
    t = Table(title="Plinth control plane (SQLite, one process, loopback HTTP)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    t.add_row(f"submissions/s ({args.jobs} jobs, {args.threads} client threads)",
              f"{rate:.0f}", ">= 500 (Slurm)")
    t.add_row("submit call p99 (ms)", f"{p99_submit:.1f}", "")
    t.add_row("server CPU per submission (ms, all its threads)", f"{cpu_per * 1000:.2f}", "")
    t.add_row("submissions per server CPU-second", f"{1 / cpu_per:.0f}", "")
    t.add_row(f"submit-to-launch-decision p50 (ms, {args.latency_jobs} jobs)",
              f"{results['decision_p50_ms']:.1f}", "")
    t.add_row("submit-to-launch-decision p99 (ms)", f"{results['decision_p99_ms']:.1f}", "< 100")
    t.add_row("submit-to-launch-decision max (ms)", f"{results['decision_max_ms']:.1f}", "")
    t.add_row(f"{args.array_tasks}-task array, submit to last end (s)", f"{array_s:.1f}", "")
    t.add_row(f"GET /v1/workloads?kind=Job page of 1000, {stored} jobs stored (ms)",
              f"{ls_page_ms:.0f}", "")
    t.add_row(f"`plinth ls -a`, {stored} jobs stored (s, the whole command)", f"{ls_cli_s:.2f}",
              "")
    if users:
        t.add_row("submit to end of `true`: server's user / tenant's own user (ms)",
                  f"{users[0] * 1000:.0f} / {users[1] * 1000:.0f}", "")
    Console().print(t)
    Console().print(f"load average during the run: {psutil.getloadavg()[0]:.1f} on "
                    f"{psutil.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
