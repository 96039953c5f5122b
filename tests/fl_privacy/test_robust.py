import numpy as np
import pytest

from plinth.fl.robust import (
    bulyan,
    centered_clipping,
    check_updates,
    coordinate_median,
    fedavg,
    fltrust,
    krum,
    multi_krum,
    pairwise_sq_distances,
    trimmed_mean,
)
from plinth.fl.robust.aggregators import krum_scores


def test_gram_distances_match_pair_loop():
    rng = np.random.default_rng(0)
    u = rng.normal(size=(15, 40))
    loop = np.array([[np.sum((a - b) ** 2) for b in u] for a in u])
    np.testing.assert_allclose(pairwise_sq_distances(u), loop, atol=1e-9)


def test_krum_hand_computed():
    u = np.array([[0.0], [1.0], [2.0], [10.0]])
    # f=1 -> each row sums its n-f-2 = 1 nearest squared distances: 1, 1, 1, 64.
    np.testing.assert_allclose(krum_scores(u, 1), [1, 1, 1, 64])
    assert krum(u, f=1).vector[0] == 0.0  # ties break to the lowest index
    np.testing.assert_allclose(multi_krum(u, f=1, m=3).vector, [1.0])
    np.testing.assert_allclose(
        multi_krum(u, f=1, m=3, weights=np.array([1, 1, 2, 1])).vector, [1.25]
    )


def test_krum_ignores_f_outliers():
    rng = np.random.default_rng(1)
    honest = rng.normal(0, 0.1, (16, 30)) + 1.0
    bad = rng.normal(0, 0.1, (4, 30)) - 50.0
    u = np.vstack([honest, bad])
    for res in (krum(u, f=4), multi_krum(u, f=4, m=10)):
        assert np.all(res.selected < 16)
        assert np.abs(res.vector - 1.0).max() < 0.5
    assert np.abs(fedavg(u).vector - 1.0).max() > 5


def test_median_and_trimmed_mean_hand_computed():
    u = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, -100.0]])
    np.testing.assert_allclose(coordinate_median(u).vector, [2.5, 15.0])
    np.testing.assert_allclose(trimmed_mean(u, trim=1).vector, [2.5, 15.0])
    np.testing.assert_allclose(trimmed_mean(u, trim=0).vector, u.mean(axis=0))
    with pytest.raises(ValueError, match="trim"):
        trimmed_mean(u, trim=2)


def test_bulyan_rejects_outliers_and_checks_n():
    rng = np.random.default_rng(2)
    u = np.vstack([rng.normal(0, 0.1, (9, 5)), rng.normal(1e3, 1.0, (2, 5))])
    res = bulyan(u, f=2)
    assert np.all(res.selected < 9) and np.abs(res.vector).max() < 0.3
    with pytest.raises(ValueError, match="4f \\+ 3"):
        bulyan(u[:10], f=2)


def test_centered_clipping_hand_computed():
    u = np.array([[1.0, 0.0], [0.0, 1.0], [100.0, 0.0]])
    res = centered_clipping(u, center=np.zeros(2), tau=1.0, iterations=1)
    np.testing.assert_allclose(res.vector, [2.0 / 3, 1.0 / 3])
    res = centered_clipping(u, center=np.zeros(2), tau=1e9, iterations=1)
    np.testing.assert_allclose(res.vector, u.mean(axis=0))


def test_fltrust_hand_computed():
    g0 = np.array([1.0, 0.0])
    u = np.array([[2.0, 0.0], [0.0, 3.0], [-5.0, 0.0], [1.0, 1.0]])
    res = fltrust(u, server_update=g0)
    # Trust: 1, 0, 0, 1/sqrt2; rescaled rows to norm 1: [1,0] and [1,1]/sqrt2.
    t = np.array([1.0, 1 / np.sqrt(2)])
    expect = (t[0] * np.array([1.0, 0.0]) + t[1] * np.array([1.0, 1.0]) / np.sqrt(2)) / t.sum()
    np.testing.assert_allclose(res.vector, expect)
    assert res.selected.tolist() == [0, 3]


def test_nan_rows_rejected_by_aggregators():
    with pytest.raises(ValueError, match="rows \\[1\\]"):
        fedavg(np.array([[1.0], [np.nan]]))


def test_check_updates_reasons(caplog):
    u = np.array([[1.0, 1.0], [np.inf, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    res = check_updates(
        [10, 11, 12, 13, 14],
        u,
        [50, 50, 10_000, 40, 0],
        max_examples=1000,
        declared_examples={13: 400},
    )
    assert res.accepted.tolist() == [0]
    assert res.rejected[11] == "update contains NaN or inf"
    assert "exceeds the declared cap 1000" in res.rejected[12]
    assert "disagrees with the enrolled value 400" in res.rejected[13]
    assert "not a positive integer" in res.rejected[14]
    assert "rejected update from client 12" in caplog.text
