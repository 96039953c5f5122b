"""`plinth fl sim`: a whole federation on one machine, with the real server code.

The server's rounds are those of a deployed server (`rounds.serve_rounds`); only the transport
differs. Virtual clients run in a process pool (`PoolTransport`) or, with `backend="ray"`, as Ray
actors with per-client CPUs and GPU shares (`RayTransport`), both started by
`plinth.runtime.pool`; every message goes through `serde` as bytes, so the byte counts are those
a network would carry. The server evaluates the global model on the held-out test set after
each round.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plinth.core.errors import PlinthError
from plinth.fl.app import AppSpec, load_app
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.data import client_partitions, load_source
from plinth.fl.results import summary
from plinth.fl.rounds import initial_model, serve_rounds
from plinth.fl.server import RoundRecord
from plinth.fl.transport.inproc import PoolTransport

BACKENDS = ("pool", "ray")


def run_sim(app_path: str, *, clients: int, rounds: int | None = None,
            workers: int | None = None, resume: bool = False,
            overrides: dict[str, Any] | None = None,
            on_round: Callable[[RoundRecord], None] | None = None,
            on_start: Callable[[AppSpec, int], None] | None = None,
            backend: str = "pool", ray_address: str | None = None,
            client_cpus: float = 1.0, client_gpus: float = 0.0) -> dict[str, Any]:
    """Run a simulated federation; returns the summary that `--json` writes.

    `backend` "ray" runs the clients as `workers` Ray actors (default: as many as fit) of
    `client_cpus` CPUs and `client_gpus` GPUs each, on the Ray cluster at `ray_address`
    (HOST:PORT or auto) or on a private local Ray started and stopped here."""
    if backend not in BACKENDS:
        raise PlinthError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "pool" and (ray_address or client_cpus != 1.0 or client_gpus):
        raise PlinthError("--ray-address, --client-cpus and --client-gpus need --backend ray")
    if client_cpus <= 0 or client_gpus < 0 or (client_gpus > 1 and client_gpus % 1):
        raise PlinthError(f"--client-cpus {client_cpus:g} --client-gpus {client_gpus:g}: CPUs "
                          f"must be positive, GPUs a share up to 1 or a whole number")
    ov = {**(overrides or {}), "data.clients": clients, "server.rounds": rounds}
    spec = load_app(app_path, ov)
    ov = {k: v for k, v in ov.items() if v is not None}
    model, params = initial_model(spec)
    train, _ = load_source(spec.data, spec.seed)
    sizes = [len(p) for p in client_partitions(spec.data, train, clients, spec.seed)]
    del train
    ckpt = Checkpointer(spec.resolve(spec.checkpoint_dir)) if spec.checkpoint_dir else None
    sticky = spec.privacy.secagg is not None
    with tempfile.TemporaryDirectory(prefix="plinth-fl-") as tmp:
        state_dir = str(Path(ckpt.dir) / "clients") if ckpt else tmp
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        with _transport(backend, app_path, ov, clients, sizes, workers=workers,
                        state_dir=state_dir, sticky=sticky, ray_address=ray_address,
                        client_cpus=client_cpus, client_gpus=client_gpus) as transport:
            server, records = serve_rounds(spec, transport, model, params, ckpt=ckpt,
                                           resume=resume, on_round=on_round,
                                           on_start=on_start, simulated=True)
    return summary(spec, records, clients, server.stopped)


@contextmanager
def _transport(backend: str, app_path: str, ov: dict[str, Any], clients: int,
               sizes: list[int], *, workers: int | None, state_dir: str, sticky: bool,
               ray_address: str | None, client_cpus: float, client_gpus: float
               ) -> Iterator[Any]:
    """The clients' transport; for Ray, inside a Ray session that ends with it."""
    if backend == "pool":
        yield PoolTransport(app_path, ov, clients, sizes, workers=workers,
                            state_dir=state_dir, sticky=sticky)
        return
    from plinth.fl.transport.ray import RayTransport
    from plinth.runtime.pool import ray_session

    # a private Ray gets the CPUs for `workers` actors (else the machine's)
    cpus = math.ceil(workers * client_cpus) if workers else None
    with ray_session(ray_address, num_cpus=cpus):
        yield RayTransport(app_path, ov, clients, sizes, actors=workers,
                           client_cpus=client_cpus, client_gpus=client_gpus,
                           state_dir=state_dir, sticky=sticky)
