"""Local DP and distributed DP (with SecAgg+), switched on from the app YAML."""

import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml

from plinth.core.errors import SpecError
from plinth.fl import serde
from plinth.fl.app import parse_app
from plinth.fl.client import ClientRunner, local_dp_privatizer
from plinth.fl.deploy import run_client
from plinth.fl.messages import FitIns
from plinth.fl.privacy.dp import PrivacyAccountant
from plinth.fl.safeguards import Safeguards
from plinth.fl.sim import run_sim

APPS = Path(__file__).parent / "apps"
TINY = str(APPS / "tiny.yaml")


def _params(d: int) -> list[np.ndarray]:
    """A model of d float32 parameters, all zero (the shapes a round's updates must have)."""
    return [np.zeros(d, np.float32)]


class _FixedDelta:
    """A client whose fit moves the parameters by a fixed delta."""

    def __init__(self, delta: list[np.ndarray]) -> None:
        self.delta = delta

    def fit(self, parameters, config):
        return [p + d for p, d in zip(parameters, self.delta)], 10, {}

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


def _upload(runner: ClientRunner, params, rnd: int) -> list[np.ndarray]:
    res = serde.decode(runner.handle(serde.encode(FitIns(rnd, params, {}))))
    return [np.asarray(a) for a in res.update]


# -- local DP ------------------------------------------------------------------------------------


def test_local_dp_upload_is_the_clean_update_plus_noise_of_the_configured_std():
    spec = parse_app({"seed": 7, "privacy": {"local_dp": {"clip": 2.0, "noise_multiplier": 0.3}}})
    ldp = spec.privacy.local_dp
    rng = np.random.default_rng(0)
    clean = [rng.normal(0, 0.005, (100, 100)).astype(np.float32),
             rng.normal(0, 0.005, 500).astype(np.float32),
             np.array([3], np.int64)]  # an integer buffer goes as is
    assert np.linalg.norm(np.concatenate([c.reshape(-1) for c in clean[:2]])) < ldp.clip
    params = [np.zeros_like(c) for c in clean]
    runner = ClientRunner(_FixedDelta(clean), privatize=local_dp_privatizer(
        ldp, spec.seed, 4, simulated=True))
    up = _upload(runner, params, 1)
    noise = np.concatenate([(u.astype(np.float64) - c).reshape(-1)
                            for u, c in zip(up[:2], clean[:2])])
    want = ldp.noise_multiplier * ldp.clip
    assert abs(noise.std() / want - 1) < 0.03 and abs(noise.mean()) < 4 * want / 100
    assert up[2].tolist() == [3]
    # in simulation, seeded per client and round: the same again, another round or client
    # differs
    again = ClientRunner(_FixedDelta(clean), privatize=local_dp_privatizer(
        ldp, spec.seed, 4, simulated=True))
    np.testing.assert_array_equal(_upload(again, params, 1)[0], up[0])
    assert not np.array_equal(_upload(again, params, 2)[0], up[0])
    other = ClientRunner(_FixedDelta(clean), privatize=local_dp_privatizer(
        ldp, spec.seed, 5, simulated=True))
    assert not np.array_equal(_upload(other, params, 1)[0], up[0])


def test_local_dp_clips_the_update_before_the_noise():
    spec = parse_app({"privacy": {"local_dp": {"clip": 1.0, "noise_multiplier": 1e-6}}})
    big = [np.full(400, 5.0, np.float32)]  # norm 100
    runner = ClientRunner(_FixedDelta(big),
                          privatize=local_dp_privatizer(spec.privacy.local_dp, 0, 0))
    (up,) = _upload(runner, [np.zeros(400, np.float32)], 1)
    assert np.linalg.norm(up) == pytest.approx(1.0, rel=1e-3)


