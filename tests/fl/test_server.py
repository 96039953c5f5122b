"""The real server over the thread transport, with real (misbehaving) clients."""

import threading

import numpy as np
import pytest

from plinth.core.errors import PlinthError
from plinth.fl.app import EligibilitySpec, ServerSpec
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.client import ClientRunner
from plinth.fl.compress import Compressor
from plinth.fl.messages import ClientInfo
from plinth.fl.selection import eligible, select
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.inproc import ThreadTransport

X0 = [np.zeros((4, 3), np.float32), np.zeros(5, np.float32)]


class Step:
    """Moves every parameter by `step` and reports `n` examples."""

    def __init__(self, step=1.0, n=10):
        self.step, self.n = step, n

    def fit(self, params, config):
        return [p + self.step for p in params], self.n, {"seen": 1.0}

    def evaluate(self, params, config):
        return 0.0, self.n, {}


class NaNClient(Step):
    def fit(self, params, config):
        out = [p + 1 for p in params]
        out[0][1, 1] = np.nan
        return out, 10, {}


class WrongShape(Step):
    def fit(self, params, config):
        return [np.zeros((3, 4), np.float32), params[1]], 10, {}


class WrongDtype(Step):
    def fit(self, params, config):
        return [p.astype(np.float64) for p in params], 10, {}


class Crashes(Step):
    def fit(self, params, config):
        raise RuntimeError("disk full")

    def evaluate(self, params, config):
        raise RuntimeError("disk full")


class Stale(Step):
    """Replies as if to an older round (a replayed or delayed message)."""

    def fit(self, params, config):
        return [p + 1 for p in params], 10, {}


class Hangs(Step):
    def __init__(self, release):
        super().__init__()
        self.release = release

    def fit(self, params, config):
        self.release.wait(30)
        return [p + 1 for p in params], 10, {}


def _server(clients, cfg=None, strategy="fedavg", options=None, checkpoint=None, props=None):
    runners = {cid: ClientRunner(c) for cid, c in clients.items()}
    if "stale" in runners:
        orig = runners["stale"].handle

        def stale_handle(payload):
            from plinth.fl import serde

            msg = serde.decode(bytes(payload))
            msg.round -= 1
            return orig(serde.encode(msg))

        runners["stale"].handle = stale_handle
    transport = ThreadTransport(runners, props, threads=8)
    cfg = cfg or ServerSpec(rounds=1, fraction=1.0, min_clients=1, min_available=1,
                            straggler_timeout=2.0)
    s = Server(make_strategy(strategy, options), transport, cfg, seed=0, checkpoint=checkpoint,
               evaluate=lambda p: (float(np.abs(p[0]).mean()), {"accuracy": 0.5}))
    s.initialize(X0)
    return s, transport


def test_bad_clients_are_failures_and_the_round_goes_on():
    release = threading.Event()
    clients = {"good1": Step(1.0, 10), "good2": Step(3.0, 30), "nan": NaNClient(),
               "shape": WrongShape(), "dtype": WrongDtype(), "crash": Crashes(),
               "stale": Stale(), "hang": Hangs(release)}
    s, t = _server(clients)
    try:
        recs = s.run(1)
    finally:
        release.set()
        t.close()
    kinds = {f["cid"]: (f["kind"], f["reason"]) for f in recs[0].failures}
    assert kinds["nan"][0] == "rejected" and "NaN" in kinds["nan"][1]
    assert kinds["shape"][0] == "rejected" and "shape" in kinds["shape"][1]
    assert kinds["dtype"][0] == "rejected" and "dtype" in kinds["dtype"][1]
    assert kinds["crash"] == ("error", kinds["crash"][1]) and "disk full" in kinds["crash"][1]
    assert kinds["stale"][0] == "rejected" and "round 0" in kinds["stale"][1]
    assert kinds["hang"][0] == "timeout"
    assert recs[0].updates == 2
    # only the good clients moved the model: (10·1 + 30·3) / 40 = 2.5
    np.testing.assert_allclose(s.strategy.parameters[0], 2.5)
    assert recs[0].bytes_up > 0 and recs[0].bytes_down > 0 and recs[0].accuracy == 0.5


def test_federated_evaluation_when_the_server_has_no_test_set():
    class Scored(Step):
        def __init__(self, acc, n):
            super().__init__(1.0, n)
            self.acc = acc

        def evaluate(self, params, config):
            return 1.0 - self.acc, self.n, {"accuracy": self.acc}

    runners = {"a": ClientRunner(Scored(0.5, 10)), "b": ClientRunner(Scored(1.0, 30)),
               "c": ClientRunner(Crashes())}
    t = ThreadTransport(runners)
    s = Server(make_strategy("fedavg"), t, ServerSpec(fraction=1.0, min_clients=1,
                                                      min_available=1))
    s.initialize(X0)
    rec = s.run(1)[0]
    t.close()
    assert rec.accuracy == (0.5 * 10 + 1.0 * 30) / 40 and rec.loss == (0.5 * 10) / 40


