"""Dynamic batching on one replica: throughput and latency at batch 1 and at the adaptive size.

    python bench/serve_batching.py [--model examples.serve.cnn:make_resnet] [--input-shape 3,32,32]
        [--slo-ms 100] [--clients 16] [--duration-s 10] [--max-wait-ms 5] [--json PATH]

One replica process per configuration (one torch thread), driven closed-loop by `--clients`
concurrent clients (each one keep-alive connection of a minimal HTTP/1.1 client) that each send
one image (an npy body) and wait for its answer before sending the next. Latency is measured at the client, so it includes the HTTP round trip and the queue.
The first second of each run is a warm-up and is not counted; the replica's own
p50/p99 (queue plus model, from /stats) covers the whole run. A second table drives the same
batcher and model in this process with as many concurrent submitters and no HTTP, to separate
what batching buys in model time from the cost of the HTTP path. The bench process itself takes CPU
from the replica on a small machine; the table prints /proc/loadavg so a reader can judge.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from plinth.serve.batching import Batcher
from plinth.serve.model import parse_shape
from plinth.serve.replica import NPY, prepare

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "serve"))
from replica_process import ReplicaProcess

WARMUP_S = 1.0


class Conn:
    """One keep-alive HTTP/1.1 connection that POSTs npy bodies. A client this small costs the
    replica's machine little CPU; httpx's pure-Python HTTP costs a few ms a request, which on a
    busy 2-CPU machine would make the bench measure its own client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Conn:
        u = urlsplit(url)
        return cls(*await asyncio.open_connection(u.hostname, u.port))

    async def post(self, path: str, body: bytes) -> bytes:
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: replica\r\nContent-Type: {NPY}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        data = await self.reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"replica answered {status.decode()}: {data[:200]!r}")
        return data

    def close(self) -> None:
        self.writer.close()


async def closed_loop(url: str, body: bytes, clients: int, duration_s: float) -> list[float]:
    """Closed-loop load; the latencies (ms) of requests that started after the warm-up."""
    lat: list[float] = []
    t_start = time.perf_counter()
    t_count, t_end = t_start + WARMUP_S, t_start + WARMUP_S + duration_s

    async def client() -> None:
        conn = await Conn.open(url)
        try:
            while (t0 := time.perf_counter()) < t_end:
                await conn.post("/infer", body)
                if t0 >= t_count:
                    lat.append((time.perf_counter() - t0) * 1000)
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return lat


def run_inprocess(args: argparse.Namespace, max_batch: int) -> dict:
    """The same batcher and model without HTTP: what batching alone buys on this CPU."""
    import torch

    torch.set_num_threads(1)
    shape = parse_shape(args.input_shape)
    ns = argparse.Namespace(model=args.model, workdir=str(ROOT), handler=None,
                            input_shape=args.input_shape, max_batch=max_batch,
                            slo_ms=args.slo_ms, max_wait_ms=args.max_wait_ms)
    x = torch.from_numpy(np.random.default_rng(0).random((1, *shape), dtype=np.float32))

    async def go() -> tuple[list[float], dict]:
        with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,)) as ex:
            m = prepare(ns, ex)
            b = Batcher(m.forward, batch_size=m.choice.size, max_wait_s=m.max_wait_ms / 1000,
                        executor=ex)
            b.start()
            lat: list[float] = []
            t_count = time.perf_counter() + WARMUP_S
            t_end = t_count + args.duration_s

            async def client() -> None:
                while (t0 := time.perf_counter()) < t_end:
                    await b.submit(x)
                    if t0 >= t_count:
                        lat.append((time.perf_counter() - t0) * 1000)

            await asyncio.gather(*(client() for _ in range(args.clients)))
            await b.close()
            return lat, b.snapshot()

    lat, stats = asyncio.run(go())
    a = np.asarray(lat)
    return {"config": "batch 1" if max_batch == 1 else "adaptive",
            "batch_size": stats["batch_size"],
            "mean_batch": round(stats["rows"] / max(stats["batches"], 1), 2),
            "requests": int(a.size), "throughput_rps": round(a.size / args.duration_s, 1),
            "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2),
            "slo_met": round(float((a <= args.slo_ms).mean()), 4)}


def run_one(args: argparse.Namespace, max_batch: int, env: dict[str, str]) -> dict:
    shape = parse_shape(args.input_shape)
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(0).random((1, *shape), dtype=np.float32))
    cmd = ["--model", args.model, "--input-shape", args.input_shape, "--slo-ms",
           f"{args.slo_ms:g}", "--max-batch", str(max_batch), "--max-wait-ms",
           f"{args.max_wait_ms:g}", "--workdir", str(ROOT)]
    with ReplicaProcess.start(cmd, env=env, cwd=str(ROOT)) as rp:
        before = httpx.get(rp.url + "/stats").json()
        lat = asyncio.run(closed_loop(rp.url, buf.getvalue(), args.clients, args.duration_s))
        stats = httpx.get(rp.url + "/stats").json()
    a = np.asarray(lat)
    batches = stats["batches"] - before["batches"]
    return {"config": "batch 1" if max_batch == 1 else "adaptive",
            "batch_size": stats["batch_size"], "reason": stats["reason"],
            "mean_batch": round((stats["rows"] - before["rows"]) / max(batches, 1), 2),
            "requests": int(a.size), "throughput_rps": round(a.size / args.duration_s, 1),
            "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2),
            "slo_met": round(float((a <= args.slo_ms).mean()), 4),
            "replica_p50_ms": stats["p50_ms"], "replica_p99_ms": stats["p99_ms"],
            "profile_ms": stats["profile_ms"]}


def _table(title: str, rows: list[dict]) -> Table:
    table = Table(title=title)
    cols = ["config", "batch size", "mean batch", "requests", "req/s", "p50 ms", "p99 ms",
            "within SLO"]
    replica = "replica_p50_ms" in rows[0]
    for col in [*cols, "replica p50/p99 ms"] if replica else cols:
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        cells = [r["config"], str(r["batch_size"]), f"{r['mean_batch']:.2f}", str(r["requests"]),
                 f"{r['throughput_rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                 f"{100 * r['slo_met']:.1f}%"]
        if replica:
            cells.append(f"{r['replica_p50_ms']:.1f} / {r['replica_p99_ms']:.1f}")
        table.add_row(*cells)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="examples.serve.cnn:make_resnet")
    ap.add_argument("--input-shape", default="3,32,32")
    ap.add_argument("--slo-ms", type=float, default=100.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    rows = [run_one(args, mb, env) for mb in (1, 0)]
    inproc = [run_inprocess(args, mb) for mb in (1, 0)]
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    title = (f"{args.model} ({args.input_shape}), SLO {args.slo_ms:g} ms, {args.clients} "
             f"closed-loop clients, {args.duration_s:g} s each, max wait {args.max_wait_ms:g} ms")
    console = Console()
    console.print(_table(title, rows))
    console.print(_table("the same batcher in process, without HTTP", inproc))
    console.print(f"adaptive choice: {rows[1]['reason']}")
    console.print(f"profile (ms per batch): {rows[1]['profile_ms']}")
    console.print(f"loadavg before {' '.join(load_before)}, after {' '.join(load_after)} "
                  f"({os.cpu_count()} CPUs)")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(
            {"args": vars(args), "loadavg_before": load_before, "loadavg_after": load_after,
             "cpus": os.cpu_count(), "runs": rows, "in_process": inproc}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
