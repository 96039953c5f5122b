"""`plinth fl server`, `plinth fl client` and `plinth fl aggregator`: the same app over real gRPC,
one process each."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from plinth.core.errors import SpecError
from plinth.fl.app import AppSpec, load_app
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.client import AppClients
from plinth.fl.server import RoundRecord
from plinth.fl.sim import initial_model, serve_rounds, summary
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport, load_tokens, parse_address, read_pem


def run_server(app_path: str, *, address: str, rounds: int | None = None, resume: bool = False,
               overrides: dict[str, Any] | None = None,
               on_round: Callable[[RoundRecord], None] | None = None,
               on_listen: Callable[[AppSpec, int], None] | None = None) -> dict[str, Any]:
    spec = load_app(app_path, {**(overrides or {}), "server.rounds": rounds})
    model, params = initial_model(spec)
    ckpt = Checkpointer(spec.resolve(spec.checkpoint_dir)) if spec.checkpoint_dir else None
    if resume and ckpt is None:
        raise SpecError("--resume needs checkpoint_dir in the app or --checkpoint")
    transport = _listen(spec, app_path, address)
    if on_listen is not None:
        try:
            on_listen(spec, transport.port)
        except BaseException:
            transport.close()
            raise
    server, records = serve_rounds(spec, transport, model, params, ckpt=ckpt, resume=resume,
                                   on_round=on_round)
    return summary(spec, records, len(transport.clients()), server.stopped)


def _listen(spec: AppSpec, app_path: str, address: str) -> GrpcTransport:
    """The server end of the app's transport (its client tokens and TLS) on `address`."""
    t = spec.transport
    tokens = load_tokens(spec.resolve(t.tokens)) if t.tokens else None  # type: ignore[arg-type]
    cert = key = None
    if t.tls is not None:
        if not (t.tls.cert and t.tls.key):
            raise SpecError(f"{app_path}: transport.tls: the server needs both cert and key")
        cert = read_pem(spec.resolve(t.tls.cert), "transport.tls.cert")
        key = read_pem(spec.resolve(t.tls.key), "transport.tls.key")
    return GrpcTransport(address, tokens=tokens, cert=cert, key=key, chunk_size=t.chunk_size)


def _dial(spec: AppSpec, server: str, client_id: str, token: str | None,
          properties: dict[str, Any]) -> GrpcClient:
    """The client end of the app's transport, dialling `server` (its CA, a token)."""
    t = spec.transport
    ca = None
    if t.tls is not None and t.tls.ca:
        ca = read_pem(spec.resolve(t.tls.ca), "transport.tls.ca")
    token = token or t.token or os.environ.get("PLINTH_FL_TOKEN")
    # With a token the server knows who we are; without one, `client_id` is our id.
    return GrpcClient(server, client_id=t.client_id or ("" if token else client_id),
                      token=token, ca=ca, properties=properties, chunk_size=t.chunk_size)


def run_aggregator(app_path: str, *, server: str, address: str, clients: int, name: str,
                   token: str | None = None,
                   on_listen: Callable[[int], None] | None = None) -> int:
    """A machine's middle aggregator (`plinth.fl.aggregate.middle`): `clients` clients join it
    on `address`; it joins `server` as one client named `name` and sends one update per task."""
    from plinth.fl.aggregate.middle import MiddleAggregator

    parse_address(server)
    spec = load_app(app_path)
    if spec.privacy.secagg is not None or spec.strategy.robust is not None \
            or spec.privacy.dp is not None or spec.consent is not None:
        raise SpecError(f"{app_path}: an aggregator forwards one mean per machine; SecAgg, DP, "
                        f"robust rules and consent need each client's update at the server")
    downstream = _listen(spec, app_path, address)
    try:
        if on_listen is not None:
            on_listen(downstream.port)
        # its own stragglers are cut a little before the server's deadline for its reply
        middle = MiddleAggregator(downstream, clients=clients,
                                  straggler_timeout=0.9 * spec.server.straggler_timeout,
                                  wait_timeout=spec.server.wait_timeout,
                                  threads=spec.server.aggregation_threads)
        examples = middle.wait_for_clients()
        up = _dial(spec, server, name, token, {"num_examples": examples, "aggregator": True})
        return up.serve(middle.handle)
    finally:
        downstream.close()


def run_client(app_path: str, *, server: str, cid: int, clients: int | None = None,
               token: str | None = None, overrides: dict[str, Any] | None = None) -> int:
    """Serve one client of the app (data partition `cid` of `clients`) until the server ends."""
    parse_address(server)  # a typo fails now, not after the data has loaded
    spec = load_app(app_path, overrides)
    _client_noise_is_secret(spec, app_path)
    n = clients or spec.data.clients
    if not 0 <= cid < n:
        raise SpecError(f"--cid: {cid} is outside 0..{n - 1} (data.clients or --clients)")
    import torch

    torch.set_num_threads(1)
    app_clients = AppClients(spec, n)
    runner = app_clients.runner(cid)
    client = _dial(spec, server, str(cid), token, {"num_examples": app_clients.sizes()[cid]})
    return client.serve(runner.handle)


def _client_noise_is_secret(spec: AppSpec, app_path: str) -> None:
    """Noise a real client adds itself (local DP, distributed DP's share) must not come from the
    app's seed: the server has the same app YAML and could regenerate and subtract it."""
    for field, dp in (("privacy.local_dp", spec.privacy.local_dp),
                      ("privacy.dp", spec.privacy.dp if spec.privacy.dp is not None
                       and spec.privacy.dp.mode == "distributed" else None)):
        if dp is not None and dp.noise == "numpy":
            raise SpecError(f"{app_path}: {field}.noise: numpy noise is seeded from the app's "
                            f"seed, which the server knows; real clients need noise: chacha "
                            f"(numpy is for plinth fl sim)")
