"""The strategy interface: how updates are weighted, folded and turned into the next model.

A strategy is small: it configures clients (`fit_config`), opens an accumulator for a round
(`begin`), folds each arriving update into it (`accept`, called eagerly as updates arrive), and
turns the accumulator plus the round's failures into the next global model (`aggregate_fit`).
Failures arrive as data (`list[Failure]`), never as exceptions.

Clients send *deltas* (their trained parameters minus the ones they received), so every strategy
works on the weighted mean (or sum) of deltas. Asynchronous strategies (`asynchronous = True`) are
stepped by the server whenever `ready(acc)` says so, with `staleness` = model versions elapsed
since the client's copy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from plinth.fl.aggregate.accumulator import Accumulator, UpdateRejected
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

    def __init__(self, *, threads: int = 1, **options: Any) -> None:
        self.opts = self.Opts(**options)
        self.threads = threads
        self.parameters: NDArrays = []
        self._tree: Any = None  # the elastic aggregator tree (server.aggregation.mode: tree)

    # -- lifecycle ------------------------------------------------------------------------------

    def initialize(self, parameters: NDArrays) -> None:
        """Set the starting global model (copied: the strategy owns its arrays)."""
        self.parameters = [np.array(p, copy=True) for p in parameters]

    def fit_config(self, round: int) -> Config:
        """Extra config sent to clients with each fit (e.g. FedProx's mu)."""
        return {}

    def begin(self, round: int, expected: int | None = None,
              aggregation: Any = None) -> Accumulator:
        """The round's accumulator. With `aggregation` (the app's server.aggregation) in mode
        tree, the strategy's elastic LIFL tree, scaled to `expected` updates."""
        if aggregation is not None and aggregation.mode == "tree":
            from plinth.fl.aggregate.tree import begin_tree

            return begin_tree(self, aggregation, expected, round)
        from plinth.fl.aggregate.engine import StreamingAggregator

        return StreamingAggregator(self.parameters, threads=self.threads)

    @property
    def tree(self) -> Any:
        """The elastic aggregator tree (`TreeAggregation`) once a tree round ran, else None."""
        return self._tree

    def close(self) -> None:
        """Stop what the strategy started for the task (the aggregator tree's processes)."""
        if self._tree is not None:
            self._tree.close()
            self._tree = None

    def weight(self, num_examples: int, staleness: int) -> float:
        return float(num_examples)

    def accept(self, acc: Accumulator, delta: NDArrays, num_examples: int,
               staleness: int = 0) -> float:
        """Fold one update; raises `UpdateRejected` (nothing folded) for a bad one."""
        w = self.weight(num_examples, staleness)
        acc.add(delta, w)
        return w

    def accept_many(self, acc: Accumulator,
                    items: list[tuple[NDArrays, int, int]]) -> list[tuple[int, str]]:
        """Fold several (delta, num_examples, staleness) in one sweep; returns the rejected
        ``(index, reason)``; the others are folded."""
        if type(self).accept is not Strategy.accept:  # a subclass vets updates one by one
            out = []
            for j, (delta, n, s) in enumerate(items):
                try:
                    self.accept(acc, delta, n, s)
                except UpdateRejected as e:
                    out.append((j, str(e)))
            return out
        return acc.add_many([(d, self.weight(n, s)) for d, n, s in items])

    def ready(self, acc: Accumulator) -> bool:
        """Async only: whether enough updates are buffered to step the model."""
        return acc.count >= 1

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
