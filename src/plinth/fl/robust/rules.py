"""The robust rules by name: how an app's `strategy.robust` settings drive each pure rule of
`aggregators`, and the fewest updates each rule is defined for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plinth.core.registry import Registry
from plinth.fl.robust import aggregators as agg
from plinth.fl.robust.aggregators import AggregateResult


@dataclass(frozen=True, slots=True)
class RuleInputs:
    """What a round hands a rule besides the (n, d) updates and their weights."""

    rows: np.ndarray
    weights: np.ndarray
    center: np.ndarray | None = None  # centered_clipping: last round's aggregate
    server_update: np.ndarray | None = None  # fltrust: the server's root-set update


def _one(spec: Any) -> int:
    return 1


@dataclass(frozen=True, slots=True)
class RobustRule:
    """`reduce(spec, inputs)` is a pure function; `spec` is the app's RobustSpec."""

    reduce: Callable[[Any, RuleInputs], AggregateResult]
    min_clients: Callable[[Any], int] = _one
    needs_server_update: bool = False


def _krum_need(spec: Any) -> int:
    return spec.f + 3


def _bulyan_need(spec: Any) -> int:
    return 4 * spec.f + 3


def _trim(spec: Any) -> int:
    return spec.f if spec.trim is None else spec.trim


def _trimmed_mean_need(spec: Any) -> int:
    return 2 * _trim(spec) + 1


def _krum(spec: Any, x: RuleInputs) -> AggregateResult:
    return agg.krum(x.rows, f=spec.f, weights=x.weights)


def _multi_krum(spec: Any, x: RuleInputs) -> AggregateResult:
    n = x.rows.shape[0]
    m = min(n, spec.m if spec.m is not None else max(1, n - spec.f))
    return agg.multi_krum(x.rows, f=spec.f, m=m, weights=x.weights)


def _bulyan(spec: Any, x: RuleInputs) -> AggregateResult:
    return agg.bulyan(x.rows, f=spec.f)


def _median(spec: Any, x: RuleInputs) -> AggregateResult:
    return agg.coordinate_median(x.rows)


def _trimmed_mean(spec: Any, x: RuleInputs) -> AggregateResult:
    return agg.trimmed_mean(x.rows, trim=_trim(spec))


def _centered_clipping(spec: Any, x: RuleInputs) -> AggregateResult:
    c = np.zeros(x.rows.shape[1]) if x.center is None else x.center
    return agg.centered_clipping(x.rows, center=c, tau=spec.tau, iterations=spec.iterations,
                                 weights=x.weights)


def _fltrust(spec: Any, x: RuleInputs) -> AggregateResult:
    if x.server_update is None:
        raise ValueError("fltrust needs the server's root-set update")
    return agg.fltrust(x.rows, server_update=x.server_update)


RULES: Registry[RobustRule] = Registry("robust rule")
RULES.add("krum", RobustRule(_krum, _krum_need))
RULES.add("multi_krum", RobustRule(_multi_krum, _krum_need))
RULES.add("bulyan", RobustRule(_bulyan, _bulyan_need))
RULES.add("median", RobustRule(_median))
RULES.add("trimmed_mean", RobustRule(_trimmed_mean, _trimmed_mean_need))
RULES.add("centered_clipping", RobustRule(_centered_clipping))
RULES.add("fltrust", RobustRule(_fltrust, needs_server_update=True))
