"""SLICE-TUNE end to end: a tuned model served at a 1-core share, with the records tuned at that
share against the records tuned at the whole machine (2 cores).

A small CNN (`plinth.tune.models:small_cnn` at 1x3x32x32) is tuned by one Tune task through the
control plane at shares 1 and 2 (bench/tune_common.py). Then replicas serve it as a Service's
replicas do (`python -m plinth.serve.replica --tuned-db`), each pinned to core 1 with one thread
(a 1-core share): one with a database holding only the share-1 records, one with only the
share-2 records (links to the same folders), so each runs the records it is given; a third
serves the same model with torch, untuned, for reference. One closed-loop client (pinned to
core 0, npy bodies over one keep-alive connection) drives the replicas in turns, round after
round, so that the shared machine's changing load falls on each alike; latency is measured at
the client, the HTTP round trip included. The paired column is the median, over rounds, of a
round's p50 divided by the same round's p50 of the replica tuned at its own share; the last
column is the replica's own p50 and p99 (queue and model, without the HTTP path).

    python bench/tune_serve.py [--trials 16] [--rounds 8] [--round-s 5] \
        [--json results/tune_serve.json] [--workdir W] [--serve-only]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table
from serve_batching import ROOT, closed_loop
from tune_common import model_args, run_spec

from plinth.tune.db import model_key
from plinth.tune.plan import share_key
from plinth.tune.spec import TuneSpec

sys.path.insert(0, str(ROOT / "tests" / "serve"))
from replica_process import ReplicaProcess  # one replica, started directly

SERVE_CORE, CLIENT_CORE = 1, 0


def view(db: Path, work: Path, key: str, share: int) -> Path:
    """A database that holds only the records tuned at `share` (linked, not copied)."""
    out = work / f"only-share-{share}"
    folder = out / key / "cpu"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / share_key(share)
    if not link.exists():
        link.symlink_to(db / key / "cpu" / share_key(share), target_is_directory=True)
    return out


def start(model: str, shape: list[int], db: Path | None) -> ReplicaProcess:
    """A replica at a 1-core share: it inherits this process's CPU set, core 1 only, at start."""
    args = ["--model", model, "--input-shape", ",".join(map(str, shape[1:])),
            "--slo-ms", "10000", *(["--tuned-db", str(db)] if db else [])]
    os.sched_setaffinity(0, {SERVE_CORE})
    try:
        return ReplicaProcess.start(args, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                    timeout_s=600)
    finally:
        os.sched_setaffinity(0, {CLIENT_CORE})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(p, trials=16, per_iter=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--round-s", type=float, default=5.0, help="closed-loop seconds per replica "
                   "per round (after a 1 s warm-up)")
    p.add_argument("--json", default="results/tune_serve.json")
    p.add_argument("--workdir", default=None)
    p.add_argument("--serve-only", action="store_true",
                   help="serve what is already tuned in --workdir, without tuning again")
    args = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs cores 0 and 1: the client on one, the replica on the other")
    shape = [int(d) for d in args.input_shape.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tune-serve-"))
    spec = TuneSpec.model_validate({
        "name": "serve", "model": args.model, "target": "cpu", "shares": [1, 2],
        "input_shape": shape, "trials": args.trials, "trials_per_iter": args.trials_per_iter,
        "builder": "inline"})
    db, tune_s = work / "db", None
    if not args.serve_only:
        t0 = time.monotonic()
        run_spec(spec, db)
        tune_s = time.monotonic() - t0
    key = model_key(args.model, shape)
    configs = {"tuned at 1 core": view(db, work, key, 1),
               "tuned at 2 cores": view(db, work, key, 2), "torch, not tuned": None}
    os.sched_setaffinity(0, {CLIENT_CORE})
    replicas = {}
    try:
        for name, folder in configs.items():
            replicas[name] = start(args.model, shape, folder)
        info = {n: httpx.get(f"{rp.url}/healthz").json() for n, rp in replicas.items()}
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        lat: dict[str, list[float]] = {n: [] for n in replicas}
        per_round: dict[str, list[float]] = {n: [] for n in replicas}
        order = list(replicas)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                ms = asyncio.run(closed_loop(replicas[name].url, buf.getvalue(), 1,
                                             args.round_s))
                lat[name] += ms
                per_round[name].append(float(np.median(ms)))
        # The replica's own view, queue and model without the HTTP path (one client: no queue).
        stats = {n: httpx.get(f"{rp.url}/stats").json() for n, rp in replicas.items()}
    finally:
        for rp in replicas.values():
            rp.close()
    load = Path("/proc/loadavg").read_text().split()[:3]
    rows = []
    base = np.array(per_round[order[0]])
    for name in replicas:
        a = np.array(lat[name])
        tuned = info[name].get("tuned")
        # Paired: each round's p50 against the same round's p50 tuned at the serving share.
        ratio = np.array(per_round[name]) / base
        rows.append({"config": name, "tuned_at": tuned["tuned_at"] if tuned else None,
                     "replica_share": tuned["share"] if tuned else 1,
                     "records": tuned["records"] if tuned else 0, "requests": len(a),
                     "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                     "mean_ms": float(a.mean()), "round_p50_ms": per_round[name],
                     "round_ratio": ratio.tolist(),
                     "replica_p50_ms": stats[name]["p50_ms"],
                     "replica_p99_ms": stats[name]["p99_ms"]})
    table = Table(title=f"{args.model} {args.input_shape} served at a 1-core share, "
                        f"{args.trials} trials per share; load {' '.join(load)}")
    for col in ("served with", "records", "requests", "p50 ms", "p99 ms",
                "round p50 min-max", f"x {order[0]}, paired", "in replica p50 / p99"):
        table.add_column(col, justify="left" if col == "served with" else "right")
    for row in rows:
        r = row["round_ratio"]
        table.add_row(row["config"], str(row["records"]), str(row["requests"]),
                      f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
                      f"{min(row['round_p50_ms']):.2f}-{max(row['round_p50_ms']):.2f}",
                      f"{np.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]",
                      f"{row['replica_p50_ms']:.2f} / {row['replica_p99_ms']:.2f}")
    Console(width=max(Console().width, 150)).print(table)
    out = {"model": args.model, "input_shape": shape, "trials": args.trials,
           "rounds": args.rounds, "round_s": args.round_s, "tune_seconds": tune_s,
           "loadavg": load, "workdir": str(work), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
