"""The collecting accumulator: every update of a round kept, then reduced at once.

Robust rules and central DP need all n updates together, so they get this accumulator
(O(n·model) memory, where the streaming engine keeps O(model)). It satisfies the same
`Accumulator` protocol, so every synchronous strategy runs on top of it: `mean()` is the
rule's aggregate delta, which FedAvg, FedAvgM or FedAdam then apply.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.accumulator import Accumulator, Template, template_of, vet
from plinth.fl.messages import Metrics, NDArrays

log = logging.getLogger("plinth.fl.safeguards")

# vector, metrics, reason
Reduced = tuple[np.ndarray, Metrics, str]
Reduce = Callable[[np.ndarray, np.ndarray], Reduced]


def no_reduce(rows: np.ndarray, weights: np.ndarray) -> Reduced:
    raise PlinthError("aggregator: this round has no updates to reduce")


def flatten(arrays: NDArrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])


def unflatten(vec: np.ndarray, template: Template) -> NDArrays:
    out, s = [], 0
    for shape, dt in template:
        n = math.prod(shape)
        part = vec[s:s + n].reshape(shape)
        s += n
        if np.issubdtype(dt, np.integer) or np.dtype(dt) == np.bool_:
            part = np.rint(part)
        out.append(part.astype(dt))
    return out


class CollectingAggregator(Accumulator):
    """Keeps every update of a round, then reduces them all at once with `reduce`."""

    def __init__(self, template: NDArrays, reduce: Reduce) -> None:
        self.template = template_of(template)
        self.reduce = reduce
        self.rows: list[np.ndarray] = []
        self.weights: list[float] = []
        self.count = 0
        self.total_weight = 0.0
        self.metrics: Metrics = {}
        self.reason = ""
        self._mean: NDArrays | None = None

    @classmethod
    def reduced(cls, template: NDArrays, count: int, vec: np.ndarray, metrics: Metrics,
                reason: str) -> CollectingAggregator:
        """An aggregator closed on a result computed elsewhere (a SecAgg+ sum of `count`
        updates): `mean()` returns `vec` shaped like the model."""
        acc = cls(template, no_reduce)
        acc.count, acc.metrics, acc.reason = count, metrics, reason
        acc._mean = unflatten(vec, acc.template)
        return acc

    def add_many(self, updates: Sequence[tuple[NDArrays, float]]) -> list[tuple[int, str]]:
        if self._mean is not None:
            raise PlinthError("aggregator: mean() was taken; the round is closed")
        good, rejected = vet(self.template, updates)
        for j in good:
            row = flatten(updates[j][0])
            if not np.all(np.isfinite(row)):
                rejected.append((j, "NaN or Inf in the update"))
                continue
            self.rows.append(row)
            self.weights.append(float(updates[j][1]))
            self.count += 1
            self.total_weight += float(updates[j][1])
        return sorted(rejected)

    def sums(self) -> NDArrays:
        raise PlinthError("a collecting aggregator has no running sums (synchronous rounds only)")

    def mean(self) -> NDArrays | None:
        """The rule's aggregate of the collected updates, shaped like the model."""
        if self.count == 0:
            return None
        if self._mean is None:
            vec, self.metrics, self.reason = self.reduce(np.stack(self.rows),
                                                         np.asarray(self.weights))
            self._mean = unflatten(vec, self.template)
            log.info("aggregate: %s", self.reason)
        return self._mean

    def close(self) -> None:
        self.rows.clear()
