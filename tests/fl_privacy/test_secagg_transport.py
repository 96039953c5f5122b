"""SecAgg+ as a real protocol through the FL transport: the real server drives the four stages
over the thread transport, the process pool and gRPC (separate processes on 127.0.0.1), and
only ever sees masked vectors and the unmasked sum."""

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from plinth.core.net import free_port
from plinth.fl import serde
from plinth.fl.app import ServerSpec, load_app, parse_app
from plinth.fl.client import AppClients, ClientRunner
from plinth.fl.messages import ErrorRes, FitIns, FitRes, SecAggIns, SecAggRes
from plinth.fl.privacy import shamir
from plinth.fl.privacy.masking import quantize
from plinth.fl.privacy.secagg import SecAggConfig
from plinth.fl.privacy.secagg_messages import (
    CIPHERTEXT_LEN,
    AdvertiseKeys,
    ForwardedShares,
    KeyDirectory,
    MaskedInput,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
    WireError,
    from_arrays,
    to_arrays,
)
from plinth.fl.privacy.secagg_round import ServerRound
from plinth.fl.safeguards import Safeguards
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.inproc import PoolTransport, ThreadTransport

APPS = Path(__file__).parents[1] / "fl" / "apps"
D = 600
X0 = [np.zeros((20, 25), np.float32), np.zeros(100, np.float32)]
SCALE = 2.0 ** 16


class Fixed:
    """Adds a fixed, client-specific delta (equal example counts: FedAvg is the plain mean)."""

    def __init__(self, cid: int) -> None:
        rng = np.random.default_rng(cid)
        self.delta = [rng.uniform(-0.5, 0.5, p.shape).astype(np.float32) for p in X0]

    def fit(self, params, config):
        return [p + d for p, d in zip(params, self.delta)], 10, {}

    def evaluate(self, params, config):
        return 0.0, 10, {}


class Faulty(ClientRunner):
    """A real runner that dies (raises, like a lost connection) or hangs at one stage."""

    def __init__(self, client, stage: str, how: str, release: threading.Event) -> None:
        super().__init__(client)
        self.stage, self.how, self.release = stage, how, release

    def handle(self, payload):
        msg = serde.decode(payload)
        if isinstance(msg, SecAggIns) and msg.stage == self.stage:
            if self.how == "crash":
                raise ConnectionError("client process died")
            self.release.wait(60)  # hangs past the straggler timeout
        return super().handle(payload)


class Recording:
    """A transport that passes every message through to another and keeps a copy."""

    def __init__(self, inner) -> None:
        self.inner, self.replies = inner, []

    def clients(self):
        return self.inner.clients()

    def wait_for(self, n, timeout):
        return self.inner.wait_for(n, timeout)

    def submit(self, cid, payload):
        fut = self.inner.submit(cid, payload)
        fut.add_done_callback(lambda f: self.replies.append((cid, bytes(f.result())))
                              if not f.cancelled() and f.exception() is None else None)
        return fut

    def close(self):
        self.inner.close()


def _spec(**secagg):
    return parse_app({"privacy": {"secagg": {"full_graph": True, "threshold": 0.5, **secagg}}})


def _server(transport, spec, *, timeout=60.0, n=None):
    cfg = ServerSpec(fraction=1.0, min_clients=n or 3, min_available=n or 3,
                     straggler_timeout=timeout, wait_timeout=30, evaluate_every=10**6)
    server = Server(make_strategy("fedavg"), transport, cfg, safeguards=Safeguards(spec))
    server.initialize(X0)
    return server


def _masked_views(replies):
    out = {}
    for cid, raw in replies:
        res = serde.decode(raw)
        if isinstance(res, SecAggRes) and res.stage == "masked_input":
            out[cid] = np.array(res.arrays[0])
    return out


# -- serde: every stage message round-trips -------------------------------------------------------


