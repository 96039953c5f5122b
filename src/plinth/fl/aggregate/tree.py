"""The server's accumulator backed by the elastic LIFL tree (`server.aggregation.mode: tree`).

`TreeAggregation` belongs to the server (`plinth.fl.server.Server`, which starts it on the
first tree round and closes it at the end) and lives for the whole task: its leaf processes stay
warm across rounds. Before each round `begin(expected)` sizes the tree with `size_tree` (a pure
function of the expected updates, their size and the leaves' throughput, an EWMA of what they
measured in earlier rounds), scales the active leaves to it, gives the shape (`shape_doc`:
the server's checkpointer reports its size to the task's controller, `plinth.fl.reports`) and
hands out a `TreeAccumulator`, which satisfies the `Accumulator` protocol.

The network transport receives each update straight into a shared-memory slot of the tree
(`landing`); `add_many` runs the common boundary check (`vet`) on the decoded views and hands each
good update's slot to a leaf without copying it (an update that arrived otherwise, e.g. a
decompressed one, is copied into a slot once), and moves on: the leaves fold while the server
keeps receiving. NaN/Inf are found by the leaves, so those rejections, and the updates lost with
a leaf that died, are known only when the round ends: `settle()` returns them as ``(client,
reason)``, named by `name_updates`. `count`, `sums` and `mean` settle first, so they always
describe the updates actually folded.

What the tree cannot take is refused when the app is loaded (`plinth.fl.app`, `tree_problem`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from plinth.core.errors import PlinthError
from plinth.fl.aggregate.accumulator import Accumulator, template_of, vet
from plinth.fl.aggregate.engine import StreamingAggregator
from plinth.fl.aggregate.hierarchy import Hierarchy
from plinth.fl.aggregate.leaf_link import LeafRegistry
from plinth.fl.aggregate.sizing import TreeShape, ewma, leaf_throughput, size_tree
from plinth.fl.messages import NDArrays

log = logging.getLogger("plinth.fl.aggregate")


class TreeAccumulator(Accumulator):
    """One round's running sum, folded by the tree's leaves (see the module's docstring)."""

    def __init__(self, owner: TreeAggregation, template: NDArrays) -> None:
        self.owner, self.tree = owner, owner.tree
        self.template = template_of(template)
        self._agg = StreamingAggregator(template, threads=owner.threads)
        self._names: deque[str] = deque()
        self._late: list[tuple[str, str]] = []
        self._open = False  # updates handed to the tree and not yet settled
        self._seq = 0
        self._taken = False  # mean() was taken
        self.metrics: dict[str, float] = {"leaves": float(self.tree.leaves)}
        self._replaced = self.tree.replaced

    def landing(self, size: int) -> Any:
        """A free slot of the tree's pool to receive an update of `size` bytes into."""
        return self.tree.land(size)

    def name_updates(self, names: Sequence[str]) -> None:
        """Names for the next updates passed to `add_many`, in order (for late rejections)."""
        self._names.extend(names)

    def add_many(self, updates: Sequence[tuple[NDArrays, float]]) -> list[tuple[int, str]]:
        """Hand updates to the tree; returns the ones rejected at once (shape, dtype, weight).
        NaN/Inf rejections come from `settle`."""
        if self._taken:
            raise PlinthError("aggregator: mean() was taken; reset() before adding again")
        names = [self._names.popleft() if self._names else f"update {self._seq + j + 1}"
                 for j in range(len(updates))]
        self._seq += len(updates)
        good, rejected = vet(self.template, updates)
        for k, j in enumerate(good):
            self._open = True
            try:
                self.tree.submit_arrays(updates[j][0], float(updates[j][1]), names[j])
            except PlinthError as e:  # no leaf left to fold it: failures, not a crash
                rejected += [(i, str(e)) for i in good[k:]]
                break
        return sorted(rejected)

    def settle(self) -> list[tuple[str, str]]:
        """End the tree's round (once): fold the leaves' partial sums here and feed their
        measured throughput to the sizing. Returns the rejections found since the last call,
        as (name, reason)."""
        if self._open:
            self._open = False
            res = self.tree.finish(into=self._agg)
            self._late += res.rejected
            self.metrics["leaf_replacements"] = float(self.tree.replaced - self._replaced)
            tput = self.owner.measured(res.folded_bytes, res.busy_s)
            if tput is not None:
                self.metrics["leaf_mbps"] = tput / 1e6
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
    """The server's elastic tree: warm leaf processes, sized per round by `size_tree`."""

    def __init__(self, template: NDArrays, *, leaves: Any = "auto", max_leaves: int = 4,
                 updates_per_leaf: int = 8, fold_deadline: float = 1.0, threads: int = 1,
                 leaf_timeout: float = 60.0, alpha: float = 0.5,
                 listen: str | LeafRegistry | None = None,
                 token: bytes | None = None, join_timeout: float = 60.0,
                 max_updates_per_leaf: int | None = None) -> None:
        self.fixed = None if leaves == "auto" else int(leaves)
        self.max_leaves, self.updates_per_leaf = max_leaves, updates_per_leaf
        self.max_updates_per_leaf = max_updates_per_leaf
        self.fold_deadline, self.threads, self.alpha = fold_deadline, threads, alpha
        self.throughput: float | None = None  # bytes/s a leaf: EWMA over the rounds
        self.shapes = template_of(template)
        self.round = 0
        self.shape = self._size(1)
        self.tree = Hierarchy(template, leaves=self.shape.leaves, stall_timeout=leaf_timeout,
                              listen=listen, token=token, join_timeout=join_timeout)

    @classmethod
    def from_spec(cls, spec: Any, template: NDArrays, threads: int = 1,
                  registry: LeafRegistry | None = None) -> TreeAggregation:
        """The tree `spec` (an `AggregationSpec`) describes; its external leaves join at
        `registry` when given (bound by the unit when it started), else at `leaf_listen`."""
        from pathlib import Path

        token = None if spec.leaf_token_file is None or registry is not None else \
            Path(spec.leaf_token_file).read_bytes().strip()
        return cls(template, leaves=spec.leaves, max_leaves=spec.max_leaves,
                   updates_per_leaf=spec.updates_per_leaf, fold_deadline=spec.fold_deadline,
                   threads=threads, leaf_timeout=spec.leaf_timeout,
                   listen=registry if registry is not None else spec.leaf_listen,
                   token=token, join_timeout=spec.leaf_join_timeout,
                   max_updates_per_leaf=spec.max_updates_per_leaf)

    def fits(self, template: NDArrays) -> bool:
        return template_of(template) == self.shapes

    def _size(self, expected: int) -> TreeShape:
        from plinth.fl.aggregate.hierarchy import layout

        return size_tree(expected_updates=expected, update_bytes=layout(self.shapes)[1],
                         throughput_bps_per_leaf=self.throughput,
                         round_deadline_s=self.fold_deadline, max_leaves=self.max_leaves,
                         prior_updates_per_leaf=self.updates_per_leaf, fixed_leaves=self.fixed,
                         max_updates_per_leaf=self.max_updates_per_leaf)

    def measured(self, folded_bytes: list[int], busy_s: list[float]) -> float | None:
        """Fold one round's measured leaf throughput into the EWMA; returns the round's."""
        sample = leaf_throughput(folded_bytes, busy_s)
        self.throughput = ewma(self.throughput, sample, alpha=self.alpha)
        return sample

    def begin(self, template: NDArrays, expected: int | None, round: int = 0
              ) -> TreeAccumulator:
        n = expected if expected is not None else self.tree.leaves * self.updates_per_leaf
        self.shape, self.round = self._size(n), round
        if self.tree.in_round:  # a round that ended without settling (an error): drop it
            self.tree.finish()
        if self.shape.leaves != self.tree.leaves:
            log.info("aggregator tree: %d -> %d leaves (%s)", self.tree.leaves,
                     self.shape.leaves, self.shape.reason)
        self.tree.scale(self.shape.leaves)
        return TreeAccumulator(self, template)

    def shape_doc(self, clients: Sequence[str] = ()) -> dict[str, Any]:
        """The round's desired tree as data a controller reads to size aggregator units:
        the shape, why, the measured throughput, and the planned clients of each leaf."""
        sh, ids = self.shape, sorted(clients)
        per = max(1, sh.updates_per_leaf)
        plan = {f"leaf-{k}": ids[k * per:(k + 1) * per] for k in range(sh.leaves)}
        return {"round": self.round, "leaves": sh.leaves, "middles": sh.middles,
                "updates_per_leaf": sh.updates_per_leaf, "cpus_per_leaf": sh.cpus,
                "reason": sh.reason, "leaf_throughput_bps": self.throughput,
                "assignment": plan, "pids": self.tree.pids, "standby": self.tree.standby,
                "listen": self.tree.address, "active": self.tree.leaves}

    def close(self) -> None:
        self.tree.close()
