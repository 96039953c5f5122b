"""Closed-loop load on a service, run on a host of the bed (or anywhere): `clients` senders
posting the digits example's one request to URL until SIGTERM or `--seconds`, with what they got
written to OUT (JSON, replaced atomically) every 0.2 s and at the end:

    python load.py URL OUT [--clients 4] [--seconds 0] [--input 784]

{"codes": {"200": 812}, "ok": 812, "p50_ms": ..., "p99_ms": ..., "seconds": ..., "rps": ...,
"done": false}. A connection that fails is counted under the error's name, as
`plinth.serve.loadgen.ClosedLoop` counts it."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

from plinth.serve.loadgen import ClosedLoop


def write(out: Path, load: ClosedLoop, t0: float, done: bool) -> None:
    lat = np.array(load.latencies_s[:]) * 1000
    seconds = time.perf_counter() - t0
    ok = load.codes.get(200, 0)
    doc = {"codes": {str(k): n for k, n in dict(load.codes).items()}, "ok": ok,
           "p50_ms": float(np.percentile(lat, 50)) if len(lat) else 0.0,
           "p99_ms": float(np.percentile(lat, 99)) if len(lat) else 0.0,
           "seconds": seconds, "rps": ok / seconds if seconds else 0.0, "done": done}
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=0.0, help="0: until SIGTERM")
    ap.add_argument("--input", type=int, default=784, help="values in the one request")
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    body = json.dumps({"inputs": [[0.0] * args.input]})
    t0 = time.perf_counter()
    with ClosedLoop(args.url, body, clients=args.clients) as load:
        end = t0 + args.seconds if args.seconds else float("inf")
        while not stop.wait(0.2) and time.perf_counter() < end:
            write(args.out, load, t0, False)
    write(args.out, load, t0, True)


if __name__ == "__main__":
    main()
