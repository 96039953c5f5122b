"""`plinth fl server`, `plinth fl client` and `plinth fl aggregator`: the same app over real gRPC,
one process each.

On the platform (an FLTask's units), a server or middle aggregator listens on its node's
address (PLINTH_NODE_ADDRESS) on a free port, binds its leaves' loopback address too, and
reports both to the task's controller before anything else (`plinth.fl.reports`); the
controller starts what connects to it only then. Its clients find it through the control plane
(`run_clients(locate=...)`, `plinth fl client --task`), again whenever they lose it.

Safe by default: a server run by hand listens on loopback unless given another address, refuses to start
without client tokens (`transport.tokens` or `--tokens`; `--no-tokens` for a trusted network),
takes TLS from one flag (`--tls DIR`, a `plinth fl certs DIR` pair), and warns when it listens
beyond loopback in plaintext. Seeded DP noise (`noise: numpy`) is refused on this path: every
party holds the app's seed.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plinth.core.errors import SpecError
from plinth.core.net import advertised, node_address
from plinth.core.runtime import NODE_ADDRESS
from plinth.fl.aggregate.leaf_link import LeafRegistry
from plinth.fl.app import AppSpec, load_app
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.client import AppClients
from plinth.fl.reports import RoundReports
from plinth.fl.results import summary
from plinth.fl.rounds import initial_model, serve_rounds
from plinth.fl.server import RoundRecord
from plinth.fl.transport.grpc import (
    LOCATE_S,
    GrpcClient,
    GrpcTransport,
    load_tokens,
    parse_address,
    read_pem,
)
from plinth.runtime.report import Reporter

log = logging.getLogger("plinth.fl.deploy")
SECAGG_MAX_CLIENTS = 1 << 15  # SecAgg+'s default fixed point (clip 1, scale 2^16) sums 32,767


def listen_address(address: str | None, port: int) -> str:
    """Where to listen: `address`, else on the platform this node's address
    (PLINTH_NODE_ADDRESS) on a free port, else loopback on `port` (a process run by hand)."""
    if address is not None:
        return address
    if NODE_ADDRESS in os.environ:
        return advertised(node_address(), 0)
    return f"127.0.0.1:{port}"


def run_server(app_path: str, *, address: str | None = None, rounds: int | None = None,
               resume: bool = False, overrides: dict[str, Any] | None = None,
               on_round: Callable[[RoundRecord], None] | None = None,
               on_listen: Callable[[AppSpec, int], None] | None = None,
               require_tokens: bool = True) -> dict[str, Any]:
    spec = load_app(app_path, {**(overrides or {}), "server.rounds": rounds})
    refuse_seeded_noise(spec, app_path, "plinth fl server")
    if spec.server.aggregation.middles:
        raise SpecError(f"{app_path}: server.aggregation.middles: only an FLTask's controller "
                        f"starts middle aggregators; by hand, start `plinth fl aggregator` on "
                        f"each machine and leave middles out")
    if resume and not spec.checkpoint_dir:
        raise SpecError("--resume needs checkpoint_dir in the app or --checkpoint")
    consent = None
    if spec.consent is not None:
        from plinth.fl.privacy.consent import ConsentService

        consent = ConsentService(spec.resolve(spec.consent.registry) or "",
                                 spec.consent.purpose, wall=time.time).handle
    address = listen_address(address, 8080)
    # the transport's checks (tokens, TLS) come before the model is built, so they fail fast
    transport = _listen(spec, app_path, address, require_tokens=require_tokens, consent=consent)
    reports = RoundReports(Reporter.from_env(), server=True)
    leaves = None
    try:
        leaves = leaf_registry(spec)
        reports.listening(advertised(parse_address(address, any_port=True)[0], transport.port),
                          leaves.address if leaves is not None else None)
        ckpt = Checkpointer(spec.resolve(spec.checkpoint_dir), reports) \
            if spec.checkpoint_dir else None
        model, params = initial_model(spec)
        if on_listen is not None:
            on_listen(spec, transport.port)
    except BaseException:
        transport.close()
        if leaves is not None:
            leaves.close()
        reports.close()
        raise
    try:  # it closes the transport, the tree and the checkpoint
        server, records = serve_rounds(spec, transport, model, params, ckpt=ckpt,
                                       resume=resume, on_round=on_round, leaves=leaves)
    finally:
        if leaves is not None:
            leaves.close()
        reports.close()
    return summary(spec, records, len(transport.clients()), server.stopped)


def leaf_registry(spec: AppSpec) -> LeafRegistry | None:
    """With `server.aggregation.leaf_listen` (a tree whose leaves are started elsewhere: the
    runtime's leaf units), the address they join, listening now (port 0: a free one), so that
    it can be reported before the tree is built; else None."""
    agg = spec.server.aggregation
    if agg.mode != "tree" or agg.leaf_listen is None:
        return None
    path = spec.resolve(agg.leaf_token_file) or ""
    try:
        token = Path(path).read_bytes().strip()
    except OSError as e:
        raise SpecError(f"server.aggregation.leaf_token_file: cannot read {path} "
                        f"({e.strerror})") from None
    try:
        return LeafRegistry(agg.leaf_listen, token)
    except OSError as e:
        raise SpecError(f"server.aggregation.leaf_listen: cannot listen on {agg.leaf_listen} "
                        f"({e.strerror})") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def listen_warnings(spec: AppSpec, address: str) -> list[str]:
    """What is unsafe about listening on `address` with the app's transport, one line each."""
    host, _ = parse_address(address, "--address", any_port=True)
    out = []
    if spec.transport.tls is None and not is_loopback(host):
        out.append(f"--address {address} is reachable beyond this machine and the transport is "
                   f"plaintext: tokens and updates can be read on the network; add --tls DIR "
                   f"(plinth fl certs DIR)")
    if spec.transport.tokens is None:
        out.append("--no-tokens: any process that can reach the server may join as any client")
    return out


def _listen(spec: AppSpec, app_path: str, address: str, *, require_tokens: bool = True,
            consent: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
            ) -> GrpcTransport:
    """The server end of the app's transport (its client tokens and TLS) on `address`."""
    t = spec.transport
    if t.tokens is None and require_tokens:
        raise SpecError(f"{app_path}: transport.tokens: a server needs client tokens by default; "
                        f"name a file of 'client_id token' lines (plinth fl tokens FILE) with "
                        f"--tokens FILE, or pass --no-tokens on a trusted network")
    for line in listen_warnings(spec, address):
        log.warning("%s", line)
    tokens = load_tokens(spec.resolve(t.tokens)) if t.tokens else None  # type: ignore[arg-type]
    cert = key = None
    if t.tls is not None:
        if not (t.tls.cert and t.tls.key):
            raise SpecError(f"{app_path}: transport.tls: the server needs both cert and key")
        cert = read_pem(spec.resolve(t.tls.cert), "transport.tls.cert")
        key = read_pem(spec.resolve(t.tls.key), "transport.tls.key")
    # SecAgg+ keeps each round client's reply to a stage until the stage closes (the masked
    # inputs are the sum's terms), so the bound on whole replies held at once must cover a
    # round; the default 8 stalled every 10-client round for straggler_timeout and lost two
    # clients a stage. The bound stays for plain rounds, which fold each reply as it arrives.
    held = {} if spec.privacy.secagg is None else {"max_bodies": SECAGG_MAX_CLIENTS}
    return GrpcTransport(address, tokens=tokens, cert=cert, key=key, chunk_size=t.chunk_size,
                         consent=consent, **held)


def _dial(spec: AppSpec, server: str, client_id: str, token: str | None,
          properties: dict[str, Any], locate: Callable[[], str | None] | None = None
          ) -> GrpcClient:
    """The client end of the app's transport, dialling `server` (its CA, a token); with
    `locate`, finding the server again where it says when it is lost."""
    t = spec.transport
    ca = None
    if t.tls is not None and t.tls.ca:
        ca = read_pem(spec.resolve(t.tls.ca), "transport.tls.ca")
    token = token or t.token or os.environ.get("PLINTH_FL_TOKEN")
    # With a token the server knows who we are; without one, `client_id` is our id.
    return GrpcClient(server, client_id=t.client_id or ("" if token else client_id),
                      token=token, ca=ca, properties=properties, chunk_size=t.chunk_size,
                      connect_timeout=t.connect_timeout, locate=locate)


def run_aggregator(app_path: str, *, server: str, address: str | None, clients: int, name: str,
                   token: str | None = None, status_dir: str | None = None,
                   fraction: float = 1.0,
                   on_listen: Callable[[int], None] | None = None,
                   overrides: dict[str, Any] | None = None, require_tokens: bool = True) -> int:
    """A machine's middle aggregator (`plinth.fl.middle`): `clients` clients join it
    on `address`; it joins `server` as one client named `name` and sends one update per task.
    Each task runs on `fraction` of its clients (at least one). With
    `server.aggregation.mode: tree` in the app, the machine's leaves fold its clients' updates,
    and each round's tree size is reported to the task's controller (on the platform); its
    state is kept in `status_dir`."""
    from plinth.fl.middle import MiddleAggregator

    parse_address(server)
    spec = load_app(app_path, overrides)
    if spec.privacy.secagg is not None or spec.strategy.robust is not None \
            or spec.privacy.dp is not None or spec.consent is not None:
        raise SpecError(f"{app_path}: an aggregator forwards one mean per machine; SecAgg, DP, "
                        f"robust rules and consent need each client's update at the server")
    agg = spec.server.aggregation
    address = listen_address(address, 8081)
    downstream = _listen(spec, app_path, address, require_tokens=require_tokens)
    reports = RoundReports(Reporter.from_env(), server=False)
    middle = leaves = None
    try:
        leaves = leaf_registry(spec)
        reports.listening(advertised(parse_address(address, any_port=True)[0],
                                     downstream.port),
                          leaves.address if leaves is not None else None)
        if on_listen is not None:
            on_listen(downstream.port)
        # its own stragglers are cut a little before the server's deadline for its reply
        middle = MiddleAggregator(downstream, clients=clients,
                                  straggler_timeout=0.9 * spec.server.straggler_timeout,
                                  wait_timeout=spec.server.wait_timeout,
                                  threads=spec.server.aggregation_threads,
                                  fraction=fraction,
                                  aggregation=agg if agg.mode == "tree" else None,
                                  status=Checkpointer(status_dir, reports)
                                  if status_dir else None, leaves=leaves)
        examples = middle.wait_for_clients()
        up = _dial(spec, server, name, token, {"num_examples": examples, "aggregator": True})
        return up.serve(middle.handle)
    finally:
        if middle is not None:
            middle.close()
        if leaves is not None:
            leaves.close()
        downstream.close()
        reports.close()


def run_client(app_path: str, *, server: str, cid: int, clients: int | None = None,
               token: str | None = None, overrides: dict[str, Any] | None = None) -> int:
    """Serve one client of the app (data partition `cid` of `clients`) until the server ends."""
    return run_clients(app_path, server=server, cids=[cid], clients=clients,
                       tokens={cid: token}, overrides=overrides)


def run_clients(app_path: str, *, server: str | None = None,
                locate: Callable[[int], str | None] | None = None, cids: list[int],
                clients: int | None = None, tokens: dict[int, str | None],
                overrides: dict[str, Any] | None = None, what: str = "--cid") -> int:
    """Serve clients `cids` of the app (data partitions of `clients`) until the server ends:
    one process holding several partitions (a site with several data owners, or many clients
    on one machine), each its own client over its own connection, proven by its own token.
    The data and the model code load once. Returns the tasks run, all clients together.

    Each joins `server`, or where `locate(cid)` says its server is (None: not known yet), as
    `plinth fl client --task` asks the control plane: it waits for that, and asks again
    whenever it loses its server."""
    if (server is None) == (locate is None):
        raise SpecError("--server or --task: give one of them")
    if server is not None:
        parse_address(server)  # a typo fails now, not after the data has loaded
    spec = load_app(app_path, overrides)
    refuse_seeded_noise(spec, app_path, "plinth fl client")
    n = clients or spec.data.clients
    for cid in cids:
        if not 0 <= cid < n:
            raise SpecError(f"{what}: {cid} is outside 0..{n - 1} (data.clients or --clients)")
    import torch

    torch.set_num_threads(1)
    app_clients = AppClients(spec, n)
    sizes = app_clients.sizes()
    served = []
    for cid in cids:
        find = None if locate is None else functools.partial(locate, cid)
        where = server if find is None else located(find, spec.transport.connect_timeout)
        served.append((app_clients.runner(cid), _dial(
            spec, where, str(cid), tokens.get(cid), {"num_examples": sizes[cid]}, find)))
    if len(served) == 1:
        runner, client = served[0]
        return client.serve(runner.handle)
    ran, errors = [0] * len(served), []

    def serve(i: int) -> None:
        runner, client = served[i]
        try:
            ran[i] = client.serve(runner.handle)
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(i,), name=f"fl-client-{cids[i]}",
                                daemon=True) for i in range(len(served))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(ran)


