"""The elastic LIFL tree behind the real server: same model as the streaming engine, bad updates
as failures, leaves scaled per round, a killed leaf replaced, `plinth fl sim` in tree mode."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from plinth.cli.fl import app
from plinth.core.errors import SpecError
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.app import ServerSpec, parse_app
from plinth.fl.checkpoint import Checkpointer
from plinth.fl.client import ClientRunner
from plinth.fl.server import Server
from plinth.fl.strategies import make_strategy
from plinth.fl.transport.inproc import ThreadTransport

X0 = [np.zeros((40, 30), np.float32), np.zeros(7, np.float32)]
APPS = Path(__file__).parent / "apps"


def _leaked(names):
    """Which of these shared-memory blocks still exist (/dev/shm on Linux)."""
    return {n for n in names if os.path.exists(f"/dev/shm/{n.lstrip('/')}")}


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Rand:
    """Moves the model by a fixed random delta of its own (per client) and reports `n`."""

    def __init__(self, seed, n, poison=None):
        self.rng, self.n, self.poison = np.random.default_rng(seed), n, poison

    def fit(self, params, config):
        out = [p + self.rng.standard_normal(p.shape).astype(p.dtype) for p in params]
        if self.poison == "nan":
            out[0][3, 4] = np.nan
        elif self.poison == "shape":
            out[0] = np.zeros((30, 40), np.float32)
        elif self.poison == "inf":
            out[1][0] = np.inf
        return out, self.n, {}

    def evaluate(self, params, config):
        return 0.0, self.n, {}


def _server(clients, aggregation=None, fraction=1.0, checkpoint=None):
    t = ThreadTransport({cid: ClientRunner(c) for cid, c in clients.items()}, threads=4)
    cfg = ServerSpec(rounds=2, fraction=fraction, min_clients=1, min_available=1,
                     straggler_timeout=60.0, aggregation=aggregation or {})
    s = Server(make_strategy("fedavg"), t, cfg, seed=0, checkpoint=checkpoint,
               evaluate=lambda p: (0.0, {"accuracy": 0.5}))
    s.initialize(X0)
    return s, t


def _clients(poison=True):
    out = {f"c{i}": Rand(i, 5 + i) for i in range(6)}
    if poison:
        out |= {"nan": Rand(90, 3, "nan"), "inf": Rand(91, 3, "inf"),
                "shape": Rand(92, 3, "shape")}
    return out


def test_tree_gives_the_streaming_model_and_bad_updates_become_failures():
    runs, blocks = {}, []
    for mode in ("stream", "tree"):
        s, t = _server(_clients(), {"mode": mode, "leaves": 2})
        try:
            runs[mode] = (s.run(2), [p.copy() for p in s.strategy.parameters])
        finally:
            t.close()
            if mode == "tree":
                blocks = s.tree.tree.blocks()
                s.close()
    (stream, p_stream), (tree, p_tree) = runs["stream"], runs["tree"]
    for a, b in zip(p_stream, p_tree):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert not np.allclose(p_tree[0], 0)
    for rs, rt in zip(stream, tree):
        assert rt.updates == rs.updates == 6
        kinds = {f["cid"]: (f["kind"], f["reason"]) for f in rt.failures}
        assert set(kinds) == {"nan", "inf", "shape"}
        assert kinds["nan"][0] == "rejected" and "NaN" in kinds["nan"][1]
        assert kinds["inf"][0] == "rejected" and "NaN or Inf" in kinds["inf"][1]
        assert kinds["shape"][0] == "rejected" and "shape" in kinds["shape"][1]
        assert rt.metrics["failures"] == 3 and rt.metrics["leaves"] == 2
    assert blocks and not _leaked(blocks)  # every slot and partial-sum block was freed


def test_leaves_follow_the_sizing_stay_warm_and_the_shape_is_published(tmp_path):
    """Round 1 has no measured throughput (the prior: ceil(2 / 2) leaves); later rounds have
    a fold deadline no leaf can meet, so as many leaves as updates, at most max_leaves. Each
    round's desired shape goes to the checkpointer, which reports its size to a controller."""
    clients = _clients(poison=False) | {f"d{i}": Rand(50 + i, 4) for i in range(2)}  # 8 clients
    agg = {"mode": "tree", "updates_per_leaf": 2, "max_leaves": 3, "fold_deadline": 1e-9}
    s, t = _server(clients, agg, checkpoint=Checkpointer(tmp_path))
    try:
        seen = []
        for r, fraction in enumerate((0.25, 1.0, 0.5, 0.25, 0.25), start=1):
            s.cfg.fraction = fraction  # 2, 8, 4, 2, 2 clients
            rec = s.fit_round(r)
            tree = s.tree
            doc = s.checkpoint.shape
            assert s.checkpoint.reports.leaves == doc["leaves"]
            seen.append((rec.metrics["leaves"], rec.updates, tree.tree.pids, doc, rec.clients,
                         tree.tree.standby))
        third = seen[2][2][2]
        third_gone = _gone(third)  # before close(): retired by the tree itself
    finally:
        t.close()
        s.close()
    assert [(n, u) for n, u, *_ in seen] == [(1.0, 2), (3.0, 8), (3.0, 4), (2.0, 2), (2.0, 2)]
    for r, (n, _, pids, doc, chosen, _) in enumerate(seen, start=1):
        assert doc["round"] == r and doc["leaves"] == n and doc["middles"] == 1
        assert doc["pids"] == pids and len(doc["assignment"]) == n
        assert sorted(c for cs in doc["assignment"].values() for c in cs) == sorted(chosen)
    assert "no throughput measured" in seen[0][3]["reason"]
    assert seen[1][3]["leaf_throughput_bps"] > 0  # measured in round 1, used from round 2
    # the first leaf ran every round (warm); the third, not needed in round 4, was kept warm
    # on standby for one round, then stopped
    assert len({pids[0] for _, _, pids, *_ in seen}) == 1
    assert seen[3][5] == [third] and seen[4][5] == [] and third_gone


