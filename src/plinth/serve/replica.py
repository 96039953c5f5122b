"""One model replica: the user's model behind HTTP with dynamic batching, run as its own process.

    python -m plinth.serve.replica --model examples.serve.cnn:make --input-shape 1,28,28 \\
        --slo-ms 100 [--handler examples.serve.handler:Handler] [--max-batch 0] \\
        [--max-wait-ms 5] [--host ADDRESS] [--port 0] [--workdir DIR] \\
        [--register URL] [--unit NAME] [--tuned-db DB --tuned-target cpu]

At startup the replica loads the model (see `plinth.serve.model`), times it per batch size and
picks its batch size (see `plinth.serve.batching`); only then does it listen, on its node's
address (PLINTH_NODE_ADDRESS, which the runtime gives every unit; else 127.0.0.1) unless --host
says otherwise, and print one line, ``ready http://HOST:PORT``. HTTP:

- GET /healthz: 200 (the model is loaded and profiled before the port opens); with a tuned
  model, its "tuned" member says which share's records it runs (see `plinth.serve.tuned`).
- POST /infer: a JSON body goes through the handler (default: ``{"inputs": [...]}`` in,
  ``{"outputs": [...], "classes": [...]}`` out); a body of type ``application/x-npy`` is one
  `numpy.save` array (a batch, cast to float32), answered with the outputs as npy. A body the
  replica cannot use is a 400 naming the reason; the model failing is a 500.
- GET /stats: {batch_size, requests, batches, p50_ms, p99_ms, ...}.

With --register URL (its service's router's) it POSTs {"unit", "url"} to URL with
``Authorization: Bearer $PLINTH_REPLICA_SECRET`` once ready and every second after. On SIGTERM
it stops the heartbeat, POSTs the same body to URL/leave, finishes the requests it holds and
exits 0.

The model runs on one torch thread unless OMP_NUM_THREADS says otherwise: a replica is one CPU.
With --tuned-db it is instead the TVM build of the records tuned at the share nearest the
replica's (its OMP_NUM_THREADS, or its MPS share on cuda), run on the Relax VM, a batch one
example at a time; the replica says which records at startup, on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from plinth.core.errors import PlinthError, SpecError
from plinth.core.runtime import NODE_ADDRESS
from plinth.runtime.report import Reporter
from plinth.serve import httpserver
from plinth.serve.batching import (
    ADAPTIVE_CAP,
    SLO_SHARE,
    BatchChoice,
    Batcher,
    bounded_wait_ms,
    choose_batch_size,
    profile,
    profile_sizes,
)
from plinth.serve.model import (
    DefaultHandler,
    Forward,
    Handler,
    forward_fn,
    load_handler,
    load_model,
    parse_shape,
    replica_device,
    try_example,
)
from plinth.serve.reports import ReplicaReport
from plinth.serve.spec import SECRET_ENV
from plinth.serve.tuned import TunedInfo, replica_share, tuned_forward

NPY = "application/x-npy"
HEARTBEAT_S = 1.0


class BadInput(ValueError):
    """A request body the replica cannot use: answered with 400, never raised further."""


# --- request bodies -----------------------------------------------------------------------------


def decode_npy(body: bytes) -> torch.Tensor:
    """One `numpy.save` array as a float32 tensor."""
    try:
        a = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # numpy raises several kinds on garbage
        raise BadInput(f"body: not a .npy array ({type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''})") from e
    if not isinstance(a, np.ndarray):
        raise BadInput("body: expected one .npy array, got an .npz archive")
    if a.dtype.kind not in "biuf":
        raise BadInput(f"body: expected a numeric array, got dtype {a.dtype}")
    return torch.from_numpy(np.array(a, dtype=np.float32, order="C", copy=True))


def encode_npy(y: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    np.save(buf, y.numpy(), allow_pickle=False)
    return buf.getvalue()


def check_batch(x: Any, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """`x` if it is a batch of examples of `shape`, else a BadInput naming both shapes."""
    want = f"(N, {', '.join(map(str, shape))})"
    if not isinstance(x, torch.Tensor):
        raise BadInput(f"{what}: expected a tensor of shape {want}, got {type(x).__name__}")
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape or x.shape[0] < 1:
        raise BadInput(f"{what}: expected a batch of shape {want}, got {tuple(x.shape)}")
    return x


# --- the replica --------------------------------------------------------------------------------


@dataclass(slots=True)
class Loaded:
    """A model ready to serve: what the app needs, decided once at startup."""

    ref: str
    input_shape: tuple[int, ...]
    forward: Forward
    handler: Handler
    choice: BatchChoice
    profile_ms: dict[int, float]
    profile_stop: str
    max_wait_ms: float
    tuned: TunedInfo | None = None


def prepare(args: argparse.Namespace, executor: ThreadPoolExecutor) -> Loaded:
    """Load, try and profile the model on the worker thread, and choose the batch size."""
    shape = parse_shape(args.input_shape)
    tuned = None
    if args.tuned_db is None:
        forward = forward_fn(load_model(args.model, workdir=args.workdir), replica_device())
    else:
        forward, tuned = tuned_forward(args.tuned_db, args.model, shape, args.tuned_target,
                                       replica_share(args.tuned_target), workdir=args.workdir)
        print(f"replica: serving {args.model} built by TVM: {tuned.line()}", file=sys.stderr,
              flush=True)
    handler = load_handler(args.handler, workdir=args.workdir)
    executor.submit(try_example, forward, shape).result()
    if tuned is not None and args.max_batch == 0:
        # A batch runs one example after another: batching would only add the wait to fill it.
        times, stop = executor.submit(profile, forward, shape, [1]).result()
        choice = BatchChoice(1, "a tuned model is built for a batch of one")
    elif args.max_batch == 0:
        times, stop = executor.submit(profile, forward, shape, profile_sizes(ADAPTIVE_CAP),
                                      stop_above_ms=SLO_SHARE * args.slo_ms).result()
        choice = choose_batch_size(times, slo_ms=args.slo_ms)
    else:
        sizes = sorted({1, args.max_batch})
        times, stop = executor.submit(profile, forward, shape, sizes).result()
        if args.max_batch not in times:
            raise SpecError(f"--max-batch: the model cannot run a batch of {args.max_batch}: "
                            f"{stop}")
        choice = BatchChoice(args.max_batch, f"fixed by --max-batch {args.max_batch}")
    wait = bounded_wait_ms(args.max_wait_ms, slo_ms=args.slo_ms, batch_ms=times[choice.size])
    return Loaded(args.model, shape, forward, handler, choice, times, stop, wait, tuned)


def make_app(m: Loaded, batcher: Batcher) -> Starlette:
    default = isinstance(m.handler, DefaultHandler)

    def error(status: int, reason: str) -> JSONResponse:
        return JSONResponse({"error": reason}, status)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": m.ref, "batch_size": m.choice.size,
                             **({"tuned": m.tuned.as_json()} if m.tuned else {})})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse({**batcher.snapshot(), "max_wait_ms": m.max_wait_ms,
                             "reason": m.choice.reason, "profile_stop": m.profile_stop,
                             "profile_ms": {str(b): round(t, 4) for b, t in m.profile_ms.items()}})

    async def infer(request: Request) -> Response:
        """The answer, with `Server-Timing: replica;dur=MS`: the time from the request
        reaching this replica's handler to its answer (reading it, its wait for a batch, and
        the model)."""
        t0 = time.perf_counter()
        r = await answer(request)
        r.headers["server-timing"] = f"replica;dur={(time.perf_counter() - t0) * 1000:.3f}"
        return r

    async def answer(request: Request) -> Response:
        body = await request.body()
        npy = request.headers.get("content-type", "").split(";")[0].strip() == NPY
        try:
            if npy:
                x = check_batch(decode_npy(body), m.input_shape, "body")
            else:
                try:
                    payload = json.loads(body)
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadInput(f"body: not JSON ({e})") from e
                try:
                    x = m.handler.preprocess(payload)
                except Exception as e:  # the handler refusing the payload
                    raise BadInput(f"{'' if default else 'handler preprocess: '}"
                                   f"{str(e) or type(e).__name__}") from e
                x = check_batch(x, m.input_shape,
                                "inputs" if default else "handler preprocess returned")
        except BadInput as e:
            return error(400, str(e))
        try:
            y = await batcher.submit(x)
        except Exception as e:  # noqa: BLE001 -- the model failing is this request's 500
            return error(500, f"model: {type(e).__name__}: {str(e)[:500]}")
        if npy:
            return Response(encode_npy(y), media_type=NPY)
        try:
            return JSONResponse(m.handler.postprocess(y))
        except Exception as e:  # noqa: BLE001 -- user code failing is this request's 500
            return error(500, f"handler postprocess: {type(e).__name__}: {str(e)[:500]}")

    return Starlette(routes=[Route("/healthz", healthz), Route("/stats", stats),
                             Route("/infer", infer, methods=["POST"])])


# --- process lifecycle --------------------------------------------------------------------------


async def _post(client: httpx.AsyncClient, url: str, body: dict,
                warned: set[int]) -> None:
    try:
        r = await client.post(url, json=body)
    except httpx.HTTPError:
        return  # the router may be restarting; the next heartbeat tries again
    if r.status_code >= 400 and r.status_code not in warned:
        warned.add(r.status_code)
        print(f"replica: {url} answered {r.status_code}: {r.text[:200]}", file=sys.stderr,
              flush=True)


async def _heartbeat(client: httpx.AsyncClient, url: str, body: dict) -> None:
    warned: set[int] = set()
    while True:
        await _post(client, url, body, warned)
        await asyncio.sleep(HEARTBEAT_S)


async def serve(m: Loaded, executor: ThreadPoolExecutor, sock: socket.socket, url: str,
                register: str | None, unit: str) -> None:
    batcher = Batcher(m.forward, batch_size=m.choice.size, max_wait_s=m.max_wait_ms / 1000,
                      executor=executor)
    batcher.start()
    config = uvicorn.Config(make_app(m, batcher), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=30)
    server, served = await httpserver.start(config, sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {url}", flush=True)
    body: dict = {"unit": unit, "url": url}
    if 1 in m.profile_ms:  # one request's time: what the autoscaler plans with
        body["service_ms"] = round(m.profile_ms[1], 3)
    headers = {"Authorization": f"Bearer {os.environ.get(SECRET_ENV, '')}"}
    async with httpx.AsyncClient(headers=headers, timeout=2.0) as client:
        beat = asyncio.create_task(_heartbeat(client, register, body)) if register else None
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([served, stopped], return_when=asyncio.FIRST_COMPLETED)
        if register and beat is not None:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await _post(client, register.rstrip("/") + "/leave", body, set())
    stopped.cancel()
    batcher.drain()  # the requests held must not wait for a batch that will not fill
    server.should_exit = True  # stop listening, let the requests in flight finish
    await served
    await batcher.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m plinth.serve.replica",
                                 description="one plinth model replica")
    ap.add_argument("--model", required=True,
                    help="a built-in name, MODULE:FACTORY, or a TorchScript / .pt2 file")
    ap.add_argument("--handler", default=None, help="MODULE:NAME with preprocess/postprocess")
    ap.add_argument("--input-shape", required=True, help="one example's shape, e.g. 1,28,28")
    ap.add_argument("--slo-ms", type=float, required=True)
    ap.add_argument("--max-batch", type=int, default=0, help="0: adaptive (default)")
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--host", default=None, help=f"default: ${NODE_ADDRESS}, else 127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    ap.add_argument("--workdir", default=None, help="put on sys.path; relative files from here")
    ap.add_argument("--register", default=None, metavar="URL")
    ap.add_argument("--unit", default=None, help="the name to register (default replica-PID)")
    ap.add_argument("--tuned-db", default=None, metavar="DB",
                    help="serve the TVM build tuned in this database (plinth.serve.tuned)")
    ap.add_argument("--tuned-target", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args(argv)
    if args.slo_ms <= 0:
        ap.error(f"--slo-ms must be > 0, got {args.slo_ms:g}")
    if args.max_batch < 0 or args.max_wait_ms < 0:
        ap.error("--max-batch and --max-wait-ms must be >= 0")
    if args.register and not os.environ.get(SECRET_ENV):
        ap.error(f"--register needs {SECRET_ENV} in the environment")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Stopped while it loads or profiles: nothing is registered or in flight yet, so just exit 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args.host = args.host or os.environ.get(NODE_ADDRESS) or "127.0.0.1"
    threads = int(os.environ.get("OMP_NUM_THREADS") or 1)
    torch.set_num_threads(threads)
    # One worker thread runs every batch; torch's thread count is per thread, so set it there too.
    executor = ThreadPoolExecutor(1, thread_name_prefix="model", initializer=torch.set_num_threads,
                                  initargs=(threads,))
    try:
        m = prepare(args, executor)
        sock = httpserver.listen(args.host, args.port)
    except (PlinthError, OSError) as e:
        print(f"replica: {e}", file=sys.stderr, flush=True)
        executor.shutdown()
        return 2
    reporter = Reporter.from_env()  # on the platform: tell the controller what it serves
    if reporter is not None:
        reporter.send(ReplicaReport(tuned=m.tuned.line() if m.tuned else None).model_dump())
    port = sock.getsockname()[1]
    host = socket.gethostname() if args.host in ("0.0.0.0", "::", "") else args.host
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    try:
        asyncio.run(serve(m, executor, sock, url, args.register, args.unit or
                          f"replica-{os.getpid()}"))
    finally:
        executor.shutdown()
        if reporter is not None:
            reporter.close(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
