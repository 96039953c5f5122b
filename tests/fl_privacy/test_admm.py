import numpy as np
import pytest

from plinth.fl.admm.consensus import ADMMConfig, Site, decode, encode, iteration_cap, run_admm
from plinth.fl.privacy.dp import NumpyNoise


@pytest.mark.parametrize("v", [9, 15])
def test_admm_converges_to_weighted_average(v):
    rng = np.random.default_rng(v)
    w = rng.normal(size=(v, 200))
    n = rng.integers(20, 400, v)
    rep = run_admm(w, n, seed=1)
    assert rep.iterations == iteration_cap(v)
    np.testing.assert_allclose(rep.exact, (n / n.sum()) @ w)
    assert rep.errors[-1] < 1e-6 < rep.errors[0]
    assert rep.errors[-1] < rep.errors[2] < rep.errors[0]


def test_iteration_cap_enforced():
    with pytest.raises(ValueError, match="2 \\(v-1\\)/2 - 1"):
        run_admm(np.zeros((9, 2)), [1] * 9, config=ADMMConfig(iterations=8))


def test_no_site_sees_a_partner_value():
    # What a partner receives (a share, then a partial sum) is uniform and independent of y_i.
    rng = np.random.default_rng(0)
    site = Site(0, np.full(5000, 3.0), 0.5, ADMMConfig(), NumpyNoise(rng))
    shares = site.shares(0, (0, 1, 2))
    for r in shares.values():
        top = (r >> np.uint64(60)).astype(int)  # top 4 bits of a uniform word are uniform
        counts = np.bincount(top, minlength=16)
        assert counts.min() > 200
    part = site.partial([np.zeros(5000, np.uint64), np.zeros(5000, np.uint64)])
    assert np.bincount((part >> np.uint64(60)).astype(int), minlength=16).min() > 200
    np.testing.assert_allclose(decode(encode(np.array([1.5, -2.25]))), [1.5, -2.25])

