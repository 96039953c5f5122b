import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.fl.privacy.dp import (
    AdaptiveClip,
    ChaChaNoise,
    NumpyNoise,
    PrivacyAccountant,
    check_budget,
    clip_updates,
    distributed_noise_share,
    dp_fedavg,
    local_dp,
)


def test_clipping_bounds_norms():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(20, 50)) * rng.uniform(0.1, 5, (20, 1))
    c, norms = clip_updates(u, 1.0)
    assert np.all(np.linalg.norm(c, axis=1) <= 1.0 + 1e-12)
    small = norms <= 1.0
    np.testing.assert_allclose(c[small], u[small])
    with pytest.raises(ValueError, match="NaN"):
        clip_updates(np.array([[np.nan, 1.0]]), 1.0)


@pytest.mark.parametrize("source", ["numpy", "chacha"])
def test_noisy_sum_variance_matches_sigma(source):
    noise = (
        NumpyNoise(np.random.default_rng(1)) if source == "numpy" else ChaChaNoise(bytes(range(32)))
    )
    u = np.zeros((10, 20000))
    agg = dp_fedavg(u, clip_norm=2.0, noise_multiplier=1.5, expected_clients=1.0, noise=noise)
    # Sum noise std = z*C = 3; sample variance of 20k draws is within ~2% (5 sigma ~ 5%).
    assert agg.noise_std == pytest.approx(3.0)
    assert np.var(agg.mean) == pytest.approx(9.0, rel=0.05)
    assert abs(np.mean(agg.mean)) < 5 * 3.0 / np.sqrt(20000)


def test_chacha_noise_is_keyed_and_fresh():
    a, b = ChaChaNoise(bytes(32)), ChaChaNoise(bytes(32))
    x1, x2 = a.normal(1.0, 5), a.normal(1.0, 5)
    assert np.array_equal(x1, b.normal(1.0, 5)) and not np.array_equal(x1, x2)


def test_local_and_distributed_noise_scale():
    rng = np.random.default_rng(2)
    upd = np.zeros(40000)
    ld = local_dp(upd, clip_norm=1.0, noise_multiplier=0.5, noise=NumpyNoise(rng))
    assert np.std(ld) == pytest.approx(0.5, rel=0.03)
    m = 25
    shares = [
        distributed_noise_share(
            upd, clip_norm=1.0, noise_multiplier=2.0, min_honest_clients=m, noise=NumpyNoise(rng)
        )
        for _ in range(m)
    ]
    assert np.std(shares[0]) == pytest.approx(2.0 / 5, rel=0.03)
    assert np.std(np.sum(shares, axis=0)) == pytest.approx(2.0, rel=0.03)


def test_adaptive_clip_moves_toward_quantile():
    state = AdaptiveClip(clip_norm=0.1, target_quantile=0.5, learning_rate=0.5, count_noise_std=0.5)
    rng = np.random.default_rng(3)
    for _ in range(60):
        norms = rng.lognormal(0.0, 0.3, 100)  # median 1.0
        state = state.step(norms, expected_clients=100, noise=NumpyNoise(rng))
    assert 0.8 < state.clip_norm < 1.25
    z_delta = AdaptiveClip(count_noise_std=5.0).update_noise_multiplier(1.0)
    assert z_delta > 1.0
    with pytest.raises(ValueError, match="too small"):
        AdaptiveClip(count_noise_std=0.4).update_noise_multiplier(1.0)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_epsilon_matches_dp_accounting(kind):
    z, q, rounds, delta = 1.1, 0.05, 30, 1e-5
    acc = PrivacyAccountant(kind=kind, delta=delta)
    for _ in range(rounds):
        eps = acc.step(noise_multiplier=z, sample_rate=q)
    ev = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds
    )
    ref = (
        dp_accounting.rdp.RdpAccountant()
        if kind == "rdp"
        else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    )
    ref.compose(ev)
    assert eps == pytest.approx(ref.get_epsilon(delta), rel=1e-9)
    assert len(acc.history) == rounds


@settings(max_examples=12, deadline=None)
@given(
    z=st.floats(0.5, 5.0),
    q=st.floats(0.001, 1.0),
    rounds=st.integers(1, 8),
)
def test_epsilon_never_decreases(z, q, rounds):
    acc = PrivacyAccountant(kind="rdp")
    for _ in range(rounds):
        acc.step(noise_multiplier=z, sample_rate=q)
    assert all(b >= a for a, b in zip(acc.history, acc.history[1:]))
    assert acc.history[0] > 0


def test_budget_stops_before_exceeding():
    acc = PrivacyAccountant(kind="rdp", delta=1e-5)
    budget, ran = 1.5, 0
    while True:
        d = check_budget(acc, epsilon_budget=budget, noise_multiplier=2.0, sample_rate=0.3)
        if not d.allowed:
            break
        acc.step(noise_multiplier=2.0, sample_rate=0.3)
        ran += 1
    assert ran > 0 and acc.history[-1] <= budget < d.epsilon_next
    assert "would raise epsilon" in d.reason and "budget 1.5" in d.reason


def test_dpfedavg_object_stops_at_budget():
    from plinth.fl.privacy.dp import DPFedAvg

    rng = np.random.default_rng(4)
    dp = DPFedAvg(
        noise_multiplier=2.0,
        expected_clients=10,
        epsilon_budget=1.5,
        adaptive=AdaptiveClip(clip_norm=1.0, count_noise_std=2.0),
    )
    released = 0
    for _ in range(50):
        out = dp.aggregate(rng.normal(size=(10, 5)), sample_rate=0.3, noise=NumpyNoise(rng))
        if out is None:
            break
        released += 1
        assert "epsilon=" in out.reason
    assert 0 < released < 50 and dp.stopped and "budget 1.5" in dp.stopped
    assert dp.accountant.history[-1] <= 1.5
