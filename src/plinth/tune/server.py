"""`python -m plinth.tune.server --tracker HOST:PORT --key share-2 --threads 2`: a tuning server.

It binds a port free on its own node, at the node's address (PLINTH_NODE_ADDRESS, or `--host`),
registers there with the task's RPC tracker under its share's key, reports the address it bound
to its controller (`plinth.tune.reports`), and runs the candidates that clients send it, with
`--threads` runtime threads (TVM_NUM_THREADS): on a CPU, the share. The CPU set comes from the
runtime's limits, or from `--cpus` when run by hand.
"""

from __future__ import annotations

import argparse
import os
import sys

from plinth.core.errors import PlinthError
from plinth.core.net import advertised, free_port, host_port, node_address
from plinth.tune.reports import Bound, send
from plinth.tune.tracker import PORT_RANGE, serve


def parse_cpus(text: str) -> set[int]:
    """`"0-3,6"` -> {0, 1, 2, 3, 6}."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m plinth.tune.server", description=__doc__)
    p.add_argument("--tracker", required=True, type=host_port, help="the tracker's HOST:PORT")
    p.add_argument("--key", required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cpus", type=parse_cpus, default=None, help="e.g. 0-1: pin to these CPUs")
    p.add_argument("--host", default=None, help="the address to bind (default: this node's)")
    args = p.parse_args(argv)
    host = args.host or node_address()
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)  # inherited by the worker that runs candidates
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when the worker starts
    from tvm import rpc

    try:
        port = free_port(host)
    except PlinthError as e:  # its node's address is not this host's: one line, not a trace
        sys.exit(f"server: {e}")
    # custom_addr: the address the tracker hands clients is the one bound, whichever address
    # this node's connection to the tracker leaves from
    server = rpc.Server(host, port=port, port_end=port + PORT_RANGE, key=args.key,
                        tracker_addr=args.tracker, custom_addr=host, silent=True)
    send(Bound.here(advertised(host, server.port)))  # sent again until it gets through
    serve(server)


if __name__ == "__main__":
    main()