def test_a_killed_leaf_is_replaced_and_its_updates_are_lost_not_fatal():
    rng = np.random.default_rng(1)
    ups = [([rng.standard_normal(t.shape).astype(np.float32) for t in X0], float(k + 1))
           for k in range(6)]
    tree = Hierarchy(X0, leaves=2)
    try:
        victim = tree.pids[0]
        for k, (a, w) in enumerate(ups):
            tree.submit_arrays(a, w, f"u{k}")
        blocks = tree.blocks()
        os.kill(victim, signal.SIGKILL)
        res = tree.finish(timeout=60)
        lost = {tag for tag, why in res.rejected if "died" in why}
        # the next round runs on the replacement
        tree.submit_arrays(ups[0][0], 1.0, "again")
        again = tree.finish(timeout=60)
        pids = tree.pids
        blocks += tree.blocks()
    finally:
        tree.close()
    assert lost and res.count == 6 - len(lost) and tree.replaced == 1
    kept = [u for k, u in enumerate(ups) if f"u{k}" not in lost]
    assert res.total_weight == sum(w for _, w in kept)
    want = sum(a[0] * w for a, w in kept)
    np.testing.assert_allclose(res.sums[0], want, rtol=1e-5, atol=1e-5)
    assert victim not in pids and again.count == 1
    np.testing.assert_allclose(again.sums[0], ups[0][0][0], rtol=1e-6)
    assert not _leaked(blocks)  # the dead leaf's partial-sum block too


