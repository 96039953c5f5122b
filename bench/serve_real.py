"""The real serving path against the simulator, on the same time-compressed trace.

A part of Faro's 10-job Twitter trace is replayed, one trace minute in 60/c s, against a real
`plinth up`: ten `kind: Service` workloads submitted with the client, replicas started by the
runtime and placed by the scheduler, the control plane's router and autoscaler, and real HTTP
requests sent open-loop at each minute's count (uniform times within the minute, as the
simulator's default). Each replica's model stands in for ResNet34 by sleeping a service time
drawn from the trace's fit, divided by c (`bench/serve_emulated.py`), so that a 2-core machine
can host the replicas of the CPU budget. The same compressed trace (counts thinned by `--thin`
so that the router and the load generator keep up on 2 cores) then goes through
`plinth serve sim --compress c` with the same CPU budget, cold start and SLO.

An SLO violation is a request answered after the SLO (720 ms / c) or not answered with 200.
Two rates are given on both paths: per request (late or failed requests over all requests),
and Faro's (1 - the mean over minutes of the jobs' mean share of requests within the SLO),
which is what `plinth serve sim` reports first.

Hops: each answer's Server-Timing says how long it waited in the router for a replica and how
long the replica took; the rest of its latency is the hops (sender, router and replica HTTP
handling on the way there and back), which the simulator does not model by default.
`--hop-out F` writes this run's hop times; `--hop F` gives hop times measured on another run
(another part of the trace) to the simulator, which is then also run without them.

The simulator runs after the real path: `--sim-seeds N` gives the mean and range over N seeds
(one seed is not a figure: its spread is about 2x), and `--cold-start measured` gives each
policy's simulator the median replica start its real run measured. For each late request the
real path records when it was sent and the largest part of its latency (queue, replica, hop).

    .venv/bin/python bench/serve_real.py --minutes 0:30 --compress 5 --thin 2 --cpus 16 \\
        --json results/serve_real.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from plinth.cli.quickstart import kill_jobs, start_server, stop_server
from plinth.client import Client
from plinth.core.net import free_port
from plinth.serve.sim import COLD_START_S

TRACES = Path(os.environ.get("PLINTH_TRACES", ROOT.parent / "shared" / "data" / "traces"))
TRACE = TRACES / "faro-twitter" / "jobs10_6h.jsonl"
FIT = TRACES / "faro-twitter" / "resnet34_latency_lognorm.yaml"
ROUTER_CPUS = 0.2  # each service's router unit (under a CPU limit, it caps the router's rate)


def thinned_trace(src: Path, start: int, end: int, thin: int, out: Path) -> list[dict]:
    """The trace's minutes [start, end) with every count divided by `thin` (rounded)."""
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if start <= r["ts"] < end]
    for i, r in enumerate(rows):
        r["ts"] = i
        r["counts"] = {j: {k: round(v / thin) for k, v in m.items()}
                       for j, m in r["counts"].items()}
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def mean_service_s(fit: dict) -> float:
    from scipy import stats

    p = fit["params"]
    return float(stats.lognorm(p["shape"], loc=p["loc"], scale=p["scale"]).mean())


