import math

import numpy as np
import pytest

from plinth.core.errors import SpecError
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.messages import EvaluateRes, Failure
from plinth.fl.strategies import STRATEGIES, make_strategy

X0 = [np.zeros((3, 2), np.float32), np.ones(4, np.float32)]


def _fold(strategy, acc, delta, examples, staleness=0):
    """What the server does with one update: the strategy weighs it, the accumulator folds it."""
    acc.add(delta, strategy.weight(examples, staleness))


def _step(strategy, deltas, weights, staleness=None):
    acc = StreamingAggregator(strategy.parameters)
    for i, (d, w) in enumerate(zip(deltas, weights)):
        _fold(strategy, acc, d, w, 0 if staleness is None else staleness[i])
    params, metrics = strategy.aggregate_fit(1, acc, [Failure("9", 1, "timeout", "late")])
    return params, metrics


def _d(v):
    return [np.full((3, 2), v, np.float32), np.full(4, v, np.float32)]


def test_registry_has_one_class_per_name():
    assert set(STRATEGIES) == {"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi",
                               "fedadagrad", "fedbuff", "fedasync"}


def test_fedavg_moves_by_the_example_weighted_mean_delta():
    s = make_strategy("fedavg")
    s.initialize(X0)
    params, metrics = _step(s, [_d(1.0), _d(4.0)], [30, 10])
    np.testing.assert_allclose(params[0], 1.75)
    np.testing.assert_allclose(params[1], 2.75)
    assert metrics["updates"] == 2 and metrics["failures"] == 1
    assert X0[0].sum() == 0  # the strategy copied its start


def test_no_updates_keeps_the_model():
    s = make_strategy("fedavg")
    s.initialize(X0)
    params, metrics = _step(s, [], [])
    assert metrics["skipped"] == 1
    np.testing.assert_array_equal(params[1], X0[1])


def test_fedprox_sends_mu_and_aggregates_like_fedavg():
    s = make_strategy("fedprox", {"proximal_mu": 0.3})
    s.initialize(X0)
    assert s.fit_config(1) == {"proximal_mu": 0.3}
    params, _ = _step(s, [_d(2.0)], [1])
    np.testing.assert_allclose(params[0], 2.0)


def test_fedavgm_accumulates_momentum_across_rounds():
    s = make_strategy("fedavgm", {"momentum": 0.5})
    s.initialize(X0)
    _step(s, [_d(1.0)], [1])
    params, _ = _step(s, [_d(1.0)], [1])
    np.testing.assert_allclose(params[0], 1.0 + 1.5)  # v1 = 1, v2 = 0.5 + 1
    s2 = make_strategy("fedavgm", {"momentum": 0.5})
    s2.initialize(params)
    s2.load_state(s.state())
    np.testing.assert_allclose(s2.velocity[0], 1.5)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_first_step_follows_the_paper(name):
    s = make_strategy(name, {"server_lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3})
    s.initialize(X0)
    params, _ = _step(s, [_d(0.5)], [1])
    m = 0.1 * 0.5
    v0 = 1e-6
    v = {"fedadam": 0.99 * v0 + 0.01 * 0.25,
         "fedyogi": v0 - 0.01 * 0.25 * np.sign(v0 - 0.25),
         "fedadagrad": v0 + 0.25}[name]
    np.testing.assert_allclose(params[0], 0.1 * m / (math.sqrt(v) + 1e-3), rtol=1e-5)
    assert set(s.state()) == {"m", "v"}


def test_fedbuff_waits_for_k_and_discounts_staleness():
    s = make_strategy("fedbuff", {"buffer_size": 2, "server_lr": 1.0})
    s.initialize(X0)
    acc = StreamingAggregator(s.parameters)
    _fold(s, acc, _d(1.0), 100, staleness=0)
    assert not s.ready(acc)
    _fold(s, acc, _d(1.0), 5, staleness=3)
    assert s.ready(acc)
    params, _ = s.aggregate_fit(1, acc, [])
    np.testing.assert_allclose(params[0], (1.0 + 1.0 / 2.0) / 2)  # weights 1 and 1/√4


def test_fedbuff_refuses_too_stale_updates():
    s = make_strategy("fedbuff", {"buffer_size": 2, "max_staleness": 2})
    s.initialize(X0)
    assert "staleness 5 exceeds max_staleness 2" in s.refuse(5)
    assert s.refuse(2) is None


def test_fedasync_mixes_with_polynomial_staleness():
    s = make_strategy("fedasync", {"alpha": 0.5, "staleness_exponent": 1.0})
    s.initialize(X0)
    acc = StreamingAggregator(s.parameters)
    _fold(s, acc, _d(2.0), 10, staleness=1)
    assert s.ready(acc)
    params, _ = s.aggregate_fit(1, acc, [])
    np.testing.assert_allclose(params[0], 0.5 * 2.0 ** -1 * 2.0)


@pytest.mark.parametrize("name, options, field", [
    ("fedavg2", {}, "strategy.name"),
    ("fedprox", {"mu": 0.1}, "strategy.options.mu"),
    ("fedavgm", {"momentum": 1.5}, "strategy.options.momentum"),
    ("fedbuff", {"buffer_size": 0}, "strategy.options.buffer_size"),
])
def test_bad_strategy_config_names_the_field(name, options, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        make_strategy(name, options)


def test_federated_evaluation_is_example_weighted():
    s = make_strategy("fedavg")
    loss, m = s.aggregate_evaluate(1, [EvaluateRes(1, 1.0, 1, {"accuracy": 1.0}),
                                       EvaluateRes(1, 3.0, 3, {"accuracy": 0.0})], [])
    assert loss == 2.5 and m["accuracy"] == 0.25