def test_a_stuck_leaf_is_killed_and_replaced_after_the_stall_timeout():
    """A leaf that is alive but stops folding (SIGSTOP) would hold its slots forever: after
    `stall_timeout` without a slot back, it is killed and replaced, its updates lost."""
    rng = np.random.default_rng(2)
    ups = [([rng.standard_normal(t.shape).astype(np.float32) for t in X0], float(k + 1))
           for k in range(12)]
    tree = Hierarchy(X0, leaves=2, slots=2, stall_timeout=1.0)
    try:
        assert tree.wait_ready(120)  # stopped while folding, not while starting
        stuck = tree.pids[0]
        os.kill(stuck, signal.SIGSTOP)
        for k, (a, w) in enumerate(ups):  # the pool (2 slots) runs dry on the stuck leaf
            tree.submit_arrays(a, w, f"u{k}")
        res = tree.finish()
        pids = tree.pids
    finally:
        tree.close()
    lost = {tag for tag, why in res.rejected if "stopped folding for 1s" in why}
    assert lost and res.count + len(lost) == 12 and tree.replaced >= 1
    assert stuck not in pids and _gone(stuck)
    kept = [u for k, u in enumerate(ups) if f"u{k}" not in lost]
    np.testing.assert_allclose(res.sums[0], sum(a[0] * w for a, w in kept), rtol=1e-5,
                               atol=1e-5)


def test_a_leaf_killed_mid_round_does_not_crash_the_server():
    class Killer(Rand):
        killed = False

        def fit(self, params, config):
            if Killer.killed:
                return super().fit(params, config)
            Killer.killed = True
            # Kill a leaf that is there now: once, under load, the first pid read was already
            # gone by the time of the kill (ProcessLookupError), failing the test before it began.
            for pid in server.tree.tree.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    break
                except ProcessLookupError:
                    continue
            else:
                raise AssertionError("no live leaf to kill")
            while not _gone(pid) and not _reaped(pid):
                time.sleep(0.01)
            return super().fit(params, config)

    def _reaped(pid):  # a zombie, or already gone (reaped between the two checks)
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] == "Z"
        except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or the read
            return True

    clients = _clients(poison=False) | {"killer": Killer(70, 2)}
    server, t = _server(clients, {"mode": "tree", "leaves": 2})
    try:
        first = server.fit_round(1)
        second = server.fit_round(2)  # the replacement leaf takes its share
    finally:
        t.close()
        server.close()
    lost = [f for f in first.failures if "died" in f["reason"]]
    assert first.updates + len(lost) == 7 and len(first.failures) == len(lost), first.failures
    assert first.metrics["leaf_replacements"] == 1.0
    assert second.updates == 7 and second.failures == []
    assert all(np.isfinite(p).all() for p in server.strategy.parameters)


def test_the_tree_takes_consent_and_local_dp_like_the_flat_server(tmp_path):
    """Consent (selection, refusal on arrival, audit) and local DP (accounting) act outside the
    fold, so the tree runs them: the same model and the same failures as mode: stream."""
    from plinth.fl.privacy.consent import ConsentRegistry
    from plinth.fl.safeguards import Safeguards

    class Revoker(Rand):
        def fit(self, params, config):
            if int(config.get("round", 0)) == 2:
                reg = ConsentRegistry(str(db))
                reg.revoke("c1", "p", now=time.time())
                reg.close()
            return super().fit(params, config)

    out = {}
    for mode in ("stream", "tree"):
        db = tmp_path / f"{mode}.sqlite"
        reg = ConsentRegistry(str(db))
        for cid in ("c0", "c1", "c2", "c3", "c4"):  # c5 never consents
            reg.grant(cid, "p", version=1, now=time.time())
        reg.close()
        spec = parse_app({"name": "t", "consent": {"purpose": "p", "registry": str(db)},
                          "privacy": {"local_dp": {"noise_multiplier": 1.0}},
                          "server": {"aggregation": {"mode": mode, "leaves": 2}}})
        clients = _clients(poison=False) | {"c1": Revoker(1, 6)}
        t = ThreadTransport({cid: ClientRunner(c) for cid, c in clients.items()}, threads=4)
        cfg = ServerSpec(rounds=2, fraction=1.0, min_clients=1, min_available=1,
                         straggler_timeout=60.0, aggregation=spec.server.aggregation)
        guard = Safeguards(spec)
        s = Server(make_strategy("fedavg"), t, cfg, seed=0, safeguards=guard,
                   evaluate=lambda p: (0.0, {"accuracy": 0.5}))
        s.initialize(X0)
        try:
            recs = s.run(2)
        finally:
            t.close()
            s.close()
            guard.close()
        out[mode] = (recs, [p.copy() for p in s.strategy.parameters])
    (stream, p_stream), (tree, p_tree) = out["stream"], out["tree"]
    for a, b in zip(p_stream, p_tree):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    for rs, rt in zip(stream, tree):
        assert "c5" not in rt.clients and rt.updates == rs.updates
        assert rt.metrics["local_epsilon"] == pytest.approx(rs.metrics["local_epsilon"])
        assert rt.metrics["leaves"] == 2.0
    refused = [f for f in tree[1].failures if f["cid"] == "c1"]
    assert refused and "consent" in refused[0]["reason"] and tree[1].updates == 4


