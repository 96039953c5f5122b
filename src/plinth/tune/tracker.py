"""`python -m plinth.tune.tracker`: the RPC tracker of one tuning task.

It binds a port free on its own node, at the node's address (PLINTH_NODE_ADDRESS, or `--host`),
and reports the address it bound to its controller (`plinth.tune.reports`), which hands it to
the task's servers and clients (`--tracker HOST:PORT`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from plinth.core.errors import PlinthError
from plinth.core.net import advertised, free_port, node_address
from plinth.tune.reports import Bound, send

PORT_RANGE = 50  # ports tried from the free one up, should another process take it first


def serve(tvm_server: Any) -> None:
    """Wait on a TVM tracker or server (it serves from a worker process, a child of ours);
    on SIGTERM or on our exit, end that worker, so that stopping the unit leaves nothing."""
    def stop() -> None:
        try:
            tvm_server.terminate()
        except OSError:  # the worker had the signal too (one process group) and is gone
            pass

    def handler(signum: int, _frame: object) -> None:
        stop()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    try:
        tvm_server.proc.join()
    finally:
        stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m plinth.tune.tracker", description=__doc__)
    p.add_argument("--host", default=None, help="the address to bind (default: this node's)")
    args = p.parse_args(argv)
    host = args.host or node_address()
    from tvm.rpc.tracker import Tracker

    # TVM binds the first free port of a range (port 0 is not one it takes): one free here.
    try:
        port = free_port(host)
    except PlinthError as e:  # its node's address is not this host's: one line, not a trace
        sys.exit(f"tracker: {e}")
    tracker = Tracker(host, port=port, port_end=port + PORT_RANGE, silent=True)
    send(Bound.here(advertised(host, tracker.port)))  # sent again until it gets through
    serve(tracker)


if __name__ == "__main__":
    main()