def located(locate: Callable[[], str | None], timeout: float) -> str:
    """Where `locate` says the server is, asking every LOCATE_S for up to `timeout` seconds
    (a task's server reports its address once it is placed and listening)."""
    deadline = time.monotonic() + timeout
    while True:
        where = locate()
        if where:
            parse_address(where, "--task")
            return where
        if time.monotonic() >= deadline:
            raise SpecError(f"--task: the task's server reported no address within "
                            f"{timeout:g}s (transport.connect_timeout)")
        time.sleep(LOCATE_S)


def parse_cids(text: str, tokens_path: str | None) -> tuple[list[int], dict[int, str | None]]:
    """`--cids 0-9` or `--cids 0,3,7` and the tokens file that holds each one's token."""
    cids: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cids += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise SpecError(f"--cids: expected a range A-B or a list A,B,C of client ids, got "
                        f"{text!r}") from None
    if not cids or len(set(cids)) != len(cids):
        raise SpecError(f"--cids: {text!r} names no client or one twice")
    if tokens_path is None:
        raise SpecError("--tokens: several clients in one process each need their own token; "
                        "pass the tokens file (plinth fl tokens FILE)")
    by_id = {cid: tok for tok, cid in load_tokens(tokens_path).items()}
    missing = [c for c in cids if str(c) not in by_id]
    if missing:
        raise SpecError(f"--tokens: {tokens_path} has no token for client {missing[0]}")
    return cids, {c: by_id[str(c)] for c in cids}


