"""A client that announces a huge reply and sends a sliver of it (issue 36, item 10).

The FL server used to allocate whatever a push announced (up to 64 GiB) before the data came: a
3 GiB announcement backed by 1 KiB raised its memory by 3 GiB. Now a push is checked against the
largest reply an update of the server's model can be (`reply_limit`, set from the model when the
server starts) before anything is allocated, refused over it with RESOURCE_EXHAUSTED and its client
dropped, while the round goes on with the honest clients; under it, the buffer grows only as
chunks arrive. The peer exchange of decentralised
tasks, which reads the same kind of header, grows its buffer the same way. Memory is measured as
the process's peak resident set (VmHWM) across each attack, so nothing here waits or times."""

from __future__ import annotations

import itertools
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from plinth.fl import serde
from plinth.fl.app import ServerSpec
from plinth.fl.client import ClientRunner
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport import reply_limit
from plinth.fl.transport.grpc import SERVICE, GrpcClient, GrpcTransport
from plinth.fl.transport.peer import PeerExchange

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the peak resident set is read from /proc (Linux)")

X0 = [np.zeros((64, 64), np.float32), np.zeros(10, np.float32)]
SLIVER = b"x" * 1024
BOUND = 64 << 20  # what an attack may add to the server's peak memory, at most


class Plus:
    """An honest client: its delta is +1 everywhere."""

    def fit(self, params, config):
        return [p + 1 for p in params], 5, {}

    def evaluate(self, params, config):
        return 0.0, 5, {}


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def peak_growth(attack) -> int:
    """How far this process's peak resident set rose above its resident set while `attack`
    ran (the peak is reset first: `5` to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _kib("VmRSS")
    attack()
    return _kib("VmHWM") - before


def _server(transport: GrpcTransport, n: int) -> Server:
    cfg = ServerSpec(rounds=1, fraction=1.0, min_clients=n, min_available=n,
                     straggler_timeout=60.0, wait_timeout=60.0)
    s = Server(make_strategy("fedavg"), transport, cfg, seed=0,
               evaluate=lambda p: (0.0, {"accuracy": 0.5}))
    s.initialize(X0)
    return s


def _honest(addr: str, cid: str) -> threading.Thread:
    t = threading.Thread(target=lambda: GrpcClient(
        addr, client_id=cid, properties={"num_examples": 5}, chunk_size=1024).serve(
        ClientRunner(Plus()).handle), daemon=True)
    t.start()
    return t


def _joined(addr: str, cid: str) -> GrpcClient:
    c = GrpcClient(addr, client_id=cid, properties={"num_examples": 5}, chunk_size=1024)
    c.join()
    return c


def _take_task(c: GrpcClient) -> int:
    """What a raw client does first: pull its task (long polls until there is one); its id."""
    req = json.dumps({"client_id": c.client_id}).encode()
    while True:
        frames = iter(c._pull(req, wait_for_ready=True, timeout=30))
        head = json.loads(next(frames))
        if "task" in head:
            serde.join(frames, int(head["total"]))
            return int(head["task"])


def _announce(c: GrpcClient, task: int, total: int) -> grpc.RpcError:
    """Push a header announcing `total` bytes, then 1 KiB, then end: the server's answer."""
    header = json.dumps({"task": task, "total": total, "client_id": c.client_id}).encode()
    with pytest.raises(grpc.RpcError) as e:
        c.channel.stream_unary(f"/{SERVICE}/Push")(iter([header, SLIVER]), timeout=30)
    return e.value


def test_a_huge_announcement_is_refused_before_anything_is_allocated_and_its_client_dropped():
    t = GrpcTransport("127.0.0.1:0", chunk_size=1024)
    try:
        s = _server(t, 2)
        limit = reply_limit(X0)  # from the model: 4106 parameters
        addr = f"127.0.0.1:{t.port}"
        _honest(addr, "good")
        with ThreadPoolExecutor(1) as pool:
            rnd = pool.submit(s.fit_round, 1)
            attacker = _joined(addr, "evil")
            task = _take_task(attacker)
            got: list[grpc.RpcError] = []
            grown = peak_growth(lambda: got.append(_announce(attacker, task, 1 << 30)))
            rec = rnd.result(timeout=120)
        assert grown < BOUND, f"the server's peak memory rose by {grown / 2**20:.0f} MiB"
        assert got[0].code() is grpc.StatusCode.RESOURCE_EXHAUSTED, got[0]
        assert f"more than the {limit}" in got[0].details(), got[0].details()
        assert t.max_reply == limit < BOUND
        # the round went on with the honest client; the attacker is a failure, and gone
        assert rec is not None and rec.updates == 1, rec
        assert [(f["cid"], "announced" in f["reason"]) for f in rec.failures] == [("evil", True)]
        assert "evil" not in [c.cid for c in t.clients()]
        assert np.allclose(s.strategy.parameters[0], 1.0)  # the honest +1, folded
        attacker.channel.close()
    finally:
        t.close(grace=0)


def test_an_announcement_under_the_limit_holds_only_what_has_arrived() -> None:
    """A model large enough to admit a 512 MiB reply: a push that announces that much and
    sends 1 KiB is lost as a short stream, and the server held only the KiB."""
    t = GrpcTransport("127.0.0.1:0", chunk_size=1024)
    try:
        t.max_reply = 1 << 30
        addr = f"127.0.0.1:{t.port}"
        c = _joined(addr, "0")
        fut = t.submit("0", serde.arrays_to_bytes(X0))
        task = _take_task(c)
        got: list[grpc.RpcError] = []
        grown = peak_growth(lambda: got.append(_announce(c, task, 512 << 20)))
        assert grown < BOUND, f"the server's peak memory rose by {grown / 2**20:.0f} MiB"
        assert got[0].code() is grpc.StatusCode.INVALID_ARGUMENT, got[0]
        assert "got 1024 of the announced" in got[0].details(), got[0].details()
        assert "got 1024 of the announced" in str(fut.exception(timeout=30))
        c.channel.close()
    finally:
        t.close(grace=0)


def test_a_peer_that_announces_a_huge_message_costs_only_what_it_sent() -> None:
    site = PeerExchange(0, 2, "127.0.0.1:0", chunk_size=1024)
    channel = grpc.insecure_channel(site.address)
    try:
        header = json.dumps({"sender": 1, "seq": 1, "total": 1 << 30}).encode()
        send = channel.stream_unary("/plinth.fl.Peer/Send")
        got: list[grpc.RpcError] = []

        def attack() -> None:
            with pytest.raises(grpc.RpcError) as e:
                send(itertools.chain([header], [SLIVER]), timeout=30)
            got.append(e.value)

        grown = peak_growth(attack)
        assert grown < BOUND, f"the site's peak memory rose by {grown / 2**20:.0f} MiB"
        assert got[0].code() is grpc.StatusCode.INVALID_ARGUMENT, got[0]
        assert any("got 1024 of the announced" in r for r in site.rejected), site.rejected
    finally:
        channel.close()
        site.close(grace=0)
