"""FGD vs best fit on the Alibaba GPU 2023 cluster (Weng et al., ATC'23, the "inflation" test).

Pods from a pod list arrive one after another in file (arrival) order and never leave. Each is
placed at once; the run stops at the first pod that cannot be placed, and we report how much of
the cluster's GPU share was allocated then (allocated milli-GPUs / total). Fragmentation is
what stops a run early: free GPU share is left, but in pieces no arriving pod can use. FGD's
target workload is the pod list's own shape mix, as in the paper.

If a list runs out before a pod fails, it starts again from the top (the workload is inflated
by repeating the list), so every run ends at a real failure.

The first failure can be one rare pod shape (an 8-GPU pod that only one node type has the CPU
for), so we also report the measure the paper plots: pods keep arriving, a pod that does not
fit is skipped, and the allocation ratio is read when the arrived GPU demand reaches the
cluster's capacity ("at 100% arrived").

Policies: Plinth's best fit (GPU models tried one at a time in cluster order), FGD (all allowed
models weighed at once), and FGD restricted to best fit's model order, which separates what the
fragmentation measure gains from what choosing the node type gains. The cluster is the GPU node
list as `plinth.core.spec.load_cluster` reads it (nodes without GPUs are left out), so CPU-only
pods land on GPU nodes.

    .venv/bin/python bench/alibaba_frag.py --json out.json
    .venv/bin/python bench/alibaba_frag.py --lists default gpushare40
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from plinth.core.resources import MILLI, Cluster, Request
from plinth.core.spec import load_cluster
from plinth.sched.fgd import WorkloadProfile, cluster_fragmentation
from plinth.sched.placement import DEFAULT_PLACEMENT, PlacementConfig, place_and_allocate
from plinth.sched.state import ClusterState
from plinth.sim.inflate import describe, first_failure
from plinth.sim.inflate import fill as fill_ratio
from plinth.sim.traces import load_trace

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "traces" / "alibaba-gpu-2023"
LISTS = ("default", "gpushare40", "gpushare100", "multigpu50")


def pod_requests(path: Path) -> list[Request]:
    """The pods of a list in arrival order, read with the Alibaba trace loader.

    The `multigpu*` lists have no time columns (their rows are already in arrival order), and
    the loader needs them; so for those we add the row number as the creation time and still
    let the loader do the parsing.
    """
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    if "creation_time" in header:
        return [j.request for j in load_trace(str(path), "alibaba").jobs]
    with open(path, newline="", encoding="utf-8") as src, tempfile.NamedTemporaryFile(
            "w", suffix=".csv", newline="", delete=False) as tmp:
        rows = csv.reader(src)
        out = csv.writer(tmp)
        out.writerow([*next(rows), "creation_time", "deletion_time"])
        for i, row in enumerate(rows):
            if row:
                out.writerow([*row, i, i + 1])
    try:
        return [j.request for j in load_trace(tmp.name, "alibaba").jobs]
    finally:
        os.unlink(tmp.name)


class Policy(NamedTuple):
    name: str
    cfg: PlacementConfig
    # Try GPU models one at a time in cluster order, as best fit does, instead of letting FGD
    # weigh all models at once: separates what the fragmentation measure gains from what
    # choosing the node type gains.
    model_order: bool = False

    def place(self, state: ClusterState, req: Request) -> bool:
        models = None
        if self.model_order and (req.gpus or req.gpu_milli):
            models = tuple(m for m in state.cluster.models if req.allows(m))
        return place_and_allocate(state, req, self.cfg, models) is not None


def _timed(fn, cluster: Cluster, pods: list[Request], policy: Policy,
           profile: WorkloadProfile) -> dict:
    start = time.perf_counter()
    r = fn(cluster, pods, placer=policy.place)
    elapsed = time.perf_counter() - start
    total = r.state.capacity_milli
    return {
        "placed": r.placed, "skipped": r.skipped, "alloc_ratio": r.alloc_ratio,
        "allocated_gpus": r.state.used_milli / MILLI,
        "unallocated_gpus": (total - r.state.used_milli) / MILLI,
        # Expected fragmented GPUs for the target workload at that point.
        "frag_gpus": cluster_fragmentation(r.state, profile) / MILLI,
        "failed_pod": None if r.failed_pod is None else describe(r.failed_pod),
        "seconds": elapsed, "pods_per_s": (r.placed + r.skipped + 1) / elapsed,
    }


def inflate(cluster: Cluster, pods: list[Request], policy: Policy,
            profile: WorkloadProfile) -> dict:
    return _timed(first_failure, cluster, pods, policy, profile)


def fill(cluster: Cluster, pods: list[Request], policy: Policy,
         profile: WorkloadProfile) -> dict:
    return _timed(fill_ratio, cluster, pods, policy, profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--nodes", default="openb_node_list_gpu_node.csv",
                    help="node list file in --data-dir")
    ap.add_argument("--lists", nargs="+", default=list(LISTS),
                    help="pod lists (openb_pod_list_<name>.csv) to run")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    cluster = load_cluster(str(args.data_dir / args.nodes))
    console = Console()
    console.print(f"cluster {args.nodes}: {cluster.describe()}")
    results = []
    for name in args.lists:
        pods = pod_requests(args.data_dir / f"openb_pod_list_{name}.csv")
        profile = WorkloadProfile.from_requests(pods)
        demand = sum(p.gpu_milli_total for p in pods) / 1000
        row = {"list": name, "pods": len(pods), "shapes": len(profile.shapes),
               "demand_gpus": demand}
        fgd = PlacementConfig(fractional="fgd", profile=profile)
        for policy in (Policy("best fit", DEFAULT_PLACEMENT), Policy("FGD", fgd),
                       Policy("FGD, model order", fgd, model_order=True)):
            first = inflate(cluster, pods, policy, profile)
            full = fill(cluster, pods, policy, profile)
            row[policy.name] = {"first_failure": first, "full": full}
            console.print(f"  {name:12s} {policy.name:17s} first failure "
                          f"{first['alloc_ratio']:.2%} after {first['placed']} pods; at 100% "
                          f"arrived {full['alloc_ratio']:.2%} "
                          f"({first['seconds'] + full['seconds']:.1f} s)")
        results.append(row)

    table = Table(title=f"GPU allocation ratio, {cluster.total_gpus} GPUs "
                        f"(no departures; FGD profile = the list's shape mix)")
    for col in ("pod list", "policy", "at first failure", "pods placed", "at 100% arrived",
                "unallocated GPUs", "fragmented GPUs", "pods/s"):
        table.add_column(col, justify="left" if col in ("pod list", "policy") else "right")
    for r in results:
        for policy in ("best fit", "FGD", "FGD, model order"):
            first, full = r[policy]["first_failure"], r[policy]["full"]
            table.add_row(
                r["list"] if policy == "best fit" else "", policy,
                f"{first['alloc_ratio']:.2%}", str(first["placed"]),
                f"{full['alloc_ratio']:.2%}", f"{full['unallocated_gpus']:.0f}",
                f"{full['frag_gpus']:.0f}", f"{full['pods_per_s']:.0f}",
                end_section=policy == "FGD, model order")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"cluster": args.nodes, "total_gpus": cluster.total_gpus,
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