async def replay(urls: dict[str, str], rows: list[dict], minute_s: float, slo_s: float,
                 seed: int) -> dict:
    """Send each minute's requests at uniform random times within it; returns counts."""
    rng = np.random.default_rng(seed)
    plan = []
    for m, r in enumerate(rows):
        for job, counts in r["counts"].items():
            n = sum(counts.values())
            plan += [(m * minute_s + t, job, m) for t in rng.uniform(0, minute_s, n)]
    plan.sort()
    started_at = time.time()
    results: list[tuple[str, int, float, int]] = []
    hops: list[float] = []
    late_parts: dict[str, int] = {"queue": 0, "replica": 0, "hop": 0, "failed": 0}
    late_at: list[float] = []  # when each late request was sent (s from the start)
    body = json.dumps({"inputs": [[0.0]]})

    async def one(c: aiohttp.ClientSession, job: str, minute: int) -> None:
        t0 = time.perf_counter()
        timing = None
        try:
            async with c.post(urls[job], data=body, headers={"content-type":
                                                             "application/json"}) as r:
                await r.read()
                code, timing = r.status, r.headers.get("server-timing")
        except (TimeoutError, aiohttp.ClientError):
            code = -1
        lat = time.perf_counter() - t0
        results.append((job, code, lat, minute))
        parts = dict(p.split(";dur=") for p in timing.split(", ")) if code == 200 and timing else {}
        if "replica" in parts:
            q, rep = float(parts["queue"]) / 1000, float(parts["replica"]) / 1000
            hops.append(lat - q - rep)
        if code != 200 or lat > slo_s:  # late: which part of its latency was the largest
            late_at.append(t0 - start)
            late_parts["failed" if code != 200 else "hop" if "replica" not in parts else
                       max((q, "queue"), (rep, "replica"), (lat - q - rep, "hop"))[1]] += 1

    # aiohttp, not httpx: with a few thousand requests in flight httpx's own CPU cost (its
    # pool is scanned per request) would slow the sender below the trace's rate on 2 cores.
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as c:
        t0 = start = time.perf_counter()
        tasks = []
        for at, job, m in plan:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(c, job, m)))
        overrun = time.perf_counter() - t0 - len(rows) * minute_s  # how far the sender fell behind
        await asyncio.gather(*tasks)
    jobs = sorted({job for _, job, _ in plan})
    asked = np.zeros((len(rows), len(jobs)))
    good = np.zeros((len(rows), len(jobs)))
    codes: dict[int, int] = {}
    for job, code, lat, m in results:
        codes[code] = codes.get(code, 0) + 1
        asked[m, jobs.index(job)] += 1
        good[m, jobs.index(job)] += code == 200 and lat <= slo_s
    lats = [lat for _, code, lat, _ in results if code == 200]
    late = (asked - good).sum(axis=1).astype(int).tolist()
    sat = np.where(asked > 0, good / np.maximum(asked, 1), 1.0)
    return {"requests": len(results),
            "request_violation_rate": 1 - good.sum() / max(asked.sum(), 1),
            "slo_violation_rate": float(1 - sat.mean(axis=1).mean()),
            "codes": codes, "p50_latency_s": float(np.percentile(lats, 50)) if lats else None,
            "p99_latency_s": float(np.percentile(lats, 99)) if lats else None,
            "hop_s": hops, "hop_p50_ms": float(np.percentile(hops, 50)) * 1000 if hops else None,
            "hop_p99_ms": float(np.percentile(hops, 99)) * 1000 if hops else None,
            "overrun_s": round(overrun, 2), "started_at": started_at, "late_by_minute": late,
            "late_by_part": late_parts, "late_at_s": sorted(round(t, 3) for t in late_at)}


def real_run(policy: str, rows: list[dict], args, fit_path: Path, jobs: list[str]) -> dict:
    minute_s = 60.0 / args.compress
    home = Path(tempfile.mkdtemp(prefix="plinth-serve-real-"))
    print(f"home: {home}", flush=True)
    port = free_port()
    proc = start_server(home, port, "--fake-gpus", "1xA100", "--min-runtime", "0", "--grace",
                        "2", "--serve-policy", policy,
                        "--serve-tick", f"{10 / args.compress:g}", "--serve-minute",
                        f"{minute_s:g}")
    try:
        token = (home / "token").read_text().strip()
        env = {"SERVE_EMU_FIT": str(fit_path), "SERVE_EMU_COMPRESS": f"{args.compress:g}"}
        os.environ.update(env)  # the client times the model once at submit
        slo_ms = args.slo_ms / args.compress
        service_ms = mean_service_s(yaml.safe_load(fit_path.read_text())) * 1000 / args.compress
        with Client(f"127.0.0.1:{port}", token) as c:
            # So that the cluster holds exactly --cpus replicas beside the services' routers.
            cpus = c.nodes()[0]["cpus"] - len(jobs) * ROUTER_CPUS
            per_replica = cpus / args.cpus
            urls = {}
            for i, job in enumerate(jobs):
                c.submit_workload({
                    "kind": "Service", "name": f"job{i}", "model": "bench.serve_emulated:make",
                    "input_shape": [1], "slo_ms": slo_ms, "service_ms": round(service_ms, 3),
                    "resources": {"cpus": per_replica, "memory": "1Gi"},
                    "min_replicas": 1, "max_replicas": args.cpus,
                    "batching": {"max_batch": 1, "max_wait_ms": 0}, "env": env,
                    "router": {"cpus": ROUTER_CPUS}, "workdir": str(ROOT)})
            deadline = time.monotonic() + 300
            while not all(c.workload(f"job{i}")["status"].get("ready") for i in range(len(jobs))):
                if time.monotonic() > deadline:
                    raise SystemExit("replicas not ready after 300 s")
                time.sleep(0.5)
            for i, job in enumerate(jobs):  # where each one's router reported it listens
                urls[job] = c.workload(f"job{i}")["status"]["url"]
            # The services' desired and ready replicas through the replay, to set late requests
            # against scale-ups (each added replica is a cold start on the same 2 cores) and to
            # time each added replica's start under the replay's load.
            seen: list[tuple[float, list[int], list[int]]] = []
            done = threading.Event()

            def watch() -> None:
                with Client(f"127.0.0.1:{port}", token) as w:
                    while not done.wait(0.5):
                        st = [w.workload(f"job{i}")["status"] for i in range(len(jobs))]
                        seen.append((time.time(), [s["desired"] for s in st],
                                     [s.get("ready", 0) for s in st]))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                out = asyncio.run(replay(urls, rows, minute_s, slo_ms / 1000, args.seed))
            finally:
                done.set()
                watcher.join()
            out.update(scale_ups(seen, out["started_at"], minute_s, out.pop("late_by_minute")))
            out["replica_start_s"] = replica_starts(seen)
            out["replicas_end"] = [c.workload(f"job{i}")["status"]["desired"]
                                   for i in range(len(jobs))]
        return {"policy": policy, "path": "real", **out}
    finally:
        stop_server(proc)
        kill_jobs(home)


