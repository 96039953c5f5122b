"""SecAgg+ over real gRPC on 127.0.0.1 against the same round without it: wall time and bytes.

One `GrpcTransport` server in this process and n client processes (`GrpcClient` + `ClientRunner`,
spawned), each adding a fixed random delta to a model of `--params` float32 values, so the time
is the protocol's and the transport's, not training. For each n the same clients first run
`--rounds` plain FedAvg rounds, then `--rounds` SecAgg+ rounds (four stage exchanges a round).
Round time is the median over the rounds after the first (warm-up); bytes are the serde payloads
a round sends each client (down) and receives from it (up), without gRPC framing. The final
models of both runs are checked to agree to the fixed-point resolution.

    .venv/bin/python bench/fl_secagg_grpc.py [--clients 10,20] [--params 100000] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.fl.app import ServerSpec, parse_app
from plinth.fl.client import ClientRunner
from plinth.fl.safeguards import Safeguards
from plinth.fl.server import RoundRecord, Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport


class FixedDelta:
    def __init__(self, cid: int, d: int) -> None:
        self.delta = np.random.default_rng(cid).uniform(-0.01, 0.01, d).astype(np.float32)

    def fit(self, params, config):
        return [params[0] + self.delta], 10, {}

    def evaluate(self, params, config):
        return 0.0, 10, {}


def _client(address: str, cid: int, d: int) -> None:
    GrpcClient(address, client_id=str(cid)).serve(ClientRunner(FixedDelta(cid, d)).handle)


def _rounds(transport: GrpcTransport, n: int, d: int, rounds: int, secagg: bool
            ) -> tuple[list[RoundRecord], np.ndarray]:
    spec = parse_app({"privacy": {"secagg": {}}} if secagg else {})
    cfg = ServerSpec(fraction=1.0, min_clients=n, min_available=n, straggler_timeout=120,
                     wait_timeout=120, evaluate_every=10**9)
    server = Server(make_strategy("fedavg"), transport, cfg, safeguards=Safeguards(spec))
    server.initialize([np.zeros(d, np.float32)])
    recs = server.run(rounds)
    assert all(r.updates == n for r in recs), [r.failures for r in recs]
    return recs, server.strategy.parameters[0]


def one(n: int, d: int, rounds: int) -> list[dict]:
    transport = GrpcTransport("127.0.0.1:0", workers=max(32, 2 * n))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_client, args=(f"127.0.0.1:{transport.port}", c, d))
             for c in range(n)]
    for p in procs:
        p.start()
    try:
        plain, x_plain = _rounds(transport, n, d, rounds, secagg=False)
        masked, x_masked = _rounds(transport, n, d, rounds, secagg=True)
    finally:
        transport.close()
        for p in procs:
            p.join(30)
    # each round's unmasked mean is within 1/(2·scale) of the plain mean
    assert np.abs(x_plain - x_masked).max() <= rounds * 0.5 / 2**16 + 1e-6, "SecAgg sum is wrong"
    rows = []
    for name, recs in (("plain FedAvg", plain), ("SecAgg+", masked)):
        timed = recs[1:] or recs
        rows.append({"n": n, "params": d, "mode": name,
                     "round_s": statistics.median(r.seconds for r in timed),
                     "up_B_per_client": recs[-1].bytes_up / n,
                     "down_B_per_client": recs[-1].bytes_down / n,
                     "degree": None if name == "plain FedAvg" else
                     min(n - 1, 2 * int(np.ceil(np.log2(n))))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="10,20")
    ap.add_argument("--params", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [row for n in (int(x) for x in args.clients.split(","))
            for row in one(n, args.params, args.rounds)]
    table = Table(title=f"one round over gRPC on 127.0.0.1, {args.params:,} float32 params, "
                        f"client processes, median of rounds 2..{args.rounds}")
    for col in ("clients", "mode", "round ms", "up KB / client", "down KB / client",
                "× plain time", "× plain up"):
        table.add_column(col, justify="right")
    for plain, sec in zip(rows[::2], rows[1::2]):
        for r in (plain, sec):
            table.add_row(str(r["n"]), r["mode"], f"{1e3 * r['round_s']:.0f}",
                          f"{r['up_B_per_client'] / 1e3:.1f}",
                          f"{r['down_B_per_client'] / 1e3:.1f}",
                          f"{r['round_s'] / plain['round_s']:.2f}",
                          f"{r['up_B_per_client'] / plain['up_B_per_client']:.2f}")
    console = Console(width=160)
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))
        console.print(f"results: {args.json}")


if __name__ == "__main__":
    main()
