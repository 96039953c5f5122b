"""Central DP, consent and SecAgg+, switched on from the app YAML and run in a federated task."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.fl.app import parse_app
from plinth.fl.privacy.consent import ConsentRegistry
from plinth.fl.privacy.dp import PrivacyAccountant
from plinth.fl.safeguards import Safeguards
from plinth.fl.sim import run_sim

APPS = Path(__file__).parent / "apps"
TINY = str(APPS / "tiny.yaml")


def _params(d: int) -> list[np.ndarray]:
    """A model of d float32 parameters, all zero (the shapes a round's updates must have)."""
    return [np.zeros(d, np.float32)]


# -- central DP --------------------------------------------------------------------------------


def test_dp_reports_epsilon_each_round_and_stops_at_the_budget():
    z, q = 1.5, 0.5  # 2 of 4 clients a round
    acc = PrivacyAccountant(delta=1e-5)
    eps = [acc.step(noise_multiplier=z, sample_rate=q) for _ in range(4)]
    budget = (eps[2] + eps[3]) / 2  # three rounds fit, the fourth would not
    dp = {"clip": 0.5, "noise_multiplier": z, "delta": 1e-5, "epsilon_budget": budget}
    r = run_sim(TINY, clients=4, rounds=6, workers=1,
                overrides={"server.fraction": 0.5, "privacy": {"dp": dp}})
    got = [x["epsilon"] for x in r["rounds"]]
    assert len(got) == 3
    assert all(a <= b for a, b in itertools.pairwise(got))  # never decreases
    np.testing.assert_allclose(got, eps[:3], rtol=1e-6)  # the accountant's numbers, per round
    assert max(got) <= budget and r["epsilon"] == got[-1]
    assert "epsilon_budget" in r["stopped"] and "round 4" in r["stopped"]
    assert all(x["dp_clip"] == 0.5 for x in r["rounds"])


def test_dp_clips_each_update_and_adapts_the_clip():
    spec = parse_app({"seed": 3, "privacy": {"dp": {
        "clip": 1.0, "noise_multiplier": 1.0,
        "adaptive": {"target_quantile": 0.5, "learning_rate": 0.5}}}})
    # Seeded noise (as in `plinth fl sim`): the clip's move is noised (std 1 on a count of 4),
    # and a draw above 2 would turn it; deployed noise is unpredictable, which is its point.
    guard = Safeguards(spec, simulated=True)
    assert guard.admit(1, 4, 4) is None
    acc = guard.begin(1, _params(50), ["0", "1", "2", "3"])
    rng = np.random.default_rng(0)
    for _ in range(4):  # norms ~70, far above the clip: every update is clipped
        acc.add([rng.normal(0, 10, 50).astype(np.float32)], 1.0)
    acc.mean()
    assert acc.metrics["dp_clipped"] == 4 and acc.metrics["dp_clip"] == 1.0
    # no update fell under the clip, so the clip grows toward the median norm
    assert acc.metrics["dp_next_clip"] > 1.0
    assert acc.metrics["epsilon"] > 0


# -- consent -----------------------------------------------------------------------------------


def test_a_revoked_client_is_never_selected(tmp_path):
    db = tmp_path / "consent.sqlite"
    reg = ConsentRegistry(str(db))
    for c in "0123":
        reg.grant(c, "digits-research", version=1, now=1.0)
    reg.grant("4", "ads", version=1, now=1.0)  # consent for another purpose only
    assert reg.revoke("2", "digits-research", now=2.0)
    reg.close()
    r = run_sim(TINY, clients=5, rounds=2, workers=1, overrides={
        "server.fraction": 1.0,
        "consent": {"purpose": "digits-research", "registry": str(db), "task_id": "t1"}})
    assert [x["clients"] for x in r["rounds"]] == [["0", "1", "3"], ["0", "1", "3"]]
    reg = ConsentRegistry(str(db))
    log = reg.audit_log(task_id="t1")
    reg.close()
    took_part = {(e.client_id, e.round) for e in log if e.event == "participated"}
    assert took_part == {(c, rnd) for c in "013" for rnd in (1, 2)}
    excluded = {(e.client_id, e.round) for e in log if e.event == "excluded"}
    assert excluded == {(c, rnd) for c in "24" for rnd in (1, 2)}
    assert not [e for e in log if e.client_id in "24" and e.event != "excluded"]


def test_a_new_consent_registry_starts_empty_and_a_missing_folder_is_one_line(tmp_path):
    # grants arrive through the server's consent API, so the server creates its registry
    db = tmp_path / "new.sqlite"
    guard = Safeguards(parse_app({"consent": {"purpose": "p", "registry": str(db)}}))
    assert db.is_file() and guard.registry.audit_log() == []
    guard.close()
    spec = parse_app({"consent": {"purpose": "p", "registry": str(tmp_path / "no" / "x.db")}})
    with pytest.raises(SpecError, match="consent.registry: folder .* does not exist"):
        Safeguards(spec)


# -- SecAgg+ -------------------------------------------------------------------------------------


def test_secagg_aggregate_equals_the_plaintext_mean():
    spec = parse_app({"privacy": {"secagg": {"neighbours": 4, "threshold": 0.5,
                                             "scale": 2.0 ** 16}}})
    guard = Safeguards(spec)
    n, d = 7, 300
    rows = np.random.default_rng(1).uniform(-0.5, 0.5, (n, d)).astype(np.float32)
    acc = guard.begin(1, _params(d), [str(i) for i in range(n)])
    for row in rows:
        acc.add([row], 10.0)
    (got,) = acc.mean()
    assert acc.metrics["secagg_survivors"] == n
    # each client's coordinate is rounded to 1/scale: the mean is within 1/(2·scale)
    np.testing.assert_allclose(got, rows.astype(np.float64).mean(axis=0), rtol=0,
                               atol=0.5 / 2 ** 16 + 1e-7)


def test_secagg_runs_in_the_simulation():
    r = run_sim(TINY, clients=4, rounds=2, workers=1, overrides={
        "server.fraction": 1.0, "privacy": {"secagg": {"threshold": 0.5}}})
    assert r["secagg"] is True
    assert [x["secagg_survivors"] for x in r["rounds"]] == [4, 4]
    assert r["final_accuracy"] > 0.4  # learns like plain FedAvg (digits, 2 rounds)


@pytest.mark.parametrize("doc, field", [
    ({"privacy": {"dp": {"clip": 1.0}}}, "privacy.dp.noise_multiplier"),
    ({"privacy": {"dp": {"noise_multiplier": 1.0, "delta": 2}}}, "privacy.dp.delta"),
    ({"privacy": {"dp": {"noise_multiplier": 1.0, "epsilon_budget": -1}}},
     "privacy.dp.epsilon_budget"),
    ({"privacy": {"dp": {"noise_multiplier": 1.0, "adaptive": {"count_noise_std": 0.1}}}},
     "privacy.dp"),
    ({"privacy": {"secagg": {"threshold": 1.5}}}, "privacy.secagg.threshold"),
    ({"privacy": {"secagg": {}, "dp": {"noise_multiplier": 1.0}}}, "privacy.secagg"),
    ({"strategy": {"robust": {"rule": "median"}}, "privacy": {"dp": {"noise_multiplier": 1}}},
     "strategy.robust"),
    ({"consent": {"registry": "x.sqlite"}}, "consent.purpose"),
    ({"strategy": {"name": "fedasync"}, "consent": {"purpose": "p", "registry": "x"}},
     "consent"),
])
def test_bad_privacy_config_names_the_field(doc, field):
    with pytest.raises(SpecError) as e:
        parse_app(doc, "app.yaml")
    msg = str(e.value)
    assert "\n" not in msg and f"app.yaml: {field}:" in msg


def test_resume_replays_the_dp_accounting():
    from plinth.fl.server import RoundRecord

    spec = parse_app({"privacy": {"dp": {"noise_multiplier": 1.2}}})
    first = Safeguards(spec)
    records = []
    for r in (1, 2):
        assert first.admit(r, 2, 4) is None
        acc = first.begin(r, _params(5), ["0", "1"])
        acc.add([np.ones(5, np.float32)], 1.0)
        acc.mean()
        records.append(RoundRecord(r, None, None, 0.0, 0, 0, ["0", "1"], 1,
                                   metrics=dict(acc.metrics)))
    resumed = Safeguards(spec)
    resumed.restore(records)
    assert resumed.dp.accountant.history == pytest.approx(first.dp.accountant.history)
    assert resumed.dp.accountant.epsilon() == pytest.approx(records[-1].metrics["epsilon"])


# `plinth fl server` with privacy.secagg runs the protocol over gRPC:
# tests/fl_privacy/test_secagg_transport.py::test_secagg_over_grpc_with_separate_processes
