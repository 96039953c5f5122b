"""The gRPC data plane under attack and under load, with the flat engine and with the aggregator
tree (whose slots the uploads land in): a client that sends half its upload and drops leaves
nothing folded and its slot back in the pool, the transport holds a bounded number of whole
replies, and the tree's model is the flat engine's."""

import contextlib
import gc
import itertools
import json
import threading

import grpc
import numpy as np
import pytest

from plinth.fl import serde
from plinth.fl.app import ServerSpec
from plinth.fl.client import ClientRunner
from plinth.fl.messages import FitIns, FitRes
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.grpc import SERVICE, GrpcClient, GrpcTransport

X0 = [np.zeros((64, 64), np.float32), np.zeros(10, np.float32)]


class Plus:
    """An honest client: its delta is +1 everywhere."""

    def fit(self, params, config):
        return [p + 1 for p in params], 5, {}

    def evaluate(self, params, config):
        return 0.0, 5, {}


class _Dropped(Exception):
    pass


def _half_then_drop(addr, cid, sent, began):
    """A real gRPC client that pulls its task, uploads half of a poisoned reply and drops once
    the server has begun to receive it (`began`: dropped sooner, under load, the server may
    never read the header, and the task is lost to the straggler timeout instead)."""
    c = GrpcClient(addr, client_id=cid, properties={"num_examples": 5}, chunk_size=1024)
    c.join()
    req = json.dumps({"client_id": cid}).encode()
    while True:
        frames = iter(c._pull(req, wait_for_ready=True, timeout=30))
        head = json.loads(next(frames))
        if "task" in head:
            break
    ins = serde.decode(serde.join(frames, int(head["total"])), expect=FitIns)
    reply = serde.encode(FitRes(ins.round, [p + 1000 for p in ins.parameters], 5, {}))
    parts = list(serde.chunks(reply, 1024))
    header = json.dumps({"task": head["task"], "total": len(reply), "client_id": cid}).encode()

    def upload():
        yield header
        yield from parts[:len(parts) // 2]
        sent.set()
        began.wait(30)
        raise _Dropped  # the client goes away mid-stream

    with contextlib.suppress(grpc.RpcError, _Dropped):  # the call dies with our own drop
        c.channel.stream_unary(f"/{SERVICE}/Push")(upload(), timeout=30)
    c.channel.close()


class Rand:
    """A client whose delta is random (its own seed) and whose weight is its own."""

    def __init__(self, seed):
        self.rng, self.n = np.random.default_rng(seed), 3 + seed

    def fit(self, params, config):
        return [p + self.rng.standard_normal(p.shape).astype(p.dtype) for p in params], \
            self.n, {}

    def evaluate(self, params, config):
        return 0.0, self.n, {}


def _serve(addr, cid, client=None):
    n = client.n if client is not None else 5
    GrpcClient(addr, client_id=cid, properties={"num_examples": n}, chunk_size=1024).serve(
        ClientRunner(client or Plus()).handle)


def _server(transport, n, mode="stream"):
    aggregation = {"mode": "tree", "leaves": 2} if mode == "tree" else {}
    cfg = ServerSpec(rounds=1, fraction=1.0, min_clients=n, min_available=n,
                     straggler_timeout=60.0, wait_timeout=60.0, aggregation=aggregation)
    s = Server(make_strategy("fedavg"), transport, cfg, seed=0,
               evaluate=lambda p: (0.0, {"accuracy": 0.5}))
    s.initialize(X0)
    return s


def _on_receiving(transport, n, began):
    """Sets `began` once the transport has begun to receive `n` uploads (read each header and
    given it a buffer to be received into)."""
    buffer, seen = transport._buffer, itertools.count(1)

    def counted(total):
        body = buffer(total)
        if next(seen) >= n:
            began.set()
        return body
    transport._buffer = counted


def _pool_is_whole(server):
    """The tree's slots are all free again, and none is still held by a landed upload."""
    tree = server.tree.tree
    return sorted(tree._free) == list(range(len(tree._slots))) and not tree._landed


@pytest.mark.parametrize("mode", ["stream", "tree"])
def test_a_client_that_drops_mid_upload_leaves_no_partial_update_folded(mode):
    transport = GrpcTransport("127.0.0.1:0", chunk_size=1024)
    addr = f"127.0.0.1:{transport.port}"
    sent, began = threading.Event(), threading.Event()
    _on_receiving(transport, 4, began)  # the three honest uploads and mallory's
    threads = [threading.Thread(target=_serve, args=(addr, f"h{i}"), daemon=True)
               for i in range(3)]
    threads.append(threading.Thread(target=_half_then_drop, args=(addr, "mallory", sent, began),
                                    daemon=True))
    for t in threads:
        t.start()
    server = _server(transport, 4, mode)
    try:
        rec = server.fit_round(1)
        if mode == "tree":  # every upload, the broken one too, was received into a slot
            tree = server.tree.tree
            assert tree.landings == 4 and tree.copied == 0
            gc.collect()
            assert _pool_is_whole(server)
    finally:
        transport.close()
        server.close()
    assert sent.is_set() and began.is_set()
    assert rec.updates == 3 and [f["cid"] for f in rec.failures] == ["mallory"]
    why = rec.failures[0]["reason"]
    assert rec.failures[0]["kind"] == "lost" and ("of the announced" in why or "broke off" in why)
    for p in server.strategy.parameters:  # exactly the honest mean: nothing of mallory's
        np.testing.assert_array_equal(p, np.ones_like(p))
    gc.collect()
    assert transport.bodies == 0


@pytest.mark.parametrize("mode", ["stream", "tree"])
def test_the_transport_holds_at_most_max_bodies_whole_replies(mode):
    """Eight clients upload at once into a transport with room for two: every update
    arrives and is folded, and no more than two replies were ever held whole (in the tree's
    slots, which are six: none waits for a slot)."""
    transport = GrpcTransport("127.0.0.1:0", chunk_size=1024, max_bodies=2)
    addr = f"127.0.0.1:{transport.port}"
    for i in range(8):
        threading.Thread(target=_serve, args=(addr, f"c{i}"), daemon=True).start()
    server = _server(transport, 8, mode)
    try:
        recs = [server.fit_round(r) for r in (1, 2)]
        if mode == "tree":
            assert server.tree.tree.landings == 16
            gc.collect()
            assert _pool_is_whole(server)
    finally:
        transport.close()
        server.close()
    assert [r.updates for r in recs] == [8, 8] and all(not r.failures for r in recs)
    assert 1 <= transport.peak_bodies <= 2
    for p in server.strategy.parameters:
        np.testing.assert_array_equal(p, np.full_like(p, 2))


def test_uploads_landed_in_the_tree_give_the_flat_engines_model():
    """The same seeded clients over real gRPC, folded by the flat engine and by the tree from
    the slots they were received into: the same model after two rounds, and no update copied.
    """
    models = {}
    for mode in ("stream", "tree"):
        transport = GrpcTransport("127.0.0.1:0", chunk_size=1024, max_bodies=3)
        addr = f"127.0.0.1:{transport.port}"
        for i in range(6):
            threading.Thread(target=_serve, args=(addr, f"c{i}", Rand(i)), daemon=True).start()
        server = _server(transport, 6, mode)
        try:
            recs = [server.fit_round(r) for r in (1, 2)]
            if mode == "tree":
                tree = server.tree.tree
                assert tree.landings == 12 and tree.copied == 0
        finally:
            transport.close()
            server.close()
        assert [r.updates for r in recs] == [6, 6] and all(not r.failures for r in recs)
        models[mode] = server.strategy.parameters
    for t, f in zip(models["tree"], models["stream"]):
        np.testing.assert_allclose(t, f, rtol=1e-5, atol=1e-6)