def test_secagg_messages_round_trip_through_serde():
    rng = np.random.default_rng(0)
    ct = {3: rng.bytes(CIPHERTEXT_LEN), 9: rng.bytes(CIPHERTEXT_LEN)}
    msgs = [
        AdvertiseKeys(7, 2, rng.bytes(32), rng.bytes(32)),
        KeyDirectory(7, 2, {3: (rng.bytes(32), rng.bytes(32)), 9: (rng.bytes(32), rng.bytes(32))}),
        ShareKeys(7, 2, rng.bytes(32), ct),
        ForwardedShares(7, 2, ct),
        MaskedInput(7, 2, rng.integers(0, 2**32, 50, dtype=np.uint32)),
        UnmaskRequest(7, 2, frozenset({3}), frozenset({9}), 4),
        UnmaskResponse(7, 2, {3: shamir.PRIME - 1}, {9: 12345}),
        UnmaskResponse(7, 2, {}, {}),
    ]
    for msg in msgs:
        meta, arrays = to_arrays(msg)
        for env in (SecAggIns(7, "share_keys", arrays, meta), SecAggRes(7, "unmask", arrays, meta)):
            back = serde.decode(serde.encode(env))
            assert type(back) is type(env) and back.stage == env.stage and back.meta == meta
            got = from_arrays(type(msg), back.meta, back.arrays)
            if isinstance(msg, MaskedInput):
                assert got.round_id == 7 and np.array_equal(got.vector, msg.vector)
            else:
                assert got == msg
    # a setup message carries the model and the round's parameters
    ins = SecAggIns(3, "advertise", X0, {"config": {"mu": 0.1}, "secagg": {"n": 4}, "dp": None})
    back = serde.decode(serde.encode(ins))
    assert back.meta == ins.meta and all(np.array_equal(a, b) for a, b in zip(back.arrays, X0))


def test_malformed_stage_arrays_name_what_is_wrong():
    meta, arrays = to_arrays(ShareKeys(1, 0, bytes(32), {1: bytes(CIPHERTEXT_LEN)}))
    with pytest.raises(WireError, match="ShareKeys: expected 3 arrays"):
        from_arrays(ShareKeys, meta, arrays[:2])
    with pytest.raises(WireError, match="distinct int64"):
        from_arrays(ShareKeys, meta, [arrays[0], arrays[1].astype(np.float64), arrays[2]])
    with pytest.raises(WireError, match="missing field sender"):
        from_arrays(ShareKeys, {"round_id": 1}, arrays)
    with pytest.raises(WireError, match="uint8\\[64\\]"):
        from_arrays(AdvertiseKeys, {"round_id": 1, "sender": 0}, [np.zeros(63, np.uint8)])


# -- through the real server ------------------------------------------------------------------


def test_thread_transport_round_equals_fedavg_and_server_sees_only_masked_inputs():
    n = 5
    clients = {str(i): Fixed(i) for i in range(n)}
    transport = Recording(ThreadTransport({c: ClientRunner(x) for c, x in clients.items()},
                                          threads=n))
    server = _server(transport, _spec())
    (rec,) = server.run(1)
    transport.close()
    plain = _server(ThreadTransport({c: ClientRunner(x) for c, x in clients.items()}),
                    parse_app({}))
    plain.run(1)
    plain.transport.close()
    assert rec.updates == n and rec.metrics["secagg_survivors"] == n and not rec.failures
    assert rec.metrics["secagg_dropped"] == 0 and "secagg" in rec.reason
    for got, want in zip(server.strategy.parameters, plain.strategy.parameters):
        np.testing.assert_allclose(got, want, rtol=0, atol=0.5 / SCALE + 1e-6)
    # what the server received in the masked-input stage is not the client's encoded update,
    # and looks uniform; no reply carries a client's plaintext delta
    views = _masked_views(transport.replies)
    assert sorted(views) == sorted(clients)
    for cid, v in views.items():
        flat = np.concatenate([d.reshape(-1) for d in clients[cid].delta])
        enc = quantize(flat, clip=1.0, scale=SCALE)
        assert np.mean(v == enc) < 0.01
        assert stats.kstest(v.astype(np.float64) / 2**32, "uniform").pvalue > 1e-4
        assert stats.kstest(enc.astype(np.float64) / 2**32, "uniform").pvalue < 1e-6
        raw = clients[cid].delta[0].tobytes()[:64]
        assert not any(raw in reply for _, reply in transport.replies)
    assert {serde.decode(r).stage for _, r in transport.replies} == {
        "advertise", "share_keys", "masked_input", "unmask"}