def _app(tmp_path, mode, **extra):
    doc = yaml.safe_load((APPS / "tiny.yaml").read_text())
    doc["code"] = str(APPS / "tiny.py")
    doc["server"]["aggregation"] = {"mode": mode, "updates_per_leaf": 2}
    # a loaded machine starts the client workers (torch) and the leaves slowly: no straggler
    doc["server"]["straggler_timeout"] = 900
    doc |= extra
    p = tmp_path / f"{mode}.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_sim_in_tree_mode_matches_stream_mode(tmp_path):
    acc = {}
    for mode in ("stream", "tree"):
        out = tmp_path / f"{mode}.json"
        res = CliRunner().invoke(app, ["sim", _app(tmp_path, mode), "--clients", "4", "--rounds",
                                       "2", "--workers", "1", "--json", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        assert [r["updates"] for r in doc["rounds"]] == [4, 4]
        acc[mode] = doc["final_accuracy"]
        if mode == "tree":  # round 1: the prior ceil(4 / 2); then the measured throughput
            leaves = [r["leaves"] for r in doc["rounds"]]
            assert leaves[0] == 2.0 and 1.0 <= leaves[1] <= 2.0
            assert doc["rounds"][1]["leaf_mbps"] > 0
    assert acc["tree"] > 0.4 and abs(acc["tree"] - acc["stream"]) < 0.05


@pytest.mark.parametrize(("aggregation", "extra", "field"), [
    ({"mode": "tree", "leaves": 0}, {}, "server.aggregation.leaves"),
    ({"mode": "tree", "leaves": 4, "max_leaves": 2}, {}, "server.aggregation"),
    ({"mode": "forest"}, {}, "server.aggregation.mode"),
    ({"mode": "tree", "updates_per_leaf": 0}, {}, "server.aggregation.updates_per_leaf"),
    ({"mode": "tree", "leaf_timeout": -1}, {}, "server.aggregation.leaf_timeout"),
    ({"mode": "tree"}, {"strategy": {"name": "fedbuff"}}, "server.aggregation.mode"),
    ({"mode": "tree"}, {"strategy": {"name": "fedavg", "robust": {"rule": "median"}}},
     "strategy.robust"),
])
def test_bad_aggregation_config_is_a_one_line_error(aggregation, extra, field):
    with pytest.raises(SpecError) as e:
        parse_app({"server": {"aggregation": aggregation}, **extra})
    assert "\n" not in str(e.value) and field in str(e.value)


def test_bad_aggregation_config_from_the_cli(tmp_path):
    bad = _app(tmp_path, "tree", strategy={"name": "fedasync"})
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "sim", bad],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "server.aggregation.mode" in r.stderr
