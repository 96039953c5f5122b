"""Decentralised ADMM aggregation over Kirkman triples: error per iteration and accuracy vs FedAvg.

Part 1: relative error max|z_k - sum pi_i w_i| / max|sum pi_i w_i| after each ADMM iteration, for
9, 15 and 21 sites holding random 7,850-parameter models (iterations capped at 2 (v-1)/2 - 1).
Part 2: federated training of softmax regression on MNIST (sklearn digits fallback) with 9 and 15
sites of unequal size: each round every site trains locally from the current model, then the
sites aggregate either by exact weighted averaging (centralised FedAvg) or by the decentralised
ADMM protocol; we report final test accuracy of both and the gap.

    .venv/bin/python bench/fl_admm.py [--rounds 10] [--train 20000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from fl_robust import load_data, local_sgd, predict  # bench/ is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

from plinth.fl.admm.consensus import ADMMConfig, iteration_cap, run_admm


def errors_per_iteration(v: int, d: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.1, (v, d))
    n = rng.integers(100, 3000, v)
    return run_admm(w, n, seed=seed).errors


def train(sites: int, data, *, rounds: int, decentralised: bool, seed: int) -> float:
    xtr, ytr, xte, yte = data
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, sites).astype(float)
    cuts = (np.cumsum(sizes) / sizes.sum() * len(ytr)).astype(int)[:-1]
    shards = np.split(rng.permutation(len(ytr)), cuts)
    counts = [len(s) for s in shards]
    w = np.zeros((xtr.shape[1] + 1, 10))
    for r in range(rounds):
        models = np.stack([local_sgd(w, xtr[s], ytr[s], rng).ravel() for s in shards])
        if decentralised:
            w = run_admm(models, counts, config=ADMMConfig(), seed=seed * 1000 + r).z.reshape(
                w.shape
            )
        else:
            w = (np.asarray(counts, float) / sum(counts) @ models).reshape(w.shape)
    return float(np.mean(predict(w, xte) == yte))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(width=180)
    out: dict = {"cpus": os.cpu_count()}
    t = Table(title="ADMM relative error per iteration (7,850 params, random models)")
    t.add_column("sites")
    t.add_column("cap", justify="right")
    t.add_column("error after iteration 1, 2, ...")
    out["errors"] = {}
    for v in (9, 15, 21):
        e = errors_per_iteration(v, 7850, args.seed)
        out["errors"][v] = e
        t.add_row(str(v), str(iteration_cap(v)), " ".join(f"{x:.1e}" for x in e))
    console.print(t)
    name, _, data = load_data(args.train, args.seed)
    t2 = Table(title=f"{name}: test accuracy after {args.rounds} rounds, softmax regression")
    for col in ("sites", "centralised FedAvg", "ADMM (Kirkman)", "gap (points)", "seconds"):
        t2.add_column(col, justify="right")
    out["accuracy"] = []
    for v in (9, 15):
        t0 = time.perf_counter()
        a_fed = train(v, data, rounds=args.rounds, decentralised=False, seed=args.seed)
        a_admm = train(v, data, rounds=args.rounds, decentralised=True, seed=args.seed)
        secs = time.perf_counter() - t0
        out["accuracy"].append({"sites": v, "fedavg": a_fed, "admm": a_admm})
        t2.add_row(
            str(v), f"{a_fed:.4f}", f"{a_admm:.4f}", f"{100 * (a_fed - a_admm):+.2f}", f"{secs:.0f}"
        )
    console.print(t2)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
