"""FL simulation on Ray (issue 15): seconds per round, Ray actors against the process pool.

Each configuration runs `run_sim` in a fresh child process (the real server, the real clients)
while this process samples the resident memory of the child's whole process tree (the pool's
workers; or Ray's GCS, raylet, agents and actors) every 0.2 s and keeps the peak. Every client
trains in every round (`server.fraction` 1.0), so a round of 1,000 clients is 1,000 fits. The
app is tests/fl/apps/tiny.yaml: the digits data (1,438 training images, split IID, so 1.4 per
client at 1,000 clients) and a 64-32-10 MLP. The pool has `--workers` processes; Ray gets the
same number of actors of one CPU each, on a private local Ray started for the run.

    .venv/bin/python bench/fl_sim_ray.py [--clients 100,1000] [--rounds 4] [--workers 2]
        [--json results/fl_sim_ray.json]

Seconds per round is the median of rounds 2 … R (round 1 also starts the pool's processes);
"start" is the wall time before round 1 (imports, Ray, the actors loading the app).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

APP = str(Path(__file__).parents[1] / "tests" / "fl" / "apps" / "tiny.yaml")
SAMPLE_S = 0.2


def one(args: argparse.Namespace) -> None:
    """The child: one simulation, its summary and timings as JSON on `args.out`."""
    from plinth.fl.sim import run_sim

    t0 = time.monotonic()
    firsts: list[float] = []
    res = run_sim(args.app, clients=args.one_clients, rounds=args.rounds, workers=args.workers,
                  backend=args.one_backend,
                  overrides={"server.fraction": 1.0, "server.straggler_timeout": 1800},
                  on_start=lambda spec, first: firsts.append(time.monotonic()))
    res["start_s"] = firsts[0] - t0 if firsts else None
    res["wall_s"] = time.monotonic() - t0
    Path(args.out).write_text(json.dumps(res))


def tree_rss(p: psutil.Process) -> int:
    total = 0
    for q in [p, *p.children(recursive=True)]:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(args: argparse.Namespace, clients: int, backend: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, __file__, "--app", args.app, "--rounds", str(args.rounds),
               "--workers", str(args.workers), "--one-clients", str(clients),
               "--one-backend", backend, "--out", f.name]
        load = Path("/proc/loadavg").read_text().split()[:3]
        p = subprocess.Popen(cmd)
        proc, peak = psutil.Process(p.pid), 0
        while p.poll() is None:
            try:
                peak = max(peak, tree_rss(proc))
            except psutil.Error:
                pass
            time.sleep(SAMPLE_S)
        if p.returncode != 0:
            raise SystemExit(f"{backend} with {clients} clients failed ({p.returncode})")
        res = json.loads(Path(f.name).read_text())
    secs = [r["seconds"] for r in res["rounds"]]
    return {"clients": clients, "backend": backend, "workers": args.workers,
            "s_per_round": statistics.median(secs[1:] or secs), "round1_s": secs[0],
            "start_s": res["start_s"], "wall_s": res["wall_s"],
            "updates": [r["updates"] for r in res["rounds"]],
            "failures": sum(r["failures"] for r in res["rounds"]),
            "final_accuracy": res["final_accuracy"], "peak_rss_mib": peak / 2**20,
            "loadavg": " ".join(load)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default=APP)
    ap.add_argument("--clients", default="100,1000")
    ap.add_argument("--backends", default="pool,ray")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one-clients", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one-backend", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_clients:
        return one(args)
    console = Console(width=160)
    rows = []
    for n in map(int, args.clients.split(",")):
        for backend in args.backends.split(","):
            rows.append(measure(args, n, backend))
            console.print(rows[-1], highlight=False)
    t = Table(title=f"FL sim, tiny digits app, every client trains, {args.rounds} rounds, "
                    f"{args.workers} workers/actors, {psutil.cpu_count()} cores")
    for c in ("clients", "backend", "s/round", "round 1 s", "start s", "updates/round",
              "failures", "final acc", "peak RSS MiB", "loadavg at start"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["clients"]), r["backend"], f"{r['s_per_round']:.2f}",
                  f"{r['round1_s']:.2f}", f"{r['start_s']:.1f}", str(min(r["updates"])),
                  str(r["failures"]), f"{r['final_accuracy']:.3f}",
                  f"{r['peak_rss_mib']:.0f}", r["loadavg"])
    console.print(t)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "cpus": psutil.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