def test_pool_transport_round_equals_fedavg_of_the_same_updates(tmp_path):
    app = tmp_path / "app.yaml"
    app.write_text((APPS / "tiny.yaml").read_text().replace("code: tiny.py",
                                                            f"code: {APPS}/tiny.py"))
    ov = {"privacy": {"secagg": {"clip": 4.0, "threshold": 0.5}}, "server.min_clients": 4}
    spec = load_app(str(app), ov)
    from plinth.fl.rounds import initial_model

    _, params = initial_model(spec)
    local = AppClients(spec, 4)
    deltas = []
    for c in range(4):  # the same clients, trained here: the plain FedAvg of their updates
        res = serde.decode(local.runner(c).handle(serde.encode(FitIns(1, params, {}))))
        assert isinstance(res, FitRes)
        deltas.append([np.asarray(a, np.float64) for a in res.update])
    transport = Recording(PoolTransport(str(app), ov, 4, local.sizes(), workers=2, sticky=True))
    cfg = ServerSpec(fraction=1.0, min_clients=4, min_available=4, straggler_timeout=120,
                     evaluate_every=10**6)
    server = Server(make_strategy("fedavg"), transport, cfg, safeguards=Safeguards(spec))
    server.initialize(params)
    try:
        (rec,) = server.run(1)
    finally:
        transport.close()
    assert rec.metrics["secagg_survivors"] == 4 and not rec.failures
    for j, p in enumerate(server.strategy.parameters):
        want = params[j] + np.mean([d[j] for d in deltas], axis=0)
        np.testing.assert_allclose(p, want, rtol=0, atol=0.5 / SCALE + 1e-5)
    views = _masked_views(transport.replies)
    assert len(views) == 4
    for c, v in views.items():
        enc = quantize(np.concatenate([d.reshape(-1) for d in deltas[int(c)]]), clip=4.0,
                       scale=SCALE)
        assert np.mean(v == enc) < 0.01


def test_dropouts_after_sharing_keys_give_the_exact_sum_of_survivors(caplog):
    n = 8  # full graph: 7 neighbours, threshold 4
    release = threading.Event()
    clients = {str(i): Fixed(i) for i in range(n)}
    runners = {c: ClientRunner(x) for c, x in clients.items()}
    runners["1"] = Faulty(clients["1"], "masked_input", "crash", release)
    runners["4"] = Faulty(clients["4"], "masked_input", "hang", release)
    runners["6"] = Faulty(clients["6"], "unmask", "crash", release)  # its input still counts
    transport = ThreadTransport(runners, threads=n)
    server = _server(transport, _spec(), timeout=1.5)
    try:
        with caplog.at_level(logging.WARNING):
            (rec,) = server.run(1)
    finally:
        release.set()
        transport.close()
    survivors = ["0", "2", "3", "5", "6", "7"]
    assert rec.metrics["secagg_survivors"] == 6 and rec.updates == 6
    assert rec.metrics["secagg_dropped"] == 2
    assert {(f["cid"], f["kind"]) for f in rec.failures} == {("1", "lost"), ("4", "timeout"),
                                                              ("6", "lost")}
    for j, p in enumerate(server.strategy.parameters):
        want = np.mean([clients[c].delta[j].astype(np.float64) for c in survivors], axis=0)
        np.testing.assert_allclose(p, want, rtol=0, atol=0.5 / SCALE + 1e-6)


def test_too_many_dropouts_abort_the_round_and_keep_the_model():
    n = 5  # full graph: 4 neighbours, threshold 3; three die before masking
    release = threading.Event()
    clients = {str(i): Fixed(i) for i in range(n)}
    runners = {c: ClientRunner(x) for c, x in clients.items()}
    for c in "013":
        runners[c] = Faulty(clients[c], "masked_input", "crash", release)
    transport = Recording(ThreadTransport(runners, threads=n))
    server = _server(transport, _spec())
    (rec,) = server.run(1)
    transport.close()
    assert rec.updates == 0 and rec.metrics["secagg_aborted"] == 1
    assert rec.metrics["skipped"] == 1 and rec.metrics["secagg_dropped"] == 3
    assert "secagg aborted" in rec.reason and "threshold" in rec.reason
    assert all(np.array_equal(p, x) for p, x in zip(server.strategy.parameters, X0))
    # the two survivors' masked inputs reached the server, but no unmask request went out
    assert len(_masked_views(transport.replies)) == 2
    assert not [r for _, r in transport.replies if serde.decode(r).stage == "unmask"]


# -- replayed and malformed stage messages -----------------------------------------------------


