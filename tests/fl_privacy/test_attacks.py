import numpy as np
import pytest

from plinth.fl.robust.attacks import (
    add_trigger,
    backdoor,
    backdoor_success_rate,
    choose_attackers,
    gaussian_noise_update,
    label_flip,
    scaled_update,
    sign_flip,
)


def test_update_attacks():
    u = np.array([1.0, -2.0])
    np.testing.assert_allclose(sign_flip(u, scale=3), [-3.0, 6.0])
    np.testing.assert_allclose(scaled_update(u, boost=10), [10.0, -20.0])
    g = gaussian_noise_update(np.zeros(20000), std=2.0, rng=np.random.default_rng(0))
    assert np.std(g) == pytest.approx(2.0, rel=0.05)


def test_choose_attackers_fraction():
    a = choose_attackers(50, 0.2, np.random.default_rng(1))
    assert len(a) == 10 and len(set(a.tolist())) == 10
    with pytest.raises(ValueError):
        choose_attackers(10, 1.0, np.random.default_rng(1))


def test_label_flip():
    y = np.array([0, 1, 9, 3])
    assert label_flip(y, num_classes=10).tolist() == [9, 8, 0, 6]
    assert label_flip(y, num_classes=10, mapping={1: 7}).tolist() == [0, 7, 9, 3]


def test_backdoor_poisons_fraction_and_success_rate():
    rng = np.random.default_rng(2)
    x = np.zeros((100, 16))
    y = rng.integers(0, 3, 100)
    x2, y2 = backdoor(x, y, side=4, target=7, fraction=0.3, rng=rng, patch=2)
    poisoned = np.flatnonzero(y2 == 7)
    assert len(poisoned) == 30
    assert np.all(x2[poisoned].reshape(-1, 4, 4)[:, 2:, 2:] == 1.0)
    assert np.all(x2[y2 != 7] == 0)
    stamped = add_trigger(np.zeros((1, 16)), side=4, patch=2)

    def predict(xx):
        return np.where(xx.reshape(len(xx), -1)[:, -1] > 0.5, 7, 0)

    assert stamped.sum() == 4
    assert backdoor_success_rate(predict, x, y, side=4, target=7, patch=2) == 1.0
