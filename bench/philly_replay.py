"""Replay the whole Microsoft Philly trace (82k jobs) on a 256-GPU cluster under each policy.

    python bench/philly_replay.py [--trace PATH] [--cluster 32x8xV100] [--policies fifo,...]
                                  [--window 0d:30d] [--rounds 360|off] [--throughputs FILE]
                                  [--json PATH]

The trace is read from ../shared/data/traces/philly/philly.csv by default; it is never copied
into the repository. Each policy's wall time is measured around the whole replay, with the
time spent inside the policy's passes beside it (the rest is the owner and the simulated
runtime). The machine's load average is printed with the results: the replay is single-threaded
and other processes on the same cores slow it down.
"""

from __future__ import annotations

import argparse
import os
import time

from plinth.core.spec import load_cluster
from plinth.core.throughput import DEFAULT_THROUGHPUTS, Throughputs
from plinth.sched.policies import make_policy
from plinth.sim import report
from plinth.sim.engine import SimResult, simulate
from plinth.sim.metrics import run_settings, summarize
from plinth.sim.run import parse_rounds, sched_config

from philly_common import add_replay_args, philly


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_replay_args(ap, "fifo,sjf,priority,drf,tiresias,gavel,themis")
    ap.add_argument("--rounds", default="360", help="round length (s) for gavel and themis, "
                    "or 'off' (reallocate at every event)")
    ap.add_argument("--throughputs", default=None, help="Gavel JSON or CSV throughput matrix")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--plots", default=None, help="folder for the JCT CDF and utilisation plots")
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    thr = Throughputs.load(args.throughputs) if args.throughputs else DEFAULT_THROUGHPUTS
    cfg = sched_config(round_s=parse_rounds(args.rounds), throughputs=thr)
    t = time.perf_counter()
    trace = philly(args.trace, args.window)
    load_s = time.perf_counter() - t
    console = report.console()
    console.print(f"{len(trace.jobs):,} jobs loaded in {load_s:.1f} s; cluster {cluster.describe()}")
    results, rows = [], []
    for name in args.policies.split(","):
        res, row = _replay(trace.jobs, cluster, name, cfg)
        results.append(res)
        rows.append(row)
        console.print(f"{name}: {row['replay_wall_s']:.1f} s ({row['policy_s']:.1f} s in the "
                      f"policy), {row['passes']:,} passes; load average "
                      f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    console.print(report.table(rows, f"Philly replay, {len(trace.jobs):,} jobs, {cluster.describe()}"))
    if args.json_path:
        report.write_json(rows, args.json_path)
    if args.plots:
        report.plot(results, args.plots, "philly")


def _replay(jobs, cluster, name: str, cfg) -> tuple[SimResult, dict]:
    """One policy's replay, as `compare` runs it, with the time inside its passes added up."""
    policy = make_policy(name)
    inner, spent = policy.schedule, [0.0]

    def timed(snap, now):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return inner(snap, now)
        finally:
            spent[0] += time.perf_counter() - t

    policy.schedule = timed  # type: ignore[method-assign]
    t = time.perf_counter()
    r = simulate(jobs, cluster, policy, cfg)
    row = {**summarize(r), **run_settings(policy, cfg), "replay_wall_s": time.perf_counter() - t,
           "policy_s": spent[0], "loadavg": os.getloadavg()[0]}
    return r, row

if __name__ == "__main__":
    main()
