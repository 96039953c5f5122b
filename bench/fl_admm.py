"""Decentralised ADMM aggregation over Kirkman triples, sites talking gRPC: error and accuracy.

Every ADMM number here comes from sites running as separate processes that exchange shares over
the gRPC peer exchange on 127.0.0.1 (token-authenticated), not from an in-process simulation.

Part 1: relative error max|z_k - sum pi_i w_i| / max|sum pi_i w_i| after each ADMM iteration, for
9, 15 and 21 sites holding random 7,850-parameter models (iterations capped at 2 (v-1)/2 - 1).
Part 2: what the pair masks that hide the triple sums cost a site per iteration (computing m_i
for 20 peers), against the iteration's own arithmetic. Part 3: federated training of softmax regression on MNIST (sklearn digits fallback) with 9 and 15
sites of unequal size: each round every site trains locally from the current model, then the
sites aggregate by the decentralised ADMM protocol over gRPC; the baseline is centralised FedAvg
(exact weighted average) with the same local training and the same per-site random streams.
We report final test accuracy of both, the gap, and the largest ADMM error over the rounds.

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

from plinth.fl.admm.consensus import ADMMConfig, PairMasks, Site, iteration_cap
from plinth.fl.admm.kirkman import kirkman_triple_system
from plinth.fl.admm.loopback import run_admm_processes, run_sites, site_loop


def errors_per_iteration(v: int, d: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.1, (v, d))
    n = rng.integers(100, 3000, v)
    rep, _ = run_admm_processes(w, n.tolist(), timeout=120)
    return rep.errors


def mask_cost(v: int, d: int, repeat: int = 5) -> tuple[float, float]:
    """(ms for one site's m_i, ms for its shares of pi_i y_i) per iteration, d parameters,
    v sites; medians of `repeat`."""
    masks = [PairMasks(i) for i in range(v)]
    publics = {i: m.public() for i, m in enumerate(masks)}
    masks[0].agree(publics)
    site = Site(0, np.zeros(d), 1.0 / v, ADMMConfig())
    site.agree(publics)
    mask_ms, share_ms = [], []
    for k in range(repeat):
        t0 = time.perf_counter()
        masks[0].mask(k, d)
        t1 = time.perf_counter()
        site.shares(k, (0, 1, 2))  # steps 1-2, the mask, and the additive shares
        site.partial([np.zeros(d, np.uint64)] * 2)
        mask_ms.append(1e3 * (t1 - t0))
        share_ms.append(1e3 * (time.perf_counter() - t1))
    return float(np.median(mask_ms)), float(np.median(share_ms))


def shards_of(sites: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, sites).astype(float)
    cuts = (np.cumsum(sizes) / sizes.sum() * n).astype(int)[:-1]
    return np.split(rng.permutation(n), cuts)


def _site_job(ex, report, x, y, shape, pi, rounds, seed):
    """One site: local SGD from the shared model, then ADMM with its triple partners, per round."""
    v = len(ex.peers) + 1
    design, config = kirkman_triple_system(v), ADMMConfig()
    rng = np.random.default_rng([seed, ex.me])
    w = np.zeros(shape)
    for r in range(rounds):
        local = local_sgd(w, x, y, rng)
        site = Site(ex.me, local.ravel(), pi, config)  # secret randomness: the OS CSPRNG
        w = site_loop(site, design, config.num_iterations(v), ex)[-1].reshape(shape)
        report((r, local.ravel(), w.ravel() if ex.me == 0 else None))


def train_fedavg(sites: int, data, *, rounds: int, seed: int) -> float:
    xtr, ytr, xte, yte = data
    shards = shards_of(sites, len(ytr), seed)
    pi = np.array([len(s) for s in shards], float) / len(ytr)
    rngs = [np.random.default_rng([seed, i]) for i in range(sites)]
    w = np.zeros((xtr.shape[1] + 1, 10))
    for _ in range(rounds):
        models = np.stack([local_sgd(w, xtr[s], ytr[s], rngs[i]).ravel()
                           for i, s in enumerate(shards)])
        w = (pi @ models).reshape(w.shape)
    return float(np.mean(predict(w, xte) == yte))


def train_admm_grpc(sites: int, data, *, rounds: int, seed: int) -> tuple[float, float]:
    """(test accuracy, largest relative ADMM error over the rounds) with sites as processes."""
    xtr, ytr, xte, yte = data
    shards = shards_of(sites, len(ytr), seed)
    pi = np.array([len(s) for s in shards], float) / len(ytr)
    shape = (xtr.shape[1] + 1, 10)
    got: dict[int, dict[int, np.ndarray]] = {}
    final: dict[int, np.ndarray] = {}

    def collect(site: int, rep) -> None:
        r, local, z = rep
        got.setdefault(r, {})[site] = local
        if z is not None:
            final[r] = z

    args = [(xtr[s], ytr[s], shape, float(pi[i]), rounds, seed) for i, s in enumerate(shards)]
    run_sites(sites, _site_job, args, timeout=300, on_report=collect)
    errs = []
    for r in range(rounds):
        exact = pi @ np.stack([got[r][i] for i in range(sites)])
        errs.append(float(np.max(np.abs(final[r] - exact)) / np.max(np.abs(exact))))
    w = final[rounds - 1].reshape(shape)
    return float(np.mean(predict(w, xte) == yte)), max(errs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--train", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(width=180)
    out: dict = {"cpus": os.cpu_count(), "transport": "grpc (127.0.0.1, one process per site)"}
    t = Table(title="ADMM relative error per iteration over gRPC (7,850 params, random models)")
    t.add_column("sites")
    t.add_column("cap", justify="right")
    t.add_column("error after iteration 1, 2, ...")
    t.add_column("seconds", justify="right")
    out["errors"] = {}
    for v in (9, 15, 21):
        t0 = time.perf_counter()
        e = errors_per_iteration(v, 7850, args.seed)
        out["errors"][v] = e
        t.add_row(str(v), str(iteration_cap(v)), " ".join(f"{x:.1e}" for x in e),
                  f"{time.perf_counter() - t0:.1f}")
    console.print(t)
    tm = Table(title="Pair masks: one site's cost per iteration, 21 sites (20 peers)")
    for col in ("parameters", "m_i (ms)", "whole share step, m_i included (ms)"):
        tm.add_column(col, justify="right")
    out["mask_ms"] = {}
    for d in (7_850, 1_000_000):
        m, sh = mask_cost(21, d)
        out["mask_ms"][d] = {"mask": m, "share_step": sh}
        tm.add_row(f"{d:,}", f"{m:.2f}", f"{sh:.2f}")
    console.print(tm)
    name, _, data = load_data(args.train, args.seed)
    t2 = Table(title=f"{name}: test accuracy after {args.rounds} rounds, softmax regression")
    for col in ("sites", "centralised FedAvg", "ADMM over gRPC", "gap (points)",
                "max ADMM error", "ADMM seconds"):
        t2.add_column(col, justify="right")
    out["accuracy"] = []
    for v in (9, 15):
        a_fed = train_fedavg(v, data, rounds=args.rounds, seed=args.seed)
        t0 = time.perf_counter()
        a_admm, err = train_admm_grpc(v, data, rounds=args.rounds, seed=args.seed)
        secs = time.perf_counter() - t0
        out["accuracy"].append({"sites": v, "fedavg": a_fed, "admm": a_admm,
                                "max_admm_error": err, "admm_seconds": secs})
        t2.add_row(str(v), f"{a_fed:.4f}", f"{a_admm:.4f}", f"{100 * (a_fed - a_admm):+.2f}",
                   f"{err:.1e}", f"{secs:.0f}")
    console.print(t2)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
