"""`python -m plinth.tune.tracker --addr-file F`: the RPC tracker of one tuning task.

It binds a free port, then writes {"host", "port"} to F (atomically), where the task's servers
and clients read it (`wait_for_tracker`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from plinth.core.net import free_port

PORT_RANGE = 50  # ports tried from the free one up, should another process take it first


def wait_for_tracker(path: str | Path, timeout_s: float = 300.0) -> tuple[str, int]:
    """(host, port) of the tracker once its address file names one that answers (a file left
    by an earlier run of the same task names a tracker that is gone)."""
    deadline = time.monotonic() + timeout_s
    path = Path(path)
    while time.monotonic() < deadline:
        if path.exists():
            addr = json.loads(path.read_text())
            host, port = str(addr["host"]), int(addr["port"])
            try:
                socket.create_connection((host, port), timeout=2).close()
                return host, port
            except OSError:
                pass  # not up yet, or gone: wait for the tracker to write the file again
        time.sleep(0.2)  # an entry point waiting on another process: no clock to inject
    raise SystemExit(f"--tracker-file: no tracker answered at {path} in {timeout_s:g} s")


def write_address(path: Path, host: str, port: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"host": host, "port": port, "pid": os.getpid()}))
    tmp.replace(path)


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
    p.add_argument("--addr-file", required=True, type=Path)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    from tvm.rpc.tracker import Tracker

    port = free_port(args.host)
    tracker = Tracker(args.host, port=port, port_end=port + PORT_RANGE, silent=True)
    write_address(args.addr_file, args.host, tracker.port)
    serve(tracker)


if __name__ == "__main__":
    main()
