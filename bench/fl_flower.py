"""FedAvg aggregation throughput: Plinth's streaming engine against Flower's FedAvg and a copy.

Run it in the benchmark-only venv made by `bench/flower_venv.sh` (flwr conflicts with .venv):

    bash bench/flower_venv.sh
    .venv-flower/bin/python bench/fl_flower.py [--params 1e6,1e7] [--clients 100,1000]
        [--repeat 2] [--json results/fl_flower.json]

For N clients × P float32 parameters (four tensors: P/2, P/4, P/8, rest), each method reads N
updates, N·P·4 bytes. The same arrays are serialised once per wire format, as each server receives
them: Plinth's serde buffers, Flower's `Parameters` (np.save bytes, legacy strategies) and Flower's
`ArrayRecord` (Message API). 1,000 distinct 10M-parameter updates (40 GB) do not fit in memory, so
a pool of distinct updates (at least --pool of them and --pool-mb MB, far past the 32 MiB L3
here) is cycled through; every read comes from DRAM.

Methods, in one run and on the same values:
- copy:                 np.copyto of each update into one model-sized buffer (the hardware limit
                        for touching every byte once).
- flower FedAvg (legacy): `flwr.server.strategy.aggregate.aggregate_inplace(results)` with
                        results = [(ClientProxy, FitRes)], as `flwr.server.strategy.FedAvg.
                        aggregate_fit` calls it with its default inplace=True. It deserialises
                        each update (np.load) itself; that is part of Flower's path.
- flower FedAvg (Message API): `flwr.serverapp.strategy.strategy_utils.aggregate_arrayrecords(
                        records, "num-examples")` with the reply RecordDicts, as
                        `flwr.serverapp.strategy.FedAvg.aggregate_train` calls it.
- flower aggregate (inplace=False): parameters_to_ndarrays for every result, then
                        `aggregate(weights_results)`, as FedAvg(inplace=False) does. It holds all
                        N updates twice, so it runs only where that fits in --flower-max-gb.
- plinth engine:        serde.decode (zero-copy views) + StreamingAggregator.add per update, then
                        mean(); and add_many over batches of --batch updates that arrived together.

Throughput is GB of update bytes per second (N·P·4 / seconds), the median of --repeat runs. Peak
extra memory is tracemalloc's peak during one more run (numpy's buffers included), excluding the
inputs. Results of every method are checked against the engine's (max abs difference).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy.aggregate import aggregate, aggregate_inplace
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from plinth.fl import messages, serde
from plinth.fl.aggregate.engine import StreamingAggregator

try:
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - plain markdown instead
    Console = Table = None  # type: ignore[assignment,misc]

WEIGHT_KEY = "num-examples"  # flwr.serverapp.strategy.FedAvg's default weighted_by_key


class Inputs:
    """N updates in each wire format, cycling over `pool` distinct ones (shared objects)."""

    def __init__(self, params: int, pool: int, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        sizes = [params // 2, params // 4, params // 8]
        sizes.append(params - sum(sizes))
        arrays = [[rng.standard_normal(s, dtype=np.float32) for s in sizes] for _ in range(pool)]
        self.model_bytes = 4 * params
        self.weights = [int(w) for w in np.random.default_rng(1).integers(1, 100, n)]
        self.plinth = [bytes(serde.encode(messages.FitRes(1, a, 10))) for a in arrays]
        params_fl = [ndarrays_to_parameters(a) for a in arrays]
        ok = Status(code=Code.OK, message="")
        # FitRes per client (its own num_examples), sharing the pool's Parameters
        self.fitres = [(None, FitRes(status=ok, parameters=params_fl[k % pool],
                                     num_examples=w, metrics={}))
                       for k, w in enumerate(self.weights)]
        records = [ArrayRecord(numpy_ndarrays=a) for a in arrays]
        self.records = [RecordDict({"arrays": records[k % pool],
                                    "metrics": MetricRecord({WEIGHT_KEY: w})})
                        for k, w in enumerate(self.weights)]
        self.n = n


def run_copy(inp: Inputs) -> list[np.ndarray]:
    first = serde.decode(inp.plinth[0]).update
    dst = [np.empty_like(a) for a in first]
    for k in range(inp.n):
        for d, a in zip(dst, serde.decode(inp.plinth[k % len(inp.plinth)]).update):
            np.copyto(d, a)
    return []


def run_flower_inplace(inp: Inputs) -> list[np.ndarray]:
    return aggregate_inplace(inp.fitres)  # type: ignore[arg-type]


def run_flower_records(inp: Inputs) -> list[np.ndarray]:
    rec = aggregate_arrayrecords(inp.records, WEIGHT_KEY)
    return [a.numpy() for a in rec.values()]


def run_flower_aggregate(inp: Inputs) -> list[np.ndarray]:
    weights_results = [(parameters_to_ndarrays(fr.parameters), fr.num_examples)
                       for _, fr in inp.fitres]
    return aggregate(weights_results)


def run_engine(batch: int = 1, threads: int = 1) -> Callable[[Inputs], list[np.ndarray]]:
    def go(inp: Inputs) -> list[np.ndarray]:
        bufs = inp.plinth
        agg = StreamingAggregator(serde.decode(bufs[0]).update, threads=threads)
        try:
            if batch == 1:
                for k, w in enumerate(inp.weights):
                    agg.add(serde.decode(bufs[k % len(bufs)]).update, w)
            else:
                for s in range(0, inp.n, batch):
                    agg.add_many([(serde.decode(bufs[k % len(bufs)]).update, inp.weights[k])
                                  for k in range(s, min(inp.n, s + batch))])
            return agg.mean() or []
        finally:
            agg.close()
    return go


def measure(fn: Callable[[Inputs], list[np.ndarray]], inp: Inputs,
            repeat: int) -> tuple[float, float, list[np.ndarray]]:
    times = []
    out: list[np.ndarray] = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn(inp)
        times.append(time.perf_counter() - t)
    del out
    tracemalloc.start()
    tracemalloc.reset_peak()
    out = fn(inp)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="1e6,1e7")
    ap.add_argument("--clients", default="100,1000")
    ap.add_argument("--pool", type=int, default=8, help="at least this many distinct updates")
    ap.add_argument("--pool-mb", type=float, default=256.0,
                    help="and at least this many MB of them (well past the last-level cache)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="also time the engine with this many threads (if > 1)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--flower-max-gb", type=float, default=4.0,
                    help="run Flower's non-inplace aggregate() only if its 2·N models fit")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import flwr

    say = Console(width=200).print if Console else print
    # a server is long-running: load the engine's compiled kernel before timing anything
    warm = StreamingAggregator([np.zeros(8, np.float32)])
    warm.add([np.ones(8, np.float32)], 1.0)
    load0 = os.getloadavg()
    rows: list[dict] = []
    for p in [int(float(x)) for x in args.params.split(",")]:
        for n in [int(x) for x in args.clients.split(",")]:
            pool = max(args.pool, math.ceil(args.pool_mb * 1e6 / (4 * p)))
            inp = Inputs(p, pool, n)
            model = inp.model_bytes
            methods: list[tuple[str, Callable]] = [
                ("copy", run_copy),
                ("flower FedAvg, legacy (aggregate_inplace)", run_flower_inplace),
                ("flower FedAvg, Message API (aggregate_arrayrecords)", run_flower_records),
            ]
            skipped = []
            if 2 * n * model / 1e9 <= args.flower_max_gb:
                methods.append(("flower aggregate (inplace=False)", run_flower_aggregate))
            else:
                skipped.append({"params": p, "clients": n,
                                "method": "flower aggregate (inplace=False)",
                                "skipped": f"holds 2·N models, ~{2 * n * model / 1e9:.0f} GB"})
            methods.append(("plinth engine, add per update", run_engine()))
            methods.append((f"plinth engine, add_many batch {args.batch}",
                            run_engine(args.batch)))
            if args.threads > 1:
                methods.append((f"plinth engine, add, {args.threads} threads",
                                run_engine(1, args.threads)))
            ref = None
            done: list[tuple[str, list[np.ndarray]]] = []
            for name, fn in methods:
                sec, peak, out = measure(fn, inp, args.repeat)
                gbs = n * model / sec / 1e9
                rows.append({"params": p, "clients": n, "pool": pool, "method": name,
                             "seconds": sec,
                             "gb_per_s": gbs, "peak_extra_mb": peak / 1e6,
                             "peak_models": peak / model})
                if name.startswith("plinth") and ref is None:
                    ref = [np.asarray(a, dtype=np.float64) for a in out]
                if out:
                    done.append((name, [np.asarray(a, dtype=np.float64) for a in out]))
                del out
                say(f"{p:>10,} × {n:>5}  {name:52} {sec:8.3f}s {gbs:7.2f} GB/s  "
                    f"peak {peak / 1e6:8.1f} MB ({peak / model:5.2f}× model)")
            rows += skipped
            for name, out in done:
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(out, ref or out))
                for r in rows:
                    if (r["params"], r["clients"], r["method"]) == (p, n, name):
                        r["max_abs_diff_vs_engine"] = diff
            del inp, done, ref
    load1 = os.getloadavg()
    finish(rows, args, load0, load1, flwr.__version__, say)


def finish(rows: list[dict], args: argparse.Namespace, load0: tuple, load1: tuple,
           flwr_version: str, say: Callable) -> None:
    by = {}
    for r in rows:
        by.setdefault((r["params"], r["clients"]), []).append(r)
    for rs in by.values():
        timed = [r for r in rs if "seconds" in r]
        copy = next(r for r in timed if r["method"] == "copy")
        flower = [r for r in timed if r["method"].startswith("flower FedAvg")]
        best_flower = min(flower, key=lambda r: r["seconds"])
        for r in timed:
            r["vs_copy"] = r["gb_per_s"] / copy["gb_per_s"]
            r["x_flower"] = best_flower["seconds"] / r["seconds"]
    head = ("params", "clients", "method", "s", "GB/s", "% copy", "× Flower FedAvg",
            "peak extra (× model)")
    cells = []
    for r in rows:
        if "skipped" in r:
            cells.append((f"{r['params']:,}", str(r["clients"]), r["method"], "-", "-", "-", "-",
                          "skipped: " + r["skipped"]))
            continue
        cells.append((f"{r['params']:,}", str(r["clients"]), r["method"], f"{r['seconds']:.3f}",
                      f"{r['gb_per_s']:.2f}", f"{100 * r['vs_copy']:.0f}%",
                      f"{r['x_flower']:.1f}×",
                      f"{r['peak_extra_mb']:.0f} MB ({r['peak_models']:.2f}×)"))
    title = (f"FedAvg aggregation, float32 updates; flwr {flwr_version}, numpy {np.__version__}, "
             f"{os.cpu_count()} CPUs, load avg {load0[0]:.2f} → {load1[0]:.2f}")
    if Table is not None:
        t = Table(title=title)
        for c in head:
            t.add_column(c, justify="left" if c == "method" else "right")
        for c in cells:
            t.add_row(*c)
        say(t)
    else:
        print(f"\n{title}\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for c in cells:
            print("| " + " | ".join(c) + " |")
    say("× Flower FedAvg: against the faster of Flower's two FedAvg paths at that size.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"cpus": os.cpu_count(), "pool_min": args.pool, "pool_mb": args.pool_mb,
             "repeat": args.repeat,
             "flwr": flwr_version, "numpy": np.__version__, "loadavg_start": load0,
             "loadavg_end": load1, "rows": rows}, indent=1))
        say(f"results: {args.json}")


if __name__ == "__main__":
    main()
