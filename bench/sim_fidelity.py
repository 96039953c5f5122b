"""Does the simulator predict the platform? One mixed workload through a real `plinth up`, then
the same jobs replayed by `plinth sim`'s simulator from what `plinth export` wrote.

    python bench/sim_fidelity.py [--jobs 60] [--policy drf] [--seed 0] [--load 1.3]
                                 [--min-runtime 30] [--out results/sim_fidelity] [--json F]

The platform: `plinth up --fake-gpus 8xA100 --policy POLICY --min-runtime S` on 127.0.0.1,
started here, with three tenants whose GPU quotas are set through the API (4, 2 and 2 GPUs,
borrowing allowed). The workload (seeded): `sleep` jobs of 1-5 s, a third whole-GPU jobs, a
quarter gangs of 2-4 one-GPU workers, the rest fractional GPUs (0.25 or 0.5, some with a GPU
memory limit), priorities 0-2, half with a `max_runtime` estimate; submitted over HTTP on a
Poisson arrival schedule sized to `--load` x the cluster, so that jobs queue. Once every job
has ended, `plinth export` writes the trace, the cluster and the sidecar, and the simulator
replays them on the same cluster with the policy and scheduler config the platform used.

Figures (defined in `plinth.control.export.Fidelity`): the share of jobs that start in the same
order (longest common subsequence of the two start orders), the same share position by
position, pairwise agreement, and the error in average JCT, |sim - platform| / platform. Goal:
>= 95 % in the same order and the average JCT within 10 %. Then the same replay with one
platform-matching setting at a time undone, to show what each is worth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from plinth.cli.quickstart import kill_jobs, start_server, stop_server  # noqa: E402
from plinth.client import Client  # noqa: E402
from plinth.control import export as ex  # noqa: E402
from plinth.core.net import free_port  # noqa: E402
from plinth.core.spec import load_cluster  # noqa: E402
from plinth.core.lifecycle import State  # noqa: E402
from plinth.sched.policies import make_policy  # noqa: E402
from plinth.sched.types import SchedConfig  # noqa: E402
from plinth.sim.engine import simulate  # noqa: E402
from plinth.sim.traces import load_trace  # noqa: E402

GPUS = 8
TENANTS = {"team-a": 4.0, "team-b": 2.0, "team-c": 2.0}  # nominal GPUs; borrowing unlimited
GOAL_ORDER, GOAL_JCT = 0.95, 0.10


def workload(n: int, seed: int, load: float) -> list[tuple[float, dict, float]]:
    """(arrival s, job spec, sleep s) for `n` jobs, arrivals sized so the offered GPU load is
    `load` x the cluster."""
    rng = np.random.default_rng(seed)
    jobs, gpu_seconds = [], 0.0
    names = list(TENANTS)
    for i in range(n):
        sleep = round(float(rng.uniform(1.0, 5.0)), 1)
        kind = rng.choice(["whole", "gang", "fraction"], p=[0.35, 0.25, 0.40])
        res: dict = {"cpus": 0.05, "memory": "64Mi"}
        workers = 1
        if kind == "whole":
            res["gpus"] = 1
            gpus = 1.0
        elif kind == "gang":
            res["gpus"] = 1
            workers = int(rng.integers(2, 5))
            gpus = float(workers)
        else:
            share = float(rng.choice([0.25, 0.5]))
            res["gpu_fraction"] = share
            if rng.random() < 0.5:
                res["gpu_memory"] = "8Gi"
            gpus = share
        spec = {"name": f"fid-{i:03d}", "tenant": names[int(rng.choice(3, p=[0.4, 0.3, 0.3]))],
                "command": ["sleep", f"{sleep:g}"], "resources": res, "workers": workers,
                "priority": int(rng.choice(3, p=[0.6, 0.25, 0.15]))}
        if rng.random() < 0.5:
            spec["max_runtime"] = 20  # a user's estimate, as Slurm's --time
        jobs.append((spec, sleep))
        gpu_seconds += gpus * sleep
    span = gpu_seconds / (GPUS * load)
    gaps = rng.exponential(span / n, n)
    gaps[0] = 0.0
    arrivals = np.cumsum(gaps)
    return [(float(t), spec, sleep) for t, (spec, sleep) in zip(arrivals, jobs)]


def run_platform(home: Path, work: list[tuple[float, dict, float]], policy: str,
                 min_runtime: float, out: Path, console: Console) -> tuple[dict, float]:
    """Run `work` through a real platform, export it; returns (submit lags, wall seconds)."""
    port = free_port()
    proc = start_server(home, port, "--fake-gpus", f"{GPUS}xA100", "--policy", policy,
                        "--min-runtime", f"{min_runtime:g}", "--grace", "2")
    url, token = f"http://127.0.0.1:{port}", (home / "token").read_text().strip()
    lags: list[float] = []
    try:
        with Client(url, token) as c:
            for name, gpus in TENANTS.items():
                c.set_tenant(name, gpus)
            console.print(f"platform up on {url}: {GPUS}xA100, policy {policy}, min_runtime "
                          f"{min_runtime:g} s; submitting {len(work)} jobs over "
                          f"{work[-1][0]:.1f} s", highlight=False)
            t0 = time.monotonic()
            ids = []
            for at, spec, _ in work:
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                lags.append(time.monotonic() - t0 - at)
                ids.append(c.submit(spec))
            while True:
                rows = c.jobs(all=True, limit=10000)
                if all(State(r["state"]).terminal for r in rows):
                    break
                time.sleep(0.25)
            wall = time.monotonic() - t0
            bad = [r for r in rows if r["state"] != State.SUCCEEDED.value]
            if bad:
                console.print(f"[red]{len(bad)} jobs did not succeed[/] (first: job "
                              f"{bad[0]['id']} {bad[0]['state']}: {bad[0]['reason']})")
        r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "export", "-o",
                            str(out / "trace.csv"), "--min-runtime", f"{min_runtime:g}",
                            "--server", url, "--token", token],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"plinth export failed: {r.stderr.strip()}")
        console.print(r.stdout.strip(), highlight=False, soft_wrap=True)
        if r.stderr.strip():
            console.print(r.stderr.strip(), highlight=False, soft_wrap=True)
    finally:
        stop_server(proc)
        kill_jobs(home)
    return {"mean_s": float(np.mean(lags)), "max_s": float(np.max(lags))}, wall


def variants(out: Path, sleeps: dict[str, float]) -> tuple[list[tuple[str, dict]], dict]:
    """The replay as exported, then with one platform-matching setting undone at a time.
    Returns the rows and the platform's reaction to arrivals (see `reaction`)."""
    meta = ex.read_meta(out / "trace.meta.json")
    cluster = load_cluster(str(out / "trace.cluster.yaml"))
    jobs, _ = ex.replay_jobs(load_trace(str(out / "trace.csv"), "csv").jobs, meta)
    cfg = ex.sched_config(meta["sched_config"])
    opts, name = meta["policy_options"], meta["policy"]
    rows, results = [], []

    def score(label: str, js, c: SchedConfig = cfg, o: dict = opts, policy: str = name) -> None:
        r = simulate(js, cluster, make_policy(policy, **o), c)
        rows.append((label, ex.fidelity(meta["jobs"], r.jobs, r.preemptions).row()))
        results.append(r)

    score("as exported (platform's config)", jobs)
    score("simulator's default SchedConfig", jobs, c=SchedConfig())
    if opts:
        score("policy without the platform's options", jobs, o={})
    score("jobs rescaled by A100 speed (no job_type)",
          [dataclasses.replace(j, job_type="") for j in jobs])
    score("true run times as estimates (oracle)",
          [dataclasses.replace(j, time_limit=None) for j in jobs])
    other = "fifo" if name != "fifo" else "sjf"
    score(f"another policy ({other})", jobs, o={}, policy=other)
    waits = {m["job_id"]: sum(b - a for a, b, _, _ in
                              (m["runs"] if m["checkpointed"] else m["runs"][-1:]))
             for m in meta["jobs"]}
    score("run time from the launch, not the start",
          [dataclasses.replace(j, duration=j.duration - waits[j.name]) for j in jobs])
    score("requested sleep as run time",
          [dataclasses.replace(j, duration=sleeps[j.name]) for j in jobs])
    return rows, reaction(meta, results[0])