def scale_ups(seen: list[tuple[float, list[int], list[int]]], start: float, minute_s: float,
              late: list[int]) -> dict:
    """Replicas added per replay minute (from the watcher's samples), and how many of the
    late or failed requests were sent in a minute that added some."""
    added = [0] * len(late)
    for (_, a, _), (t, b, _) in zip(seen, seen[1:]):
        m = int((t - start) // minute_s)
        if 0 <= m < len(late):
            added[m] += sum(max(y - x, 0) for x, y in zip(a, b))
    busy = [m for m, n in enumerate(added) if n]
    return {"replicas_added": sum(added), "minutes_adding": len(busy),
            "late_in_adding_minutes": sum(late[m] for m in busy), "late": sum(late),
            "late_by_minute": late, "added_by_minute": added}


def replica_starts(seen: list[tuple[float, list[int], list[int]]]) -> list[float]:
    """Seconds from each rise of a service's desired replicas to the sample where its ready
    replicas reach the new count (a start under the replay's load, to within the watcher's
    0.5 s and the router's tick); a rise undone before it is ready is not counted."""
    out = []
    for j in range(len(seen[0][1]) if seen else 0):
        for i in range(1, len(seen)):
            before, (t, desired, _) = seen[i - 1][1][j], seen[i]
            if desired[j] <= before:
                continue
            for t2, d2, r2 in seen[i:]:
                if d2[j] < desired[j]:
                    break
                if r2[j] >= desired[j]:
                    out.append(round(t2 - t, 2))
                    break
    return out


def sim_run(policies: list[str], trace: Path, args, fit_path: Path, hop: str | None,
            seed: int, cold_start: float) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        cmd = [sys.executable, "-m", "plinth.cli.main", "serve", "sim", "--trace", str(trace),
               "--service-time", str(fit_path), "--cpus", str(args.cpus), "--slo-ms",
               f"{args.slo_ms:g}", "--policy", policies[0], "--compress", f"{args.compress:g}",
               "--cold-start", f"{cold_start:g}", "--queueing", "router",
               "--arrivals", "uniform", "--seed", str(seed), "--json", str(out),
               "--initial-replicas", "1",  # as the services are submitted: min_replicas 1
               "--out", tmp]
        if len(policies) > 1:
            cmd += ["--compare", ",".join(policies[1:])]
        if hop:
            cmd += ["--hop", hop]
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        doc = json.loads(out.read_text())
    rows = doc if isinstance(doc, list) else doc.get("results", doc)
    return [{"policy": r["policy"], "path": "sim+hop" if hop else "sim", "seed": seed,
             "cold_start_s": cold_start, "slo_violation_rate": r["slo_violation_rate"],
             "request_violation_rate": r["request_violation_rate"],
             "p99_latency_s": r.get("p99_latency_s"), "replicas_added": r["replicas_added"]}
            for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", default="0:30")
    ap.add_argument("--compress", type=float, default=5.0)
    ap.add_argument("--thin", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=16)
    ap.add_argument("--slo-ms", type=float, default=720.0)
    ap.add_argument("--cold-start", default=str(COLD_START_S),
                    help="the simulator's cold start (s, real): a measured replica start, or "
                    "'measured': each policy's median replica start on this run's real path")
    ap.add_argument("--policies", default="faro-fairsum,aiad")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim-seeds", type=int, default=1,
                    help="simulate with seeds --seed .. --seed+N-1 (arrival times and service "
                    "times), and report their mean and range")
    ap.add_argument("--sim-only", action="store_true", help="skip the real path")
    ap.add_argument("--hop", default=None,
                    help="hop times measured on another run, for the simulator (JSON)")
    ap.add_argument("--hop-out", default=None, help="write this run's hop times (JSON)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    start, end = (int(x) for x in args.minutes.split(":"))
    policies = args.policies.split(",")
    measured = args.cold_start == "measured"
    if measured and args.sim_only:
        raise SystemExit("--cold-start measured: needs the real path (drop --sim-only)")
    fixed_cold = None if measured else float(args.cold_start)
    hop = str(Path(args.hop).resolve()) if args.hop else None
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        rows = thinned_trace(TRACE, start, end, args.thin, trace)
        jobs = sorted(rows[0]["counts"])
        results = []
        for p in [] if args.sim_only else policies:
            print(f"real path: {p} ...", flush=True)
            results.append(real_run(p, rows, args, FIT, jobs))
        # Each policy's simulator runs with the cold start given, or the one its real path
        # measured (several replicas started at once are slower on shared cores).
        colds = {p: fixed_cold if fixed_cold is not None else
                 statistics.median(next(r["replica_start_s"] for r in results
                                        if r["policy"] == p) or [COLD_START_S])
                 for p in policies}
        for h in [None, hop] if hop else [None]:
            for seed in range(args.seed, args.seed + args.sim_seeds):
                if fixed_cold is not None:  # one run for all the policies
                    results += sim_run(policies, trace, args, FIT, h, seed, fixed_cold)
                else:
                    for p in policies:
                        results += sim_run([p], trace, args, FIT, h, seed, colds[p])
    hops = [h for r in results for h in r.pop("hop_s", [])]
    if args.hop_out:
        Path(args.hop_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.hop_out).write_text(json.dumps({
            "minutes": args.minutes, "thin": args.thin, "compress": args.compress,
            "policies": policies, "hop_s": [round(h, 6) for h in hops]}))
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"\n{Path(TRACE).name} minutes {args.minutes}, counts / {args.thin}, compressed "
          f"{args.compress:g}x, {args.cpus} CPUs, SLO {args.slo_ms:g} ms (/{args.compress:g}), "
          f"load average {load}")
    print(f"{'policy':<14} {'path':<8} {'per request':>22} {'Faro rate':>10} {'p99 (s)':>8} "
          f"{'hop p50/p99 ms':>15} {'requests':>9} {'started':>7} {'cold (s)':>8}")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["policy"], r["path"]), []).append(r)
    for (policy, path), rs in groups.items():
        if path == "real":
            (r,) = rs
            rate, hop = f"{r['request_violation_rate']:.4f}", (
                f"{r['hop_p50_ms']:.1f}/{r['hop_p99_ms']:.1f}" if r.get("hop_p50_ms") is not None
                else "-")
        else:  # the mean over the seeds, and their range
            v = [x["request_violation_rate"] for x in rs]
            rate = (f"{np.mean(v):.4f}" + (f" ({min(v):.4f}-{max(v):.4f})" if len(v) > 1 else ""))
            hop = "-"
        p99 = np.mean([x["p99_latency_s"] for x in rs if x.get("p99_latency_s") is not None] or
                      [np.nan])
        cold = rs[0].get("cold_start_s")
        print(f"{policy:<14} {path:<8} {rate:>22} "
              f"{np.mean([x['slo_violation_rate'] for x in rs]):>10.4f} {p99:>8.3f} "
              f"{hop:>15} {rs[0].get('requests', '-'):>9} "
              f"{np.mean([x['replicas_added'] for x in rs]):>7.1f} "
              f"{'-' if cold is None else f'{cold:.2f}':>8}")
    for r in results:
        if r["path"] == "real":
            print(f"{r['policy']}, real: {r['late_in_adding_minutes']} of {r['late']} late or "
                  f"failed requests were sent in the {r['minutes_adding']} of {len(rows)} "
                  f"minutes that added replicas")
            print(f"{r['policy']}, real: the largest part of each late request's latency: "
                  + ", ".join(f"{k} {v}" for k, v in r["late_by_part"].items()))
            starts = r["replica_start_s"]
            if starts:
                print(f"{r['policy']}, real: {len(starts)} replica starts, median "
                      f"{statistics.median(starts):.1f} s, max {max(starts):.1f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "load": load,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
