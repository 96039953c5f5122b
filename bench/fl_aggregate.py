"""Aggregation throughput and memory: the streaming engine against a copy and a naive baseline.

For N clients × P float32 parameters, every method reads N updates of P parameters. Updates are
serde buffers decoded to zero-copy views, as the server sees them. Since 1,000 distinct 10M-param
updates (40 GB) do not fit in memory, a pool of distinct buffers (at least `--pool` of them and
`--pool-mb` MB, well past the last-level cache: 8 × 1M-parameter updates are only 32 MB) is
cycled through; every read still comes from DRAM.

Methods, in the same run:
- copy:       np.copyto of each update into one model-sized buffer (read + write; the hardware
              limit for touching every byte once).
- engine:     StreamingAggregator.add per update (eager; one compiled pass that checks each
              L1-sized block for NaN/Inf/overflow, then folds it), with 1 and `--threads` threads.
- engine×B:   add_many over batches of B updates that arrived together (one call, the server's
              path for replies that complete together).
- naive:      stack all N updates, then np.average(axis=0, weights=...), as an aggregator that
              waits for everyone does. Skipped where it would need more than --naive-max-gb.

- shm tree:   (--tree-leaves L) the LIFL hierarchy: every update is copied into shared memory
              once, then L leaf processes and a middle process fold it; memory figures exclude
              the child processes and shared memory (tracemalloc sees this process only).

Throughput is GB of updates read per second (N·P·4 bytes / seconds), the median of --repeat runs.
Peak extra memory is tracemalloc's peak during one run, excluding the update pool.

    .venv/bin/python bench/fl_aggregate.py [--params 1e6,1e7] [--clients 100,1000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.fl import serde
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.messages import FitRes


def make_pool(params: int, pool: int, seed: int = 0) -> list[list[np.ndarray]]:
    """`pool` decoded FitRes updates of `params` float32 values in four tensors (the views keep
    their encoded buffers alive; `_BUFFERS` maps a pool entry to its bytes for the tree)."""
    rng = np.random.default_rng(seed)
    sizes = [params // 2, params // 4, params // 8]
    sizes.append(params - sum(sizes))
    out = []
    for _ in range(pool):
        arrays = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
        buf = bytes(serde.encode(FitRes(1, arrays, 10)))
        out.append(serde.decode(buf).update)
        _BUFFERS[id(out[-1])] = buf
    return out


_BUFFERS: dict[int, bytes] = {}


def run_tree(leaves: int) -> Callable:
    """The LIFL tree: each update is copied once into shared memory (as a receiver would land it
    off the network), leaf processes fold zero-copy views, a middle process folds the leaves."""
    def go(pool, n, weights):
        from plinth.fl.aggregate.hierarchy import Hierarchy

        tree = Hierarchy(pool[0], leaves=leaves)
        try:
            t = time.perf_counter()
            for k in range(n):
                tree.submit(_BUFFERS[id(pool[k % len(pool)])], weights[k])
            tree.finish()
            go.seconds = time.perf_counter() - t  # type: ignore[attr-defined]
        finally:
            tree.close()
    return go


def run_copy(pool, n, weights):
    dst = [np.empty_like(a) for a in pool[0]]
    for k in range(n):
        for d, a in zip(dst, pool[k % len(pool)]):
            np.copyto(d, a)


def run_engine(threads: int, batch: int = 1) -> Callable:
    def go(pool, n, weights):
        agg = StreamingAggregator(pool[0], threads=threads)
        if batch == 1:
            for k in range(n):
                agg.add(pool[k % len(pool)], weights[k])
        else:
            for s in range(0, n, batch):
                agg.add_many([(pool[k % len(pool)], weights[k])
                              for k in range(s, min(n, s + batch))])
        agg.mean()
        agg.close()
    return go


def run_naive(pool, n, weights):
    weights = weights.astype(np.float32)  # keep float32 (float64 weights would upcast everything)
    for i in range(len(pool[0])):
        stacked = np.stack([pool[k % len(pool)][i] for k in range(n)])
        np.average(stacked, axis=0, weights=weights)
        del stacked


def measure(fn, pool, n, weights, repeat) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(pool, n, weights)
        # the tree times itself, leaving out starting and stopping its processes
        times.append(getattr(fn, "seconds", time.perf_counter() - t))
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn(pool, n, weights)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1e6,1e7")
    ap.add_argument("--clients", default="100,1000")
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("--pool-mb", type=float, default=256.0)
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--naive-max-gb", type=float, default=9.0)
    ap.add_argument("--tree-leaves", type=int, default=0,
                    help="also time the shared-memory tree with this many leaves (N ≤ 100)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    # a server is long-running: load the engine's compiled kernel before timing anything
    warm = StreamingAggregator([np.zeros(8, np.float32)])
    warm.add([np.ones(8, np.float32)], 1.0)
    console = Console()
    rows = []
    for p in [int(float(x)) for x in args.params.split(",")]:
        pool = make_pool(p, max(args.pool, -(-int(args.pool_mb * 1e6) // (4 * p))))
        model = 4 * p
        for n in [int(x) for x in args.clients.split(",")]:
            weights = np.random.default_rng(1).integers(1, 100, n).astype(float)
            methods: list[tuple[str, Callable]] = [("copy", run_copy),
                                                   ("engine 1 thread", run_engine(1))]
            if args.threads > 1:
                methods.append((f"engine {args.threads} threads", run_engine(args.threads)))
            methods.append((f"engine batch {args.batch}", run_engine(1, args.batch)))
            if args.tree_leaves and n <= 100:
                methods.append((f"shm tree, {args.tree_leaves} leaves", run_tree(args.tree_leaves)))
            # naive holds the stacked largest tensor (half the model) and its weighted product
            if n * model / 1e9 <= args.naive_max_gb:
                methods.append(("naive stack+average", run_naive))
            copy_gbs = None
            for name, fn in methods:
                sec, peak = measure(fn, pool, n, weights, args.repeat)
                gbs = n * model / sec / 1e9
                copy_gbs = copy_gbs or gbs
                rows.append({"params": p, "clients": n, "method": name, "seconds": sec,
                             "gb_per_s": gbs, "vs_copy": gbs / copy_gbs,
                             "peak_extra_mb": peak / 1e6, "peak_models": peak / model})
                console.print(f"{p:>10,} × {n:>5}  {name:22} {sec:8.3f}s {gbs:7.2f} GB/s  "
                              f"peak {peak / 1e6:9.1f} MB ({peak / model:6.2f}× model)",
                              highlight=False)
            if not any(r["method"].startswith("naive") and r["params"] == p and r["clients"] == n
                       for r in rows):
                rows.append({"params": p, "clients": n, "method": "naive stack+average",
                             "skipped": f"needs ~{n * model / 1e9:.0f} GB"})
        del pool
    naive = {(r["params"], r["clients"]): r for r in rows
             if r["method"].startswith("naive") and "seconds" in r}
    t = Table(title=f"FL aggregation, float32 updates ({os.cpu_count()} CPUs)")
    for c in ("params", "clients", "method", "s", "GB/s", "% copy", "× naive", "peak extra"):
        t.add_column(c, justify="right")
    for r in rows:
        if "skipped" in r:
            t.add_row(f"{r['params']:,}", str(r["clients"]), r["method"], "-", "-", "-", "-",
                      r["skipped"])
            continue
        nv = naive.get((r["params"], r["clients"]))
        t.add_row(f"{r['params']:,}", str(r["clients"]), r["method"], f"{r['seconds']:.3f}",
                  f"{r['gb_per_s']:.2f}", f"{100 * r['vs_copy']:.0f}%",
                  f"{nv['seconds'] / r['seconds']:.1f}×" if nv else "-",
                  f"{r['peak_extra_mb']:.0f} MB ({r['peak_models']:.2f}×)")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "pool": args.pool,
                                         "pool_mb": args.pool_mb, "rows": rows}, indent=1))
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
