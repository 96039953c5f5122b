"""A round of the server's aggregation: the streaming engine in-process against the elastic tree.

For each model size (P float32 parameters in four tensors) and N updates per round, the server's
own accumulators are timed on the path `Server` uses (`add_many` per arriving update, then
`mean()`):
- stream:     `StreamingAggregator` in the server process (`server.aggregation.mode: stream`).
- tree, L:    `TreeAccumulator` (`mode: tree`): each update is copied once into a shared-memory
              slot (the landing cost is included), L leaf processes fold them, the server folds
              the L partial sums. One persistent tree is scaled 1 → 2 leaves between rounds, as
              the elastic server does; starting processes is outside the timed rounds.

Updates come from a pool of distinct arrays (at least --pool-mb MB, past the last-level cache),
cycled. Time is the median of --repeat warm rounds (one warm-up round per configuration, which
also faults in the shared-memory pool); GB/s is N·P·4 bytes over that time.

Peak extra memory: stream, tracemalloc's peak in this process; tree, that peak plus the tree's
shared memory (slots and partial-sum blocks) plus, per leaf, its model-sized accumulator
(resident since the warm-up round) and any growth of its private resident memory (RssAnon) over
the measured round.

    .venv/bin/python bench/fl_hierarchy.py [--params 1e6,1e7] [--updates 100] [--leaves 1,2]
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from multiprocessing import shared_memory

import numpy as np
from rich.console import Console

from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.tree import TreeAggregation


def make_pool(params: int, mb: float, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    cut = [params // 2, params // 4, params // 8]
    sizes = [*cut, params - sum(cut)]
    count = max(4, -(-int(mb * 1e6) // (4 * params)))
    return [[rng.standard_normal(s, dtype=np.float32) for s in sizes] for _ in range(count)]


def _rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def one_round(acc, pool, n, weights) -> float:
    t = time.perf_counter()
    for k in range(n):
        acc.add_many([(pool[k % len(pool)], float(weights[k]))])
    assert acc.mean() is not None and acc.count == n
    return time.perf_counter() - t


def bench_stream(pool, n, weights, repeat) -> tuple[float, int]:
    times = []
    for _ in range(repeat + 1):
        acc = StreamingAggregator(pool[0])
        times.append(one_round(acc, pool, n, weights))
        acc.close()
    tracemalloc.start()
    acc = StreamingAggregator(pool[0])
    one_round(acc, pool, n, weights)
    acc.close()
    del acc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return statistics.median(times[1:]), peak


def bench_tree(ta: TreeAggregation, leaves: int, pool, n, weights, repeat) -> tuple[float, int]:
    ta.fixed = leaves  # the elastic step: the same tree, scaled before the round
    times = []
    for _ in range(repeat + 1):
        acc = ta.begin(pool[0], n)
        times.append(one_round(acc, pool, n, weights))
        acc.close()
    assert ta.tree.leaves == leaves
    base = {pid: _rss_anon(pid) for pid in ta.tree.pids}
    tracemalloc.start()
    acc = ta.begin(pool[0], n)
    one_round(acc, pool, n, weights)
    acc.close()
    del acc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    shm = 0
    for name in ta.tree.blocks():
        b = shared_memory.SharedMemory(name=name)
        shm += b.size
        b.close()
    leaf = sum(max(0, _rss_anon(pid) - base[pid]) for pid in ta.tree.pids)
    leaf += sum(4 * sum(a.size for a in pool[0]) for _ in ta.tree.pids)  # one model per leaf
    return statistics.median(times[1:]), peak + shm + leaf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1e6,1e7")
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--leaves", default="1,2")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--pool-mb", type=float, default=160.0)
    args = ap.parse_args()
    console = Console(highlight=False)
    lines = ["| params | updates | aggregation | s/round | GB/s | peak extra MB | × model |",
             "|---:|---:|---|---:|---:|---:|---:|"]
    for p in [int(float(x)) for x in args.params.split(",")]:
        pool = make_pool(p, args.pool_mb)
        model = 4 * p
        n = args.updates
        weights = np.random.default_rng(1).integers(1, 100, n).astype(float)
        rows = [("stream (in-process)", *bench_stream(pool, n, weights, args.repeat))]
        ta = TreeAggregation(pool[0], leaves=1, updates_per_leaf=n)
        try:
            for leaves in [int(x) for x in args.leaves.split(",")]:
                rows.append((f"tree, {leaves} leaf" if leaves == 1 else f"tree, {leaves} leaves",
                             *bench_tree(ta, leaves, pool, n, weights, args.repeat)))
        finally:
            ta.close()
        for name, sec, peak in rows:
            gbs = n * model / sec / 1e9
            lines.append(f"| {p:,} | {n} | {name} | {sec:.3f} | {gbs:.2f} | {peak / 1e6:.0f} | "
                         f"{peak / model:.1f} |")
            console.print(f"{p:>10,} × {n}  {name:20} {sec:7.3f} s  {gbs:6.2f} GB/s  "
                          f"peak {peak / 1e6:7.0f} MB")
    console.print("\n".join(lines))

if __name__ == "__main__":
    main()
