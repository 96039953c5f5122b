"""Gavel's LP and one round-based scheduling pass at 1,000 active jobs.

Cluster: 1,000 nodes x 8 GPUs, heterogeneous (400 V100, 300 P100, 300 K80 nodes), 32 nodes to a
rack. Jobs: 1,000 with the throughput matrix's job types, gangs of 1..32 GPUs (10% fractional)
asking for about 1.5x the cluster, so the LP has to share. Jobs are placed in submit order until
the cluster is full; those run, the rest wait. Times are medians over `--repeat` runs.

Rows:
- lp: one max-min solve (both stages: fairness, then efficiency at that fairness).
- lp stage 1: the fairness stage alone, for reference.
- gavel pass, new LP: a fresh policy's first pass (solve + a round boundary).
- gavel pass, round boundary: a later round, the LP cached (same active set).
- gavel pass, mid-round: a pass between boundaries (only fills free GPUs).
- themis pass, round boundary / mid-round: the other round-based policy, for comparison.

    python bench/sched_lp.py [--json PATH] [--repeat 5] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.core import Cluster, Job, Node, Request
from plinth.core.throughput import JOB_TYPES
from plinth.sched.lp import max_min_fairness
from plinth.sched.placement import place_and_allocate
from plinth.sched.policies.gavel import Gavel, throughput_matrix
from plinth.sched.policies.themis import Themis
from plinth.sched.state import ClusterState
from plinth.core.lifecycle import State
from plinth.sched.types import JobState, SchedConfig, Snapshot

TARGET_MS = 1000.0
ROUND = SchedConfig().round_s


def hetero_cluster() -> Cluster:
    kinds = ["V100"] * 400 + ["P100"] * 300 + ["K80"] * 300
    return Cluster(tuple(Node(f"n{i:04d}", 96_000, 768_000, m, 8, rack=f"r{i // 32}")
                         for i, m in enumerate(kinds)))


def workload(n: int, seed: int = 1) -> list[Job]:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 4, 8, 16, 32], size=n, p=[0.1, 0.1, 0.15, 0.25, 0.2, 0.2])
    jobs = []
    for i in range(n):
        if rng.random() < 0.1:
            req = Request(gpu_milli=int(rng.integers(1, 10)) * 100, gpu_memory_mib=4096)
        elif sizes[i] <= 8:
            req = Request(gpus=int(sizes[i]))
        else:
            req = Request(gpus=8, workers=int(sizes[i]) // 8)
        jobs.append(Job(i, float(i), float(rng.lognormal(np.log(3600), 1.0)), req,
                        job_type=JOB_TYPES[int(rng.integers(len(JOB_TYPES)))]))
    return jobs


def snapshot(cluster: Cluster, jobs: list[Job]) -> Snapshot:
    state = ClusterState(cluster)
    running: dict[int, JobState] = {}
    pending: list[JobState] = []
    for j in jobs:
        a = place_and_allocate(state, j.request)
        if a is None:
            pending.append(JobState(j, pending_since=j.submit_time))
            continue
        running[j.id] = JobState(j, State.RUNNING, a, start_time=0.0, first_start=0.0,
                                 rate=1.0, model=cluster.nodes[a.slots[0].node].gpu_model)
    return Snapshot(cluster, state, pending, running)


def timed(fn, repeat: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return times, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    cluster = hetero_cluster()
    jobs = workload(args.jobs)
    snap = snapshot(cluster, jobs)
    active = sorted([*snap.running.values(), *snap.pending], key=lambda js: js.id)
    models = cluster.models
    T = throughput_matrix(active, models)
    scale = np.array([js.job.request.num_gpus for js in active])
    cap = np.array([cluster.gpus_of_model(m) for m in models], dtype=float)
    base = {"jobs": len(active), "running": len(snap.running), "nodes": len(cluster.nodes),
            "gpus": cluster.total_gpus, "demand_gpus": float(scale.sum())}
    rows = []

    def row(name: str, times: list[float], **extra) -> None:
        rows.append({"bench": name, "p50_ms": statistics.median(times), "min_ms": min(times),
                     "target_ms": TARGET_MS, **base, **extra})

    times, res = timed(lambda: max_min_fairness(T, scale, cap), args.repeat)
    row("lp", times, fairness_t=res.t, vars=int((res.X > 0).sum()))
    times, res1 = timed(lambda: max_min_fairness(T, scale, cap, efficient=False), args.repeat)
    row("lp stage 1", times, fairness_t=res1.t)

    times, d = timed(lambda: Gavel().schedule(snap, 0.0), args.repeat)
    row("gavel pass, new LP", times, starts=len(d.starts), preempts=len(d.preempts),
        resizes=len(d.resizes))
    pol = Gavel()
    pol.schedule(snap, 0.0)
    clock = iter(ROUND * k for k in range(1, 10 * args.repeat))
    times, d = timed(lambda: pol.schedule(snap, next(clock)), args.repeat)
    row("gavel pass, round boundary", times, starts=len(d.starts), preempts=len(d.preempts),
        resizes=len(d.resizes))
    mid = iter(ROUND * args.repeat + 1.0 + k for k in range(10 * args.repeat))
    pol.schedule(snap, ROUND * args.repeat + 0.5)
    times, d = timed(lambda: pol.schedule(snap, next(mid)), args.repeat)
    row("gavel pass, mid-round", times, starts=len(d.starts))

    tclock = iter(ROUND * k for k in range(10 * args.repeat))
    times, d = timed(lambda: Themis().schedule(snap, next(tclock) + 3600.0), args.repeat)
    row("themis pass, round boundary", times, starts=len(d.starts), preempts=len(d.preempts))
    th = Themis()
    th.schedule(snap, 3600.0)
    times, d = timed(lambda: th.schedule(snap, 3601.0), args.repeat)
    row("themis pass, mid-round", times, starts=len(d.starts))

    t = Table(title=f"Gavel LP and round passes: {cluster.describe()}, {len(active):,} active "
                    f"jobs ({len(snap.running):,} running) asking {scale.sum():,.0f} GPUs")
    for col in ("bench", "p50 ms", "min ms", "decisions", "target"):
        t.add_column(col, justify="left" if col == "bench" else "right")
    for r in rows:
        ok = "[green]✓[/green]" if r["p50_ms"] < TARGET_MS else "[red]✗[/red]"
        what = ", ".join(f"{k} {r[k]}" for k in ("starts", "preempts", "resizes") if k in r)
        if "fairness_t" in r:
            what = f"t = {r['fairness_t']:.3f}"
        t.add_row(r["bench"], f"{r['p50_ms']:.1f}", f"{r['min_ms']:.1f}", what,
                  f"< {TARGET_MS:.0f} {ok}")
    Console().print(t)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