def test_selection_fraction_min_and_eligibility():
    clients = [ClientInfo(str(i), {"num_examples": i, "gpu": i % 2 == 0}) for i in range(20)]
    ok = eligible(clients, EligibilitySpec(min_examples=5, require={"gpu": True}))
    assert [c.cid for c in ok] == ["6", "8", "10", "12", "14", "16", "18"]
    rng = np.random.default_rng(0)
    assert len(select(ok, fraction=0.1, min_clients=3, rng=rng)) == 3
    assert len(select(ok, fraction=0.5, min_clients=1, rng=rng)) == 4
    assert len(select(ok, fraction=0.1, min_clients=50, rng=rng)) == 7
    a = select(clients, fraction=0.3, min_clients=1, rng=np.random.default_rng([0, 4]))
    b = select(clients, fraction=0.3, min_clients=1, rng=np.random.default_rng([0, 4]))
    assert a == b and len(set(a)) == 6


def test_too_few_eligible_clients_is_a_clear_error():
    cfg = ServerSpec(fraction=1.0, min_clients=3, min_available=1,
                     eligibility=EligibilitySpec(min_examples=100))
    s, t = _server({"a": Step(), "b": Step(), "c": Step()}, cfg,
                   props={"a": {"num_examples": 10}, "b": {"num_examples": 100}})
    with pytest.raises(PlinthError, match="server.min_clients"):
        s.run(1)
    t.close()


def test_compressed_updates_are_decoded_before_folding():
    runners = {str(i): ClientRunner(Step(1.0), Compressor("q8")) for i in range(3)}
    t = ThreadTransport(runners)
    s = Server(make_strategy("fedavg"), t, ServerSpec(fraction=1.0, min_clients=1,
                                                      min_available=1))
    s.initialize(X0)
    recs = s.run(2)
    t.close()
    assert all(r.updates == 3 for r in recs)
    np.testing.assert_allclose(s.strategy.parameters[0], 2.0, atol=0.02)


def test_async_fedbuff_steps_every_k_updates():
    clients = {str(i): Step(1.0, 1) for i in range(6)}
    cfg = ServerSpec(fraction=1.0, min_clients=1, min_available=1, concurrency=3,
                     straggler_timeout=10)
    s, t = _server(clients, cfg, "fedbuff", {"buffer_size": 2})
    recs = s.run(4)
    t.close()
    assert [r.round for r in recs] == [1, 2, 3, 4]
    assert all(r.updates == 2 for r in recs)
    # each step adds the mean of two staleness-weighted deltas of 1: between 1/√(1+s) and 1
    total = float(s.strategy.parameters[1][0])
    assert 4 * 0.4 < total <= 4.0 + 1e-6


def test_checkpoint_resume_continues_where_it_stopped(tmp_path):
    clients = {str(i): Step(1.0) for i in range(3)}
    cfg = ServerSpec(fraction=1.0, min_clients=1, min_available=1)
    s, t = _server(clients, cfg, "fedavgm", {"momentum": 0.5}, Checkpointer(tmp_path))
    s.run(2)
    t.close()
    s2, t2 = _server(clients, cfg, "fedavgm", {"momentum": 0.5}, Checkpointer(tmp_path))
    s2.initialize(X0, resume=True)
    assert s2.start_round == 3 and len(s2.records) == 2
    np.testing.assert_allclose(s2.strategy.velocity[0], 1.5)
    recs = s2.run(3)
    t2.close()
    assert [r.round for r in recs] == [1, 2, 3]
    np.testing.assert_allclose(s2.strategy.parameters[0], 1 + 1.5 + 1.75)
    assert sorted(p.name for p in tmp_path.glob("round_*")) == ["round_000002", "round_000003"]


def test_clients_that_lie_about_num_examples_are_rejected():
    """FedAvg weights by the client's own num_examples: a claim past what the client declared
    on joining, or one that is not a positive integer, is refused, so a liar cannot dominate."""
    clients = {"honest": Step(1.0, 10), "liar": Step(100.0, 10**9), "zero": Step(50.0, 0),
               "undeclared": Step(1.0, 7)}
    props = {"honest": {"num_examples": 10}, "liar": {"num_examples": 10},
             "zero": {"num_examples": 10}, "undeclared": {}}
    s, t = _server(clients, props=props)
    try:
        rec = s.run(1)[0]
    finally:
        t.close()
    why = {f["cid"]: f["reason"] for f in rec.failures if f["kind"] == "rejected"}
    assert set(why) == {"liar", "zero"}
    assert "1000000000 is more than the 10" in why["liar"]
    assert "positive integer" in why["zero"]
    assert rec.updates == 2
    np.testing.assert_allclose(s.strategy.parameters[0], 1.0)  # only the honest moves: +1
