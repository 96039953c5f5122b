"""Simulator wall time against trace length: the first 10k, 20k, 40k and all 82k Philly jobs.

    python bench/sim_scaling.py [--trace PATH] [--cluster 32x8xV100] [--policies fifo,tiresias]
                                [--sizes 10000,20000,40000,0] [--json PATH]

The cluster is scaled with the number of jobs (the whole trace on 32 nodes x 8 GPUs, a
quarter of it on 8 nodes), so that every prefix offers the same load and the growth measured is
the simulator's, not a deeper queue's. 0 in --sizes means the whole trace. Per-job time that
stays flat means linear growth.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.table import Table

from plinth.core.spec import load_cluster
from plinth.sched.policies import make_policy
from plinth.sim import report
from plinth.sim.engine import simulate
from plinth.sim.run import sched_config

from philly_common import DEFAULT_TRACE, philly


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--nodes", type=int, default=32, help="nodes of 8 V100 for the whole trace")
    ap.add_argument("--policies", default="fifo,tiresias")
    ap.add_argument("--sizes", default="10000,20000,40000,0")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    jobs = philly(args.trace).jobs
    console = report.console()
    rows = []
    for policy in args.policies.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            n = size or len(jobs)
            part = jobs[:n]
            nodes = max(1, round(args.nodes * n / len(jobs)))
            cluster = load_cluster(f"{nodes}x8xV100")
            t = time.perf_counter()
            r = simulate(part, cluster, make_policy(policy), sched_config())
            wall = time.perf_counter() - t
            rows.append({"policy": policy, "jobs": n, "gpus": cluster.total_gpus,
                         "passes": r.passes, "wall_s": round(wall, 2),
                         "us_per_job": round(wall / n * 1e6, 1)})
            console.print(rows[-1])
    t = Table(title="Simulator wall time against trace length")
    for col in rows[0]:
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))
    console.print(t)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