def test_replayed_and_malformed_replies_are_rejected_with_a_logged_reason(caplog):
    n = 4
    runners = {str(i): ClientRunner(Fixed(i)) for i in range(n)}
    cfg = SecAggConfig(client_ids=tuple(range(n)), vector_len=D, round_id=5, full_graph=True)
    rnd = ServerRound(cfg, list(runners))
    reqs = rnd.setup(X0, {}, None)
    replies = {c: runners[c].handle(p) for c, p in reqs.items()}
    with caplog.at_level(logging.WARNING):
        for c, r in replies.items():
            assert rnd.receive(c, r) is None
        kind, why = rnd.receive("0", replies["0"])  # the same reply again
        assert kind == "rejected" and "duplicate" in why
        kind, why = rnd.receive("1", replies["0"])  # client 1 answers as client 0
        assert "claims SecAgg id 0" in why
        kind, why = rnd.receive("2", b"PLF1garbage")
        assert "corrupt message" in why
        res = serde.decode(replies["3"])
        old = serde.encode(SecAggRes(4, res.stage, res.arrays, res.meta))  # an older round
        assert "replayed or stale" in rnd.receive("3", old)[1]
        bad = serde.encode(SecAggRes(5, res.stage, [np.zeros(63, np.uint8)], res.meta))
        assert "uint8[64]" in rnd.receive("3", bad)[1]
    logged = caplog.text
    assert "duplicate" in logged and "claims SecAgg id 0" in logged and "corrupt" in logged
    # the round goes on and finishes with every client
    reqs = rnd.advance()
    share = {c: runners[c].handle(p) for c, p in reqs.items()}
    assert all(rnd.receive(c, r) is None for c, r in share.items())
    # a client refuses a replayed stage message without losing its state
    with caplog.at_level(logging.WARNING):
        again = serde.decode(runners["0"].handle(reqs["0"]))
    assert isinstance(again, ErrorRes) and "replayed or out of turn" in again.message
    assert "replayed or out of turn" in caplog.text
    for _ in range(2):
        reqs = rnd.advance()
        for c, p in reqs.items():
            assert rnd.receive(c, runners[c].handle(p)) is None
    assert rnd.advance() == {} and rnd.result is not None
    want = np.mean([np.concatenate([d.reshape(-1) for d in Fixed(i).delta]) for i in range(n)],
                   axis=0)
    np.testing.assert_allclose(rnd.total() / n, want, rtol=0, atol=0.5 / SCALE + 1e-6)
    # and a stage message for a round it holds no state for is refused
    res = serde.decode(runners["1"].handle(reqs["1"]))
    assert isinstance(res, ErrorRes) and "no state" in res.message


# -- gRPC, separate processes ----------------------------------------------------------------------


@pytest.fixture
def port() -> int:
    return free_port()


def test_secagg_over_grpc_with_separate_processes(tmp_path, port):
    app = tmp_path / "app.yaml"
    tiny = (APPS / "tiny.yaml").read_text().replace("code: tiny.py", f"code: {APPS}/tiny.py")
    app.write_text(tiny.replace("min_clients: 2, min_available: 2, straggler_timeout: 120",
                                "min_clients: 3, min_available: 3, straggler_timeout: 60, "
                                "wait_timeout: 60")
                   + "privacy: {secagg: {clip: 4.0, threshold: 0.5}}\n")
    fl = [sys.executable, "-m", "plinth.cli.main", "fl"]
    out = tmp_path / "r.json"
    server = subprocess.Popen([*fl, "server", str(app), "--address", f"127.0.0.1:{port}",
                               "--rounds", "3", "--json", str(out), "--no-tokens"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    clients = [subprocess.Popen([*fl, "client", str(app), "--server", f"127.0.0.1:{port}",
                                 "--cid", str(i), "--clients", "3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(3)]
    try:
        _, s_err = server.communicate(timeout=240)
        c_out = [c.communicate(timeout=60) for c in clients]
    finally:
        for p in (server, *clients):
            if p.poll() is None:
                p.kill()
    assert server.returncode == 0, s_err
    assert all(c.returncode == 0 for c in clients), c_out
    doc = json.loads(out.read_text())
    assert doc["secagg"] is True
    rounds = doc["rounds"]
    assert [r["secagg_survivors"] for r in rounds] == [3, 3, 3]
    assert [r["updates"] for r in rounds] == [3, 3, 3]
    assert all(r["secagg_dropped"] == 0 and r["failures"] == 0 for r in rounds)
    acc = [r["accuracy"] for r in rounds]
    assert acc[-1] > acc[0] and doc["final_accuracy"] > 0.5, acc  # the model learns


def test_secagg_with_compression_is_a_one_line_error_naming_the_field():
    from plinth.core.errors import SpecError

    with pytest.raises(SpecError) as e:
        parse_app({"compression": {"kind": "q8"}, "privacy": {"secagg": {}}}, "app.yaml")
    assert "\n" not in str(e.value) and str(e.value).startswith("app.yaml: privacy.secagg:")
