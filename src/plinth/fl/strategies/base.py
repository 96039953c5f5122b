"""The strategy interface: how the server configures its clients and turns the updates of a round
into the next model, as Flower's `Strategy` does (`configure_fit`, `aggregate_fit`,
`aggregate_evaluate`). A strategy decides; it starts nothing and owns no accumulator.

- `initialize(parameters)`: the starting global model;
- `fit_config(round)`: what clients are sent with each fit (FedProx's mu);
- `weight(num_examples, staleness)`: how much one update counts in the round's weighted sum;
- `aggregate_fit(round, acc, failures)`: the next model from the folded updates (`apply` is the
  subclass's step); failures arrive as data (`list[Failure]`), never as exceptions;
- `aggregate_evaluate(round, results, failures)`: the loss and metrics of federated evaluation;
- `state()` / `load_state(state)`: the server-side optimiser state a checkpoint keeps.

Asynchronous strategies (`asynchronous = True`) add `ready(acc)`, whether enough updates are
buffered to step the model, and `refuse(staleness)`, why an update that many model versions old
is not used. The server folds each update into the round's accumulator as it arrives, weighted
by `weight`; which accumulator (the streaming engine, the aggregator tree, a safeguard's
collecting one) is the server's concern.

Clients send *deltas* (their trained parameters minus the ones they received), so every strategy
works on the weighted mean (or sum) of deltas.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from plinth.fl.aggregate.accumulator import Accumulator
from plinth.fl.messages import Config, EvaluateRes, Failure, Metrics, NDArrays


class Options(BaseModel):
    """Base for a strategy's options; unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")
    server_lr: float = 1.0


class Strategy:
    """Base class. Subclasses override `Opts` and `apply` (and the async hooks if async)."""

    name: ClassVar[str] = ""
    asynchronous: ClassVar[bool] = False
    Opts: ClassVar[type[Options]] = Options

    def __init__(self, **options: Any) -> None:
        self.opts = self.Opts(**options)
        self.parameters: NDArrays = []

    def initialize(self, parameters: NDArrays) -> None:
        """Set the starting global model (copied: the strategy owns its arrays)."""
        self.parameters = [np.array(p, copy=True) for p in parameters]

    def fit_config(self, round: int) -> Config:
        """Extra config sent to clients with each fit (e.g. FedProx's mu)."""
        return {}

    def weight(self, num_examples: int, staleness: int) -> float:
        """An update's weight in the round's sum (FedAvg: its examples)."""
        return float(num_examples)

    def ready(self, acc: Accumulator) -> bool:
        """Async only: whether enough updates are buffered to step the model."""
        return acc.count >= 1

    def refuse(self, staleness: int) -> str | None:
        """Async only: why an update `staleness` model versions old is not used; None: it is."""
        return None

    def aggregate_fit(self, round: int, acc: Accumulator,
                      failures: list[Failure]) -> tuple[NDArrays, Metrics]:
        """The next global model from the folded updates. With none, the model stays."""
        metrics: Metrics = {"updates": float(acc.count), "failures": float(len(failures))}
        if acc.count == 0:
            return self.parameters, {**metrics, **acc.metrics, "skipped": 1.0}
        self.apply(acc)  # (a collecting accumulator reduces, and fills its metrics, here)
        # the accumulator's own: leaves that ran, the robust rule's, DP's, SecAgg's
        return self.parameters, {**metrics, **acc.metrics}

    def apply(self, acc: Accumulator) -> None:
        """Move `self.parameters` by the folded updates (FedAvg: by their mean)."""
        mean = acc.mean()
        assert mean is not None
        lr = self.opts.server_lr
        for p, d in zip(self.parameters, mean):
            _axpy_into(p, d, lr)

    def aggregate_evaluate(self, round: int, results: list[EvaluateRes],
                           failures: list[Failure]) -> tuple[float, Metrics]:
        """Example-weighted loss and metrics of federated evaluation."""
        n = sum(r.num_examples for r in results)
        if n == 0:
            return float("nan"), {}
        loss = sum(r.loss * r.num_examples for r in results) / n
        keys = set().union(*(r.metrics for r in results))
        return loss, {k: sum(r.metrics.get(k, 0.0) * r.num_examples for r in results) / n
                      for k in sorted(keys)}

    # -- checkpointing --------------------------------------------------------------------------

    def state(self) -> dict[str, NDArrays]:
        """Server-side optimiser state to checkpoint (momentum, moments), by name."""
        return {}

    def load_state(self, state: dict[str, NDArrays]) -> None:
        for k, v in state.items():
            setattr(self, k, [np.array(a, copy=True) for a in v])


def _axpy_into(p: np.ndarray, d: np.ndarray, lr: float) -> None:
    """p += lr * d, rounding into integer buffers (e.g. BatchNorm's batch counter)."""
    if np.issubdtype(p.dtype, np.floating):
        p += (lr * d).astype(p.dtype, copy=False)
    else:
        p += np.rint(lr * d.astype(np.float64)).astype(p.dtype)
