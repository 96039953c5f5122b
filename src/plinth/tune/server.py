"""`python -m plinth.tune.server --tracker-file F --key share-2 --threads 2`: a tuning server.

It registers with the task's RPC tracker under its share's key and runs the candidates that
clients send it, with `--threads` runtime threads (TVM_NUM_THREADS): on a CPU, the share. The
CPU set comes from the runtime's limits, or from `--cpus` when run by hand.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from plinth.core.net import free_port
from plinth.tune.tracker import PORT_RANGE, serve, wait_for_tracker


def parse_cpus(text: str) -> set[int]:
    """`"0-3,6"` -> {0, 1, 2, 3, 6}."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m plinth.tune.server", description=__doc__)
    p.add_argument("--tracker-file", required=True, type=Path)
    p.add_argument("--key", required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cpus", type=parse_cpus, default=None, help="e.g. 0-1: pin to these CPUs")
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # inherited by the worker that runs candidates
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when the worker starts
    tracker = wait_for_tracker(args.tracker_file)
    from tvm import rpc

    port = free_port(args.host)
    server = rpc.Server(args.host, port=port, port_end=port + PORT_RANGE, key=args.key,
                        tracker_addr=tracker, silent=True)
    serve(server)


if __name__ == "__main__":
    main()
