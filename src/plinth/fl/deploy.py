"""`plinth fl server` and `plinth fl client`: the same app over real gRPC, one process each."""

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
from plinth.fl.transport.grpc import GrpcClient, GrpcTransport, _read, load_tokens, parse_address


def run_server(app_path: str, *, address: str, rounds: int | None = None, resume: bool = False,
               overrides: dict[str, Any] | None = None,
               on_round: Callable[[RoundRecord], None] | None = None,
               on_listen: Callable[[AppSpec, int], None] | None = None) -> dict[str, Any]:
    spec = load_app(app_path, {**(overrides or {}), "server.rounds": rounds})
    t = spec.transport
    tokens = load_tokens(spec.resolve(t.tokens)) if t.tokens else None  # type: ignore[arg-type]
    cert = key = None
    if t.tls is not None:
        if not (t.tls.cert and t.tls.key):
            raise SpecError(f"{app_path}: transport.tls: the server needs both cert and key")
        cert = _read(spec.resolve(t.tls.cert), "transport.tls.cert")
        key = _read(spec.resolve(t.tls.key), "transport.tls.key")
    model, params = initial_model(spec)
    ckpt = Checkpointer(spec.resolve(spec.checkpoint_dir)) if spec.checkpoint_dir else None
    if resume and ckpt is None:
        raise SpecError("--resume needs checkpoint_dir in the app or --checkpoint")
    transport = GrpcTransport(address, tokens=tokens, cert=cert, key=key,
                              chunk_size=t.chunk_size)
    if on_listen is not None:
        try:
            on_listen(spec, transport.port)
        except BaseException:
            transport.close()
            raise
    server, records = serve_rounds(spec, transport, model, params, ckpt=ckpt, resume=resume,
                                   on_round=on_round)
    return summary(spec, records, len(transport.clients()), server.stopped)


def run_client(app_path: str, *, server: str, cid: int, clients: int | None = None,
               token: str | None = None, overrides: dict[str, Any] | None = None) -> int:
    """Serve one client of the app (data partition `cid` of `clients`) until the server ends."""
    parse_address(server)  # a typo fails now, not after the data has loaded
    spec = load_app(app_path, overrides)
    _client_noise_is_secret(spec, app_path)
    t = spec.transport
    n = clients or spec.data.clients
    if not 0 <= cid < n:
        raise SpecError(f"--cid: {cid} is outside 0..{n - 1} (data.clients or --clients)")
    ca = None
    if t.tls is not None and t.tls.ca:
        ca = _read(spec.resolve(t.tls.ca), "transport.tls.ca")
    import torch

    torch.set_num_threads(1)
    app_clients = AppClients(spec, n)
    runner = app_clients.runner(cid)
    token = token or t.token or os.environ.get("PLINTH_FL_TOKEN")
    # With a token the server knows who we are; without one, the partition number is our id.
    client = GrpcClient(server, client_id=t.client_id or ("" if token else str(cid)),
                        token=token, ca=ca,
                        properties={"num_examples": app_clients.sizes()[cid]},
                        chunk_size=t.chunk_size)
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
