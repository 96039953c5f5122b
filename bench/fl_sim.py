"""End-to-end FL simulation: test accuracy, bytes and wall time per round, per compression.

Runs `plinth fl sim` (the real server, virtual clients in a process pool) once per codec and
tabulates final/best accuracy, the round that first reached the target, upload MB per round and
seconds per round. Defaults: the MNIST example (100 clients, Dirichlet α = 0.5, 10 per round).

    .venv/bin/python bench/fl_sim.py [--app examples/fl/mnist/app.yaml] [--rounds 50]
        [--codecs none,q8,q16,topk] [--target 0.97] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from plinth.fl.sim import run_sim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="examples/fl/mnist/app.yaml")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--codecs", default="none,q8")
    ap.add_argument("--topk-ratio", type=float, default=0.05)
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console()
    out = {}
    for codec in args.codecs.split(","):
        ov = {"compression.kind": codec, "compression.ratio": args.topk_ratio}
        res = run_sim(args.app, clients=args.clients, rounds=args.rounds, workers=args.workers,
                      overrides=ov, on_round=lambda r, c=codec: console.print(
                          f"{c:5} round {r.round:3d} acc {r.accuracy:.4f} {r.seconds:.2f}s",
                          highlight=False))
        out[codec] = res
    t = Table(title=f"FL sim: {args.app}, {args.clients} clients, {args.rounds} rounds")
    for c in ("codec", "final acc", "best acc", f"round ≥ {args.target:.0%}", "MB up/round",
              "MB down/round", "s/round (median)"):
        t.add_column(c, justify="right")
    for codec, res in out.items():
        rs = res["rounds"]
        hit = next((r["round"] for r in rs if (r["accuracy"] or 0) >= args.target), None)
        t.add_row(codec, f"{res['final_accuracy']:.4f}", f"{res['best_accuracy']:.4f}",
                  str(hit or "-"), f"{statistics.mean(res['bytes_up']) / 1e6:.2f}",
                  f"{statistics.mean(res['bytes_down']) / 1e6:.2f}",
                  f"{statistics.median(r['seconds'] for r in rs):.2f}")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
