"""The LIFL tree against the flat engine, and the elastic tree against an always-on one.

Part 1, aggregation time per round: N updates of P float32 parameters through the server's
accumulator on the path `Server` uses (`add_many` per arriving update, then `mean()`):
- flat:        `StreamingAggregator` in the server process (`mode: stream`);
- tree, L:     `TreeAccumulator` on one node (`mode: tree`), L warm leaf processes; each update is
               copied once into a shared-memory slot (included), the leaves fold, the server folds
               the L partial sums; `auto` is what `size_tree` picks from the measured throughput.
Updates are cycled from a pool of distinct arrays (--pool-mb, past the last-level cache). Time is
the median of --repeat warm rounds.

Part 1b (--only grpc), the same through the real gRPC transport on loopback: --clients gRPC
clients in one other process push the N updates (encoded FitRes, 1 MiB chunks) and the server
side folds each as `Server` does (decode, `add_many` per completed batch, `mean()`). With the
tree, each upload is received straight into a shared-memory slot (`landing`) and a leaf folds it
there; flat, into a plain buffer that the server folds. Time: from handing out the N tasks to the
mean, the median of --repeat warm rounds (the upload is in it, as in a server's round).

With --nodes K (Part 1c), also the tree over K nodes, LIFL's level per node: a process per
node (a middle aggregator) with its own --clients/K gRPC clients and --node-leaves leaves folding
its share of the N updates in shared memory; each node sends the top one update (the weighted
mean and the weight, as `plinth fl aggregator` does), and the top folds K. On one machine the
nodes share its cores; what crosses between them is one update a node.

Part 2, resources per round with client counts varying 10x across rounds (--counts): the
elastic tree (`leaves: auto`, at most --max-leaves, sized each round by `size_tree` with
--deadline) against an always-on tree of --max-leaves leaves. CPU-seconds: this process plus
every leaf (the live ones' CPU times, and the reaped ones' through RUSAGE_CHILDREN); peak memory:
sampled every 10 ms, the leaves' private resident memory (RssAnon) plus the tree's shared memory
plus this process's growth.

BLAS is pinned to one thread (threadpoolctl) here and in every leaf: the fold is one compiled
kernel, and a BLAS pool would only fight it for the cores.

    .venv/bin/python bench/fl_tree.py [--params 1e6,1e7] [--updates 100,1000] [--json out.json]
    .venv/bin/python bench/fl_tree.py --only grpc --params 1e6,1e7 --updates 100 --leaves 1,2
    .venv/bin/python bench/fl_tree.py --only grpc --leaves 1 --nodes 2 --node-leaves 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait
from multiprocessing import shared_memory

import psutil
from fl_hierarchy import make_pool  # bench/ is on sys.path when run as a script
from rich.console import Console
from threadpoolctl import threadpool_limits

from plinth.fl import serde
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.tree import TreeAggregation
from plinth.fl.messages import FitRes
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport


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


def _push_clients(addr: str, clients: int, params: int, pool_mb: float) -> None:
    """The gRPC clients (in their own process): task k is answered with update k of the pool,
    encoded once, weighted 1 + k % 7."""
    pool = make_pool(params, pool_mb)
    replies = [serde.encode(FitRes(1, arrays, 1 + k % 7, {})) for k, arrays in enumerate(pool)]

    def handle(payload: bytes) -> bytearray:
        return replies[int(payload) % len(replies)]

    threads = [threading.Thread(target=GrpcClient(addr, client_id=f"b{i}").serve, args=(handle,))
               for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def joined(transport: GrpcTransport, n: int, who: str, timeout: float = 120) -> list[str]:
    """The ids of the `n` clients that join `transport`, once they have."""
    if not transport.wait_for(n, timeout):
        raise RuntimeError(f"{who} did not join within {timeout:g} s")
    return sorted(c.cid for c in transport.clients())


def grpc_round(transport: GrpcTransport, acc, cids: list[str], n: int) -> tuple[float, list]:
    """One round as `Server.fit_round` runs it over the transport: the N replies folded as
    they complete (decode, `add_many`), then `mean()`; its seconds and the mean."""
    t = time.perf_counter()
    # a tree receives into its slots (getattr: so that this bench runs on an older checkout)
    transport.landing = getattr(acc, "landing", None)
    pending = {transport.submit(cids[k % len(cids)], str(k).encode()) for k in range(n)}
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        items = []
        for f in done:
            res = serde.decode(f.result(), expect=FitRes)
            items.append((res.update, float(res.num_examples)))
        del done, f, res  # the replies go once folded: the transport bounds the ones held
        assert not acc.add_many(items)
        del items
    mean = acc.mean()
    assert mean is not None and acc.count == n
    transport.landing = None
    return time.perf_counter() - t, mean


def time_grpc(params: int, updates: list[int], leaves: list[str], *, clients: int,
              pool_mb: float, repeat: int, console: Console) -> list[dict]:
    pool = make_pool(params, pool_mb)
    transport = GrpcTransport("127.0.0.1:0")
    proc = mp.get_context("spawn").Process(
        target=_push_clients, args=(f"127.0.0.1:{transport.port}", clients, params, pool_mb))
    proc.start()
    ta = TreeAggregation(pool[0], leaves=1, max_leaves=8, fold_deadline=0.5)
    out = []
    try:
        cids = joined(transport, clients, "the gRPC clients")
        for n in updates:
            rep = repeat if n * params <= 1e9 else 1
            times = []
            for _ in range(rep + 1):
                acc = StreamingAggregator(pool[0])
                times.append(grpc_round(transport, acc, cids, n)[0])
                acc.close()
            flat = statistics.median(times[1:])
            out.append({"params": params, "updates": n, "mode": "grpc flat", "leaves": 0,
                        "seconds": flat})
            console.print(f"{params:>10,} x {n:>5}  grpc flat       {flat:8.3f} s")
            for lv in leaves:
                ta.fixed = None if lv == "auto" else int(lv)
                times = []
                for _ in range(rep + 1):
                    acc = ta.begin(pool[0], n)
                    ta.tree.wait_ready(120)
                    used = ta.tree.leaves
                    times.append(grpc_round(transport, acc, cids, n)[0])
                    acc.close()
                sec = statistics.median(times[1:])
                out.append({"params": params, "updates": n, "mode": f"grpc tree {lv}",
                            "leaves": used, "seconds": sec})
                console.print(f"{params:>10,} x {n:>5}  grpc tree {lv:>4} ({used} leaves) "
                              f"{sec:8.3f} s  {flat / sec:5.2f}x flat")
    finally:
        ta.close()
        transport.close()
        proc.join(30)
    return out


def _node(top: str, name: str, clients: int, params: int, pool_mb: float, leaves: int) -> None:
    """One node of a multi-node tree (in its own process): its middle aggregator's gRPC clients
    push to it, its `leaves` fold their updates in shared memory, and it answers the top with
    one update, their weighted mean with their total weight (what `MiddleAggregator` sends)."""
    with threadpool_limits(limits=1):
        template = make_pool(params, 0)[0]
        transport = GrpcTransport("127.0.0.1:0")
        proc = mp.get_context("spawn").Process(
            target=_push_clients, args=(f"127.0.0.1:{transport.port}", clients, params, pool_mb))
        proc.start()
        ta = TreeAggregation(template, leaves=leaves, max_leaves=8, fold_deadline=0.5)
        try:
            cids = joined(transport, clients, f"{name}: the gRPC clients")

            def handle(payload: bytes) -> bytearray:
                acc = ta.begin(template, int(payload))
                ta.tree.wait_ready(120)
                _, mean = grpc_round(transport, acc, cids, int(payload))
                total = acc.total_weight
                acc.close()
                return serde.encode(FitRes(1, mean, round(total), {}))

            GrpcClient(top, client_id=name).serve(handle)
        finally:
            ta.close()
            transport.close()
            proc.join(30)


def time_nodes(params: int, updates: list[int], *, nodes: int, leaves: int, clients: int,
               pool_mb: float, repeat: int, console: Console) -> list[dict]:
    """The tree over `nodes` nodes: a node process each (its middle, its clients, its leaves),
    the N updates shared between them; the top folds one update a node. Time: from handing the
    nodes their tasks to the top's mean."""
    template = make_pool(params, 0)[0]
    top = GrpcTransport("127.0.0.1:0")
    procs = [mp.get_context("spawn").Process(
        target=_node, args=(f"127.0.0.1:{top.port}", f"node-{k}", max(1, clients // nodes),
                            params, pool_mb, leaves)) for k in range(nodes)]
    for proc in procs:
        proc.start()
    out = []
    try:
        names = joined(top, nodes, "the nodes", timeout=300)
        for n in updates:
            rep = repeat if n * params <= 1e9 else 1
            times = []
            for _ in range(rep + 1):
                t = time.perf_counter()
                futures = [top.submit(names[k], str(len(range(k, n, nodes))).encode())
                           for k in range(nodes)]
                acc = StreamingAggregator(template)
                for f in futures:
                    res = serde.decode(f.result(), expect=FitRes)
                    assert not acc.add_many([(res.update, float(res.num_examples))])
                assert acc.mean() is not None
                times.append(time.perf_counter() - t)
                acc.close()
            sec = statistics.median(times[1:])
            out.append({"params": params, "updates": n, "mode": f"grpc {nodes} nodes",
                        "leaves": leaves * nodes, "seconds": sec})
            console.print(f"{params:>10,} x {n:>5}  grpc {nodes} nodes x {leaves} leaves "
                          f"{sec:8.3f} s")
    finally:
        top.close()
        for proc in procs:
            proc.join(60)
    return out


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
    ap.add_argument("--clients", type=int, default=4, help="gRPC clients (--only grpc)")
    ap.add_argument("--nodes", type=int, default=0, help="with --only grpc: also the tree "
                    "over this many nodes (a process each), --node-leaves leaves a node")
    ap.add_argument("--node-leaves", type=int, default=1)
    ap.add_argument("--only", choices=("time", "elastic", "grpc"), default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    console = Console(highlight=False)
    load0 = os.getloadavg()
    skip = {tuple(float(v) for v in c.split("x")) for c in args.skip.split(",") if c}
    res: dict = {"cpus": os.cpu_count(), "load_before": load0, "time": [], "elastic": {}}
    params = [int(float(x)) for x in args.params.split(",")]
    with threadpool_limits(limits=1):
        for p in params if args.only == "grpc" else []:
            res["time"] += time_grpc(p, [int(x) for x in args.updates.split(",")
                                         if (float(p), float(x)) not in skip],
                                     args.leaves.split(","), clients=args.clients,
                                     pool_mb=args.pool_mb, repeat=args.repeat, console=console)
            if args.nodes:
                res["time"] += time_nodes(p, [int(x) for x in args.updates.split(",")
                                              if (float(p), float(x)) not in skip],
                                          nodes=args.nodes, leaves=args.node_leaves,
                                          clients=args.clients, pool_mb=args.pool_mb,
                                          repeat=args.repeat, console=console)
        for p in params if args.only in (None, "time") else []:
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
        for name, auto in (("elastic", True), ("always-on", False)) if args.only in (
                None, "elastic") else ():
            res["elastic"][name] = elastic_rounds(pool, counts, auto=auto,
                                                  max_leaves=args.max_leaves,
                                                  deadline=args.deadline)
    res["load_after"] = os.getloadavg()
    lines = ["| params | updates | aggregation | leaves | s / round | vs flat |",
             "|---:|---:|---|---:|---:|---:|"]
    flat = {(r["params"], r["updates"]): r["seconds"] for r in res["time"]
            if r["mode"] in ("flat", "grpc flat")}
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
