"""Replay the whole Microsoft Philly trace (82k jobs) on a 256-GPU cluster under each policy.

    python bench/philly_replay.py [--trace PATH] [--cluster 32x8xV100] [--policies fifo,...]
                                  [--window 0d:30d] [--json PATH]

The trace is read from ../shared/data/traces/philly/philly.csv by default; it is never copied
into the repository. Each policy's wall time is measured around the whole replay.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from plinth.core.spec import load_cluster
from plinth.sim import report
from plinth.sim.run import compare, sched_config
from plinth.sim.traces import load_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared/data/traces/philly/philly.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cluster", default="32x8xV100")
    ap.add_argument("--policies", default="fifo,sjf,priority,drf,tiresias,gavel,themis")
    ap.add_argument("--window", default=None)
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--plots", default=None, help="folder for the JCT CDF and utilisation plots")
    args = ap.parse_args()
    if not Path(args.trace).exists():
        sys.exit(f"{args.trace}: no such file (pass --trace PATH to the Philly CSV)")
    cluster = load_cluster(args.cluster)
    t = time.perf_counter()
    trace = load_trace(args.trace, "philly", window=args.window)
    load_s = time.perf_counter() - t
    console = report.console()
    console.print(f"{len(trace.jobs):,} jobs loaded in {load_s:.1f} s; cluster {cluster.describe()}")
    results, rows = [], []
    for name in args.policies.split(","):
        t = time.perf_counter()
        res, row = compare(trace.jobs, cluster, [name], sched_config())
        row[0]["replay_wall_s"] = time.perf_counter() - t
        results += res
        rows += row
        console.print(f"{name}: {row[0]['replay_wall_s']:.1f} s, {row[0]['passes']:,} passes")
    console.print(report.table(rows, f"Philly replay, {len(trace.jobs):,} jobs, {cluster.describe()}"))
    if args.json_path:
        report.write_json(rows, args.json_path)
    if args.plots:
        report.plot(results, args.plots, "philly")


if __name__ == "__main__":
    main()
