"""Robust aggregation and simulated attackers, switched on from the app YAML."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.fl.app import parse_app
from plinth.fl.client import AppClients, update_attack
from plinth.fl.safeguards import CollectingAggregator, Safeguards
from plinth.fl.sim import run_sim

APPS = Path(__file__).parent / "apps"
TINY = str(APPS / "tiny.yaml")
# 8 clients, 2 of them (25%) send -4 x their honest update: the plain mean moves backwards.
ATTACK = {"kind": "sign_flip", "fraction": 0.25, "scale": 4.0}
BENCH = {"server.fraction": 1.0, "train.epochs": 2, "train.lr": 0.2, "attack": ATTACK}


def _final(overrides):
    r = run_sim(TINY, clients=8, rounds=3, workers=1, overrides={**BENCH, **overrides})
    assert [x["updates"] for x in r["rounds"]] == [8, 8, 8]
    return r


def test_sign_flip_attack_hurts_fedavg_but_not_median_or_krum():
    fedavg = _final({})
    median = _final({"strategy.robust": {"rule": "median"}})
    krum = _final({"strategy.robust": {"rule": "krum", "f": 2}})
    assert fedavg["attack"] == {"kind": "sign_flip", "fraction": 0.25}
    assert median["robust"] == "median" and krum["robust"] == "krum"
    # Attacked FedAvg stays near chance (0.1); the robust rules learn (clean run: ~0.7).
    assert fedavg["final_accuracy"] < 0.3
    assert median["final_accuracy"] > fedavg["final_accuracy"] + 0.25
    assert krum["final_accuracy"] > fedavg["final_accuracy"] + 0.25
    # Krum keeps one update per round, never an attacker's
    assert all(x["robust_selected"] == 1 for x in krum["rounds"])


def test_attackers_are_drawn_from_the_seed_and_tamper_with_their_update():
    spec = parse_app({"code": "tiny.py", "data": {"source": "digits", "clients": 8},
                      "attack": ATTACK}, base_dir=str(APPS))
    a, b = AppClients(spec, 8), AppClients(spec, 8)
    assert a.attackers == b.attackers and len(a.attackers) == 2
    tamper = update_attack(spec.attack, 0)
    delta = [np.ones((2, 3), np.float32), np.arange(3, dtype=np.int64)]
    bad = tamper(delta, 1)
    np.testing.assert_array_equal(bad[0], -4 * delta[0])
    assert bad[0].dtype == np.float32  # the server accepts it: same dtype as the model
    np.testing.assert_array_equal(bad[1], delta[1])  # integer buffers stay honest


def test_collecting_aggregator_applies_the_rule_and_rejects_nan():
    spec = parse_app({"strategy": {"robust": {"rule": "median"}}})
    guard = Safeguards(spec)

    acc = guard.begin(1, [np.zeros(3, np.float32)], ["0", "1", "2"])
    assert isinstance(acc, CollectingAggregator)
    rej = acc.add_many([([np.array([1, 1, 1], np.float32)], 5.0),
                        ([np.array([2, 2, 2], np.float32)], 5.0),
                        ([np.array([np.nan, 0, 0], np.float32)], 5.0),
                        ([np.array([1e6, 1e6, 1e6], np.float32)], 5.0)])
    assert [j for j, _ in rej] == [2]
    (m,) = acc.mean()
    np.testing.assert_allclose(m, [2, 2, 2])  # the median ignores the huge outlier
    assert m.dtype == np.float32


@pytest.mark.parametrize("doc, field", [
    ({"strategy": {"robust": {"rule": "krumm"}}}, "strategy.robust.rule"),
    ({"strategy": {"robust": {"rule": "krum", "f": -1}}}, "strategy.robust.f"),
    ({"strategy": {"robust": {"rule": "median", "extra": 1}}}, "strategy.robust.extra"),
    ({"strategy": {"name": "fedbuff", "robust": {"rule": "median"}}}, "strategy.robust"),
    ({"attack": {"kind": "sign_flip", "fraction": 1.5}}, "attack.fraction"),
    ({"attack": {"kind": "poison"}}, "attack.kind"),
])
def test_bad_robust_config_names_the_field(doc, field):
    with pytest.raises(SpecError) as e:
        parse_app(doc, "app.yaml")
    msg = str(e.value)
    assert "\n" not in msg and f"app.yaml: {field}:" in msg


def test_cli_runs_the_attack_and_the_rule_from_the_yaml(tmp_path):
    out = tmp_path / "r.json"
    app = tmp_path / "app.yaml"
    app.write_text((APPS / "tiny.yaml").read_text().replace("code: tiny.py",
                                                            f"code: {APPS / 'tiny.py'}")
                   .replace("strategy: {name: fedavg}",
                            "strategy: {name: fedavg, robust: {rule: fltrust}}")
                   + "attack: {kind: backdoor, fraction: 0.25, target: 7}\n")
    r = subprocess.run([sys.executable, "-m", "plinth.cli.main", "fl", "sim", str(app),
                        "--clients", "4", "--rounds", "2", "--workers", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["robust"] == "fltrust" and doc["attack"]["kind"] == "backdoor"
    assert doc["stopped"] is None and [x["updates"] for x in doc["rounds"]] == [4, 4]
    # the server scores the trigger on every round: a rate, reported next to the accuracy
    assert all(0 <= x["backdoor_success"] <= 1 for x in doc["rounds"])
    assert all(1 <= x["robust_selected"] <= 4 for x in doc["rounds"])


def test_too_few_clients_for_the_rule_stops_with_a_reason():
    res = run_sim(TINY, clients=4, rounds=2, workers=1,
                  overrides={"strategy.robust": {"rule": "bulyan", "f": 1}})
    assert res["rounds"] == [] and "needs at least 7 clients" in res["stopped"]


def test_data_attacks_flip_labels_or_stamp_the_trigger():
    from plinth.fl.app import AttackSpec
    from plinth.fl.client import poison
    from plinth.fl.data import Dataset

    ds = Dataset(np.zeros((40, 64), np.float32), np.arange(40, dtype=np.int64) % 10)
    flipped = poison(ds, AttackSpec(kind="label_flip"), 0, num_classes=10)
    np.testing.assert_array_equal(flipped.y, 9 - ds.y)
    bd = poison(ds, AttackSpec(kind="backdoor", target=7, poison_fraction=0.5), 0, num_classes=10)
    stamped = bd.x.reshape(-1, 8, 8)[:, 5:, 5:].min(axis=(1, 2)) == 1.0
    assert stamped.sum() == 20 and np.all(bd.y[stamped] == 7)
    assert bd.x.dtype == np.float32 and bd.y.dtype == np.int64
    assert poison(ds, AttackSpec(kind="sign_flip"), 0, num_classes=10) is ds