def test_local_dp_runs_in_the_simulation_and_reports_local_epsilon():
    ldp = {"clip": 5.0, "noise_multiplier": 1.0, "delta": 1e-5}
    r = run_sim(TINY, clients=3, rounds=3, workers=1,
                overrides={"server.fraction": 1.0, "privacy": {"local_dp": ldp}})
    got = [x["local_epsilon"] for x in r["rounds"]]
    assert len(got) == 3 and all(a <= b for a, b in itertools.pairwise(got))
    acc = PrivacyAccountant(delta=1e-5)
    want = [acc.step(noise_multiplier=1.0, sample_rate=1.0) for _ in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert r["local_epsilon"] == got[-1] and r["local_delta"] == 1e-5


def test_app_clients_noise_their_uploads():
    from plinth.fl.app import load_app
    from plinth.fl.client import AppClients

    spec = load_app(TINY, {"privacy": {"local_dp": {"noise_multiplier": 1.0}}})
    assert AppClients(spec, 2).runner(1).privatize is not None
    assert AppClients(load_app(TINY), 2).runner(1).privatize is None


def test_local_dp_budget_stops_the_task():
    acc = PrivacyAccountant(delta=1e-5)
    eps = [acc.step(noise_multiplier=2.0, sample_rate=1.0) for _ in range(3)]
    spec = parse_app({"privacy": {"local_dp": {"noise_multiplier": 2.0,
                                               "epsilon_budget": (eps[1] + eps[2]) / 2}}})
    guard = Safeguards(spec)
    assert guard.active
    got = []
    for r in (1, 2, 3):
        why = guard.admit(r, 2, 2)
        if why:
            assert "privacy.local_dp.epsilon_budget" in why and "round 3" in why
            break
        got.append(guard.end_round(r, None, [], [])["local_epsilon"])
    assert got == pytest.approx(eps[:2])


@pytest.mark.parametrize("doc, field", [
    ({"privacy": {"local_dp": {"clip": 1.0}}}, "privacy.local_dp.noise_multiplier"),
    ({"privacy": {"local_dp": {"noise_multiplier": 1.0, "clip": 0}}}, "privacy.local_dp.clip"),
    ({"privacy": {"local_dp": {"noise_multiplier": -1.0}}}, "privacy.local_dp.noise_multiplier"),
    ({"privacy": {"local_dp": {"noise_multiplier": 1.0, "delta": 1.5}}},
     "privacy.local_dp.delta"),
    ({"privacy": {"local_dp": {"noise_multiplier": 1.0, "sigma": 1}}},
     "privacy.local_dp.sigma"),
    ({"strategy": {"name": "fedasync"}, "privacy": {"local_dp": {"noise_multiplier": 1.0}}},
     "privacy.local_dp"),
    ({"privacy": {"dp": {"noise_multiplier": 1.0, "mode": "distributed"}}}, "privacy.dp.mode"),
    ({"privacy": {"dp": {"noise_multiplier": 1.0, "mode": "hybrid"}}}, "privacy.dp.mode"),
    ({"privacy": {"secagg": {}, "dp": {"noise_multiplier": 1.0, "mode": "distributed",
                                       "min_honest_clients": 0}}},
     "privacy.dp.min_honest_clients"),
])
def test_bad_local_and_distributed_dp_config_names_the_field(doc, field):
    with pytest.raises(SpecError) as e:
        parse_app(doc, "app.yaml")
    msg = str(e.value)
    assert "\n" not in msg and f"app.yaml: {field}:" in msg


# -- distributed DP with SecAgg+ ---------------------------------------------------------------


def test_distributed_dp_unmasked_sum_carries_the_full_noise():
    z, clip, n, d = 0.5, 1.0, 5, 20_000
    spec = parse_app({"seed": 2, "privacy": {
        "dp": {"mode": "distributed", "clip": clip, "noise_multiplier": z},
        "secagg": {"full_graph": True, "clip": 8.0, "scale": 2.0 ** 12}}})
    guard = Safeguards(spec)
    assert guard.admit(1, n, n) is None
    rows = np.random.default_rng(1).uniform(-0.002, 0.002, (n, d)).astype(np.float32)
    assert np.linalg.norm(rows, axis=1).max() < clip  # no clipping: the deviation is the noise
    acc = guard.begin(1, _params(d), [str(i) for i in range(n)])
    for row in rows:
        acc.add([row], 1.0)
    (got,) = acc.mean()
    dev = (got.astype(np.float64) - rows.astype(np.float64).mean(axis=0)) * n  # on the sum
    # n shares of std z·C/sqrt(m), m = n: the sum's noise has std z·C
    assert abs(dev.std() / (z * clip) - 1) < 0.03
    assert acc.metrics["secagg_survivors"] == n
    assert acc.metrics["dp_noise_std"] == pytest.approx(z * clip)
    want = PrivacyAccountant(delta=1e-5).step(noise_multiplier=z, sample_rate=1.0)
    assert acc.metrics["epsilon"] == pytest.approx(want)


def test_distributed_dp_with_fewer_clients_than_assumed_accounts_less_noise():
    z, m, n = 1.0, 8, 4
    spec = parse_app({"privacy": {
        "dp": {"mode": "distributed", "noise_multiplier": z, "min_honest_clients": m},
        "secagg": {"full_graph": True, "clip": 8.0, "scale": 2.0 ** 12}}})
    guard = Safeguards(spec)
    assert guard.admit(1, n, n) is None
    acc = guard.begin(1, _params(50), [str(i) for i in range(n)])
    for _ in range(n):
        acc.add([np.zeros(50, np.float32)], 1.0)
    acc.mean()
    assert acc.metrics["dp_noise_multiplier"] == pytest.approx(z * (n / m) ** 0.5)
    want = PrivacyAccountant(delta=1e-5).step(noise_multiplier=z * (n / m) ** 0.5,
                                             sample_rate=1.0)
    assert acc.metrics["epsilon"] == pytest.approx(want)


def test_distributed_dp_runs_in_the_simulation():
    r = run_sim(TINY, clients=4, rounds=2, workers=1, overrides={
        "server.fraction": 1.0,
        "privacy": {"dp": {"mode": "distributed", "clip": 5.0, "noise_multiplier": 0.1},
                    "secagg": {"clip": 4.0, "scale": 2.0 ** 14}}})
    assert r["secagg"] is True and r["dp_mode"] == "distributed"
    assert [x["secagg_survivors"] for x in r["rounds"]] == [4, 4]
    eps = [x["epsilon"] for x in r["rounds"]]
    assert eps[0] > 0 and eps[0] <= eps[1] and r["epsilon"] == eps[-1]


def test_resume_replays_the_local_dp_accounting():
    from plinth.fl.server import RoundRecord

    spec = parse_app({"privacy": {"local_dp": {"noise_multiplier": 1.5}}})
    first = Safeguards(spec)
    records = [RoundRecord(r, None, None, 0.0, 0, 0, ["0"], 1,
                           metrics=first.end_round(r, None, ["0"], [])) for r in (1, 2)]
    resumed = Safeguards(spec)
    resumed.restore(records)
    assert resumed.privacy.local_accountant.history == \
        pytest.approx(first.privacy.local_accountant.history)
    assert resumed.end_round(3, None, ["0"], [])["local_epsilon"] == pytest.approx(
        first.end_round(3, None, ["0"], [])["local_epsilon"])


def test_chacha_local_dp_noise_has_the_std_and_is_not_reproducible():
    spec = parse_app({"seed": 7, "privacy": {"local_dp": {"clip": 2.0, "noise_multiplier": 0.3,
                                                          "noise": "chacha"}}})
    ldp = spec.privacy.local_dp
    clean = [np.zeros(20_000, np.float32)]
    runs = [_upload(ClientRunner(_FixedDelta(clean),
                                 privatize=local_dp_privatizer(ldp, spec.seed, 4)), clean, 1)[0]
            for _ in range(2)]
    want = ldp.noise_multiplier * ldp.clip
    assert all(abs(r.std() / want - 1) < 0.03 for r in runs)
    assert not np.array_equal(runs[0], runs[1])  # from a CSPRNG, not from the app's seed


@pytest.mark.parametrize(("privacy", "field"), [
    ({"local_dp": {"noise_multiplier": 1.0, "noise": "numpy"}}, "privacy.local_dp.noise"),
    ({"secagg": {}, "dp": {"mode": "distributed", "noise_multiplier": 1.0, "noise": "numpy"}},
     "privacy.dp.noise"),
])
def test_a_real_client_refuses_noise_seeded_from_the_app(tmp_path, privacy, field):
    """`plinth fl client` adds its own noise: seeded from the app's seed, the server (which has
    the same YAML) could subtract it, so it must come from a CSPRNG."""
    app = tmp_path / "app.yaml"
    app.write_text(yaml.safe_dump({"name": "t", "privacy": privacy}))
    with pytest.raises(SpecError) as e:
        run_client(str(app), server="127.0.0.1:1", cid=0)
    assert field in str(e.value) and "chacha" in str(e.value) and "\n" not in str(e.value)
