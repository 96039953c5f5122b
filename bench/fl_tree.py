"""The LIFL tree against the flat engine, and the elastic tree against an always-on one.

Part 1, aggregation time per round: N updates of P float32 parameters through the server's
accumulator on the path `Server` uses (`add_many` per arriving update, then `mean()`):
- flat:        `StreamingAggregator` in the server process (`mode: stream`);
- tree, L:     `TreeAccumulator` on one node (`mode: tree`), L warm leaf processes; each update is
               copied once into a shared-memory slot (included), the leaves fold, the server folds
               the L partial sums; `auto` is what `size_tree` picks from the measured throughput.
Updates are cycled from a pool of distinct arrays (--pool-mb, past the last-level cache). Time is
the median of --repeat warm rounds.

Part 2, resources per round with client counts varying 10x across rounds (--counts): the
elastic tree (`leaves: auto`, at most --max-leaves, sized each round by `size_tree` with
--deadline) against an always-on tree of --max-leaves leaves. CPU-seconds: this process plus
every leaf (the live ones' CPU times, and the reaped ones' through RUSAGE_CHILDREN); peak memory:
sampled every 10 ms, the leaves' private resident memory (RssAnon) plus the tree's shared memory
plus this process's growth.

BLAS is pinned to one thread (threadpoolctl) here and in every leaf: the fold is one compiled
kernel, and a BLAS pool would only fight it for the cores.

    .venv/bin/python bench/fl_tree.py [--params 1e6,1e7] [--updates 100,1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import threading
import time
from multiprocessing import shared_memory

import psutil
from fl_hierarchy import make_pool  # bench/ is on sys.path when run as a script
from rich.console import Console
from threadpoolctl import threadpool_limits

from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.tree import TreeAggregation


def one_round(acc, pool, n) -> float:
    t = time.perf_counter()
    for k in range(n):
        acc.add_many([(pool[k % len(pool)], float(1 + k % 7))])
    assert acc.mean() is not None and acc.count == n
    return time.perf_counter() - t


def time_flat(pool, n, repeat) -> float:
    times = []
    for _ in range(repeat + 1):
        acc = StreamingAggregator(pool[0])
        times.append(one_round(acc, pool, n))
        acc.close()
    return statistics.median(times[1:])


def time_tree(ta: TreeAggregation, leaves, pool, n, repeat) -> tuple[float, int]:
    ta.fixed = None if leaves == "auto" else int(leaves)
    times, used = [], 0
    for _ in range(repeat + 1):
        acc = ta.begin(pool[0], n)
        ta.tree.wait_ready(120)  # a leaf started for this round: its start is not folding
        used = ta.tree.leaves
        times.append(one_round(acc, pool, n))
        acc.close()
    return statistics.median(times[1:]), used


def _rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _shm(names: list[str]) -> int:
    total = 0
    for name in names:
        try:
            b = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            continue
        total += b.size
        b.close()
    return total


class Sampler:
    """Peak of (leaves' RssAnon, standby ones included, + the tree's shared memory + this
    process's growth)."""

    def __init__(self, ta: TreeAggregation) -> None:
        self.ta, self.peak, self._stop = ta, 0, threading.Event()
        self.base = _rss_anon(os.getpid())
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def sample(self) -> None:
        tree = self.ta.tree
        leaves = [*tree.pids, *tree.standby]  # a warm leaf on standby holds memory too
        now = sum(_rss_anon(p) for p in leaves) + _shm(list(tree.blocks())) + \
            max(0, _rss_anon(os.getpid()) - self.base)
        self.peak = max(self.peak, now)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.sample()

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        self.sample()  # the leaves still hold their accumulators (a round shorter than 10 ms)
        return self.peak


def _cpu(pids: list[int]) -> float:
    me = psutil.Process().cpu_times()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.user + me.system + kids.ru_utime + kids.ru_stime
    for p in pids:
        try:
            t = psutil.Process(p).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def elastic_rounds(pool, counts, *, auto: bool, max_leaves: int, deadline: float) -> list[dict]:
    ta = TreeAggregation(pool[0], leaves="auto" if auto else max_leaves, max_leaves=max_leaves,
                         fold_deadline=deadline, updates_per_leaf=8)
    out = []
    try:
        warm = ta.begin(pool[0], 8)  # measure the leaves' throughput once before the rounds
        ta.tree.wait_ready(120)
        one_round(warm, pool, 8)
        warm.close()
        for r, n in enumerate(counts, start=1):
            # every leaf alive now, standby ones too: a reused leaf's CPU counts from here
            seen = set(ta.tree.pids) | set(ta.tree.standby)
            c0, t0 = _cpu(list(seen)), time.perf_counter()
            sampler = Sampler(ta)
            acc = ta.begin(pool[0], n, r)
            seen |= set(ta.tree.pids)
            one_round(acc, pool, n)
            acc.close()
            peak = sampler.stop()
            wall = time.perf_counter() - t0
            out.append({"round": r, "updates": n, "leaves": ta.tree.leaves,
                        "seconds": wall, "cpu_s": _cpu(list(seen)) - c0,
                        "peak_mb": peak / 1e6, "reason": ta.shape.reason})
    finally:
        ta.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1e6,1e7")
    ap.add_argument("--updates", default="100,1000")
    ap.add_argument("--leaves", default="1,2,auto")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--pool-mb", type=float, default=160.0)
    ap.add_argument("--skip", default="", help="P x N cells to skip, e.g. 1e7x1000")
    ap.add_argument("--counts", default="10,100,10,100,30,10")
    ap.add_argument("--elastic-params", type=float, default=1e6)
    ap.add_argument("--max-leaves", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=0.05)
    ap.add_argument("--only", choices=("time", "elastic"), default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    console = Console(highlight=False)
    load0 = os.getloadavg()
    skip = {tuple(float(v) for v in c.split("x")) for c in args.skip.split(",") if c}
    res: dict = {"cpus": os.cpu_count(), "load_before": load0, "time": [], "elastic": {}}
    with threadpool_limits(limits=1):
        for p in [] if args.only == "elastic" else [int(float(x)) for x in args.params.split(",")]:
            pool = make_pool(p, args.pool_mb)
            ta = TreeAggregation(pool[0], leaves=1, max_leaves=8, fold_deadline=0.5)
            try:
                for n in [int(x) for x in args.updates.split(",")]:
                    if (float(p), float(n)) in skip:
                        continue
                    rep = args.repeat if n * p <= 1e9 else 1
                    flat = time_flat(pool, n, rep)
                    res["time"].append({"params": p, "updates": n, "mode": "flat",
                                        "leaves": 0, "seconds": flat})
                    console.print(f"{p:>10,} x {n:>5}  flat            {flat:8.3f} s")
                    for lv in args.leaves.split(","):
                        sec, used = time_tree(ta, lv, pool, n, rep)
                        res["time"].append({"params": p, "updates": n, "mode": f"tree {lv}",
                                            "leaves": used, "seconds": sec})
                        console.print(f"{p:>10,} x {n:>5}  tree {lv:>4} ({used} leaves) "
                                      f"{sec:8.3f} s  {flat / sec:5.2f}x flat")
            finally:
                ta.close()
        pool = make_pool(int(args.elastic_params), args.pool_mb)
        counts = [int(x) for x in args.counts.split(",")]
        for name, auto in () if args.only == "time" else (("elastic", True), ("always-on", False)):
            res["elastic"][name] = elastic_rounds(pool, counts, auto=auto,
                                                  max_leaves=args.max_leaves,
                                                  deadline=args.deadline)
    res["load_after"] = os.getloadavg()
    lines = ["| params | updates | aggregation | leaves | s / round | vs flat |",
             "|---:|---:|---|---:|---:|---:|"]
    flat = {(r["params"], r["updates"]): r["seconds"] for r in res["time"] if r["mode"] == "flat"}
    for r in res["time"]:
        f = flat[(r["params"], r["updates"])]
        lines.append(f"| {r['params']:,} | {r['updates']} | {r['mode']} | {r['leaves']} | "
                     f"{r['seconds']:.3f} | {f / r['seconds']:.2f}x |")
    lines += ["", "| tree | round | updates | leaves (CPUs reserved) | s | CPU-s | peak MB |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows in res["elastic"].items():
        for r in rows:
            lines.append(f"| {name} | {r['round']} | {r['updates']} | {r['leaves']} | "
                         f"{r['seconds']:.2f} | {r['cpu_s']:.2f} | {r['peak_mb']:.0f} |")
        lines.append(f"| {name}, total | | {sum(r['updates'] for r in rows)} | "
                     f"{sum(r['leaves'] for r in rows)} | "
                     f"{sum(r['seconds'] for r in rows):.2f} | "
                     f"{sum(r['cpu_s'] for r in rows):.2f} | "
                     f"{max(r['peak_mb'] for r in rows):.0f} |")
    lines.append(f"\nload average {load0[0]:.2f} before, {res['load_after'][0]:.2f} after, "
                 f"{os.cpu_count()} CPUs")
    console.print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
