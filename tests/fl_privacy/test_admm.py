import numpy as np
import pytest

from plinth.fl.admm.consensus import (
    ADMMConfig,
    PairMasks,
    Site,
    decode,
    encode,
    iteration_cap,
    run_admm,
)
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
    site.agree({p: PairMasks(p).public() for p in (1, 2)})
    shares = site.shares(0, (0, 1, 2))
    for r in shares.values():
        top = (r >> np.uint64(60)).astype(int)  # top 4 bits of a uniform word are uniform
        counts = np.bincount(top, minlength=16)
        assert counts.min() > 200
    part = site.partial([np.zeros(5000, np.uint64), np.zeros(5000, np.uint64)])
    assert np.bincount((part >> np.uint64(60)).astype(int), minlength=16).min() > 200
    np.testing.assert_allclose(decode(encode(np.array([1.5, -2.25]))), [1.5, -2.25])



def test_pair_masks_cancel_in_z_and_not_in_a_triple():
    """The masks of all sites sum to 0 mod 2^64 (z is exact); a triple's masks do not (its
    published sum is uniform words), and a site refuses to share before agreeing keys."""
    v, n = 9, 4096
    masks = [PairMasks(i) for i in range(v)]
    publics = {i: m.public() for i, m in enumerate(masks)}
    for m in masks:
        m.agree(publics)
    assert masks[0].peers == list(range(1, v))
    total = sum((m.mask(3, n) for m in masks), np.zeros(n, np.uint64))
    assert not total.any()
    triple = masks[0].mask(3, n) + masks[1].mask(3, n) + masks[2].mask(3, n)
    assert np.bincount((triple >> np.uint64(60)).astype(int), minlength=16).min() > 150
    assert not np.array_equal(masks[0].mask(3, n), masks[0].mask(4, n))  # fresh per iteration
    with pytest.raises(RuntimeError, match="no pair keys agreed"):
        Site(0, np.zeros(3), 0.5, ADMMConfig()).shares(0, (0, 1, 2))