def consent_request(app_path: str, *, server: str, token: str | None,
                    request: dict[str, Any], overrides: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """One consent call (grant, revoke, list) to `server` as the client the token names."""
    parse_address(server)
    spec = load_app(app_path, overrides)
    if spec.consent is None:
        raise SpecError(f"{app_path}: consent: the app asks no consent (no consent.purpose)")
    token = token or spec.transport.token or os.environ.get("PLINTH_FL_TOKEN")
    if not token:
        raise SpecError("--token: consent is bound to the client's token; pass --token or set "
                        "PLINTH_FL_TOKEN")
    client = _dial(spec, server, "", token, {})
    client.connect_timeout = 10.0  # a one-shot call: do not wait long for a server that is not up
    try:
        return client.consent({**request, "purpose": spec.consent.purpose})
    finally:
        client.channel.close()


def refuse_seeded_noise(spec: AppSpec, app_path: str, role: str) -> None:
    """DP noise outside `plinth fl sim` must not come from the app's seed: every party holds the
    app YAML, so whoever knows the seed (the server for a client's noise, the clients for the
    server's noise, which they see added to every global model) could regenerate and subtract
    it. `noise: auto` (the default) is a CSPRNG here; an explicit `numpy` is refused."""
    for field, dp in (("privacy.dp", spec.privacy.dp), ("privacy.local_dp", spec.privacy.local_dp)):
        if dp is not None and dp.noise == "numpy":
            raise SpecError(f"{app_path}: {field}.noise: numpy noise is seeded from the app's "
                            f"seed, which every party holds; {role} needs noise: auto or chacha "
                            f"(numpy is for plinth fl sim)")
