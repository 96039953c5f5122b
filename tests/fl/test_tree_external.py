"""Aggregators the server did not start: leaf units (separate processes, as the runtime would
start them) join the tree with the task's token, are activated or kept warm on standby as the
sizing asks, and one killed mid-round costs only its round's updates."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from plinth.core.errors import PlinthError, SpecError
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.app import parse_app

X0 = [np.zeros((40, 30), np.float32), np.zeros(7, np.float32)]
TOKEN = b"task-token-0123456789"


@pytest.fixture
def sock(tmp_path):
    path = tmp_path / "agg.sock"
    (tmp_path / "token").write_bytes(TOKEN + b"\n")
    (tmp_path / "forged").write_bytes(b"not-the-token")
    return str(path), tmp_path


def _leaf(sock, token_file):
    return subprocess.Popen([sys.executable, "-m", "plinth.fl.aggregate.leaf", "--connect", sock,
                             "--token-file", str(token_file)], stderr=subprocess.PIPE, text=True)


def _updates(n, seed=0):
    rng = np.random.default_rng(seed)
    return [([rng.standard_normal(t.shape).astype(np.float32) for t in X0], float(k + 1))
            for k in range(n)]


def _wait_standby(tree, n, timeout=60):
    deadline = time.monotonic() + timeout
    while len(tree.standby) + tree.leaves < n and time.monotonic() < deadline:
        tree.scale(tree.leaves)  # adopts what joined since, activates nothing more
        time.sleep(0.05)


def test_joined_leaves_fold_a_round_and_stay_warm_between_rounds(sock):
    path, tmp = sock
    procs = [_leaf(path, tmp / "token") for _ in range(2)]
    tree = Hierarchy(X0, leaves=1, listen=path, token=TOKEN, join_timeout=60)
    try:
        _wait_standby(tree, 2)
        assert tree.scale(2) == 2 and sorted(tree.pids) == sorted(p.pid for p in procs)
        ups = _updates(6)
        for k, (a, w) in enumerate(ups):
            tree.submit_arrays(a, w, f"u{k}")
        res = tree.finish(timeout=60)
        first = tree.pids
        assert tree.scale(1) == 1 and tree.standby == first[1:]  # warm, not stopped
        assert procs[0].poll() is None and procs[1].poll() is None
        assert tree.scale(2) == 2 and tree.pids == first  # the same processes again
    finally:
        tree.close()
    assert res.count == 6 and res.rejected == []
    np.testing.assert_allclose(res.sums[0], sum(a[0] * w for a, w in ups), rtol=1e-5,
                               atol=1e-5)
    assert [p.wait(30) for p in procs] == [0, 0]  # told to stop when the tree closed


def test_a_leaf_with_a_forged_token_is_refused_and_changes_nothing(sock):
    path, tmp = sock
    good = _leaf(path, tmp / "token")
    tree = Hierarchy(X0, leaves=1, listen=path, token=TOKEN, join_timeout=60)
    try:
        forged = _leaf(path, tmp / "forged")
        assert forged.wait(60) == 1 and "token was refused" in forged.stderr.read()
        assert tree._registry[0].refused == 1
        assert tree.scale(2) == 1 and tree.pids == [good.pid]  # nobody else joined
        tree.submit_arrays(*_updates(1)[0], "u0")
        assert tree.finish(timeout=60).count == 1
    finally:
        tree.close()
        good.wait(30)


def test_a_leaf_killed_mid_round_loses_only_its_updates_and_the_next_round_goes_on(sock):
    path, tmp = sock
    procs = {p.pid: p for p in (_leaf(path, tmp / "token") for _ in range(2))}
    tree = Hierarchy(X0, leaves=1, listen=path, token=TOKEN, join_timeout=60)
    try:
        _wait_standby(tree, 2)
        tree.scale(2)
        victim = tree.pids[0]
        ups = _updates(6, seed=1)
        for k, (a, w) in enumerate(ups):
            tree.submit_arrays(a, w, f"u{k}")
        os.kill(victim, signal.SIGKILL)
        procs[victim].wait(30)
        res = tree.finish(timeout=60)
        after = tree.pids
        tree.submit_arrays(ups[0][0], 1.0, "again")  # round 2 on the survivor
        again = tree.finish(timeout=60)
    finally:
        tree.close()
    lost = {tag for tag, why in res.rejected if "died" in why}
    assert res.count + len(lost) == 6 and len(res.rejected) == len(lost)
    kept = [u for k, u in enumerate(ups) if f"u{k}" not in lost]
    np.testing.assert_allclose(res.sums[0], sum(a[0] * w for a, w in kept), rtol=1e-5,
                               atol=1e-5)
    assert victim not in after and len(after) == 1 and again.count == 1


def test_no_leaf_joining_is_a_one_line_error(sock):
    path, _ = sock
    with pytest.raises(PlinthError, match="no aggregator leaf joined .* within 0.5s"):
        Hierarchy(X0, leaves=1, listen=path, token=TOKEN, join_timeout=0.5)


def test_a_tree_no_leaf_joined_frees_its_port_for_the_next_round():
    # a middle aggregator whose leaves could not be placed in time tries again next round on
    # the same address: its first listener's accepting thread must not still hold the port
    from plinth.core.net import free_port

    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    for _ in range(2):
        with pytest.raises(PlinthError, match="no aggregator leaf joined .* within 0.2s"):
            Hierarchy(X0, leaves=1, listen=address, token=TOKEN, join_timeout=0.2)


@pytest.mark.parametrize(("aggregation", "field"), [
    ({"mode": "tree", "leaf_listen": "10.0.0.5:7070", "leaf_token_file": "t"},
     "server.aggregation.leaf_listen"),
    ({"mode": "tree", "leaf_listen": "127.0.0.1:7070"}, "leaf_token_file"),
])
def test_bad_external_leaf_config_is_a_one_line_error(aggregation, field):
    with pytest.raises(SpecError) as e:
        parse_app({"server": {"aggregation": aggregation}})
    assert "\n" not in str(e.value) and field in str(e.value)


def test_the_server_runs_rounds_on_joined_leaves_and_survives_one_killed(sock):
    """The real server in tree mode with `leaf_listen`: it starts no leaf process, folds on
    the two joined leaves, gives where they join in its tree's shape, and when one is killed in
    the middle of round 1 its updates are that round's failures and round 2 goes on."""
    from plinth.fl.app import ServerSpec
    from plinth.fl.checkpoint import Checkpointer
    from plinth.fl.client import ClientRunner
    from plinth.fl.server import Server
    from plinth.fl.strategies import make_strategy
    from plinth.fl.transport.inproc import ThreadTransport

    path, tmp = sock
    procs = {p.pid: p for p in (_leaf(path, tmp / "token") for _ in range(2))}
    killed = []

    class Client:
        def __init__(self, seed, kill=False):
            self.rng, self.kill = np.random.default_rng(seed), kill

        def fit(self, params, config):
            if self.kill and not killed:
                victim = server.tree.tree.pids[0]
                os.kill(victim, signal.SIGKILL)
                procs[victim].wait(30)
                killed.append(victim)
            return [p + self.rng.standard_normal(p.shape).astype(p.dtype) for p in params], \
                5, {}

        def evaluate(self, params, config):
            return 0.0, 5, {}

    clients = {f"c{i}": Client(i, kill=(i == 3)) for i in range(6)}
    t = ThreadTransport({cid: ClientRunner(c) for cid, c in clients.items()}, threads=3)
    agg = {"mode": "tree", "leaves": 2, "leaf_listen": path,
           "leaf_token_file": str(tmp / "token"), "leaf_join_timeout": 60}
    cfg = ServerSpec(rounds=2, fraction=1.0, min_clients=1, min_available=1,
                     straggler_timeout=60.0, aggregation=agg)
    server = Server(make_strategy("fedavg"), t, cfg, seed=0, checkpoint=Checkpointer(tmp),
                    evaluate=lambda p: (0.0, {"accuracy": 0.5}))
    server.initialize(X0)
    try:
        _wait_for_join(server, 2)
        first = server.fit_round(1)
        doc = server.checkpoint.shape
        second = server.fit_round(2)
        spawned = [leaf.proc for leaf in server.tree.tree._leaves]
    finally:
        t.close()
        server.close()
    assert doc["listen"] == path and doc["leaves"] == 2
    assert set(doc["pids"]) == set(procs) and spawned == [None]  # none started by the tree
    lost = [f for f in first.failures if "died" in f["reason"]]
    assert first.updates + len(lost) == 6 and len(first.failures) == len(lost)
    assert first.metrics["leaf_replacements"] == 1.0
    assert second.updates == 6 and second.failures == []  # on the survivor
    assert all(np.isfinite(p).all() for p in server.strategy.parameters)


def _wait_for_join(server, n, timeout=60):
    """Open the tree (round 0's begin) and wait until `n` leaves joined it."""
    server.accumulator(0, n).close()
    tree = server.tree.tree
    _wait_standby(tree, n, timeout)
