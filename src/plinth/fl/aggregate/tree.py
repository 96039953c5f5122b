"""The server's accumulator backed by the elastic LIFL tree (`server.aggregation.mode: tree`).

`TreeAggregation` belongs to a strategy and lives for the whole task: its leaf processes persist
across rounds. Before each round `begin(expected)` scales the active leaves to the expected load,
``ceil(expected / updates_per_leaf)`` clamped to ``[1, max_leaves]`` (or a fixed `leaves`), and
hands out a `TreeAccumulator` with the interface the strategies use (`add`, `add_many`, `count`,
`total_weight`, `sums`, `mean`, `reset`, `close`).

`add_many` checks shapes, dtypes and weights at once (those rejections return as usual), copies
each good update into a shared-memory slot and moves on: the leaves fold while the server keeps
receiving. NaN/Inf are found by the leaves, so those rejections, and the updates lost with a leaf
that died, are known only when the round ends: `settle()` returns them as ``(client, reason)``,
named by `name_updates` (the server names each batch before folding it). `count`, `sums` and
`mean` settle first, so they always describe the updates actually folded.

Strategies that vet updates one at a time (`accept` overridden), asynchronous strategies, and the
safeguards (robust rules, DP, SecAgg, consent: they need every update or the server's own fold)
refuse the tree at start-up; see `tree_problem`.
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.engine import StreamingAggregator, UpdateRejected, check_shapes
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.messages import NDArrays

log = logging.getLogger("plinth.fl.aggregate")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


def leaves_for(expected: int, *, leaves: Any = "auto", max_leaves: int | None = None,
               updates_per_leaf: int = 8) -> int:
    """Active leaves for a round of `expected` updates."""
    cap = max_leaves or cpu_count()
    if leaves != "auto":
        return min(int(leaves), cap)
    return max(1, min(cap, math.ceil(max(0, expected) / updates_per_leaf)))


def tree_problem(spec: Any) -> str | None:
    """Why an app cannot use `server.aggregation.mode: tree`, as 'field: why'; None if it can."""
    from plinth.fl.strategies import STRATEGIES
    from plinth.fl.strategies.base import Strategy

    agg = spec.server.aggregation
    if agg.mode != "tree":
        return None
    cls = STRATEGIES.get(spec.strategy.name)
    if cls.asynchronous or cls.accept is not Strategy.accept:
        return (f"server.aggregation.mode: tree needs a synchronous strategy that folds updates "
                f"in batches, not {spec.strategy.name!r}")
    for name, on in (("strategy.robust", spec.strategy.robust), ("privacy.dp", spec.privacy.dp),
                     ("privacy.local_dp", spec.privacy.local_dp),
                     ("privacy.secagg", spec.privacy.secagg), ("consent", spec.consent)):
        if on is not None:
            return (f"server.aggregation.mode: tree cannot be combined with {name} (the "
                    f"safeguards fold every update in the server process); use mode: stream")
    return None


class TreeAccumulator:
    """One round's running sum, folded by the tree's leaves (see the module's docstring)."""

    def __init__(self, tree: Hierarchy, template: NDArrays, *, threads: int = 1) -> None:
        self.tree = tree
        self.template = [(tuple(t.shape), t.dtype) for t in template]
        self._agg = StreamingAggregator(template, threads=threads)
        self._names: deque[str] = deque()
        self._late: list[tuple[str, str]] = []
        self._open = False  # updates handed to the tree and not yet settled
        self._seq = 0
        self._taken = False  # mean() was taken
        self.metrics: dict[str, float] = {"leaves": float(tree.leaves)}
        self._replaced = tree.replaced

    def name_updates(self, names: Sequence[str]) -> None:
        """Names for the next updates passed to `add_many`, in order (for late rejections)."""
        self._names.extend(names)

    def add(self, arrays: NDArrays, weight: float) -> None:
        rejected = self.add_many([(arrays, weight)])
        if rejected:
            raise UpdateRejected(rejected[0][1])

    def add_many(self, updates: Sequence[tuple[NDArrays, float]]) -> list[tuple[int, str]]:
        """Hand updates to the tree; returns the ones rejected at once (shape, dtype, weight).
        NaN/Inf rejections come from `settle`."""
        if self._taken:
            raise PlinthError("aggregator: mean() was taken; reset() before adding again")
        rejected = []
        for j, (arrays, w) in enumerate(updates):
            self._seq += 1
            name = self._names.popleft() if self._names else f"update {self._seq}"
            try:
                if not (math.isfinite(w) and w > 0):
                    raise UpdateRejected(f"weight {w!r} must be a finite number > 0")
                check_shapes(self.template, arrays)
            except UpdateRejected as e:
                rejected.append((j, str(e)))
                continue
            self._open = True
            self.tree.submit_arrays(arrays, float(w), name)
        return rejected

    def settle(self) -> list[tuple[str, str]]:
        """End the tree's round (once): fold the leaves' partial sums here. Returns the
        rejections found since the last call, as (name, reason)."""
        if self._open:
            self._open = False
            res = self.tree.finish(into=self._agg)
            self._late += res.rejected
            self.metrics["leaf_replacements"] = float(self.tree.replaced - self._replaced)
        late, self._late = self._late, []
        return late

    @property
    def count(self) -> int:
        self.settle_quietly()
        return self._agg.count

    @property
    def total_weight(self) -> float:
        self.settle_quietly()
        return self._agg.total_weight

    def settle_quietly(self) -> None:
        """Settle, keeping the rejections for the next `settle()`."""
        if self._open:
            self._late = self.settle()

    def sums(self) -> NDArrays:
        self.settle_quietly()
        return self._agg.sums()

    def mean(self) -> NDArrays | None:
        self.settle_quietly()
        self._taken = True
        return self._agg.mean()

    def reset(self) -> None:
        self.settle_quietly()
        self._agg.reset()
        self._late, self._taken = [], False

    def close(self) -> None:
        """Ends this round's accumulator; the tree (and its processes) stays for the next."""
        self.settle_quietly()
        self._agg.close()


class TreeAggregation:
    """A strategy's elastic tree: persistent leaf processes, scaled per round."""

    def __init__(self, template: NDArrays, *, leaves: Any = "auto", max_leaves: int | None = None,
                 updates_per_leaf: int = 8, threads: int = 1, pin: bool = True,
                 leaf_timeout: float = 60.0) -> None:
        self.leaves, self.max_leaves = leaves, max_leaves
        self.updates_per_leaf, self.threads = updates_per_leaf, threads
        self.tree = Hierarchy(template, leaves=leaves_for(1, leaves=leaves, max_leaves=max_leaves,
                                                          updates_per_leaf=updates_per_leaf),
                              pin=pin, stall_timeout=leaf_timeout)
        self.shapes = [(tuple(t.shape), t.dtype) for t in template]

    @classmethod
    def from_spec(cls, spec: Any, template: NDArrays, threads: int = 1) -> TreeAggregation:
        return cls(template, leaves=spec.leaves, max_leaves=spec.max_leaves,
                   updates_per_leaf=spec.updates_per_leaf, threads=threads,
                   leaf_timeout=spec.leaf_timeout)

    def fits(self, template: NDArrays) -> bool:
        return [(tuple(t.shape), t.dtype) for t in template] == self.shapes

    def begin(self, template: NDArrays, expected: int | None) -> TreeAccumulator:
        n = leaves_for(expected if expected is not None else self.tree.leaves *
                       self.updates_per_leaf, leaves=self.leaves, max_leaves=self.max_leaves,
                       updates_per_leaf=self.updates_per_leaf)
        if self.tree.in_round:  # a round that ended without settling (an error): drop it
            self.tree.finish()
        if n != self.tree.leaves:
            log.info("aggregator tree: %d -> %d leaves for %s expected updates",
                     self.tree.leaves, n, expected)
        self.tree.scale(n)
        return TreeAccumulator(self.tree, template, threads=self.threads)

    def close(self) -> None:
        self.tree.close()


def begin_tree(strategy: Any, spec: Any, expected: int | None) -> TreeAccumulator:
    """`strategy.begin` with `server.aggregation.mode: tree`: the strategy's tree (started on
    first use, kept across rounds, restarted if the model's shapes change), scaled to
    `expected` updates."""
    from plinth.fl.strategies.base import Strategy

    if type(strategy).accept is not Strategy.accept or strategy.asynchronous:
        raise PlinthError(f"server.aggregation.mode: tree needs a synchronous strategy that folds "
                          f"updates in batches, not {strategy.name!r}")
    tree = strategy._tree
    if tree is None or not tree.fits(strategy.parameters):
        if tree is not None:
            tree.close()
        tree = strategy._tree = TreeAggregation.from_spec(spec, strategy.parameters,
                                                          threads=strategy.threads)
    return tree.begin(strategy.parameters, expected)
