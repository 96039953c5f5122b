"""SecAgg+ cost per round: client and server time and bytes against the number of clients.

Each round runs the real protocol in one process (plinth.fl.privacy.secagg_driver): X25519 + HKDF,
Shamir shares under ChaCha20-Poly1305, ChaCha20 masks, and `--drop` of the clients silent after
sharing keys (so the server must rebuild their pair masks). Time is wall time on this machine with
one thread; bytes are the protocol's wire sizes. The server cost is fitted to a * n log2 n.

    .venv/bin/python bench/fl_secagg.py [--clients 50,100,200] [--params 100000] [--drop 0.05] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from plinth.fl.privacy.masking import quantize
from plinth.fl.privacy.secagg import SecAggConfig
from plinth.fl.privacy.secagg_driver import run_secagg_round


def one(n: int, d: int, drop: float, full: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cfg = SecAggConfig(
        client_ids=tuple(range(n)), vector_len=d, full_graph=full, graph_seed=seed, round_id=seed
    )
    updates = {c: rng.uniform(-0.5, 0.5, d).astype(np.float32) for c in range(n)}
    dropped = set(rng.choice(n, int(drop * n), replace=False).tolist())
    out = run_secagg_round(cfg, updates, drop={"masked_input": dropped})
    expect = np.zeros(d, dtype=np.uint32)
    for c in out.result.survivors:
        expect += quantize(updates[c], clip=cfg.clip, scale=cfg.scale)
    assert np.array_equal(expect, out.result.total), "SecAgg sum is wrong"
    st = out.stats
    live = [c for c in range(n) if c not in dropped]
    return {
        "n": n,
        "params": d,
        "degree": len(out.server.graph[0]),
        "threshold": out.server.threshold,
        "dropped": len(dropped),
        "full_graph": full,
        "client_s": statistics.mean(st.client_seconds[c] for c in live),
        "client_sent_B": statistics.mean(st.client_bytes_sent[c] for c in live),
        "client_recv_B": statistics.mean(st.client_bytes_received.get(c, 0) for c in live),
        "server_s": st.server_seconds,
        "server_recv_B": sum(st.client_bytes_sent.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="50,100,200")
    ap.add_argument("--params", type=int, default=100_000)
    ap.add_argument("--drop", type=float, default=0.05)
    ap.add_argument("--full-graph", action="store_true", help="original SecAgg: every pair masks")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with threadpool_limits(limits=1):
        for n in (int(x) for x in args.clients.split(",")):
            runs = [
                one(n, args.params, args.drop, args.full_graph, seed) for seed in range(args.repeat)
            ]
            row = dict(runs[0])
            for key in ("client_s", "server_s"):
                row[key] = statistics.median(r[key] for r in runs)
            rows.append(row)
    ns = np.array([r["n"] for r in rows], dtype=float)
    ts = np.array([r["server_s"] for r in rows])
    basis = ns * np.log2(ns)
    a = float(basis @ ts / (basis @ basis))
    resid = ts - a * basis
    r2 = 1.0 - float(resid @ resid) / float(((ts - ts.mean()) ** 2).sum()) if len(ts) > 1 else 1.0
    slope = float(np.polyfit(np.log(ns), np.log(ts), 1)[0]) if len(ts) > 1 else float("nan")
    table = Table(
        title=f"SecAgg{'' if args.full_graph else '+'} round, {args.params:,} params, {args.drop:.0%} dropped after sharing"
    )
    for col in (
        "clients",
        "k",
        "t",
        "client ms",
        "client sent KB",
        "client recv KB",
        "server ms",
        "server recv MB",
        "server ms / (n log2 n)",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["n"]),
            str(r["degree"]),
            str(r["threshold"]),
            f"{1e3 * r['client_s']:.1f}",
            f"{r['client_sent_B'] / 1e3:.1f}",
            f"{r['client_recv_B'] / 1e3:.1f}",
            f"{1e3 * r['server_s']:.0f}",
            f"{r['server_recv_B'] / 1e6:.1f}",
            f"{1e3 * r['server_s'] / (r['n'] * math.log2(r['n'])):.3f}",
        )
    console = Console(width=180)
    console.print(table)
    console.print(
        f"server time fit: {a * 1e3:.4f} ms * n log2 n (R^2 = {r2:.3f}); log-log slope {slope:.2f}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpus": os.cpu_count(),
                    "rows": rows,
                    "fit_ms_per_nlogn": a * 1e3,
                    "fit_r2": r2,
                    "loglog_slope": slope,
                },
                indent=2,
            )
        )
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