def reaction(meta: dict, result) -> dict:
    """How long the platform took to start the jobs that the replay starts the instant they
    arrive: the loop's reaction to a submission, and passes held back by the pass spacing."""
    plat = {m["job_id"]: m for m in meta["jobs"]}
    lat = np.array([plat[js.job.name]["first_start"] - plat[js.job.name]["submit"]
                    for js in result.jobs if js.first_start == js.job.submit_time])
    if not lat.size:
        return {"jobs": 0}
    return {"jobs": int(lat.size), "median_s": float(np.median(lat)),
            "p90_s": float(np.percentile(lat, 90)), "max_s": float(lat.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--policy", default="drf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load", type=float, default=1.3, help="offered GPU load x the cluster")
    ap.add_argument("--min-runtime", type=float, default=30.0,
                    help="plinth up --min-runtime (its default is 30)")
    ap.add_argument("--out", type=Path, default=Path("results/sim_fidelity"),
                    help="folder for the export (trace.csv, .cluster.yaml, .meta.json)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--replay-only", action="store_true",
                    help="score the export already in --out again (same --jobs and --seed), "
                         "without running the platform")
    args = ap.parse_args()
    console = Console(width=None if sys.stdout.isatty() else 140)
    args.out.mkdir(parents=True, exist_ok=True)
    work = workload(args.jobs, args.seed, args.load)
    lags, wall = None, None  # not measured again with --replay-only
    if not args.replay_only:
        with tempfile.TemporaryDirectory(prefix="plinth-fidelity-") as tmp:
            lags, wall = run_platform(Path(tmp) / "home", work, args.policy, args.min_runtime,
                                      args.out, console)
    meta = ex.read_meta(args.out / "trace.meta.json")
    if len(meta["jobs"]) != len(work):
        raise SystemExit(f"{args.out}: the export has {len(meta['jobs'])} jobs, the workload "
                         f"{len(work)}; give the --jobs and --seed it was run with")
    # Platform ids are 1..n in submission order (one client, one job at a time).
    sleeps = {m["job_id"]: work[i][2] for i, m in enumerate(
        sorted(meta["jobs"], key=lambda m: int(m["job_id"])))}
    _, supplied = ex.replay_jobs(load_trace(str(args.out / "trace.csv"), "csv").jobs, meta)
    rows, react = variants(args.out, sleeps)
    overhead = np.array([m["run_time"] - sleeps[m["job_id"]] for m in meta["jobs"]])
    main_row = rows[0][1]

    t = Table(title=f"simulator vs platform: {main_row['jobs']} jobs, {GPUS}xA100, "
                    f"{meta['policy']}, min_runtime {meta['sched_config']['min_runtime']:g} s")
    for col in ("figure", "value", "goal", "met"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    ok_order = main_row["same_order"] >= GOAL_ORDER
    ok_jct = main_row["jct_error"] <= GOAL_JCT
    t.add_row("jobs that start in the same order", f"{main_row['same_order']:.1%}",
              f">= {GOAL_ORDER:.0%}", "yes" if ok_order else "NO")
    t.add_row("error in average JCT", f"{main_row['jct_error']:.1%}", f"<= {GOAL_JCT:.0%}",
              "yes" if ok_jct else "NO")
    t.add_row("  same position in the start order", f"{main_row['same_rank']:.1%}", "", "")
    t.add_row("  job pairs in the same start order", f"{main_row['pairwise']:.1%}", "", "")
    t.add_row("  avg JCT platform / sim (s)", f"{main_row['platform_avg_jct_s']:.2f} / "
              f"{main_row['sim_avg_jct_s']:.2f}", "", "")
    t.add_row("  first start error mean / max (s)", f"{main_row['start_error_s']:.3f} / "
              f"{main_row['max_start_error_s']:.3f}", "", "")
    t.add_row("  preemptions platform / sim", f"{main_row['platform_preemptions']} / "
              f"{main_row['sim_preemptions']}", "", "")
    t.add_row("  run time over the sleep: mean / max (s)",
              f"{overhead.mean():.3f} / {overhead.max():.3f}", "", "")
    if react["jobs"]:
        t.add_row(f"  start after arrival, {react['jobs']} jobs the replay starts at once: "
                  f"median / p90 / max (s)", f"{react['median_s']:.3f} / {react['p90_s']:.3f} "
                  f"/ {react['max_s']:.3f}", "", "")
    if lags is not None:
        t.add_row("  submission behind schedule: mean / max (s)",
                  f"{lags['mean_s']:.3f} / {lags['max_s']:.3f}", "", "")
    console.print(t)

    v = Table(title="the replay with one platform-matching setting undone")
    for col in ("replay", "same order", "same position", "pairs", "avg JCT sim (s)",
                "JCT error", "preempt"):
        v.add_column(col, justify="left" if col == "replay" else "right")
    for label, r in rows:
        v.add_row(label, f"{r['same_order']:.1%}", f"{r['same_rank']:.1%}",
                  f"{r['pairwise']:.1%}", f"{r['sim_avg_jct_s']:.2f}", f"{r['jct_error']:.1%}",
                  str(r["sim_preemptions"]))
    console.print(v)
    if supplied:
        console.print(f"the sidecar supplied what the CSV loader does not read: "
                      f"{', '.join(supplied)}", highlight=False)
    result = {"jobs": args.jobs, "policy": args.policy, "seed": args.seed, "load": args.load,
              "min_runtime_s": args.min_runtime, "gpus": GPUS, "platform_wall_s": wall,
              "fidelity": main_row, "variants": {label: r for label, r in rows},
              "sidecar_supplied": supplied,
              "run_time_overhead_s": {"mean": float(overhead.mean()),
                                      "max": float(overhead.max())},
              "submit_lag_s": lags, "platform_reaction_s": react,
              "goal_met": bool(ok_order and ok_jct)}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
