"""The one accumulator interface: the streaming engine, the tree's and the collecting one all
satisfy `Accumulator`, refuse the same bad updates for the same reason, and agree on the mean."""

import numpy as np
import pytest

from plinth.fl.aggregate.accumulator import Accumulator, UpdateRejected, template_of, vet
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.tree import TreeAggregation
from plinth.fl.safeguards import CollectingAggregator

X0 = [np.zeros((20, 10), np.float32), np.zeros(5, np.float32)]


def _mean(rows, weights):
    return (rows * weights[:, None]).sum(0) / weights.sum(), {}, "weighted mean"


def _batch(rng):
    good = [([rng.standard_normal(t.shape).astype(np.float32) for t in X0], float(k + 1))
            for k in range(3)]
    bad = [
        (good[0][0], float("nan")),
        (good[0][0], -1.0),
        (good[0][0], "3"),
        ([np.zeros((10, 20), np.float32), X0[1]], 1.0),
        ([X0[0].astype(np.float64), X0[1]], 1.0),
        (good[0][0][:1], 1.0),
    ]
    return good, bad


@pytest.fixture
def tree():
    t = TreeAggregation(X0, leaves=2)
    yield t
    t.close()


def test_every_accumulator_has_the_one_interface_and_the_one_check(tree):
    good, bad = _batch(np.random.default_rng(0))
    expected = vet(template_of(X0), good + bad)[1]
    assert [j for j, _ in expected] == list(range(3, 9))
    made = {"stream": StreamingAggregator(X0), "collect": CollectingAggregator(X0, _mean),
            "tree": tree.begin(X0, expected=9)}
    want = sum(a[0] * w for a, w in good) / sum(w for _, w in good)
    for name, acc in made.items():
        assert isinstance(acc, Accumulator), name
        assert acc.add_many(good + bad) == expected, name
        with pytest.raises(UpdateRejected, match="weight nan"):
            acc.add(*bad[0])  # the protocol's own `add`, over `add_many`
        assert type(acc).add is Accumulator.add, name
        assert acc.settle() == [] and acc.count == 3, name
        np.testing.assert_allclose(acc.mean()[0], want, rtol=1e-5, atol=1e-6, err_msg=name)
        acc.close()


def test_nan_is_refused_by_every_accumulator_now_or_when_the_round_settles(tree):
    rng = np.random.default_rng(1)
    good, _ = _batch(rng)
    poisoned = [a.copy() for a in good[1][0]]
    poisoned[0][2, 3] = np.nan
    for acc in (StreamingAggregator(X0), CollectingAggregator(X0, _mean),
                tree.begin(X0, expected=2)):
        acc.name_updates(["ok", "poisoned"])
        now = acc.add_many([good[0], (poisoned, 1.0)])
        late = acc.settle()
        assert len(now) + len(late) == 1 and acc.count == 1
        assert (now and now[0][0] == 1) or late[0][0] == "poisoned"
        acc.close()
