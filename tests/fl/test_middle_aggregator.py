"""A machine's middle aggregator (LIFL across machines): one update per machine goes up."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plinth.core.errors import PlinthError
from plinth.core.net import free_port
from plinth.fl import serde
from plinth.fl.app import ServerSpec
from plinth.fl.client import ClientRunner
from plinth.fl.messages import ErrorRes, EvaluateIns, EvaluateRes, FitIns, FitRes
from plinth.fl.middle import MiddleAggregator
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.inproc import ThreadTransport

APPS = Path(__file__).parent / "apps"
X0 = [np.zeros((4, 3), np.float32), np.zeros(5, np.float32)]


class Step:
    """Moves every parameter by `step`, reports `n` examples, and remembers its fit config."""

    def __init__(self, step, n, accuracy=0.5):
        self.step, self.n, self.accuracy, self.config = step, n, accuracy, None

    def fit(self, params, config):
        self.config = config
        return [p + self.step for p in params], self.n, {}

    def evaluate(self, params, config):
        return 1.0 - self.accuracy, self.n, {"accuracy": self.accuracy}


class NaN(Step):
    def fit(self, params, config):
        out = [p + 1 for p in params]
        out[0][0, 0] = np.nan
        return out, self.n, {}


def _machine(clients):
    runners = {cid: ClientRunner(c) for cid, c in clients.items()}
    props = {cid: {"num_examples": c.n} for cid, c in clients.items()}
    return ThreadTransport(runners, props)


def test_the_machine_sends_the_weighted_mean_of_its_clients_and_their_examples():
    a, b = Step(1.0, 10), Step(3.0, 30)
    down = _machine({"a": a, "b": b, "bad": NaN(0, 20)})
    middle = MiddleAggregator(down, clients=3, straggler_timeout=10)
    try:
        assert middle.wait_for_clients() == 60  # what it declares upstream
        res = serde.decode(middle.handle(serde.encode(FitIns(3, X0, {"mu": 0.1}))))
        ev = serde.decode(middle.handle(serde.encode(EvaluateIns(3, X0, {}))))
    finally:
        down.close()
    assert isinstance(res, FitRes) and res.round == 3
    assert res.num_examples == 40  # the NaN client's 20 are left out with its update
    np.testing.assert_allclose(res.update[0], (10 * 1 + 30 * 3) / 40)
    assert res.metrics == {"clients": 2.0, "client_failures": 1.0}
    assert a.config["mu"] == 0.1 and a.config["round"] == 3  # the server's config passed down
    assert isinstance(ev, EvaluateRes) and ev.num_examples == 60
    assert ev.metrics["accuracy"] == pytest.approx(0.5)


def test_a_machine_samples_its_share_of_clients_each_round():
    steps = {f"c{k}": Step(float(k), 10) for k in range(10)}
    down = _machine(steps)
    middle = MiddleAggregator(down, clients=10, straggler_timeout=10, fraction=0.3)
    try:
        middle.wait_for_clients()
        picked = []
        for r in (1, 2, 3):
            for c in steps.values():
                c.config = None
            res = serde.decode(middle.handle(serde.encode(FitIns(r, X0, {}))))
            took = sorted(cid for cid, c in steps.items() if c.config is not None)
            assert len(took) == 3 and res.metrics["clients"] == 3.0 and res.num_examples == 30
            # the update is the mean of exactly the clients that trained
            np.testing.assert_allclose(res.update[0],
                                       np.mean([steps[cid].step for cid in took]))
            picked.append(took)
    finally:
        down.close()
    assert len({tuple(t) for t in picked}) > 1  # drawn afresh each round
    with pytest.raises(PlinthError, match=r"--fraction: 0 is not in \(0, 1\]"):
        MiddleAggregator(_machine(steps), clients=1, fraction=0.0)


def test_a_machine_whose_clients_all_fail_answers_with_an_error():
    down = _machine({"bad": NaN(0, 20)})
    middle = MiddleAggregator(down, clients=1, straggler_timeout=10)
    try:
        res = serde.decode(middle.handle(serde.encode(FitIns(1, X0, {}))))
    finally:
        down.close()
    assert isinstance(res, ErrorRes) and "no client of this aggregator" in res.message


def test_two_machines_give_the_server_the_same_model_as_four_flat_clients():
    def clients():
        return {"a": Step(1.0, 10), "b": Step(3.0, 30), "c": Step(-2.0, 5), "d": Step(0.5, 55)}

    cfg = ServerSpec(fraction=1.0, min_clients=2, min_available=2, straggler_timeout=10)
    flat_t = _machine(clients())
    flat = Server(make_strategy("fedavg"), flat_t, cfg)
    flat.initialize(X0)
    flat.fit_round(1)
    flat_t.close()

    cs = clients()
    m1, m2 = _machine({k: cs[k] for k in "ab"}), _machine({k: cs[k] for k in "cd"})
    middles = {"m1": MiddleAggregator(m1, clients=2), "m2": MiddleAggregator(m2, clients=2)}
    top_t = ThreadTransport(middles, {k: {"num_examples": m.wait_for_clients()}
                                      for k, m in middles.items()})
    top = Server(make_strategy("fedavg"), top_t, cfg)
    top.initialize(X0)
    rec = top.fit_round(1)
    for t in (top_t, m1, m2):
        t.close()
    assert rec.updates == 2 and rec.failures == []  # one update per machine
    for got, want in zip(top.strategy.parameters, flat.strategy.parameters):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_server_two_aggregators_and_four_client_processes_over_grpc(tmp_path):
    app = tmp_path / "app.yaml"
    app.write_text((APPS / "tiny.yaml").read_text()
                   .replace("code: tiny.py", f"code: {APPS}/tiny.py")
                   .replace("straggler_timeout: 120", "straggler_timeout: 60, wait_timeout: 60"))
    fl = [sys.executable, "-m", "plinth.cli.main", "fl"]
    top, out = free_port(), tmp_path / "r.json"
    procs = [subprocess.Popen([*fl, "server", str(app), "--address", f"127.0.0.1:{top}",
                               "--json", str(out), "--no-tokens"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)]
    for m in range(2):
        port = free_port()
        procs.append(subprocess.Popen(
            [*fl, "aggregator", str(app), "--server", f"127.0.0.1:{top}", "--clients", "2",
             "--address", f"127.0.0.1:{port}", "--name", f"rack{m}", "--no-tokens"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        procs += [subprocess.Popen([*fl, "client", str(app), "--server", f"127.0.0.1:{port}",
                                    "--cid", str(2 * m + i), "--clients", "4"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i in range(2)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    doc = json.loads(out.read_text())
    assert [r["updates"] for r in doc["rounds"]] == [2, 2]  # one per machine, not four
    assert sorted(doc["rounds"][0]["clients"]) == ["rack0", "rack1"]
    assert doc["final_accuracy"] > 0.5
    for m in (1, 4):  # the aggregators: two fits each, for their two clients
        assert re.search(r"rack\d: 2 tasks done", outs[m][0])
