"""Measure a real replica's cold start: process start plus model load, to its first /healthz 200.

    python bench/serve_cold_start.py [--model tiny-cnn] [--runs 5] [--extra "ARGS"]

Each run starts `python -m plinth.serve.replica --port P --model M` as a fresh subprocess (the
interpreter, torch and FastAPI imports, the model build, uvicorn's bind) and polls
GET /healthz every 20 ms until it answers 200; the time from `Popen` to that answer is one cold
start. The median is what `plinth serve sim` takes as its default `--cold-start-s`. On a busy
machine the wall time mostly measures the wait for a core, so the replica's own CPU seconds until
it answered (user + system, from psutil) are printed too: about what the start takes on an idle
core. `--extra`
passes more replica options (the replica's command line is being extended, e.g.
`--extra "--input-shape 1,28,28 --slo-ms 720"`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import statistics
import subprocess
import sys
import time

import httpx
import psutil


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cold_start(model: str, extra: list[str], timeout_s: float = 120.0) -> tuple[float, float]:
    """(wall seconds to the first /healthz 200, CPU seconds the replica used until then)."""
    port = _port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "plinth.serve.replica", "--port", str(port),
                             "--model", model, *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"replica exited with {proc.returncode} before /healthz")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    wall = time.perf_counter() - t0
                    cpu = psutil.Process(proc.pid).cpu_times()
                    return wall, cpu.user + cpu.system
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"no /healthz 200 within {timeout_s} s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-cnn")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--extra", default="", help="more replica options, one string")
    args = ap.parse_args()
    runs = [cold_start(args.model, shlex.split(args.extra)) for _ in range(args.runs)]
    times, cpus = [w for w, _ in runs], [c for _, c in runs]
    print(json.dumps({"model": args.model, "runs_s": [round(t, 3) for t in times],
                      "median_s": round(statistics.median(times), 3),
                      "max_s": round(max(times), 3),
                      "cpu_s": [round(c, 3) for c in cpus],
                      "median_cpu_s": round(statistics.median(cpus), 3)}))


if __name__ == "__main__":
    main()
