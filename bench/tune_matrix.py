"""SLICE-TUNE's cross-share matrix on CPU shares: tuned at one share, run at another.

A small CNN (three 3x3 convolutions and a linear head at 1x3x32x32: a ResNet-18 at 224x224 has
about 20 tasks, too many to tune in minutes on two shared cores) is tuned with MetaSchedule at
each CPU share (1 and 2 cores: a server pinned to that many cores, with that many threads),
once per seed. Each tuned model is then built and timed at each share. Rows: share tuned at;
columns: share run at; cells: median latency over seeds, with the spread across seeds (search
noise) beside it. At each run share the models tuned at every share are timed in turns in one
process, so that the machine's changing load falls on each alike.

    python bench/tune_matrix.py [--seeds 0,1] [--trials 32] [--json results/tune_matrix.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tune_common import latency, model_args, run_spec

from plinth.tune.spec import TuneSpec

# CPU sets the tuned models are timed on, on a 2-core machine: share 1 on core 1, share 2 on
# both. (While tuning, the runtime pins each server to `share` of the least loaded cores.)
CPUS = {1: "1", 2: "0-1"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(p, trials=32, per_iter=16)
    p.add_argument("--shares", default="1,2")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--builder", default="inline", choices=("local", "inline"))
    p.add_argument("--json", default="results/tune_matrix.json")
    p.add_argument("--png", default="results/tune_matrix.png")
    p.add_argument("--workdir", default=None)
    p.add_argument("--measure-only", action="store_true",
                   help="time the models already tuned in --workdir, without tuning again")
    args = p.parse_args()
    shares = [int(s) for s in args.shares.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tune-matrix-"))
    base = TuneSpec.model_validate({
        "name": "matrix", "model": args.model, "target": "cpu", "shares": shares,
        "input_shape": [int(d) for d in args.input_shape.split(",")], "trials": args.trials,
        "trials_per_iter": args.trials_per_iter, "builder": args.builder})
    cells: dict[tuple[int, int], list[float]] = {}  # (tuned, run) -> median ms per seed
    tune_s = {}
    for seed in seeds:
        spec = base.model_copy(update={"seed": seed, "name": f"matrix-{seed}"})
        db = work / f"seed{seed}"
        if not args.measure_only:
            t0 = time.monotonic()
            run_spec(spec, db)
            tune_s[seed] = time.monotonic() - t0
        for run in shares:  # every tuned share timed in turns in one process, paired
            ms = latency(db, spec, [float(s) for s in shares], run, CPUS[run])
            for tuned in shares:
                cells.setdefault((tuned, run), []).append(statistics.median(ms[tuned]))
    table = Table(title=f"{args.model} {args.input_shape}: ms per inference (median over "
                        f"seeds {args.seeds}; \\[min-max] across seeds), {args.trials} trials")
    table.add_column("tuned at \\ run at")
    for run in shares:
        table.add_column(f"{run} core{'s' if run > 1 else ''}", justify="right")
    for tuned in shares:
        table.add_row(f"{tuned} core{'s' if tuned > 1 else ''}", *(
            f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
            for v in (cells[(tuned, run)] for run in shares)))
    Console().print(table)
    out = {"model": args.model, "input_shape": args.input_shape, "trials": args.trials,
           "seeds": seeds, "tune_seconds": tune_s,
           "cells": [{"tuned_at": t, "run_at": r, "ms_per_seed": v}
                     for (t, r), v in sorted(cells.items())]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    plot(cells, shares, Path(args.png), args.model)


def plot(cells: dict[tuple[int, int], list[float]], shares: list[int], png: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    width = 0.8 / len(shares)
    for i, tuned in enumerate(shares):
        xs = [j + i * width for j in range(len(shares))]
        meds = [statistics.median(cells[(tuned, r)]) for r in shares]
        lo = [m - min(cells[(tuned, r)]) for m, r in zip(meds, shares)]
        hi = [max(cells[(tuned, r)]) - m for m, r in zip(meds, shares)]
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=f"tuned at {tuned} core(s)")
    ax.set_xticks([j + width * (len(shares) - 1) / 2 for j in range(len(shares))],
                  [f"run at {r}" for r in shares])
    ax.set_ylabel("ms per inference")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
