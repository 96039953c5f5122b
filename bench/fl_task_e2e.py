"""End to end: MNIST with 100 clients as a task submitted to the platform, against `plinth fl
sim` of the same app.

    python bench/fl_task_e2e.py [--clients 100] [--rounds 30] [--procs 10] [--json F]

A real `plinth up` on 127.0.0.1 runs the task's FL server as a workload; `--procs` client
processes (`plinth fl client --cids A-B --tokens FILE`) hold the 100 data partitions between
them, each partition its own client over its own gRPC connection with its own token (100
processes with PyTorch each do not fit in this machine's memory). Then `plinth fl sim` runs the
same app, seed and rounds in one process. The table compares test accuracy round by round (the
server evaluates the global model on the 10,000 MNIST test images after each round).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from plinth.cli.quickstart import kill_jobs, start_server, stop_server  # noqa: E402
from plinth.client import Client  # noqa: E402
from plinth.core.net import free_port  # noqa: E402

APP = ROOT / "examples/fl/mnist/app.yaml"


def plinth(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plinth.cli.main", *args], check=True,
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, **kw)


def write_task(folder: Path, clients: int, rounds: int) -> Path:
    doc = yaml.safe_load(APP.read_text())
    doc["code"] = str(APP.parent / doc["code"])
    doc["data"]["clients"] = clients
    doc["server"]["rounds"] = rounds
    doc["transport"] = {"tokens": "tokens.txt"}
    doc["resources"] = {"cpus": 1, "memory": "4Gi"}
    spec = folder / "task.yaml"
    spec.write_text(yaml.safe_dump(doc))
    plinth("fl", "tokens", str(folder / "tokens.txt"), "--clients", str(clients))
    return spec


def run_task(spec: Path, clients: int, procs: int) -> dict:
    home = spec.parent / "home"
    port = free_port()
    server = start_server(home, port, "--fake-gpus", "4xA100")
    url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
    env = {"PLINTH_SERVER": url, "PLINTH_TOKEN": token}
    workers: list[subprocess.Popen] = []
    peak = 0
    try:
        t0 = time.perf_counter()
        plinth("submit", str(spec), env=env)
        name = yaml.safe_load(spec.read_text())["name"]
        with Client(url, token) as c:
            while not (address := c.workload(name)["status"].get("address")):
                time.sleep(0.2)
            per = -(-clients // procs)
            for lo in range(0, clients, per):
                hi = min(clients, lo + per) - 1
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "plinth.cli.main", "fl", "client", str(spec),
                     "--server", address, "--cids", f"{lo}-{hi}", "--tokens",
                     str(spec.parent / "tokens.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"}))
            while (w := c.workload(name))["state"] == "active":
                rss = 0
                for p in workers:
                    try:
                        rss += psutil.Process(p.pid).memory_info().rss
                    except psutil.Error:
                        pass
                peak = max(peak, rss)
                if any(p.poll() not in (None, 0) for p in workers):
                    bad = next(p for p in workers if p.poll() not in (None, 0))
                    raise RuntimeError(f"a client process failed: {bad.stderr.read()[-500:]}")
                time.sleep(1.0)
        wall = time.perf_counter() - t0
        if w["state"] != "succeeded":
            raise RuntimeError(f"the task ended {w['state']}: {w['status']}")
        return {"wall_s": wall, "per_round": w["status"]["per_round"],
                "client_procs_peak_rss_mib": peak / 2**20}
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
        stop_server(server)
        kill_jobs(home)


def run_sim(spec: Path, clients: int, rounds: int) -> dict:
    out = spec.parent / "sim.json"
    t0 = time.perf_counter()
    plinth("fl", "sim", str(spec), "--clients", str(clients), "--rounds", str(rounds),
           "--json", str(out))
    doc = json.loads(out.read_text())
    return {"wall_s": time.perf_counter() - t0, "per_round": doc["rounds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--procs", type=int, default=10)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="plinth-fl-e2e-"))
    spec = write_task(folder, args.clients, args.rounds)
    task = run_task(spec, args.clients, args.procs)
    sim = run_sim(spec, args.clients, args.rounds)
    acc_task = {r["round"]: r["accuracy"] for r in task["per_round"]}
    acc_sim = {r["round"]: r["accuracy"] for r in sim["per_round"]}
    rounds = sorted(acc_task)
    t = Table(title=f"MNIST, {args.clients} clients, {args.rounds} rounds: submitted task "
                    f"({args.procs} client processes) against plinth fl sim")
    for col in ("round", "task accuracy", "sim accuracy", "difference"):
        t.add_column(col, justify="right")
    for r in rounds:
        if r % 5 == 0 or r in (1, rounds[-1]):
            t.add_row(str(r), f"{acc_task[r]:.4f}", f"{acc_sim[r]:.4f}",
                      f"{acc_task[r] - acc_sim[r]:+.4f}")
    console = Console()
    console.print(t)
    last = rounds[-1]
    diffs = [abs(acc_task[r] - acc_sim[r]) for r in rounds]
    result = {"clients": args.clients, "rounds": args.rounds, "procs": args.procs,
              "task_wall_s": task["wall_s"], "sim_wall_s": sim["wall_s"],
              "task_final_accuracy": acc_task[last], "sim_final_accuracy": acc_sim[last],
              "max_abs_difference": max(diffs),
              "client_procs_peak_rss_mib": task["client_procs_peak_rss_mib"],
              "load_average_1m": psutil.getloadavg()[0],
              "task_per_round": task["per_round"], "sim_per_round": sim["per_round"]}
    console.print(f"task {task['wall_s']:.0f} s, sim {sim['wall_s']:.0f} s; final accuracy "
                  f"{acc_task[last]:.4f} against {acc_sim[last]:.4f}; largest difference in "
                  f"a round {max(diffs):.4f}; client processes peaked at "
                  f"{task['client_procs_peak_rss_mib']:.0f} MiB; load average "
                  f"{psutil.getloadavg()[0]:.1f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
